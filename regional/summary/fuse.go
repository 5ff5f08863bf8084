package summary

import (
	"errors"
	"math"
	"math/bits"
)

// fuse8 is a 3-wise binary fuse filter with 8-bit fingerprints, built from
// the description in Graf & Lemire, "Binary Fuse Filters: Fast and Smaller
// Than Xor Filters" (ACM JEA, 2022).
//
// The fingerprint array is cut into segments of segLen slots (a power of
// two). A key's 64-bit hash h picks a start slot p0 uniformly in the first
// segCount segments, and its two other slots in the next two segments, at
// offsets scrambled by bits of h. The key is present iff
//
//	fp[p0] ^ fp[p1] ^ fp[p2] == fingerprint(h)
//
// Construction assigns the array by peeling: repeatedly take a slot used by
// exactly one remaining key, push (key, slot), and remove the key; then pop
// in reverse order and set each key's own slot so that its equation holds.
// A key is never reported absent (no false negatives); a key not in the set
// is reported present with probability about 2^-8.
type fuse8 struct {
	seed     uint64
	segBits  uint8  // log2 of the segment length
	segCount uint32 // number of segments a key's first slot may fall in
	fp       []uint8
}

const (
	fuseArity      = 3
	maxSegBits     = 18 // segments of at most 2^18 slots, as in the paper
	minSegBits     = 2
	maxBuildSeeds  = 64 // seeds tried per array size before it grows
	fuseGrowFactor = 1.05
)

// errFilterTooLarge is returned when a filter would exceed what the encoding
// and the uint32 slot arithmetic can hold.
var errFilterTooLarge = errors.New("filter too large")

// errFilterBuild is returned when peeling keeps failing, which happens only
// when keys are not distinct.
var errFilterBuild = errors.New("filter construction failed (duplicate keys?)")

// mix64 is the murmur3 64-bit finalizer of key+seed: a bijection that spreads
// every input bit over the output.
func mix64(key, seed uint64) uint64 {
	h := key + seed
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func fingerprint8(h uint64) uint8 { return uint8(h ^ (h >> 32)) }

// fuseLayout returns the segment length (as log2) and segment count for n
// keys, with the sizing rules of the paper for arity 3: segment length
// 2^floor(ln n / ln 3.33 + 2.25), capped at 2^18, and an array of
// max(1.125, 0.875 + 0.25 ln(10^6) / ln n) * n slots, rounded to whole
// segments. grow > 1 enlarges the array when construction keeps failing.
func fuseLayout(n int, grow float64) (segBits uint8, segCount uint32) {
	nn := max(n, 2)
	sb := int(math.Floor(math.Log(float64(nn))/math.Log(3.33) + 2.25))
	sb = min(max(sb, minSegBits), maxSegBits)
	factor := max(1.125, 0.875+0.25*math.Log(1e6)/math.Log(float64(nn)))
	capacity := math.Ceil(float64(nn) * factor * grow)
	segLen := float64(uint64(1) << sb)
	total := int64(math.Ceil(capacity / segLen)) // segments in the array
	sc := total - (fuseArity - 1)
	if sc < 1 {
		sc = 1
	}
	return uint8(sb), uint32(min(sc, math.MaxUint32))
}

// fuseBytes is the size of the fingerprint array of a filter of n keys.
func fuseBytes(n int) int {
	if n == 0 {
		return 0
	}
	sb, sc := fuseLayout(n, 1)
	return (int(sc) + fuseArity - 1) << sb
}

func (f *fuse8) segLen() uint32 { return 1 << f.segBits }

// slots returns the three slots of hash h.
func (f *fuse8) slots(h uint64) (uint32, uint32, uint32) {
	mask := f.segLen() - 1
	hi, _ := bits.Mul64(h, uint64(f.segCount)<<f.segBits)
	p0 := uint32(hi)
	p1 := p0 + f.segLen()
	p2 := p1 + f.segLen()
	p1 ^= uint32(h>>18) & mask
	p2 ^= uint32(h) & mask
	return p0, p1, p2
}

// contains reports whether key may be in the set.
func (f *fuse8) contains(key uint64) bool {
	if len(f.fp) == 0 {
		return false
	}
	h := mix64(key, f.seed)
	p0, p1, p2 := f.slots(h)
	return f.fp[p0]^f.fp[p1]^f.fp[p2] == fingerprint8(h)
}

// buildFuse8 builds a filter over keys, which must be distinct. The seeds it
// tries are derived from seedBase, so the same keys give the same filter.
func buildFuse8(keys []uint64, seedBase uint64) (fuse8, error) {
	n := len(keys)
	if n == 0 {
		return fuse8{}, nil
	}
	if n > 1<<30 {
		return fuse8{}, errFilterTooLarge
	}
	grow := 1.0
	var b fuseBuilder
	for attempt := uint64(0); ; attempt++ {
		sb, sc := fuseLayout(n, grow)
		size := (uint64(sc) + fuseArity - 1) << sb
		if size > 1<<31 {
			return fuse8{}, errFilterTooLarge
		}
		f := fuse8{seed: mix64(attempt, seedBase^0x6d65726964696e31), segBits: sb, segCount: sc}
		if b.peel(&f, keys, int(size)) {
			f.fp = make([]uint8, size)
			b.assign(&f)
			return f, nil
		}
		if attempt%maxBuildSeeds == maxBuildSeeds-1 {
			grow *= fuseGrowFactor // very small sets may need more room
		}
		if attempt == 16*maxBuildSeeds {
			return fuse8{}, errFilterBuild // only duplicate keys get here
		}
	}
}

// fuseBuilder holds the scratch arrays of a construction.
type fuseBuilder struct {
	count []uint8  // keys still mapped to each slot (saturates: see peel)
	xor   []uint64 // xor of the hashes of those keys
	queue []uint32 // slots with count 1
	stack []peeled // keys in peeling order
}

type peeled struct {
	h    uint64
	slot uint32
}

// peel runs the peeling phase for one seed; it reports whether every key
// was peeled.
func (b *fuseBuilder) peel(f *fuse8, keys []uint64, size int) bool {
	b.count = resize(b.count, size)
	b.xor = resize(b.xor, size)
	clear(b.count)
	clear(b.xor)
	if cap(b.queue) < size {
		b.queue = make([]uint32, 0, size) // a slot is queued at most twice; the queue stays far smaller
	}
	if cap(b.stack) < len(keys) {
		b.stack = make([]peeled, 0, len(keys))
	}
	b.queue = b.queue[:0]
	b.stack = b.stack[:0]
	for _, k := range keys {
		h := mix64(k, f.seed)
		p0, p1, p2 := f.slots(h)
		for _, p := range [3]uint32{p0, p1, p2} {
			if b.count[p] == math.MaxUint8 {
				return false // pathological seed: a slot shared by 255 keys
			}
			b.count[p]++
			b.xor[p] ^= h
		}
	}
	for i, c := range b.count {
		if c == 1 {
			b.queue = append(b.queue, uint32(i))
		}
	}
	for len(b.queue) > 0 {
		i := b.queue[len(b.queue)-1]
		b.queue = b.queue[:len(b.queue)-1]
		if b.count[i] != 1 {
			continue // emptied since it was queued
		}
		h := b.xor[i]
		b.stack = append(b.stack, peeled{h, i})
		p0, p1, p2 := f.slots(h)
		for _, p := range [3]uint32{p0, p1, p2} {
			b.count[p]--
			b.xor[p] ^= h
			if b.count[p] == 1 {
				b.queue = append(b.queue, p)
			}
		}
	}
	return len(b.stack) == len(keys)
}

// assign sets the fingerprints in reverse peeling order: when a key is
// assigned, its other two slots already hold their final values.
func (b *fuseBuilder) assign(f *fuse8) {
	for k := len(b.stack) - 1; k >= 0; k-- {
		e := b.stack[k]
		p0, p1, p2 := f.slots(e.h)
		f.fp[e.slot] = 0
		f.fp[e.slot] = fingerprint8(e.h) ^ f.fp[p0] ^ f.fp[p1] ^ f.fp[p2]
	}
}

func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}
