package residency

import (
	"iter"
	"math/bits"
)

// MaxRegions is the largest number of regions a policy may declare: a
// RegionSet is a fixed 128-bit mask over the policy's region list.
const MaxRegions = 128

// RegionSet is a set of regions of one policy: bit i stands for the policy's
// i-th declared region (see Policy.Regions). It is a value type of two words,
// so decisions carry it without allocating. Sets of different policies are
// comparable only through region names (see Decision.SameRegions).
type RegionSet struct{ lo, hi uint64 }

// RegionSetOf returns the set holding the given region indexes; indexes
// outside [0, MaxRegions) are ignored.
func RegionSetOf(idx ...int) RegionSet {
	var s RegionSet
	for _, i := range idx {
		s = s.With(i)
	}
	return s
}

// allRegions returns the set of the first n regions.
func allRegions(n int) RegionSet {
	switch {
	case n <= 0:
		return RegionSet{}
	case n < 64:
		return RegionSet{lo: 1<<uint(n) - 1}
	case n == 64:
		return RegionSet{lo: ^uint64(0)}
	case n < 128:
		return RegionSet{lo: ^uint64(0), hi: 1<<uint(n-64) - 1}
	default:
		return RegionSet{lo: ^uint64(0), hi: ^uint64(0)}
	}
}

// With returns s plus region i.
func (s RegionSet) With(i int) RegionSet {
	switch {
	case i >= 0 && i < 64:
		s.lo |= 1 << uint(i)
	case i >= 64 && i < MaxRegions:
		s.hi |= 1 << uint(i-64)
	}
	return s
}

// Has reports whether region i is in s.
func (s RegionSet) Has(i int) bool {
	switch {
	case i >= 0 && i < 64:
		return s.lo&(1<<uint(i)) != 0
	case i >= 64 && i < MaxRegions:
		return s.hi&(1<<uint(i-64)) != 0
	}
	return false
}

// Empty reports whether s holds no region.
func (s RegionSet) Empty() bool { return s.lo == 0 && s.hi == 0 }

// Len returns the number of regions in s.
func (s RegionSet) Len() int { return bits.OnesCount64(s.lo) + bits.OnesCount64(s.hi) }

// Union returns s ∪ t.
func (s RegionSet) Union(t RegionSet) RegionSet { return RegionSet{s.lo | t.lo, s.hi | t.hi} }

// Intersect returns s ∩ t.
func (s RegionSet) Intersect(t RegionSet) RegionSet { return RegionSet{s.lo & t.lo, s.hi & t.hi} }

// Minus returns s \ t.
func (s RegionSet) Minus(t RegionSet) RegionSet { return RegionSet{s.lo &^ t.lo, s.hi &^ t.hi} }

// SubsetOf reports whether every region of s is in t.
func (s RegionSet) SubsetOf(t RegionSet) bool { return s.lo&^t.lo == 0 && s.hi&^t.hi == 0 }

// Overlaps reports whether s and t share a region.
func (s RegionSet) Overlaps(t RegionSet) bool { return s.lo&t.lo != 0 || s.hi&t.hi != 0 }

// Indexes yields the region indexes of s in increasing order.
func (s RegionSet) Indexes() iter.Seq[int] {
	return func(yield func(int) bool) {
		for w, word := range [2]uint64{s.lo, s.hi} {
			for word != 0 {
				i := bits.TrailingZeros64(word)
				if !yield(w*64 + i) {
					return
				}
				word &= word - 1
			}
		}
	}
}
