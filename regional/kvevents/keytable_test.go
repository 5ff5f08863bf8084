package kvevents

import (
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// TestKeyTableMatchesMap: random inserts, removals and lookups (with keys
// that collide in few hash bits, and sequential ones) give what a Go map
// gives, through growth and backward-shift deletion.
func TestKeyTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var kt keyTable
		if rapid.Bool().Draw(t, "reserve?") {
			kt.reserve(rapid.IntRange(0, 100).Draw(t, "reserve"))
		}
		want := map[ekey]int32{}
		var entries []entry
		keys := rapid.SampledFrom([]ekey{{1, 0, 0}, {2, 0, 0}, {1, 1, 0}, {1, 0, 1}, {3, 2, 1}, {1 << 63, 0, 0}})
		for step := rapid.IntRange(1, 300).Draw(t, "steps"); step > 0; step-- {
			var k ekey
			if rapid.Bool().Draw(t, "small?") {
				k = keys.Draw(t, "key")
			} else {
				k = ekey{hash: rapid.Uint64Range(0, 64).Draw(t, "hash"), group: int32(rapid.IntRange(0, 1).Draw(t, "group"))}
			}
			i, ok := want[k]
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				if !ok {
					entries = append(entries, entry{key: k})
					i = int32(len(entries) - 1)
					kt.insert(k, i)
					want[k] = i
				}
			case 1:
				if ok {
					kt.remove(k, i)
					delete(want, k)
					entries[i].key = ekey{hash: ^uint64(0), group: -1}
				}
			}
			got := kt.lookup(k, entries)
			if i, ok := want[k]; (ok && got != i) || (!ok && got != none) {
				t.Fatalf("lookup %+v = %d, want %d (present %v)", k, got, i, ok)
			}
			if kt.n != len(want) {
				t.Fatalf("n = %d, want %d", kt.n, len(want))
			}
		}
		for k, i := range want {
			if got := kt.lookup(k, entries); got != i {
				t.Fatalf("lookup %+v = %d, want %d", k, got, i)
			}
		}
		kt.clear()
		for k := range want {
			if kt.lookup(k, entries) != none {
				t.Fatal("found after clear")
			}
		}
	})
}

// TestRekeyReserve: a Rekeyer sized from the pod's capacity does not grow
// its table, its entries or its token store as the cache fills to that
// capacity.
func TestRekeyReserve(t *testing.T) {
	r := newTestRekeyer(t, 4)
	r.Reserve(1000)
	size, entries := len(r.byKey.slots), cap(r.entries)
	if size < 1000*4/3 || entries < 1000 {
		t.Fatalf("%d slots and room for %d entries after reserving 1000 blocks", size, entries)
	}
	// Chains of 4 blocks of 1 token at router block size 4: 3 blocks in 4
	// keep their token until their router block is complete. The token
	// store is sized with the first.
	toks := -1
	var parent Opt[uint64]
	for i := 0; i < 1000; i++ {
		if i%4 == 0 {
			parent = Opt[uint64]{}
		}
		r.ApplyEvent(nil, 0, stored(parent, 1, seq(1, uint32(i)), uint64(i+1)))
		parent = Some(uint64(i + 1))
		if i == 0 {
			if toks = cap(r.toks.arena(1).buf); toks < 750 {
				t.Fatalf("room for %d tokens after reserving 1000 blocks (750 keep one)", toks)
			}
		}
	}
	if r.Len() != 1000 || len(r.byKey.slots) != size || cap(r.entries) != entries || cap(r.toks.arena(1).buf) != toks {
		t.Fatalf("%d entries, %d slots (reserved %d), room for %d entries (reserved %d) and %d tokens (reserved %d)",
			r.Len(), len(r.byKey.slots), size, cap(r.entries), entries, cap(r.toks.arena(1).buf), toks)
	}
	r.Reserve(1 << 40) // bounded by MaxEntries
	if len(r.byKey.slots) > 4*DefaultRekeyConfig().MaxEntries {
		t.Fatalf("%d slots", len(r.byKey.slots))
	}
}

// TestEntrySize: an entry is one cache line.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 64 {
		t.Fatalf("entry is %d bytes, want 64", n)
	}
}
