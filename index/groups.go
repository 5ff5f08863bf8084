package index

import "math/bits"

// Groups is a lookup that answers a depth group at a time, deepest first,
// and only as far as it is asked: a caller that needs the pods holding the
// longest prefixes (a decision that prices the deepest group first and
// stops when the next cannot win) does not pay for the shallow groups.
// Started by LookupGroups, it yields with Next the groups Lookup would
// return, in the same order, slots ascending within a group; on histories
// that preserve prefix closure the concatenated groups equal Lookup's
// answer (TestGroupsMatchLookup). When evictions have broken closure each
// pod's answer is still a drop point d at or beyond the consecutive-scan
// answer (it holds H_{d-1} and not H_d), the bound Lookup keeps, but not
// necessarily the drop point Lookup picks.
//
// The search mirrors lookupSequential's from the other end: with U the
// pods not answered yet (every one holds H_0, and none holds H_hi), a
// binary search finds the largest b < hi where some pod of U holds H_b;
// those pods matched b+1 blocks, and the rest of U matched at most b. Each
// search remembers where its probes found some pod of U present; the next
// starts from the largest of those still holding a pod left, so closely
// spaced depths cost about a probe each.
//
// A Groups is about 2 KB: keep one (a decision's scratch) rather than
// declaring it per lookup. Not safe for concurrent use; the index under
// it is, as for Lookup.
type Groups struct {
	x     *Index
	chain []uint64
	hi    int // no pod of left holds chain[hi] (hi == len(chain): none can)
	left  [maxWords]uint64
	// held is a stack of positions where a probe found some pod of left
	// present, largest on top, with their bitmaps in heldAt (at [i*w,
	// (i+1)*w)); its bottom is position 0, which every pod of left holds.
	held   [lookupMemo]int32
	heldAt [lookupMemoWords]uint64
	sp     int
	// spare takes a probe when held is full, and kept one that found a
	// pod of left present (a later probe would overwrite spare).
	spare, kept [maxWords]uint64
}

// LookupGroups starts g on the query chain: the pods it will answer are
// the live pods holding H_0 (as for Lookup, a pod removed before it starts
// is never answered).
func (x *Index) LookupGroups(chain []uint64, g *Groups) {
	w := x.words
	g.x, g.chain, g.hi, g.sp = x, chain, len(chain), 0
	clear(g.left[:])
	if len(chain) == 0 {
		return
	}
	at := g.heldAt[:w]
	x.load(chain[0], at)
	for i := 0; i < w; i++ {
		g.left[i] = at[i] & x.pods.alive[i].Load()
	}
	g.held[0], g.sp = 0, 1
}

// Done reports whether every group has been answered.
func (g *Groups) Done() bool {
	for _, v := range g.left {
		if v != 0 {
			return false
		}
	}
	return true
}

// Pending reports whether the pod in slot may still be answered: it held
// H_0 when the lookup started, and its group has not been answered yet.
func (g *Groups) Pending(slot int) bool {
	return slot >= 0 && slot < len(g.left)*64 && g.left[slot/64]&(1<<(slot%64)) != 0
}

// Next appends the next group, the pods of the deepest depth not answered
// yet (all with the same Blocks), to dst and returns it; once every group
// has been answered it returns dst as it is. It allocates nothing when
// dst has room for the group.
func (g *Groups) Next(dst []Match) []Match {
	if g.Done() {
		return dst
	}
	x, w := g.x, g.x.words
	left := g.left[:w]
	memo := min(lookupMemo, len(g.heldAt)/w)
	// Drop the remembered positions at or beyond hi (no pod left holds
	// them), then those no pod left holds: each lowers hi. The bottom,
	// position 0, holds every pod left.
	for g.sp > 1 && int(g.held[g.sp-1]) >= g.hi {
		g.sp--
	}
	for g.sp > 1 && !intersects(left, g.heldAt[(g.sp-1)*w:g.sp*w]) {
		g.hi = int(g.held[g.sp-1])
		g.sp--
	}
	// Invariant: some pod of left holds chain[l] (atL), none holds
	// chain[r+1]. Find the largest such l.
	l, r := int(g.held[g.sp-1]), g.hi-1
	atL := g.heldAt[(g.sp-1)*w : g.sp*w]
	for l < r {
		m := int(uint(l+r+1) >> 1)
		at := g.spare[:w]
		if g.sp < memo {
			at = g.heldAt[g.sp*w : (g.sp+1)*w]
		}
		x.load(g.chain[m], at)
		if !intersects(left, at) {
			r = m - 1
			continue
		}
		l, atL = m, at
		if g.sp < memo {
			g.held[g.sp] = int32(m)
			g.sp++
		} else {
			copy(g.kept[:w], at)
			atL = g.kept[:w]
		}
	}
	// The pods of left holding chain[l] matched l+1 blocks; the others
	// do not hold chain[l].
	k := 0
	var group [maxWords]uint64
	for i := 0; i < w; i++ {
		group[i] = left[i] & atL[i]
		left[i] &^= group[i]
		k += bits.OnesCount64(group[i])
	}
	g.hi = l
	n := len(dst)
	if cap(dst)-n < k {
		grown := make([]Match, n, n+k+len(dst))
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n+k]
	x.pods.fill(dst[n:], group[:w], l+1)
	return dst
}

// intersects reports whether a and b share a bit.
func intersects(a, b []uint64) bool {
	for i := range a {
		if a[i]&b[i] != 0 {
			return true
		}
	}
	return false
}
