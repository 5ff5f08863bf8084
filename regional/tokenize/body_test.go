package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// checkParseBody holds ParseBody to its reference, json.Unmarshal into a
// zero Body: the same bodies refused, the same fields otherwise.
func checkParseBody(t interface {
	Helper()
	Fatalf(string, ...any)
}, raw []byte) {
	t.Helper()
	var want, got Body
	werr := json.Unmarshal(raw, &want)
	gerr := ParseBody(raw, &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%q:\n json.Unmarshal: %v\n ParseBody:      %v", raw, werr, gerr)
	}
	if werr != nil {
		return
	}
	if d := diffBody(&got, &want); d != "" {
		t.Fatalf("%q: %s", raw, d)
	}
	// ParseBodyShared decodes the same values (from its own copy of raw:
	// it keeps parts of it).
	own := bytes.Clone(raw)
	var shared Body
	if err := ParseBodyShared(own, &shared); err != nil {
		t.Fatalf("%q: ParseBodyShared: %v, ParseBody: no error", raw, err)
	}
	if d := diffBody(&shared, &want); d != "" {
		t.Fatalf("%q: ParseBodyShared: %s", raw, d)
	}
	// Into a Body parsed into before (its messages' array reused), the
	// same values, and nothing of the earlier messages left in the array.
	var reused Body
	if err := ParseBodyShared([]byte(`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`), &reused); err != nil {
		t.Fatalf("the first body: %v", err)
	}
	if err := ParseBodyShared(own, &reused); err != nil {
		t.Fatalf("%q: ParseBodyShared into a used Body: %v", raw, err)
	}
	if d := diffBody(&reused, &want); d != "" {
		t.Fatalf("%q: ParseBodyShared into a used Body: %s", raw, d)
	}
	for _, m := range reused.Messages[len(reused.Messages):cap(reused.Messages)] {
		if !reflect.DeepEqual(m, Message{}) {
			t.Fatalf("%q: an earlier message is left in the array: %+v", raw, m)
		}
	}
}

// diffBody says how two bodies differ ("" when they do not), field by
// field, so that a field added to Body is compared without being named
// here. An empty list and a missing one are the same to every reader.
func diffBody(got, want *Body) string {
	norm := func(b Body) Body {
		if len(b.Messages) == 0 {
			b.Messages = nil
		}
		if len(b.Prompt) == 0 {
			b.Prompt = nil
		}
		if len(b.PromptTokenIDs) == 0 {
			b.PromptTokenIDs = nil
		}
		return b
	}
	if g, w := norm(*got), norm(*want); !reflect.DeepEqual(g, w) {
		return fmt.Sprintf("ParseBody %s\n json.Unmarshal %s", dumpBody(g), dumpBody(w))
	}
	return ""
}

func dumpBody(b Body) string {
	agp := "nil"
	if b.AddGenerationPrompt != nil {
		agp = fmt.Sprint(*b.AddGenerationPrompt)
	}
	return fmt.Sprintf("%+v (prompt %q, add_generation_prompt %s)", b, b.Prompt, agp)
}

// Every field of Body, found by reflection with its JSON name, is read by
// ParseBody: a field added to Body or Request and not to the parser fails
// here rather than being silently dropped for every request.
func TestParseBodyEveryField(t *testing.T) {
	samples := map[reflect.Type]string{
		reflect.TypeFor[string]():          `"x\u00e9"`,
		reflect.TypeFor[bool]():            `true`,
		reflect.TypeFor[*bool]():           `false`,
		reflect.TypeFor[[]Message]():       `[{"role":"user","content":"c"}]`,
		reflect.TypeFor[json.RawMessage](): `["p"]`,
		reflect.TypeFor[[]uint32]():        `[7,8]`,
	}
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		for i := 0; i < ty.NumField(); i++ {
			f := ty.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			v, ok := samples[f.Type]
			if !ok {
				t.Fatalf("field %s (%s) has a type this test has no sample for", f.Name, f.Type)
			}
			raw := []byte(`{"` + name + `":` + v + `}`)
			var want, got Body
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatal(err)
			}
			if reflect.DeepEqual(want, Body{}) {
				t.Fatalf("%s: the sample sets nothing", raw)
			}
			if err := ParseBody(raw, &got); err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			if d := diffBody(&got, &want); d != "" {
				t.Fatalf("%s: field %s not read:\n%s", raw, f.Name, d)
			}
		}
	}
	walk(reflect.TypeFor[Body]())
}

var parseBodyCases = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","cache_salt":"tenant-a","cache_salt":null}`,
	`{"cache_salt":5}`,
	`{"model":"m","stream":true,"messages":[{"role":"system","content":"a\nb \"q\" \\ \/ \b\f\r\t \u00e9 \ud83d\ude00"},{"role":"user","content":"x","name":"bob"}]}`,
	`{"Model":"a","MODEL":"b","ſtream":true}`,
	"{\"mod\\u0065l\":\"esc\", \"\u212aey\":1}",
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
	`{"messages":[{"role":"user","content":[]}]}`,
	`{"messages":[{"role":"user","content":[null]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":null}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":5,"text":"a"}]}]}`,
	`{"messages":[{"role":"user","content":5,"content":"ok"}]}`,
	`{"messages":[{"role":"user","content":"ok","content":{}}]}`,
	`{"messages":[{"role":5,"role":"user"}]}`,
	`{"messages":[{"content":"no role"}]}`,
	`{"messages":[null]}`,
	`{"messages":[1]}`,
	`{"messages":null}`,
	`{"messages":{}}`,
	`{"messages":[{"role":"assistant","content":null}]}`,
	`{"prompt":"text"}`,
	`{"prompt":null}`,
	`{"prompt":[1,2,[3]],"prompt":{"a":[true,false,null,-0.5e+10]}}`,
	`{"prompt_token_ids":[1,2,4294967295]}`,
	`{"prompt_token_ids":[4294967296]}`,
	`{"prompt_token_ids":[1,null,3]}`,
	`{"prompt_token_ids":[1.0]}`,
	`{"prompt_token_ids":[-1]}`,
	`{"prompt_token_ids":["1"]}`,
	`{"prompt_token_ids":null}`,
	`{"add_generation_prompt":false}`,
	`{"add_generation_prompt":true,"add_generation_prompt":null}`,
	`{"add_generation_prompt":1}`,
	`{"stream":null,"model":null}`,
	`{"stream":"yes"}`,
	`{"model":5}`,
	`{"model":"\ud800"}`,
	`{"model":"\ud800\u0041"}`,
	"{\"model\":\"bad \xff utf8\"}",
	"{\"model\":\"tab\tinside\"}",
	`{"model":"m",}`,
	`{"model":"m"`,
	`{"model" "m"}`,
	`{"model":"m"} x`,
	`{"model":"m"}  `,
	`{"x":01}`,
	`{"x":1.}`,
	`{"x":-}`,
	`{"x":1e}`,
	`{"x":tru}`,
	`{"x":nul}`,
	`{"x":"\x"}`,
	`{"x":"\u12"}`,
	`{"x":[1,]}`,
	`{"x":[,1]}`,
	`{1:2}`,
	`null`,
	` null `,
	`[]`,
	`"s"`,
	`5`,
	``,
	`   `,
	`{}`,
	`{"temperature":0.7,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"model":"m"}`,
}

func TestParseBodyMatchesJSON(t *testing.T) {
	for _, c := range parseBodyCases {
		checkParseBody(t, []byte(c))
	}
}

func TestParseBodyDepth(t *testing.T) {
	for _, n := range []int{9998, 9999, 10000, 10001} {
		raw := `{"x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
		checkParseBody(t, []byte(raw))
	}
}

// The request path's allocation budget: the messages, and one string
// each for the model and every content; roles come from constants.
func TestParseBodyAllocs(t *testing.T) {
	raw := []byte(`{"model":"m","temperature":0.2,"messages":[{"role":"system","content":"You are terse.\nAnswer briefly."},{"role":"user","content":"Hi"}]}`)
	var b Body
	if n := testing.AllocsPerRun(100, func() {
		if err := ParseBody(raw, &b); err != nil {
			t.Fatal(err)
		}
	}); n > 4 {
		t.Fatalf("ParseBody allocates %v times, want at most 4", n)
	}
}

// TestParseBodySharedShares: a message content without escapes is raw's
// own bytes; one with escapes, the other strings and every string of
// ParseBody are copies.
func TestParseBodySharedShares(t *testing.T) {
	raw := []byte(`{"model":"m","messages":[{"role":"system","content":"plain text"},{"role":"user","content":"esc\naped"}]}`)
	within := func(s string) bool {
		if s == "" {
			return false
		}
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		lo := uintptr(unsafe.Pointer(&raw[0]))
		return p >= lo && p < lo+uintptr(len(raw))
	}
	var b Body
	if err := ParseBodyShared(raw, &b); err != nil {
		t.Fatal(err)
	}
	if b.Messages[0].Content != "plain text" || !within(b.Messages[0].Content) {
		t.Errorf("plain content %q: shared %v, want shared", b.Messages[0].Content, within(b.Messages[0].Content))
	}
	if b.Messages[1].Content != "esc\naped" || within(b.Messages[1].Content) {
		t.Errorf("escaped content %q: shared %v, want a copy", b.Messages[1].Content, within(b.Messages[1].Content))
	}
	if within(b.Model) || within(b.Messages[0].Role) {
		t.Error("model or role shares raw")
	}
	if err := ParseBody(raw, &b); err != nil {
		t.Fatal(err)
	}
	if within(b.Messages[0].Content) {
		t.Error("ParseBody: content shares raw")
	}
}

// FuzzParseBody compares ParseBody and ParseBodyShared with json.Unmarshal
// on arbitrary bytes.
func FuzzParseBody(f *testing.F) {
	for _, c := range parseBodyCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkParseBody(t, raw) })
}

// TestPropertyParseBody compares the two on bodies generated to reach
// every field with right and wrong types, folded and escaped keys,
// repeated keys, escapes and broken UTF-8 in strings, and now and then a
// truncation or a stray byte.
func TestPropertyParseBody(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		raw := []byte(genBody(t))
		if rapid.IntRange(0, 9).Draw(t, "mutate") == 0 && len(raw) > 0 {
			i := rapid.IntRange(0, len(raw)-1).Draw(t, "at")
			if rapid.Bool().Draw(t, "truncate") {
				raw = raw[:i]
			} else {
				raw = slices.Insert(raw, i, rapid.SampledFrom([]byte(`{}[],:"\ 0-ex`)).Draw(t, "byte"))
			}
		}
		checkParseBody(t, raw)
	})
}

func ws(t *rapid.T) string {
	return rapid.SampledFrom([]string{"", "", "", " ", "\n  ", "\t", "\r\n"}).Draw(t, "ws")
}

func genString(t *rapid.T) string {
	parts := rapid.SliceOfN(rapid.SampledFrom([]string{
		"a", "hello world", "é", "😀", `\n`, `\"`, `\\`, `\/`, `\t`, `\u00e9`, `\ud83d\ude00`, `\ud800`,
		`\udc00`, `\ud800\u0041`, "\xff", "\xe2\x82", "<|im_start|>",
	}), 0, 6).Draw(t, "str")
	return `"` + strings.Join(parts, "") + `"`
}

func genNumber(t *rapid.T) string {
	return rapid.SampledFrom([]string{"0", "1", "17", "-1", "4294967295", "4294967296", "1.5", "-0", "1e3", "2E-2", "100000000000000000000"}).Draw(t, "num")
}

func genAny(t *rapid.T, depth int) string {
	k := rapid.IntRange(0, 6).Draw(t, "kind")
	if depth > 2 && k >= 5 {
		k = 0
	}
	switch k {
	case 0:
		return genString(t)
	case 1:
		return genNumber(t)
	case 2:
		return rapid.SampledFrom([]string{"true", "false", "null"}).Draw(t, "lit")
	case 5:
		n := rapid.IntRange(0, 3).Draw(t, "n")
		items := make([]string, n)
		for i := range items {
			items[i] = ws(t) + genAny(t, depth+1) + ws(t)
		}
		return "[" + strings.Join(items, ",") + "]"
	default:
		n := rapid.IntRange(0, 3).Draw(t, "n")
		items := make([]string, n)
		for i := range items {
			items[i] = ws(t) + genString(t) + ws(t) + ":" + ws(t) + genAny(t, depth+1) + ws(t)
		}
		return "{" + strings.Join(items, ",") + "}"
	}
}

// genObject is an object whose members are drawn from fields (key ->
// value generator) or, now and then, any key with any value.
func genObject(t *rapid.T, depth int, keys []string, value func(key string) string) string {
	n := rapid.IntRange(0, 5).Draw(t, "members")
	items := make([]string, n)
	for i := range items {
		key := `"` + rapid.SampledFrom(keys).Draw(t, "key") + `"`
		var v string
		if rapid.IntRange(0, 5).Draw(t, "typo") == 0 {
			v = genAny(t, depth+1)
		} else {
			v = value(strings.ToLower(strings.Trim(key, `"`)))
		}
		items[i] = ws(t) + key + ws(t) + ":" + ws(t) + v + ws(t)
	}
	return "{" + strings.Join(items, ",") + "}"
}

func genBody(t *rapid.T) string {
	keys := []string{"model", "Model", "MODEL", "stream", "ſtream", "messages", "Messages", "prompt",
		"prompt_token_ids", "add_generation_prompt", `mod\u0065l`, "temperature", "tools", "modell", "cache_salt", "Cache_Salt"}
	return ws(t) + genObject(t, 0, keys, func(key string) string {
		switch key {
		case "model", `mod\u0065l`, "cache_salt":
			return genString(t)
		case "stream", "ſtream", "add_generation_prompt":
			return rapid.SampledFrom([]string{"true", "false", "null"}).Draw(t, "bool")
		case "messages":
			n := rapid.IntRange(0, 3).Draw(t, "msgs")
			ms := make([]string, n)
			for i := range ms {
				ms[i] = genMessage(t)
			}
			return "[" + strings.Join(ms, ",") + "]"
		case "prompt_token_ids":
			n := rapid.IntRange(0, 4).Draw(t, "ids")
			ids := make([]string, n)
			for i := range ids {
				ids[i] = genNumber(t)
			}
			return "[" + strings.Join(ids, ",") + "]"
		}
		return genAny(t, 1)
	}) + ws(t)
}

func genMessage(t *rapid.T) string {
	if rapid.IntRange(0, 9).Draw(t, "nullmsg") == 0 {
		return "null"
	}
	keys := []string{"role", "ROLE", "content", "Content", "name", "tool_calls"}
	return genObject(t, 2, keys, func(key string) string {
		switch key {
		case "role", "name":
			return genString(t)
		case "content":
			if rapid.Bool().Draw(t, "parts") {
				n := rapid.IntRange(0, 3).Draw(t, "nparts")
				ps := make([]string, n)
				for i := range ps {
					ps[i] = genObject(t, 4, []string{"type", "text", "Text", "image_url"}, func(key string) string {
						if key == "type" {
							return rapid.SampledFrom([]string{`"text"`, `"image_url"`, "null", `"TEXT"`}).Draw(t, "type")
						}
						return genString(t)
					})
				}
				return "[" + strings.Join(ps, ",") + "]"
			}
			return genString(t)
		}
		return genAny(t, 3)
	})
}

// BenchmarkParseBody decodes a chat body with a 2k-token system prompt
// (8 KB of text with escapes) with ParseBody and with json.Unmarshal, the
// way the router decoded it before.
func BenchmarkParseBody(b *testing.B) {
	var sb strings.Builder
	words := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which")
	for i := 0; i < 2000; i++ {
		sb.WriteString(words[i*7%len(words)])
		if i%50 == 49 {
			sb.WriteString("\n")
		} else {
			sb.WriteString(" ")
		}
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "stream": false, "temperature": 0.7,
		"messages": []map[string]string{{"role": "system", "content": sb.String()}, {"role": "user", "content": "What is the capital of France?"}}})
	b.Run("parser=ParseBody", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		var r Body
		for b.Loop() {
			if err := ParseBody(body, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parser=json.Unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var r Body
			if err := json.Unmarshal(body, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestPropertyParseBodyLongStrings compares ParseBody with json.Unmarshal
// on contents long enough for the string scan's 32- and 8-byte steps,
// with a byte that needs a look (quote, backslash escape, control
// character, non-ASCII or broken UTF-8) at every offset of each step.
func TestPropertyParseBodyLongStrings(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var sb strings.Builder
		for range rapid.IntRange(0, 4).Draw(t, "runs") {
			sb.WriteString(strings.Repeat("x", rapid.IntRange(0, 80).Draw(t, "plain")))
			sb.WriteString(rapid.SampledFrom([]string{`\"`, `\\`, `\n`, `\u00e9`, "\t", "\x01", "é", "😀", "\xff", "\xe2\x82", `"`, "\x7f", " "}).Draw(t, "look"))
		}
		sb.WriteString(strings.Repeat("y", rapid.IntRange(0, 40).Draw(t, "tail")))
		raw := `{"model":"m","messages":[{"role":"user","content":"` + sb.String() + `"}]}`
		checkParseBody(t, []byte(raw))
	})
}
