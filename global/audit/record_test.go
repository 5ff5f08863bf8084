package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"pgregory.net/rapid"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

// TestRecordGolden pins the canonical encoding and the hash of a record: a
// change here breaks the verification of every existing log.
func TestRecordGolden(t *testing.T) {
	h, err := NewHasher(testKey)
	if err != nil {
		t.Fatal(err)
	}
	e := testEntry(3)
	e.Cost = json.RawMessage(`{ "z": [1, 2.50, -0, 1e3], "a": {"y": null, "x": true}, "s": "tab\tquote\"é<>&\u0001" }`)
	body, err := prepare(&e, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	content := appendContent(nil, "us-east-1-a", 42, testStart.Add(123456789), body, genesisPrev)
	line, hash := sealLine(content)
	got := string(line) + "hash " + hash + "\n"
	path := filepath.Join("testdata", "record.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Fatalf("canonical record changed:\n got %s\nwant %s", got, want)
	}
	// The stored line checks out and re-encodes to itself.
	c, _ := checkLine(bytes.TrimSuffix(line, []byte("\n")), nil)
	if !c.hashOK {
		t.Fatalf("golden line does not verify: %s", c.problem)
	}
	if c.rec.TenantHMAC == "" || strings.Contains(string(line), "tenant-3") || strings.Contains(string(line), "session-3") {
		t.Fatalf("raw tenant or session stored: %s", line)
	}
}

func TestCanonicalCost(t *testing.T) {
	cases := []struct {
		in, want, err string
	}{
		{"", "{}", ""},
		{"  ", "{}", ""},
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`, ""},
		{"{ \"a\" : [ 1 , 2.50 , 1e3 , -0 ] }", `{"a":[1,2.50,1e3,-0]}`, ""},
		{`{"a":{"d":1,"c":{"f":null,"e":false}}}`, `{"a":{"c":{"e":false,"f":null},"d":1}}`, ""},
		{`{"s":"\u0041\u00e9\n\u001f\/"}`, `{"s":"Aé\n\u001f/"}`, ""},
		{`{"a":1,"a":2}`, `{"a":2}`, ""},
		{`[1,2]`, "", "must be a JSON object, got an array"},
		{`"x"`, "", "must be a JSON object, got a string"},
		{`null`, "", "must be a JSON object, got null"},
		{`{"a":1} {}`, "", "trailing data"},
		{`{"a":`, "", "not JSON"},
	}
	for _, c := range cases {
		got, err := canonicalCost(json.RawMessage(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("canonicalCost(%q) error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("canonicalCost(%q) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

func TestEntryErrors(t *testing.T) {
	h, _ := NewHasher(testKey)
	cases := []struct {
		field string
		edit  func(*Entry)
	}{
		{"kind", func(e *Entry) { e.Kind = "" }},
		{"kind", func(e *Entry) { e.Kind = "Cross-Region" }},
		{"decision_id", func(e *Entry) { e.DecisionID = "" }},
		{"origin", func(e *Entry) { e.Origin = "" }},
		{"region", func(e *Entry) { e.Kind, e.Region = KindCrossRegion, "" }},
		{"region", func(e *Entry) { e.Kind, e.Region = KindForwardedIn, "" }},
		{"policy_version", func(e *Entry) { e.PolicyVersion = "" }},
		{"policy_version", func(e *Entry) { e.Kind, e.PolicyVersion = KindResidencyDenied, "" }},
		{"rule", func(e *Entry) { e.Kind, e.Rule = KindResidencyDenied, "" }},
		{"cost", func(e *Entry) { e.Kind, e.Cost = KindCrossRegion, nil }},
		{"cost", func(e *Entry) { e.Kind, e.Cost = KindFallback, json.RawMessage(" { } ") }},
		{"pod", func(e *Entry) { e.Pod = strings.Repeat("p", MaxFieldBytes+1) }},
		{"tenant", func(e *Entry) { e.Tenant = "\xff\xfe" }},
		{"cost", func(e *Entry) { e.Cost = json.RawMessage(`[1]`) }},
		{"cost", func(e *Entry) { e.Cost = json.RawMessage(`{"a":` + strings.Repeat(" ", MaxCostBytes) + `1}`) }},
	}
	for _, c := range cases {
		e := testEntry(0)
		c.edit(&e)
		_, err := prepare(&e, h, nil)
		var ee *EntryError
		if !errors.As(err, &ee) || ee.Field != c.field {
			t.Errorf("field %s: got %v", c.field, err)
		}
	}
	e := testEntry(1)
	e.Kind, e.Region, e.Cost = KindResidencyDenied, "", nil
	if _, err := prepare(&e, h, nil); err != nil {
		t.Errorf("a denial needs no chosen region nor cost: %v", err)
	}
	e = Entry{Kind: "shadow_eval", DecisionID: "d", Origin: "o"}
	if _, err := prepare(&e, h, nil); err != nil {
		t.Errorf("another kind needs only decision_id and origin: %v", err)
	}
}

func TestHasher(t *testing.T) {
	if _, err := NewHasher([]byte("short")); err == nil {
		t.Fatal("short key accepted")
	}
	h1, _ := NewHasher(testKey)
	h2, _ := NewHasher(append([]byte("x"), testKey...))
	if first, again := h1.Tenant("acme"), h1.Tenant("acme"); first != again || len(first) != 64 {
		t.Fatal("tenant HMAC not deterministic hex")
	}
	if h1.Tenant("acme") == h1.Session("acme") {
		t.Fatal("tenant and session HMACs of the same value are equal (no domain separation)")
	}
	if h1.Tenant("acme") == h2.Tenant("acme") || h1.KeyID() == h2.KeyID() {
		t.Fatal("different keys give the same HMAC or key id")
	}
	if h1.Tenant("") != "" {
		t.Fatal("empty tenant should stay empty")
	}
}

// TestAppendStringMatchesStdlib: encoding/json is the reference decoder of
// our string encoding.
func TestAppendStringMatchesStdlib(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.String().Draw(t, "s")
		if !utf8.ValidString(s) {
			t.Skip()
		}
		enc := appendString(nil, s)
		var back string
		if err := json.Unmarshal(enc, &back); err != nil || back != s {
			t.Fatalf("appendString(%q) = %s decodes to %q, %v", s, enc, back, err)
		}
	})
}

// TestRecordRoundTrip: every line the writer produces checks out, and
// decoding plus re-encoding gives the same bytes (so Verify can recompute).
func TestRecordRoundTrip(t *testing.T) {
	h, _ := NewHasher(testKey)
	rapid.Check(t, func(t *rapid.T) {
		str := rapid.StringMatching(`[ -~\t\n"\\é中]{0,20}`)
		e := Entry{
			Kind:          Kind(rapid.SampledFrom([]string{"cross_region", "residency_denied", "x_1"}).Draw(t, "kind")),
			DecisionID:    "d" + str.Draw(t, "decision"),
			RequestID:     str.Draw(t, "request"),
			Tenant:        str.Draw(t, "tenant"),
			Session:       str.Draw(t, "session"),
			Origin:        "o" + str.Draw(t, "origin"),
			Region:        "r" + str.Draw(t, "region"),
			Pod:           str.Draw(t, "pod"),
			DataClass:     str.Draw(t, "class"),
			Rule:          "r" + str.Draw(t, "rule"),
			PolicyVersion: "p" + str.Draw(t, "policy"),
			Cost:          json.RawMessage(`{"k":` + genJSONObject(t) + `}`),
		}
		body, err := prepare(&e, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		seq := rapid.Uint64Range(1, 1<<62).Draw(t, "seq")
		ts := testStart.Add(time.Duration(rapid.Int64Range(0, 1<<50).Draw(t, "ns")))
		line, hash := sealLine(appendContent(nil, "ctl", seq, ts, body, genesisPrev))
		c, _ := checkLine(bytes.TrimSuffix(line, []byte("\n")), nil)
		if !c.hashOK || c.rec.Hash != hash || c.rec.Seq != seq || !c.rec.Time.Equal(ts) {
			t.Fatalf("line does not check out: %s\n%s", c.problem, line)
		}
		again, _ := canonicalCost(c.rec.Cost)
		if !bytes.Equal(again, c.rec.Cost) {
			t.Fatalf("canonical cost not idempotent: %s vs %s", again, c.rec.Cost)
		}
	})
}

func genJSONObject(t *rapid.T) string {
	var gen func(depth int) string
	gen = func(depth int) string {
		switch k := rapid.IntRange(0, 5).Draw(t, "k"); {
		case depth > 2 || k == 0:
			return rapid.SampledFrom([]string{"1", "-0.50", "1e-7", "true", "null", `"x\"y"`, `"é"`}).Draw(t, "scalar")
		case k <= 2:
			n := rapid.IntRange(0, 3).Draw(t, "n")
			parts := make([]string, n)
			for i := range parts {
				parts[i] = gen(depth + 1)
			}
			return "[" + strings.Join(parts, " , ") + "]"
		default:
			n := rapid.IntRange(0, 3).Draw(t, "n")
			parts := make([]string, n)
			for i := range parts {
				parts[i] = `"` + rapid.StringMatching(`[a-z]{1,3}`).Draw(t, "key") + `": ` + gen(depth+1)
			}
			return "{" + strings.Join(parts, ", ") + "}"
		}
	}
	n := rapid.IntRange(0, 4).Draw(t, "fields")
	parts := make([]string, n)
	for i := range parts {
		parts[i] = `"` + rapid.StringMatching(`[a-z_]{1,6}`).Draw(t, "key") + `":` + gen(0)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// FuzzCheckLine: no input makes checkLine panic, and whatever it accepts is
// exactly the canonical encoding of what it parsed.
func FuzzCheckLine(f *testing.F) {
	h, _ := NewHasher(testKey)
	for i := range 3 {
		e := testEntry(i)
		body, _ := prepare(&e, h, nil)
		line, _ := sealLine(appendContent(nil, "c", uint64(i+1), testStart, body, genesisPrev))
		f.Add(bytes.TrimSuffix(line, []byte("\n")))
	}
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		c, _ := checkLine(line, nil)
		if !c.hashOK {
			return
		}
		canon, err := c.rec.AppendCanonical(nil)
		if err != nil || !bytes.Equal(canon, line) {
			t.Fatalf("accepted a non-canonical line: %q", line)
		}
	})
}

func TestDecodeKey(t *testing.T) {
	for in, want := range map[string]string{
		"plain-key-bytes":     "plain-key-bytes",
		"base64:a2V5LWJ5dGVz": "key-bytes",
		"base64-but-no-colon": "base64-but-no-colon",
		"":                    "",
	} {
		got, err := DecodeKey(in)
		if err != nil || string(got) != want {
			t.Errorf("DecodeKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if got, err := DecodeKey("base64:not base64!"); err == nil || got != nil {
		t.Errorf("DecodeKey of bad base64 = %q, %v; want nil and an error", got, err)
	}
}
