package summary

import (
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func distinctKeys(rng *rand.Rand, n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// TestFuseNoFalseNegatives: every key a filter was built from is reported
// present, for set sizes from empty to a few thousand.
func TestFuseNoFalseNegatives(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 3000).Draw(t, "n")
		seed := rapid.Uint64().Draw(t, "seed")
		keys := distinctKeys(rand.New(rand.NewPCG(seed, 1)), n)
		f, err := buildFuse8(keys, seed)
		if err != nil {
			t.Fatalf("build %d keys: %v", len(keys), err)
		}
		for _, k := range keys {
			if !f.contains(k) {
				t.Fatalf("key %#x of %d reported absent", k, len(keys))
			}
		}
		if len(keys) == 0 && len(f.fp) != 0 {
			t.Fatalf("empty set got %d fingerprint bytes", len(f.fp))
		}
	})
}

// TestFuseSmallSets builds every size from 1 to 300 (the sizing rules are
// least forgiving there).
func TestFuseSmallSets(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for n := 1; n <= 300; n++ {
		keys := distinctKeys(rng, n)
		f, err := buildFuse8(keys, uint64(n))
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		for _, k := range keys {
			if !f.contains(k) {
				t.Fatalf("n=%d: false negative", n)
			}
		}
	}
}

// TestFuseDuplicateKeysFail: duplicates make peeling impossible; the builder
// must give up with an error, not loop.
func TestFuseDuplicateKeysFail(t *testing.T) {
	if _, err := buildFuse8([]uint64{5, 5, 9}, 1); err == nil {
		t.Fatal("duplicate keys built a filter")
	}
}

// TestFuseFalsePositiveRate measures the false-positive rate and the space
// per key; an 8-bit fingerprint gives 2^-8 = 0.39%.
func TestFuseFalsePositiveRate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1000, 55_000, 200_000} {
		keys := distinctKeys(rng, n)
		f, err := buildFuse8(keys, 3)
		if err != nil {
			t.Fatal(err)
		}
		const probes = 1_000_000
		fp := 0
		for range probes {
			k := rng.Uint64()
			if _, found := slices.BinarySearch(keys, k); !found && f.contains(k) {
				fp++
			}
		}
		rate := float64(fp) / probes
		bitsPerKey := float64(len(f.fp)*8) / float64(len(keys))
		t.Logf("n=%d: false-positive rate %.4f%% over %d probes, %.2f bits/key, %d bytes", len(keys), 100*rate, probes, bitsPerKey, len(f.fp))
		if rate > 0.0045 || rate < 0.0033 {
			t.Errorf("n=%d: false-positive rate %.4f%%, want about 0.39%%", n, 100*rate)
		}
		if n >= 55_000 && bitsPerKey > 9.7 {
			t.Errorf("n=%d: %.2f bits per key, want <= 9.7", n, bitsPerKey)
		}
	}
}
