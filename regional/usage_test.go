package regional

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// naiveUsage is the reference decodeUsage is compared with: decode the
// whole text with encoding/json.
func naiveUsage(b []byte) *usage {
	var body struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(b, &body) == nil {
		return body.Usage
	}
	return nil
}

// checkUsage fails when decodeUsage and naiveUsage disagree on b, or when
// scanUsage's verdict on its syntax contradicts json.Valid.
func checkUsage(t interface {
	Helper()
	Fatalf(string, ...any)
}, b []byte) {
	t.Helper()
	if got, want := decodeUsage(b), naiveUsage(b); !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: usage %s, encoding/json %s", b, showUsage(got), showUsage(want))
	}
	_, verdict := scanUsage(b, nil)
	if valid := json.Valid(b); verdict == scanInvalid && valid || (verdict == scanNone || verdict == scanFound) && !valid {
		t.Fatalf("%q: verdict %d, json.Valid %v", b, verdict, valid)
	}
}

func showUsage(u *usage) string {
	if u == nil {
		return "nil"
	}
	if u.PromptTokensDetails == nil {
		return fmt.Sprintf("{%d, nil}", u.PromptTokens)
	}
	return fmt.Sprintf("{%d, {%d}}", u.PromptTokens, u.PromptTokensDetails.CachedTokens)
}

var usageCases = []string{
	`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":2048,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1984}}}`,
	`{"usage":{"prompt_tokens":5}}`,
	`{"usage":null}`,
	`{"usage":{"prompt_tokens":5},"usage":{"prompt_tokens_details":{"cached_tokens":3}}}`,
	`{"usage":{"prompt_tokens":5},"usage":null}`,
	`{"Usage":{"prompt_tokens":5}}`,
	`{"USAGE":{"PROMPT_TOKENS":5}}`,
	`{"uſage":{"prompt_tokens":5}}`,
	`{"us\u0061ge":{"prompt_tokens":5}}`,
	`{"usage":{"prompt_tokens":"5"}}`,
	`{"usage":{"prompt_tokens":1.5}}`,
	`{"usage":{"prompt_tokens":1e2}}`,
	`{"usage":5}`,
	`{"usage":[]}`,
	`{"usage":{}} x`,
	`{"usage":{},}`,
	`{"usage":{"prompt_tokens":5}`,
	`{"choices":[{"usage":{"prompt_tokens":5}}]}`,
	`{"content":"usage","x":{"usage":{"prompt_tokens":1}}}`,
	`{"content":"\"usage\":{\"prompt_tokens\":1}"}`,
	`[{"usage":{"prompt_tokens":5}}]`,
	`null`,
	`"usage"`,
	``,
	` `,
	`{}`,
	"{\"usage\":{\"prompt_tokens\":5},\"x\":\"\x01\"}",
	"{\"usage\":{\"prompt_tokens\":5},\"x\":\"\xff\"}",
	`{"usage":{"prompt_tokens":5},"x":"\x"}`,
	`{"usage":{"prompt_tokens":5},"x":"\u12"}`,
	`{"usage":{"prompt_tokens":5},"x":01}`,
	`{"usage":{"prompt_tokens":5},"x":-}`,
	`{"usage":{"prompt_tokens":5},"x":1.}`,
	`{"usage":{"prompt_tokens":5},"x":tru}`,
	`{"usage":{"prompt_tokens":5},"x":[1,]}`,
	`{"usage":{"prompt_tokens":5},"u":1,"usage":2,"usage":3,"usage":4,"usage":{"prompt_tokens":6}}`,
	`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":9},"prompt_tokens_details":null}}`,
}

func TestDecodeUsageMatchesJSON(t *testing.T) {
	for _, c := range usageCases {
		checkUsage(t, []byte(c))
	}
	for _, n := range []int{maxScanDepth - 1, maxScanDepth, maxScanDepth + 1, 10000, 10001} {
		checkUsage(t, []byte(`{"usage":{"prompt_tokens":5},"x":`+strings.Repeat("[", n)+strings.Repeat("]", n)+`}`))
	}
}

// FuzzDecodeUsage compares decodeUsage with encoding/json on arbitrary
// bytes.
func FuzzDecodeUsage(f *testing.F) {
	for _, c := range usageCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkUsage(t, b) })
}

// TestPropertyDecodeUsage compares the two on answers generated to put
// usage objects (right, wrong and repeated, under folded and escaped
// names) at the top level and deeper, with every kind of JSON value around
// them, and now and then a truncation or a stray byte.
func TestPropertyDecodeUsage(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := []byte(genAnswer(t))
		if rapid.IntRange(0, 4).Draw(t, "mutate") == 0 && len(b) > 0 {
			i := rapid.IntRange(0, len(b)-1).Draw(t, "at")
			switch rapid.IntRange(0, 2).Draw(t, "how") {
			case 0:
				b = b[:i]
			case 1:
				b = slices.Delete(b, i, i+1)
			default:
				b = slices.Insert(b, i, rapid.SampledFrom([]byte("{}[],:\"\\ 0-e\x01")).Draw(t, "byte"))
			}
		}
		checkUsage(t, b)
	})
}

var usageNames = []string{`"usage"`, `"usage"`, `"usage"`, `"Usage"`, `"USAGE"`, `"uſage"`, `"us\u0061ge"`, `"usage "`, `"id"`, `"choices"`}

func genAnswer(t *rapid.T) string {
	if rapid.IntRange(0, 9).Draw(t, "top") == 0 {
		return genJSON(t, 0)
	}
	var fields []string
	for range rapid.IntRange(0, 5).Draw(t, "fields") {
		name := rapid.SampledFrom(usageNames).Draw(t, "name")
		value := genJSON(t, 1)
		if rapid.Bool().Draw(t, "usageValue") {
			value = genUsage(t)
		}
		fields = append(fields, name+jsonSpace(t)+":"+jsonSpace(t)+value)
	}
	return jsonSpace(t) + "{" + jsonSpace(t) + strings.Join(fields, ","+jsonSpace(t)) + "}" + jsonSpace(t)
}

func genUsage(t *rapid.T) string {
	if rapid.IntRange(0, 5).Draw(t, "usageNull") == 0 {
		return "null"
	}
	var fields []string
	for range rapid.IntRange(0, 3).Draw(t, "usageFields") {
		name := rapid.SampledFrom([]string{`"prompt_tokens"`, `"Prompt_Tokens"`, `"completion_tokens"`, `"prompt_tokens_details"`}).Draw(t, "usageName")
		var value string
		if name == `"prompt_tokens_details"` && rapid.IntRange(0, 3).Draw(t, "detailsRight") > 0 {
			value = `{"cached_tokens":` + genNumber(t) + `}`
		} else if rapid.IntRange(0, 3).Draw(t, "numberRight") > 0 {
			value = genNumber(t)
		} else {
			value = genJSON(t, 2)
		}
		fields = append(fields, name+":"+value)
	}
	return "{" + strings.Join(fields, ",") + "}"
}

func genNumber(t *rapid.T) string {
	return rapid.SampledFrom([]string{"0", "1", "2048", "-3", "1.5", "1e2", "-0", "9223372036854775808", "2E-2", "0.0"}).Draw(t, "number")
}

func genJSON(t *rapid.T, depth int) string {
	kind := rapid.IntRange(0, 6).Draw(t, "kind")
	if depth > 3 && kind >= 5 {
		kind = 0
	}
	switch kind {
	case 0:
		parts := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "usage", `\"usage\"`, "é", `\n`, `\\`, `\u00e9`, "\xff", " ", "\t", "\x1f"}), 0, 4).Draw(t, "string")
		return `"` + strings.Join(parts, "") + `"`
	case 1:
		return genNumber(t)
	case 2:
		return rapid.SampledFrom([]string{"true", "false", "null"}).Draw(t, "literal")
	case 3:
		return genUsage(t)
	case 4:
		return `"usage"`
	case 5:
		var items []string
		for range rapid.IntRange(0, 3).Draw(t, "items") {
			items = append(items, genJSON(t, depth+1))
		}
		return "[" + strings.Join(items, ","+jsonSpace(t)) + "]"
	default:
		var fields []string
		for range rapid.IntRange(0, 3).Draw(t, "fields") {
			fields = append(fields, rapid.SampledFrom(usageNames).Draw(t, "name")+":"+genJSON(t, depth+1))
		}
		return "{" + strings.Join(fields, ",") + "}"
	}
}

func jsonSpace(t *rapid.T) string {
	return rapid.SampledFrom([]string{"", "", " ", "\n", "\t", "\r\n "}).Draw(t, "space")
}

// naiveSniff is the usage sniffer as it was, over encoding/json: every
// data line of a stream that mentions "usage" decoded whole, the last
// usage kept; a whole answer decoded whole.
func naiveSniff(answer []byte, sse bool) *usage {
	if !sse {
		if len(answer) > maxSniff {
			return nil
		}
		return naiveUsage(answer)
	}
	var found *usage
	for line := range bytes.Lines(answer) {
		if !bytes.HasSuffix(line, []byte("\n")) {
			break // an unterminated last line is never looked at
		}
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
			continue
		}
		if u := naiveUsage(bytes.TrimSpace(data)); u != nil {
			found = u
		}
	}
	return found
}

// TestPropertyUsageSniffer: the sniffer, given an answer in pieces cut
// anywhere, finds what naiveSniff finds in it whole.
func TestPropertyUsageSniffer(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sse := rapid.Bool().Draw(t, "sse")
		var answer []byte
		if sse {
			for range rapid.IntRange(0, 6).Draw(t, "events") {
				line := rapid.SampledFrom([]string{"data: ", "data:", " data: ", ": ", "event: x"}).Draw(t, "prefix") + genAnswer(t)
				answer = append(answer, strings.ReplaceAll(line, "\n", " ")...)
				answer = append(answer, rapid.SampledFrom([]string{"\n\n", "\n", "\r\n\r\n", ""}).Draw(t, "end")...)
			}
		} else {
			answer = []byte(genAnswer(t))
		}
		sniff := newUsageSniffer(sse)
		if !sse && rapid.Bool().Draw(t, "keep") {
			sniff.keep(slices.Clone(answer))
		} else {
			for rest := answer; len(rest) > 0; {
				n := rapid.IntRange(1, len(rest)).Draw(t, "piece")
				sniff.write(slices.Clone(rest[:n]))
				rest = rest[n:]
			}
		}
		if got, want := sniff.result(), naiveSniff(answer, sse); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q (sse %v): usage %s, naive %s", answer, sse, showUsage(got), showUsage(want))
		}
	})
}

// BenchmarkUsageSniffer is the cost of finding the usage of an answer like
// BenchmarkProxyOverhead's pod gives, whole and streamed.
func BenchmarkUsageSniffer(b *testing.B) {
	whole := []byte(`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":2048,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1984}}}`)
	var stream []byte
	for range 16 {
		stream = append(stream, `data: {"id":"x","choices":[{"index":0,"delta":{"content":"tok "}}]}`+"\n\n"...)
	}
	stream = append(stream, `data: {"id":"x","choices":[],"usage":{"prompt_tokens":2048,"completion_tokens":16}}`+"\n\ndata: [DONE]\n\n"...)
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s := newUsageSniffer(false)
			s.keep(whole)
			if s.result() == nil {
				b.Fatal("no usage")
			}
		}
	})
	b.Run("stream", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s := newUsageSniffer(true)
			s.write(stream)
			if s.result() == nil {
				b.Fatal("no usage")
			}
		}
	})
}

// TestUsageIntoCommon: the usage objects engines send are decoded without
// encoding/json (usageInto reads them itself).
func TestUsageIntoCommon(t *testing.T) {
	for _, v := range []string{
		`{"prompt_tokens":2048,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1984}}`,
		`{"prompt_tokens":2048,"total_tokens":2050,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":{"reasoning_tokens":0,"accepted":[1,2]}}`,
		`{ "prompt_tokens" : 7 , "prompt_tokens_details" : { "cached_tokens" : 0 } }`,
		`null`,
	} {
		var u *usage
		if !usageInto([]byte(v), &u) {
			t.Errorf("%s: left to encoding/json", v)
		}
		var want *usage
		if err := json.Unmarshal([]byte(v), &want); err != nil || !reflect.DeepEqual(u, want) {
			t.Errorf("%s: %s, encoding/json %s (%v)", v, showUsage(u), showUsage(want), err)
		}
	}
}
