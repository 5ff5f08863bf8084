package auth

import (
	"crypto/subtle"
	"errors"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func digestOf(key string) string { return KeyDigest(key) }

const keyA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" // 43 bytes, as keygen makes
const keyB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

func TestParseKeys(t *testing.T) {
	doc := `version: 1
keys:
  - name: acme-prod
    sha256: ` + strings.ToUpper(digestOf(keyA)) + `
    tenant: ACME
    data_classes: [General, PHI]
    default_data_class: general
    rate_limit: {requests_per_second: 5, burst: 10}
  - name: globex
    sha256: ` + digestOf(keyB) + `
    tenant: globex
`
	ks, err := ParseKeys([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []KeyEntry{
		{Name: "acme-prod", SHA256: digestOf(keyA), Tenant: "acme", DataClasses: []string{"general", "phi"}, DefaultDataClass: "general", RateLimit: &RateLimit{RequestsPerSecond: 5, Burst: 10}},
		{Name: "globex", SHA256: digestOf(keyB), Tenant: "globex"},
	}
	if got := ks.Entries(); !reflect.DeepEqual(got, want) {
		t.Fatalf("entries\n got %+v\nwant %+v", got, want)
	}
	json := `{"keys": [{"name": "j", "sha256": "` + digestOf(keyA) + `", "tenant": "t", "data_classes": ["x"], "default_data_class": "X"}]}`
	if ks, err := ParseKeys([]byte(json)); err != nil || ks.Entries()[0].DefaultDataClass != "x" {
		t.Fatalf("JSON keys file: %v", err)
	}
	if ks, err := ParseKeys([]byte("keys: []\n")); err != nil || ks.Len() != 0 {
		t.Fatalf("an empty list revokes every key: %v", err)
	}

	cases := []struct{ doc, want string }{
		{"", "keys file is empty"},
		{"  \n", "keys file is empty"},
		{"version: 1\n", "has no keys: list"},
		{"version: 2\nkeys: []\n", "version 2"},
		{"keys: []\nextra: 1\n", "field extra not found"},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n    key: secret\n", "field key not found"},
		{"keys: []\n---\nkeys: []\n", "more than one YAML document"},
		{"keys:\n  - name: a\n    tenant: t\n", `line 2: key 0 ("a"): sha256 ""`},
		{"keys:\n  - name: a\n    sha256: abc\n    tenant: t\n", `sha256 "abc"`},
		{"keys:\n  - name: 'a b'\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n", `name "a b"`},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n", `tenant ""`},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: 'a b'\n", `tenant "a b"`},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n    data_classes: [x, X]\n", `data class "x" listed twice`},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n    data_classes: [x]\n    default_data_class: y\n", `default_data_class "y" is not one of data_classes [x]`},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n    default_data_class: y\n", `default_data_class "y" is not one of data_classes []`},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n    rate_limit: {requests_per_second: -1}\n", "rate_limit.requests_per_second = -1"},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n  - name: a\n    sha256: " + digestOf(keyB) + "\n    tenant: t\n", `line 5: key 1: name "a" is also key 0's`},
		{"keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: t\n  - name: b\n    sha256: " + strings.ToUpper(digestOf(keyA)) + "\n    tenant: t\n", `key 1 ("b"): sha256 is also key 0's ("a")`},
	}
	for _, c := range cases {
		_, err := ParseKeys([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseKeys(%q) = %v, want %q", c.doc, err, c.want)
		}
		var ke *KeysError
		if err != nil && !errors.As(err, &ke) {
			t.Errorf("ParseKeys(%q): %T is not a *KeysError", c.doc, err)
		}
	}
}

// TestLookupConstantTime: the digest of a presented key is compared with
// every entry, by crypto/subtle, whether it matches the first entry, the
// last or none.
func TestLookupConstantTime(t *testing.T) {
	var b strings.Builder
	b.WriteString("keys:\n")
	keys := make([]string, 8)
	for i := range keys {
		k, d, err := GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
		b.WriteString("  - {name: k" + string(rune('0'+i)) + ", tenant: t, sha256: " + d + "}\n")
	}
	ks, err := ParseKeys([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if reflect.ValueOf(ks.cmp).Pointer() != reflect.ValueOf(subtle.ConstantTimeCompare).Pointer() {
		t.Fatal("digests are not compared with subtle.ConstantTimeCompare")
	}
	calls := 0
	ks.cmp = func(a, b []byte) int { calls++; return subtle.ConstantTimeCompare(a, b) }
	for i, k := range append(keys, keyA) {
		calls = 0
		e, ok := ks.lookup(sha256Of(k))
		if want := i < len(keys); ok != want || (ok && e.Name != "k"+string(rune('0'+i))) {
			t.Fatalf("lookup of key %d: %+v %v", i, e, ok)
		}
		if calls != len(keys) {
			t.Fatalf("lookup of key %d compared %d digests, want all %d (no early exit)", i, calls, len(keys))
		}
	}
}

func sha256Of(k string) (out [32]byte) {
	copy(out[:], mustHex(KeyDigest(k)))
	return out
}

func mustHex(s string) []byte {
	b := make([]byte, len(s)/2)
	for i := range b {
		b[i] = unhex(s[2*i])<<4 | unhex(s[2*i+1])
	}
	return b
}

func unhex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

func TestGenerateKey(t *testing.T) {
	k1, d1, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	k2, _, _ := GenerateKey()
	if len(k1) != 43 || k1 == k2 || strings.ContainsAny(k1, "+/=") || d1 != KeyDigest(k1) || len(d1) != 64 {
		t.Fatalf("keys %q %q digest %q", k1, k2, d1)
	}
}

// FuzzParseKeys: the parser never panics; what it accepts is normalised
// (lower-case tenants and classes, a default among the classes, unique names
// and digests) and survives a round trip through YAML.
func FuzzParseKeys(f *testing.F) {
	f.Add([]byte("keys:\n  - name: a\n    sha256: " + digestOf(keyA) + "\n    tenant: T\n    data_classes: [X]\n    default_data_class: x\n"))
	f.Add([]byte(`{"keys":[{"name":"j","sha256":"` + digestOf(keyB) + `","tenant":"t","rate_limit":{"requests_per_second":2}}]}`))
	f.Add([]byte("version: 1\nkeys: []\n"))
	f.Add([]byte("keys: [{name: a, sha256: 00, tenant: t}]"))
	f.Add([]byte("keys:\n  - &a {name: a}\n  - *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ks, err := ParseKeys(data)
		if err != nil {
			return
		}
		names, digests := map[string]bool{}, map[string]bool{}
		for _, e := range ks.Entries() {
			if names[e.Name] || digests[e.SHA256] {
				t.Fatalf("duplicate entry %+v", e)
			}
			names[e.Name], digests[e.SHA256] = true, true
			if e.Tenant != strings.ToLower(e.Tenant) || e.Tenant == "" || len(e.SHA256) != 64 || e.SHA256 != strings.ToLower(e.SHA256) {
				t.Fatalf("entry not normalised: %+v", e)
			}
			for _, c := range e.DataClasses {
				if c != strings.ToLower(c) {
					t.Fatalf("data class not normalised: %+v", e)
				}
			}
			if e.DefaultDataClass != "" && !contains(e.DataClasses, e.DefaultDataClass) {
				t.Fatalf("default outside the classes: %+v", e)
			}
		}
		out, err := yaml.Marshal(keysFile{Version: 1, Keys: ks.Entries()})
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseKeys(out)
		if err != nil {
			t.Fatalf("re-encoded keys file refused: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(again.Entries(), ks.Entries()) {
			t.Fatalf("round trip changed the entries:\n%+v\n%+v", ks.Entries(), again.Entries())
		}
	})
}
