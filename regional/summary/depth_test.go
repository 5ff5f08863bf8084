package summary

import (
	"math/rand/v2"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var testTime = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func testInput(region string, gen uint64) Input {
	return Input{
		Region: region, Generation: gen, BuiltAt: testTime, BlockSize: 64,
		Models: []string{"kimi-k2"},
		Load:   []ProfileLoad{{Profile: "h100", Pods: 4, PendingPrefillTokens: 10_000, Running: 9, Slots: 1024, FreeKVBlocks: 5000}},
	}
}

func heldSet(hashes []uint64) map[uint64]bool {
	m := make(map[uint64]bool, len(hashes))
	for _, h := range hashes {
		m[h] = true
	}
	return m
}

// TestDepthMatchesNaive is the property test of the depth estimate against
// the naive reference (exact set, consecutive scan), on prefix-closed data:
//
//   - every held sampled hash is reported present (no false negatives);
//   - without a false positive on the query's sampled positions, Depth
//     equals the naive sampled scan exactly, and so brackets the true depth:
//     Lower <= true <= Upper, with no sampled position in [Lower, true) —
//     the estimate is below the truth only by the blocks after the last
//     sampled position inside the true prefix;
//   - with false positives it is never below the naive answer (they can
//     only raise it).
func TestDepthMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.Uint64().Draw(t, "seed")
		n := rapid.IntRange(1, 4000).Draw(t, "blocks")
		rate := rapid.Uint32Range(1, 12).Draw(t, "rate")
		f := newForest(seed, n, 0.7, 1, 300)
		hashes := f.hashes(nil)
		held := heldSet(hashes)
		s, err := Build(testInput("r", 1), hashes, BuildConfig{MaxBytes: 1 << 24, SampleRate: rate})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hashes {
			if s.sampler.Keep(h) && !s.MayContain(h) {
				t.Fatalf("held sampled hash %#x reported absent", h)
			}
		}
		var q []uint64
		for range 50 {
			var d int
			q, d = f.query(40, q)
			if truth := naiveTrueDepth(held, q); truth != d {
				t.Fatalf("generator: true depth %d, constructed %d", truth, d)
			}
			lower, upper := naiveSampledDepth(held, s.sampler, q)
			if lower > d || d > upper {
				t.Fatalf("naive bracket [%d, %d] misses the true depth %d", lower, upper, d)
			}
			for i := lower; i < d; i++ {
				if s.sampler.Keep(q[i]) {
					t.Fatalf("sampled position %d lies in [lower %d, true %d)", i, lower, d)
				}
			}
			got := s.Depth(q)
			if falsePositiveIn(s, held, q) {
				if got.Lower < lower {
					t.Fatalf("with a false positive: Lower %d below the naive %d", got.Lower, lower)
				}
				continue
			}
			if got.Lower != lower || got.Upper != upper {
				t.Fatalf("Depth = [%d, %d] (fallback %v), naive [%d, %d], true %d, rate %d, chain %d",
					got.Lower, got.Upper, got.Fallback, lower, upper, d, rate, len(q))
			}
		}
	})
}

// falsePositiveKey finds a sampled hash outside held that s reports present.
func falsePositiveKey(t *testing.T, s *Summary, held map[uint64]bool, rng *rand.Rand) uint64 {
	t.Helper()
	for range 10_000_000 {
		h := rng.Uint64()
		if !held[h] && s.MayContain(h) {
			return h
		}
	}
	t.Fatal("no false positive found")
	return 0
}

// TestDepthFalsePositiveDefence plants false positives in a query chain:
// one far beyond the true depth is caught by the check (Fallback) and the
// answer is the true bracket; one at the first absent sampled position
// cannot be told from a match and raises the estimate by one gap.
func TestDepthFalsePositiveDefence(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const rate = 4
	f := newForest(5, 20_000, 0.5, 200, 600)
	hashes := f.hashes(nil)
	held := heldSet(hashes)
	s, err := Build(testInput("r", 1), hashes, BuildConfig{MaxBytes: 1 << 24, SampleRate: rate})
	if err != nil {
		t.Fatal(err)
	}
	fpKey := falsePositiveKey(t, s, held, rng)
	fresh := func() uint64 { return f.fresh() }
	sampledFresh := func() uint64 {
		for {
			if h := fresh(); s.sampler.Keep(h) && !s.MayContain(h) {
				return h
			}
		}
	}
	base := f.chain(0, 150, nil)
	lower, upper := naiveSampledDepth(held, s.sampler, append(base, sampledFresh()))

	// Far: true depth 150, then 60 sampled absent blocks, the false
	// positive, then more absent blocks. Binary search may land on it.
	far := append([]uint64(nil), base...)
	for range 60 {
		far = append(far, sampledFresh())
	}
	far = append(far, fpKey)
	for range 3 {
		far = append(far, sampledFresh())
	}
	got := s.Depth(far)
	if got.Lower != lower || got.Upper != 150 {
		t.Fatalf("far false positive: Depth = %+v, want Lower %d Upper 150", got, lower)
	}
	// Force the binary search onto it: the false positive right after a
	// long present run, in the middle of the chain.
	mid := append([]uint64(nil), base...)
	for range 10 {
		mid = append(mid, sampledFresh())
	}
	mid = append(mid, fpKey)
	got = s.Depth(mid)
	if got.Lower != lower {
		t.Fatalf("false positive 10 gaps beyond: Depth = %+v, want Lower %d", got, lower)
	}

	// Adjacent: the false positive is the first sampled position after the
	// true prefix: undetectable, the estimate rises past it.
	adj := append(append([]uint64(nil), base...), fpKey, sampledFresh())
	got = s.Depth(adj)
	if got.Lower != 151 || got.Upper != 151 {
		t.Fatalf("adjacent false positive: Depth = %+v, want [151, 151] (naive bracket [%d, %d])", got, lower, upper)
	}
}

// TestDepthEdges covers empty chains, an empty summary and a chain wholly
// held.
func TestDepthEdges(t *testing.T) {
	empty, err := Build(testInput("r", 1), nil, DefaultBuildConfig())
	if err != nil {
		t.Fatal(err)
	}
	if d := empty.Depth([]uint64{1, 2, 3}); d.Lower != 0 || d.Upper != 0 { // rate 1: position 0 is sampled and absent
		t.Fatalf("empty summary: %+v", d)
	}
	f := newForest(3, 500, 0, 500, 500)
	hashes := f.hashes(nil)
	s, err := Build(testInput("r", 1), hashes, BuildConfig{MaxBytes: 1 << 20, SampleRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Depth(nil); d != (Depth{}) {
		t.Fatalf("nil chain: %+v", d)
	}
	if d := s.Depth(hashes); d.Lower != 500 || d.Upper != 500 {
		t.Fatalf("whole chain held at rate 1: %+v", d)
	}
	if d := s.Depth(hashes[:1]); d.Lower != 1 {
		t.Fatalf("first block: %+v", d)
	}
}

// TestDepthAllocations: the request path must not allocate.
func TestDepthAllocations(t *testing.T) {
	f := newForest(9, 100_000, 0.7, 100, 2000)
	s, err := Build(testInput("r", 1), f.hashes(nil), DefaultBuildConfig())
	if err != nil {
		t.Fatal(err)
	}
	q, _ := f.query(100, nil)
	if a := testing.AllocsPerRun(100, func() { _ = s.Depth(q) }); a != 0 {
		t.Fatalf("Depth allocates %.1f times per call", a)
	}
	if a := testing.AllocsPerRun(100, func() { _ = s.Candidate(testTime, q, 64*len(q)) }); a != 0 {
		t.Fatalf("Candidate allocates %.1f times per call", a)
	}
}
