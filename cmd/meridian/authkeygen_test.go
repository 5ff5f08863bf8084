package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/meridian-llm/meridian/regional/auth"
)

func TestAuthKeygenCLI(t *testing.T) {
	out, code, err := runCLI(t, newApp(), "auth", "keygen")
	if code != 0 {
		t.Fatalf("keygen: %d %v", code, err)
	}
	m := regexp.MustCompile(`(?m)^key: ([A-Za-z0-9_-]{43})\nsha256: ([0-9a-f]{64})\n$`).FindStringSubmatch(out)
	if m == nil || auth.KeyDigest(m[1]) != m[2] {
		t.Fatalf("output %q", out)
	}
	out, code, _ = runCLI(t, newApp(), "auth", "keygen", "--name", "acme-prod", "--tenant", "ACME", "--data-classes", "general,phi", "--default-data-class", "general")
	if code != 0 {
		t.Fatalf("keygen with an entry: %d %q", code, out)
	}
	key := regexp.MustCompile(`(?m)^key: (\S+)$`).FindStringSubmatch(out)[1]
	_, entry, _ := strings.Cut(out, "(the key itself goes to the client only):\n")
	ks, err := auth.ParseKeys([]byte("keys:\n" + entry))
	if err != nil {
		t.Fatalf("the printed entry does not parse: %v\n%s", err, entry)
	}
	if e := ks.Entries()[0]; e.Name != "acme-prod" || e.Tenant != "acme" || e.DefaultDataClass != "general" || e.SHA256 != auth.KeyDigest(key) {
		t.Fatalf("entry %+v", e)
	}
	out, code, _ = runCLI(t, newApp(), "auth", "keygen", "--json")
	var j map[string]string
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || auth.KeyDigest(j["key"]) != j["sha256"] {
		t.Fatalf("--json: %d %q", code, out)
	}
	for _, args := range [][]string{
		{"auth", "keygen", "--name", "x"},
		{"auth", "keygen", "--data-classes", "a"},
		{"auth", "keygen", "--name", "x", "--tenant", "t", "--data-classes", "a", "--default-data-class", "b"},
		{"auth", "keygen", "extra"},
	} {
		if _, code, err := runCLI(t, newApp(), args...); code != 2 {
			t.Errorf("%v: exit %d (%v), want 2", args, code, err)
		}
	}
}
