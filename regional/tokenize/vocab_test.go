package tokenize

import (
	"bytes"
	"compress/flate"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

var updateVocab = flag.Bool("update-vocab", false, "rewrite vocab/*.ranks from github.com/tiktoken-go/tokenizer")

// readRanks reads every ordinary token of an encoding out of the library by
// decoding each id on its own: the reference the embedded vocabularies are
// made from and checked against.
func readRanks(encoding string) map[string]uint32 {
	codec := codecs[encoding]()
	ranks := make(map[string]uint32, 200000)
	for id, misses := uint(0), 0; misses < 1024; id++ {
		s, err := codec.Decode([]uint{id})
		if err != nil {
			misses++
			continue
		}
		misses = 0
		ranks[s] = uint32(id)
	}
	return ranks
}

// TestVocabMatchesLibrary: the embedded vocabularies hold exactly the
// library's ordinary tokens, rank for rank (with -update-vocab, they are
// rewritten from it first).
func TestVocabMatchesLibrary(t *testing.T) {
	for _, enc := range fastEncodings {
		want := readRanks(enc)
		if *updateVocab {
			data, err := encodeVocab(want)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile("vocab/"+enc+".ranks", data, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: wrote %d tokens in %d bytes", enc, len(want), len(data))
		}
		data, err := os.ReadFile("vocab/" + enc + ".ranks")
		if err != nil {
			t.Fatal(err)
		}
		v, err := parseVocab(data)
		if err != nil {
			t.Fatalf("%s: %v", enc, err)
		}
		if got := v.ranks(); !maps.Equal(got, want) {
			t.Fatalf("%s: the embedded vocabulary has %d tokens, the library %d, and they differ: run this test with -update-vocab", enc, len(got), len(want))
		}
		for s, r := range want {
			if got, ok := v.token(r); !ok || got != s {
				t.Fatalf("%s: token(%d) = %q, %v; want %q", enc, r, got, ok, s)
			}
		}
		if v.n != len(want) {
			t.Errorf("%s: n = %d, want %d", enc, v.n, len(want))
		}
		if *updateVocab {
			continue // the test binary embeds the files as they were
		}
		if got := vocabs[enc]().ranks(); !maps.Equal(got, want) {
			t.Fatalf("%s: the vocabulary built into the binary differs from vocab/%s.ranks", enc, enc)
		}
	}
}

// TestVocabRoundTrip: any set of tokens of 1 to 255 bytes with distinct
// ranks reads back as written, and token finds each by its rank and
// nothing at the ranks in between.
func TestVocabRoundTrip(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		ranks := map[string]uint32{}
		used := map[uint32]bool{}
		for _, b := range rapid.SliceOfN(rapid.SliceOfN(rapid.Byte(), 1, 255), 1, 40).Draw(rt, "tokens") {
			s := string(b)
			r := rapid.Uint32Range(0, 300).Draw(rt, "rank")
			if _, dup := ranks[s]; dup || used[r] {
				continue
			}
			ranks[s], used[r] = r, true
		}
		data, err := encodeVocab(ranks)
		if err != nil {
			rt.Fatal(err)
		}
		v, err := parseVocab(data)
		if err != nil {
			rt.Fatal(err)
		}
		if got := v.ranks(); !maps.Equal(got, ranks) {
			rt.Fatalf("read back %v, wrote %v", got, ranks)
		}
		byRank := map[uint32]string{}
		for s, r := range ranks {
			byRank[r] = s
		}
		for r := uint32(0); r <= 301; r++ {
			s, ok := v.token(r)
			if want, wok := byRank[r]; ok != wok || s != want {
				rt.Fatalf("token(%d) = %q, %v; want %q, %v", r, s, ok, want, wok)
			}
		}
	})
}

// Bad vocabulary data is an error, never a panic or a partial vocabulary.
func TestParseVocabErrors(t *testing.T) {
	deflate := func(raw []byte) []byte {
		var b bytes.Buffer
		zw, _ := flate.NewWriter(&b, flate.BestSpeed)
		_, _ = zw.Write(raw)
		_ = zw.Close()
		return b.Bytes()
	}
	good, err := encodeVocab(map[string]uint32{"a": 0, "bc": 1})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty":                  nil,
		"not deflate":            []byte("\xff\xff\xff\xff"),
		"truncated stream":       good[:len(good)/2],
		"token past the end":     deflate([]byte{1, 'a', 5, 'x'}),
		"no tokens":              deflate([]byte{0, 0, 0}),
		"larger than any vocab":  deflate(bytes.Repeat([]byte{0}, maxVocab+1)),
		"only a length, no byte": deflate([]byte{1}),
	}
	for name, data := range cases {
		if v, err := parseVocab(data); err == nil {
			t.Errorf("%s: no error (%d tokens)", name, v.n)
		}
	}
	if _, err := encodeVocab(map[string]uint32{strings.Repeat("x", 256): 0}); err == nil {
		t.Error("a 256-byte token: no error")
	}
	if _, err := encodeVocab(map[string]uint32{"a": 3, "b": 3}); err == nil {
		t.Error("two tokens with one rank: no error")
	}
}

// invalidPieces are bytes that are not UTF-8 on their own or next to
// others: continuation bytes, truncated and overlong sequences, surrogates.
var invalidPieces = []string{"\x80", "\xbf", "\xc3", "\xe2\x82", "\xf0\x9f\x99", "\xff", "\xfe", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}

// checkInvalidMatchesLibrary: text that is not valid UTF-8 encodes as the
// library encodes it, wherever the library's split of it is standard (see
// TestLibrarySplitDeviation). It reports whether it compared.
func checkInvalidMatchesLibrary(t fataler, tk *Tokenizer, text string) bool {
	t.Helper()
	if utf8.ValidString(text) {
		return false
	}
	runes := string([]rune(text))
	if !slices.Equal(librarySplit(tk.Name(), runes), referenceSplit(t, tk.Name(), runes)) {
		return false
	}
	if got, want := tk.AppendEncode(nil, text), tk.appendLibrary(nil, text); !slices.Equal(got, want) {
		t.Fatalf("%s %q: %v, library %v", tk.Name(), text, got, want)
	}
	return true
}

// The fast encodings take text that is not valid UTF-8 themselves (each
// stray byte as U+FFFD), and give the library's ids for it.
func TestInvalidUTF8MatchesLibrary(t *testing.T) {
	checkAgainstLibrary(t, func(rt *rapid.T) string {
		parts := rapid.SliceOfN(rapid.OneOf(rapid.SampledFrom(runePieces), rapid.SampledFrom(invalidPieces)), 1, 40).Draw(rt, "parts")
		return strings.Join(parts, "") + rapid.SampledFrom(invalidPieces).Draw(rt, "last")
	}, checkInvalidMatchesLibrary)
}

// Decoding through the embedded vocabulary gives the library's text for
// any ids, and the same refusal of an id that is no token.
func TestDecodeMatchesLibrary(t *testing.T) {
	for _, enc := range fastEncodings {
		tk := mustTokenizer(t, enc, nil)
		codec := codecs[enc]()
		top := uint32(len(vocabs[enc]().end) + 2)
		rapid.Check(t, func(rt *rapid.T) {
			ids := rapid.SliceOfN(rapid.Uint32Range(0, top), 0, 20).Draw(rt, "ids")
			uids := make([]uint, len(ids))
			for i, id := range ids {
				uids[i] = uint(id)
			}
			got, err := tk.decodeRun(uids)
			want, werr := codec.Decode(uids)
			if (err == nil) != (werr == nil) || got != want {
				rt.Fatalf("%v: %q, %v; library %q, %v", ids, got, err, want, werr)
			}
		})
	}
}

// A controller's tokenizers (cl100k_base, o200k_base) never build the
// library's codec, whose vocabulary would stay live for the collector to
// mark (vocab.go): in a fresh process, making one with extra specials,
// encoding valid and invalid text and decoding leaves no codec built and
// under 4 MB of heap to scan (the library's vocabulary alone is ~8 MB).
// The other tests build codecs, so this runs in a child process.
func TestFastTokenizerBuildsNoCodec(t *testing.T) {
	if os.Getenv("TOKENIZE_NO_CODEC_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFastTokenizerBuildsNoCodec$", "-test.v")
		cmd.Env = append(os.Environ(), "TOKENIZE_NO_CODEC_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "child: ok") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	keep := make([]*Tokenizer, 0, 2)
	for _, enc := range fastEncodings {
		tk := mustTokenizer(t, enc, map[string]uint32{"<|extra|>": 300000})
		ids := tk.Encode("caf\xe9 au lait, <|extra|> " + strings.Repeat("word ", 50))
		if _, err := tk.Decode(ids); err != nil {
			t.Fatal(err)
		}
		if _, err := NewTokenizer(enc, map[string]uint32{"<|mine|>": 100}); err == nil {
			t.Fatalf("%s: an extra special on an ordinary rank: no error", enc)
		}
		keep = append(keep, tk)
	}
	if n := codecsBuilt.Load(); n != 0 {
		t.Fatalf("%d library codecs built", n)
	}
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
	metrics.Read(s)
	if scan := s[0].Value.Uint64(); scan > 4<<20 {
		t.Fatalf("%d bytes of heap to scan, want under 4 MB", scan)
	}
	runtime.KeepAlive(keep)
	t.Log("child: ok")
}

// encodeVocab writes ranks in the format of vocab.go (what -update-vocab
// writes).
// A token longer than 255 bytes, or two tokens with one rank, is an error.
func encodeVocab(ranks map[string]uint32) ([]byte, error) {
	byRank := map[uint32]string{}
	var top uint32
	for s, r := range ranks {
		if len(s) == 0 || len(s) > 255 {
			return nil, fmt.Errorf("token %q (rank %d): %d bytes, want 1 to 255", s, r, len(s))
		}
		if prev, dup := byRank[r]; dup {
			return nil, fmt.Errorf("tokens %q and %q share rank %d", prev, s, r)
		}
		byRank[r] = s
		top = max(top, r)
	}
	var raw []byte
	for r := uint32(0); r <= top; r++ {
		s := byRank[r]
		raw = append(raw, byte(len(s)))
		raw = append(raw, s...)
	}
	var out bytes.Buffer
	zw, err := flate.NewWriter(&out, flate.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
