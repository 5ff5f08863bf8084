package tokenize

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustTokenizer(t testing.TB, enc string, extra map[string]uint32) *Tokenizer {
	t.Helper()
	tk, err := NewTokenizer(enc, extra)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// The ids tiktoken itself documents or returns for these strings.
func TestEncodeKnownIDs(t *testing.T) {
	cases := []struct {
		enc, text string
		want      []uint32
	}{
		{Cl100kBase, "hello world", []uint32{15339, 1917}},
		{O200kBase, "hello world", []uint32{24912, 2375}},
		{R50kBase, "hello world", []uint32{31373, 995}},
		{P50kBase, "hello world", []uint32{31373, 995}},
		{Cl100kBase, "<|im_start|>user\nhi<|im_end|>", []uint32{100264, 882, 198, 6151, 100265}},
		{Cl100kBase, "<|endoftext|>", []uint32{100257}},
		{O200kBase, "<|endoftext|><|im_start|>", []uint32{199999, 200264}},
		{Cl100kBase, "", nil},
	}
	for _, c := range cases {
		got := mustTokenizer(t, c.enc, nil).Encode(c.text)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %q: got %v, want %v", c.enc, c.text, got, c.want)
		}
	}
}

func TestNewTokenizerErrors(t *testing.T) {
	if _, err := NewTokenizer("gpt-17", nil); !errors.Is(err, ErrUnknownEncoding) {
		t.Errorf("unknown encoding: got %v", err)
	}
	cases := map[string]map[string]uint32{
		"collides with an ordinary token": {"<|mine|>": 15339},
		"share id":                        {"<|a|>": 300000, "<|b|>": 300000},
		"empty content":                   {"": 300001},
	}
	for want, extra := range cases {
		_, err := NewTokenizer(Cl100kBase, extra)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("extra %v: got %v, want an error containing %q", extra, err, want)
		}
	}
}

// naiveEncode is the reference for special-token splitting: at every byte
// position, try every special token, longest first; encode the text between
// matches with the plain byte-pair encoder.
func naiveEncode(t *Tokenizer, text string) []uint32 {
	specials := make([]string, 0, len(t.specials))
	for s := range t.specials {
		specials = append(specials, s)
	}
	sort.Slice(specials, func(i, j int) bool {
		if len(specials[i]) != len(specials[j]) {
			return len(specials[i]) > len(specials[j])
		}
		return specials[i] < specials[j]
	})
	var out []uint32
	segStart := 0
	for p := 0; p < len(text); {
		matched := ""
		for _, s := range specials {
			if strings.HasPrefix(text[p:], s) {
				matched = s
				break
			}
		}
		if matched == "" {
			p++
			continue
		}
		out = t.appendBPE(out, text[segStart:p])
		out = append(out, t.specials[matched])
		p += len(matched)
		segStart = p
	}
	return t.appendBPE(out, text[segStart:])
}

// textPieces build texts that stress the special-token scanner and the
// byte-pair encoder at piece boundaries.
var textPieces = []string{
	"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|", "|>", "im_start", "<", "|",
	"[BOS]", "[", "<|im_start|>x", " ", "  ", "\n", "\n\n", "\t", "hello", " world",
	"Hello", "'s", "'ll", "123", "4567", "é", "日本語", "🙂", "!!", "...", "func()", "{", "}",
	"user", "assistant", "\r\n", " \n", "a", "x", "BOS]", "<|reserved_1|>", "<|reserved_12|>", "<|reserved_",
}

// boundaryPieces is a small alphabet dense in special tokens, their
// fragments and their extensions, so that short draws hit the cases where a
// special token straddles the end of a shared prefix.
var boundaryPieces = []string{"<|im_start|>", "<|im_end|>", "x", "<|", "|>", "im_start", " ", "\n", "hi", "[BOS]", "[", "BOS]"}

func genText(t *rapid.T, label string) string {
	pieces := textPieces
	if rapid.Bool().Draw(t, label+"Dense") {
		pieces = boundaryPieces
	}
	return strings.Join(rapid.SliceOfN(rapid.SampledFrom(pieces), 0, 40).Draw(t, label), "")
}

func TestSpecialSplittingMatchesNaive(t *testing.T) {
	single := mustTokenizer(t, Cl100kBase, map[string]uint32{"<|im_start|>x": 300000})
	multi := mustTokenizer(t, Cl100kBase, map[string]uint32{"[BOS]": 300001, "<|im_start|>x": 300000})
	// Past maxFewSpecials, specials are looked up by length in the map.
	extra := map[string]uint32{"[BOS]": 300001, "<|im_start|>x": 300000}
	for i := range maxFewSpecials {
		extra[fmt.Sprintf("<|reserved_%d|>", i)] = uint32(300100 + i)
	}
	many := mustTokenizer(t, Cl100kBase, extra)
	if single.firstOne < 0 || multi.firstOne >= 0 || single.few == nil || multi.few == nil || many.few != nil {
		t.Fatal("test setup: want one tokenizer with a single first byte and one with several, both with few specials, and one with many")
	}
	rapid.Check(t, func(rt *rapid.T) {
		text := genText(rt, "text")
		for _, tk := range []*Tokenizer{single, multi, many} {
			if got, want := tk.Encode(text), naiveEncode(tk, text); !slices.Equal(got, want) {
				rt.Fatalf("%q: got %v, naive %v", text, got, want)
			}
		}
	})
}

func TestDecodeRoundTrip(t *testing.T) {
	tk := mustTokenizer(t, O200kBase, nil)
	rapid.Check(t, func(rt *rapid.T) {
		text := genText(rt, "text")
		got, err := tk.Decode(tk.Encode(text))
		if err != nil || got != text {
			rt.Fatalf("Decode(Encode(%q)) = %q, %v", text, got, err)
		}
	})
	if _, err := tk.Decode([]uint32{1 << 31}); err == nil {
		t.Error("Decode of an unknown id: no error")
	}
}

func TestAppendEncodeKeepsPrefix(t *testing.T) {
	tk := mustTokenizer(t, Cl100kBase, nil)
	dst := make([]uint32, 2, 64)
	dst[0], dst[1] = 7, 8
	got := tk.AppendEncode(dst, "hello world")
	if !slices.Equal(got, []uint32{7, 8, 15339, 1917}) {
		t.Fatalf("got %v", got)
	}
}

func TestEncodeConcurrent(t *testing.T) {
	tk := mustTokenizer(t, Cl100kBase, nil)
	text := strings.Repeat("<|im_start|>user\nThe quick brown fox.<|im_end|>\n", 50)
	want := tk.Encode(text)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if got := tk.Encode(text); !slices.Equal(got, want) {
					errs <- "concurrent Encode differs"
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// Every Tokenizer of an encoding shares the encoding's one library codec,
// and tokenizers sharing it encode (through the library: text that is not
// valid UTF-8) and decode concurrently.
func TestTokenizersShareCodec(t *testing.T) {
	for _, enc := range Encodings() {
		a := mustTokenizer(t, enc, nil)
		b := mustTokenizer(t, enc, map[string]uint32{"<|extra|>": 300000})
		if a.library() != b.library() {
			t.Fatalf("%s: two tokenizers, two codecs", enc)
		}
		text := "caf\xe9 au lait, " + strings.Repeat("word ", 50)
		want := a.Encode(text)
		var wg sync.WaitGroup
		for i := range 8 {
			tk := a
			if i%2 == 1 {
				tk = b
			}
			wg.Go(func() {
				if got := tk.Encode(text); !slices.Equal(got, want) {
					t.Errorf("%s: concurrent encode %v, want %v", enc, got, want)
				}
				if _, err := tk.Decode(want); err != nil {
					t.Errorf("%s: concurrent decode: %v", enc, err)
				}
			})
		}
		wg.Wait()
	}
}
