package summary

import (
	"math"
	"math/rand/v2"
)

// forest is a synthetic prefix-closed cache: chains that branch off earlier
// chains at random depths (shared system prompts, multi-turn histories,
// forked agent sessions). The held set is every block of every chain, which
// holds every prefix by construction.
type forest struct {
	chains []fchain
	blocks int
	rng    *rand.Rand
}

type fchain struct {
	parent int // -1 for a root
	at     int // blocks of the parent's chain it shares
	length int // full length in blocks
	suffix []uint64
}

// newForest grows chains until it holds at least n blocks. share is the
// probability that a new chain branches off an existing one; suffix lengths
// are log-uniform in [minLen, maxLen].
func newForest(seed uint64, n int, share float64, minLen, maxLen int) *forest {
	f := &forest{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	for f.blocks < n {
		c := fchain{parent: -1}
		if len(f.chains) > 0 && f.rng.Float64() < share {
			c.parent = f.rng.IntN(len(f.chains))
			c.at = f.rng.IntN(f.chains[c.parent].length + 1)
		}
		l := logUniform(f.rng, minLen, maxLen)
		l = min(l, n-f.blocks)
		c.suffix = make([]uint64, l)
		for i := range c.suffix {
			c.suffix[i] = f.fresh()
		}
		c.length = c.at + l
		f.blocks += l
		f.chains = append(f.chains, c)
	}
	return f
}

func logUniform(rng *rand.Rand, lo, hi int) int {
	if hi <= lo {
		return lo
	}
	return int(math.Round(math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo))))))
}

// fresh returns a hash not in the forest (a collision has probability
// about 2^-64 per pair; 0 is never a chain hash).
func (f *forest) fresh() uint64 {
	for {
		if h := f.rng.Uint64(); h != 0 {
			return h
		}
	}
}

// chain appends the first n blocks of chain i to dst.
func (f *forest) chain(i, n int, dst []uint64) []uint64 {
	if n == 0 {
		return dst
	}
	c := &f.chains[i]
	if n <= c.at {
		return f.chain(c.parent, n, dst)
	}
	if c.parent >= 0 {
		dst = f.chain(c.parent, c.at, dst)
	}
	return append(dst, c.suffix[:n-c.at]...)
}

// hashes appends every held block hash.
func (f *forest) hashes(dst []uint64) []uint64 {
	for i := range f.chains {
		dst = append(dst, f.chains[i].suffix...)
	}
	return dst
}

// query draws a query chain sharing a prefix with a cached chain: a random
// chain, a true depth uniform in [0, its length], then `extra` fresh blocks
// (uniform in [0, maxExtra]). It returns the chain and its true depth.
func (f *forest) query(maxExtra int, dst []uint64) ([]uint64, int) {
	i := f.rng.IntN(len(f.chains))
	d := f.rng.IntN(f.chains[i].length + 1)
	dst = f.chain(i, d, dst[:0])
	extra := f.rng.IntN(maxExtra + 1)
	for range extra {
		dst = append(dst, f.fresh())
	}
	return dst, d
}
