package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// naiveCanonicalCost is the reference for canonicalCost: decode into
// map[string]any with json.Number, re-encode with sorted keys.
func naiveCanonicalCost(raw json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return []byte("{}"), nil
	}
	if len(raw) > MaxCostBytes {
		return nil, fmt.Errorf("%d bytes, limit %d", len(raw), MaxCostBytes)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf("must be a JSON object, got %s", jsonType(v))
	}
	return appendValue(make([]byte, 0, len(raw)), v), nil
}

func appendValue(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, x)
	case json.Number:
		return append(b, x...)
	case string:
		return appendString(b, x)
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendValue(b, e)
		}
		return append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendValue(b, x[k])
		}
		return append(b, '}')
	}
	panic(fmt.Sprintf("audit: unexpected JSON value %T", v))
}

func checkCanonAgainstNaive(t interface{ Fatalf(string, ...any) }, in []byte) {
	got, err := canonicalCost(in)
	want, werr := naiveCanonicalCost(in)
	if (err == nil) != (werr == nil) {
		t.Fatalf("canonicalCost(%q): err %v, naive err %v", in, err, werr)
	}
	if err == nil && !bytes.Equal(got, want) {
		t.Fatalf("canonicalCost(%q)\n got %s\nwant %s", in, got, want)
	}
	if err == nil {
		again, err := canonicalCost(got)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("not idempotent on %q: %s, %v", got, again, err)
		}
	}
}

func TestCanonicalCostMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		checkCanonAgainstNaive(t, []byte(genJSONObject(t)))
	})
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	checkCanonAgainstNaive(t, []byte(deep[:min(len(deep), MaxCostBytes)]))
	checkCanonAgainstNaive(t, []byte(`{"a":`+strings.Repeat("[", 9998)+strings.Repeat("]", 9998)+`}`))
	checkCanonAgainstNaive(t, []byte(`{"a":`+strings.Repeat("[", 9999)+"1"+strings.Repeat("]", 9999)+`}`))
	checkCanonAgainstNaive(t, []byte(`{"a":`+strings.Repeat("[", 10000)+strings.Repeat("]", 10000)+`}`))
}

func FuzzCanonicalCost(f *testing.F) {
	for _, s := range []string{
		`{}`, ` {"b":1,"a":[true,false,null,-0.5e+3,"x"]} `, `{"a":1,"a":2,"\u0061":3}`,
		`{"s":"\ud800\u00e9\n\"\/"}`, "{\"k\":\"\xff\xfe\"}", `{"n":01}`, `[1]`, `{"a":{}} x`,
		`{"é":{"z":[],"y":{"x":""}}}`, `{"a":1.}`, `{"a":tru}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > MaxCostBytes {
			return
		}
		checkCanonAgainstNaive(t, in)
	})
}
