package tokenize

import (
	"bytes"
	"compress/flate"
	"embed"
	"fmt"
	"io"
	"iter"
	"strings"
	"sync"
)

// The ordinary tokens of cl100k_base and o200k_base, embedded in the binary
// (vocab/*.ranks, made from github.com/tiktoken-go/tokenizer's vocabularies
// by `go test -run TestVocabMatchesLibrary -update-vocab`; the test checks
// them against the library on every run).
//
// They are not read out of the library at run time: its vocabulary is a
// package-level map of every token (~100,000 strings for cl100k_base, 6 MB
// of map groups, with a reverse table of 1.6 MB once anything decodes),
// which, once built, stays live for the process's lifetime, and the
// collector marks it at every cycle. In a proxying controller that was half
// of the heap it scanned (10 MB), and a cycle's mark is when requests wait.
// Here the tokens are two pointer-free arrays, and the library is reached
// only for the encodings this package does not encode itself.
//
// Format: a DEFLATE stream of, for each rank from 0 up, one length byte and
// that many bytes of the token (length 0: no ordinary token has the rank).
//
//go:embed vocab/cl100k_base.ranks vocab/o200k_base.ranks
var vocabFiles embed.FS

// vocabs holds each embedded encoding's vocabulary, read at most once per
// process.
var vocabs = map[string]func() *vocab{
	Cl100kBase: onceVocab(Cl100kBase),
	O200kBase:  onceVocab(O200kBase),
}

func onceVocab(encoding string) func() *vocab {
	return sync.OnceValue(func() *vocab {
		data, err := vocabFiles.ReadFile("vocab/" + encoding + ".ranks")
		if err != nil {
			panic("tokenize: " + err.Error()) // embedded at build time
		}
		v, err := parseVocab(data)
		if err != nil {
			panic("tokenize: vocab/" + encoding + ".ranks: " + err.Error()) // TestVocabMatchesLibrary
		}
		return v
	})
}

// vocab is an encoding's ordinary tokens by rank. Immutable.
type vocab struct {
	text string   // every token's bytes, by rank
	end  []uint32 // end[r]: where rank r's bytes end in text (they start at end[r-1], or 0)
	n    int      // ranks that have a token
}

// token returns the bytes of rank r, if an ordinary token has it.
func (v *vocab) token(r uint32) (string, bool) {
	if int64(r) >= int64(len(v.end)) {
		return "", false
	}
	var start uint32
	if r > 0 {
		start = v.end[r-1]
	}
	if start == v.end[r] {
		return "", false
	}
	return v.text[start:v.end[r]], true
}

// all yields every token with its rank, by rank.
func (v *vocab) all() iter.Seq2[string, uint32] {
	return func(yield func(string, uint32) bool) {
		var start uint32
		for r, end := range v.end {
			if end != start && !yield(v.text[start:end], uint32(r)) {
				return
			}
			start = end
		}
	}
}

// ranks returns the vocabulary as a map (what the tests and the naive
// merge read).
func (v *vocab) ranks() map[string]uint32 {
	m := make(map[string]uint32, v.n)
	for s, r := range v.all() {
		m[s] = r
	}
	return m
}

// maxVocab bounds what parseVocab inflates: the larger embedded vocabulary
// (o200k_base) is about 1.6 MB.
const maxVocab = 16 << 20

// parseVocab reads the format above; truncated or oversized data is an
// error.
func parseVocab(data []byte) (*vocab, error) {
	zr := flate.NewReader(bytes.NewReader(data))
	defer zr.Close()
	raw, err := io.ReadAll(io.LimitReader(zr, maxVocab+1))
	if err != nil {
		return nil, fmt.Errorf("inflate: %w", err)
	}
	if len(raw) > maxVocab {
		return nil, fmt.Errorf("more than %d bytes inflated", maxVocab)
	}
	// Built once, in room for all of it (the tokens are raw less their
	// length bytes): no copy as it grows, none to make it a string.
	var text strings.Builder
	text.Grow(len(raw))
	var end []uint32
	n := 0
	for i := 0; i < len(raw); {
		l := int(raw[i])
		i++
		if len(raw)-i < l {
			return nil, fmt.Errorf("rank %d: %d bytes, %d left", len(end), l, len(raw)-i)
		}
		text.Write(raw[i : i+l])
		end = append(end, uint32(text.Len()))
		if l > 0 {
			n++
		}
		i += l
	}
	if n == 0 {
		return nil, fmt.Errorf("no tokens")
	}
	return &vocab{text: text.String(), end: end, n: n}, nil
}
