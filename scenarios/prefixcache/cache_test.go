package prefixcache

import (
	"slices"
	"testing"
)

func victims(c *Cache[int]) []uint64 {
	var hs []uint64
	for b := range c.Victims() {
		hs = append(hs, b.Hash)
	}
	return hs
}

// The property tests of scenarios/enginesim and scenarios/sim compare each
// simulator's use of the cache with a naive reference; this one walks the
// paths only one of them takes: overcommit and Reclaim (sim), Clear with
// blocks still held (enginesim).
func TestOvercommitAndClear(t *testing.T) {
	c := New[int](2)
	var a Holding[int]
	c.Admit(&a, nil, 2)
	for _, h := range []uint64{1, 2} {
		if b, stored := c.Store(&a, h); !stored {
			t.Fatalf("store %d: not new", h)
		} else {
			b.Data = int(h)
		}
	}
	c.Release(&a)
	if got := victims(c); !slices.Equal(got, []uint64{2, 1}) {
		t.Fatalf("victims %v, want the tail first: [2 1]", got)
	}

	// A request of 3 blocks sharing block 1 overcommits: it evicts block 2,
	// still needs one block more than the cache has, and caches 3 blocks in
	// a cache of 2 until Reclaim gives one back.
	var b Holding[int]
	chain := []uint64{1, 3, 4}
	hit := chain[:c.Lookup(chain)]
	if c.Fits(hit, len(chain)-len(hit)) {
		t.Fatal("fits, want not")
	}
	if ev := c.Admit(&b, hit, len(chain)-len(hit)); !slices.Equal(ev, []uint64{2}) {
		t.Fatalf("admit evicted %v, want [2]", ev)
	}
	for _, h := range chain[len(hit):] {
		if _, stored := c.Store(&b, h); !stored {
			t.Fatalf("store %d: not new", h)
		}
	}
	if c.Used() != 3 || c.Len() != 3 || c.Usage() != 1 || c.Free() != 0 {
		t.Fatalf("overcommitted: used %d len %d usage %v free %d", c.Used(), c.Len(), c.Usage(), c.Free())
	}
	c.Release(&b)
	if ev := c.Reclaim(); !slices.Equal(ev, []uint64{4}) || c.Used() != 2 {
		t.Fatalf("reclaim evicted %v (used %d), want [4] (used 2)", ev, c.Used())
	}

	// Clear keeps a held block allocated until it is released.
	var d Holding[int]
	c.Admit(&d, []uint64{1}, 0)
	c.Clear()
	if c.Len() != 0 || c.Used() != 1 || c.Lookup([]uint64{1}) != 0 {
		t.Fatalf("after clear: len %d used %d", c.Len(), c.Used())
	}
	if d.Pinned[0].Data != 1 || d.Pinned[0].Refs() != 1 {
		t.Fatalf("held block %+v", d.Pinned[0])
	}
	c.Release(&d)
	if c.Used() != 0 || c.Evictable() != 0 {
		t.Fatalf("after release: used %d evictable %d", c.Used(), c.Evictable())
	}
}
