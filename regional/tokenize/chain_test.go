package tokenize

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/index"
)

// indexHasher chains blocks as the router does.
var indexHasher = &BlockHasher{Extend: index.Extend}

// TestChainPartsMatchesNaive: hashing ids held in parts, after skipping
// some, gives index.ChainFrom of the ids after them in one slice (the
// naive reference), wherever the parts split the blocks, for blocks
// smaller and larger than chainParts' buffer.
func TestChainPartsMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		size := rapid.SampledFrom([]int{1, 3, 16, 64, 300}).Draw(rt, "block")
		seed := rapid.Uint64().Draw(rt, "seed")
		var parts [][]uint32
		var ids []uint32
		for range rapid.IntRange(0, 6).Draw(rt, "parts") {
			part := rapid.SliceOfN(rapid.Uint32(), 0, 700).Draw(rt, "part")
			parts, ids = append(parts, part), append(ids, part...)
		}
		skip := rapid.IntRange(0, len(ids)/size).Draw(rt, "skip blocks") * size
		h := seed
		if skip > 0 {
			h = index.ChainFrom(seed, size, ids[:skip], nil)[skip/size-1]
		}
		got := chainParts(indexHasher, h, size, parts, skip, nil)
		if want := index.ChainFrom(h, size, ids[skip:], nil); !slices.Equal(got, want) {
			rt.Fatalf("%d ids in %d parts, %d skipped: chain %x, want %x", len(ids), len(parts), skip, got, want)
		}
	})
}

// TestChainMatchesNaive: through texts that share prefixes in every way,
// encoded through a prefix cache small enough to evict and extended turn
// by turn, each encoding's Chain under seeds and block sizes that change
// between calls (so that some take hashes over from the encoding they
// reuse and others cannot) is index.ChainFrom of its ids.
func TestChainMatchesNaive(t *testing.T) {
	tok := prefixTokenizer(t)
	rapid.Check(t, func(rt *rapid.T) {
		c := NewPrefixCache(int64(rapid.SampledFrom([]int{1 << 10, 1 << 20}).Draw(rt, "bytes")))
		var encs []*Encoding
		for step := rapid.IntRange(1, 30).Draw(rt, "steps"); step > 0; step-- {
			var text string
			if len(encs) > 0 && rapid.IntRange(0, 3).Draw(rt, "fresh") > 0 {
				base := rapid.SampledFrom(encs).Draw(rt, "base").Text()
				text = base[:rapid.IntRange(0, len(base)).Draw(rt, "cut")]
			}
			text += strings.Join(rapid.SliceOfN(rapid.SampledFrom(prefixPieces), 0, 12).Draw(rt, "tail"), "")
			var e *Encoding
			if len(encs) > 0 && rapid.Bool().Draw(rt, "extend") {
				e, _ = tok.Extend(rapid.SampledFrom(encs).Draw(rt, "prev"), text)
			} else {
				e, _ = tok.EncodeCached(c, text)
			}
			encs = append(encs, e)
			for range rapid.IntRange(0, 2).Draw(rt, "chains") {
				seed := rapid.SampledFrom([]uint64{1, 2}).Draw(rt, "seed")
				size := rapid.SampledFrom([]int{1, 2, 3, 5}).Draw(rt, "size")
				ids := e.AppendIDs(nil)
				if got, want := e.Chain(indexHasher, seed, size), index.ChainFrom(seed, size, ids, nil); !slices.Equal(got, want) {
					rt.Fatalf("Chain(%d, %d) of %q (%d ids): %x, want %x", seed, size, text, len(ids), got, want)
				}
			}
		}
	})
}

// TestChainReusesPrefix: a prefix-cache hit on an encoding whose chain was
// hashed with the same hasher, seed and size takes over the hashes of the
// blocks within the reused ids; under another seed or hasher it takes
// none.
func TestChainReusesPrefix(t *testing.T) {
	tok := mustModel(t, DefaultConfig()).Tokenizer()
	system := "<|im_start|>system\n" + strings.Repeat("You are a careful assistant. ", 400) + "<|im_end|>\n<|im_start|>user\n"
	c := NewPrefixCache(1 << 30)
	first, _ := tok.EncodeCached(c, system+"One?<|im_end|>\n")
	first.Chain(indexHasher, 7, 16)
	second, reused := tok.EncodeCached(c, system+"Two?<|im_end|>\n")
	if got := len(second.memo.inherited.hashes); got != reused/16 || got == 0 {
		t.Fatalf("took over %d hashes, want the %d of the %d reused ids", got, reused/16, reused)
	}
	if got, want := second.Chain(indexHasher, 7, 16), index.ChainFrom(7, 16, second.AppendIDs(nil), nil); !slices.Equal(got, want) {
		t.Fatalf("chain differs from the naive one")
	}
	third, _ := tok.EncodeCached(c, system+"Three?<|im_end|>\n")
	if got, want := third.Chain(indexHasher, 8, 16), index.ChainFrom(8, 16, third.AppendIDs(nil), nil); !slices.Equal(got, want) {
		t.Fatalf("chain under another seed differs from the naive one")
	}
	// The same seed and size with another hash function: nothing taken over.
	other := &BlockHasher{Extend: func(parent uint64, block []uint32) uint64 { return index.Extend(parent^1, block) }}
	fourth, _ := tok.EncodeCached(c, system+"Four?<|im_end|>\n")
	want := index.ChainFrom(7, 16, fourth.AppendIDs(nil), nil)
	if got := fourth.Chain(other, 7, 16); slices.Equal(got[:1], want[:1]) {
		t.Fatalf("a chain by another hasher took over the index's hashes")
	}
}

// TestChainConcurrent: goroutines asking one encoding for its chain under
// different seeds at once each get index.ChainFrom's (run with -race).
func TestChainConcurrent(t *testing.T) {
	tok := mustModel(t, DefaultConfig()).Tokenizer()
	e := tok.EncodeText(strings.Repeat("<|im_start|>user\nhello there<|im_end|>\n", 50))
	ids := e.AppendIDs(nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				seed := uint64(g*100 + i%3)
				if got := e.Chain(indexHasher, seed, 4); !slices.Equal(got, index.ChainFrom(seed, 4, ids, nil)) {
					t.Errorf("seed %d: chain differs from the naive one", seed)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestChainAllocs: hashing an encoding's chain allocates its hashes and
// nothing else, whether its ids are in one part or span two.
func TestChainAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	tok := mustModel(t, DefaultConfig()).Tokenizer()
	system := "<|im_start|>system\n" + strings.Repeat("You are a careful assistant. ", 100) + "<|im_end|>\n<|im_start|>user\n"
	c := NewPrefixCache(1 << 30)
	one, _ := tok.EncodeCached(c, system+"One?<|im_end|>\n")
	two, reused := tok.EncodeCached(c, system+"Two?<|im_end|>\n")
	if len(one.parts) != 1 || len(two.parts) != 2 || reused == 0 {
		t.Fatalf("test setup: want encodings of one and two parts, got %d and %d", len(one.parts), len(two.parts))
	}
	for _, e := range []*Encoding{one, two} {
		seed := uint64(0)
		if n := testing.AllocsPerRun(20, func() { seed++; e.Chain(indexHasher, seed, 7) }); n > 2 {
			t.Errorf("Chain of %d parts: %.0f allocations, want at most 2 (the hashes, their header)", len(e.parts), n)
		}
	}
}
