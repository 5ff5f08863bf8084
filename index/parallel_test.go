package index

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The parallel-round lookup (lookup) against the naive consecutive scan
// and against the sequential search, on chains long enough for Lookup to
// use it (the model's property tests draw short chains): many pods at few
// or many distinct depths, some removed, scratch space from plenty down to
// too little (the fallback). With closure kept, all three answer alike;
// with middle blocks evicted, every answer of both is a drop point at or
// beyond the consecutive one.
func TestParallelLookupMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.SampledFrom([]int{64, 256, 1024}).Draw(t, "capacity")
		x, err := New(Config{PodCapacity: capacity})
		if err != nil {
			t.Fatal(err)
		}
		ref := newNaive()
		seed := rapid.Uint64().Draw(t, "seed")
		n := rapid.IntRange(1, 1500).Draw(t, "blocks")
		chain := make([]uint64, n)
		for i := range chain {
			chain[i] = splitmix(seed+uint64(i)) | 1
		}
		// A few distinct depths, or any.
		depths := rapid.SliceOfN(rapid.IntRange(0, n), 1, 40).Draw(t, "depths")
		pods := rapid.IntRange(1, min(capacity-1, 300)).Draw(t, "pods")
		// Decoys: blocks with the fingerprint (and shard) of chain blocks
		// but another hash, registered first so that they come first in
		// the probe runs, held by a pod that holds nothing of the chain.
		if rapid.Bool().Draw(t, "decoys") {
			id, err := x.AddPod("decoy")
			if err != nil {
				t.Fatal(err)
			}
			ref.addPod("decoy")
			for i := range chain {
				if rapid.IntRange(0, 3).Draw(t, "decoy") == 0 {
					d := fingerprintTwin(chain[i])
					_ = x.Register(id, TierGPU, []uint64{d})
					ref.register("decoy", TierGPU, []uint64{d})
				}
			}
		}
		broken := rapid.Bool().Draw(t, "broken")
		for p := 0; p < pods; p++ {
			name := fmt.Sprint("pod-", p)
			id, err := x.AddPod(name)
			if err != nil {
				t.Fatal(err)
			}
			ref.addPod(name)
			d := depths[rapid.IntRange(0, len(depths)-1).Draw(t, "depth")]
			_ = x.Register(id, TierGPU, chain[:d])
			ref.register(name, TierGPU, chain[:d])
			if broken && d > 2 && rapid.Bool().Draw(t, "hole") {
				h := chain[rapid.IntRange(1, d-2).Draw(t, "holeAt")]
				_ = x.Evict(id, TierGPU, []uint64{h})
				ref.evict(name, TierGPU, []uint64{h})
			}
			if rapid.IntRange(0, 9).Draw(t, "remove") == 0 {
				_ = x.RemovePod(id)
				ref.removePod(name)
				continue
			}
		}
		// A hint for the chain's first block, possibly stale or
		// foreign: it may only change where the first round probes.
		if rapid.Bool().Draw(t, "hint") {
			hd := rapid.SliceOfNDistinct(rapid.IntRange(1, min(n, hintMaxLen)), 1, hintDepths, rapid.ID[int]).Draw(t, "hinted")
			slices.Sort(hd)
			depths := make([]int32, len(hd))
			for i, d := range hd {
				depths[i] = int32(d)
			}
			x.hints.set(chain[0], depths)
		}
		w := x.words
		scratch := make([]uint64, rapid.SampledFrom([]int{lookupScratchWords, 2 * w, 3 * w, 16 * w}).Draw(t, "scratch"))
		named := func(res []Match) []namedMatch {
			out := make([]namedMatch, 0, len(res))
			for i, m := range res {
				name, ok := x.PodName(m.Pod)
				if !ok {
					t.Fatalf("lookup returned %v, which is not live", m.Pod)
				}
				if i > 0 {
					p := res[i-1]
					if p.Blocks < m.Blocks || (p.Blocks == m.Blocks && p.Pod.Slot() >= m.Pod.Slot()) {
						t.Fatalf("result not ranked at %d: %v then %v", i, p, m)
					}
				}
				out = append(out, namedMatch{name, m.Blocks})
			}
			sortNamed(out)
			return out
		}
		got := named(x.lookup(chain, nil, scratch))
		want := ref.lookup(chain)
		short := named(x.lookupShort(chain, nil))
		// Any working space: too small for the lookup is answered by
		// false and nothing written.
		space := rapid.IntRange(2, 48).Draw(t, "space")
		inRes, inOK := x.lookupIn(chain, nil, make([]uint64, space*w))
		if !inOK && inRes != nil {
			t.Fatalf("lookupIn out of space answered %v", inRes)
		}
		var in []namedMatch
		if inOK {
			in = named(inRes)
		}
		if !broken {
			if !slices.Equal(got, want) {
				t.Fatalf("parallel lookup of %d blocks:\n index %v\n naive %v", n, got, want)
			}
			if !slices.Equal(short, want) {
				t.Fatalf("short-space lookup of %d blocks:\n index %v\n naive %v", n, short, want)
			}
			if inOK && !slices.Equal(in, want) {
				t.Fatalf("lookupIn (space %d) of %d blocks:\n index %v\n naive %v", space, n, in, want)
			}
			if seq := named(x.lookupSequential(chain, nil)); !slices.Equal(seq, want) {
				t.Fatalf("sequential lookup of %d blocks:\n index %v\n naive %v", n, seq, want)
			}
			if all := named(x.Lookup(chain, make([]Match, 0, capacity))); !slices.Equal(all, want) {
				t.Fatalf("Lookup of %d blocks:\n index %v\n naive %v", n, all, want)
			}
			if groups := named(allGroups(x, chain)); !slices.Equal(groups, want) {
				t.Fatalf("LookupGroups of %d blocks:\n index %v\n naive %v", n, groups, want)
			}
			return
		}
		c := map[string]int{}
		for _, m := range want {
			c[m.Name] = m.Blocks
		}
		all := [][]namedMatch{got, short, named(x.lookupSequential(chain, nil)), named(allGroups(x, chain))}
		if inOK {
			all = append(all, in)
		}
		for _, got := range all {
			if len(got) != len(want) {
				t.Fatalf("lookup pods differ:\n index %v\n naive %v", got, want)
			}
			for _, g := range got {
				cd, ok := c[g.Name]
				d := g.Blocks
				if !ok || d < cd || d > n || !ref.holds(g.Name, chain[d-1]) || (d < n && ref.holds(g.Name, chain[d])) {
					t.Fatalf("pod %q: index depth %d, consecutive depth %d: not a drop point", g.Name, d, cd)
				}
			}
		}
	})
}

// allGroups is every group LookupGroups answers for chain, in turn.
func allGroups(x *Index, chain []uint64) []Match {
	var g Groups
	x.LookupGroups(chain, &g)
	var out []Match
	for !g.Done() {
		out = g.Next(out)
	}
	return out
}

// A long chain's lookup (the parallel rounds) allocates nothing either.
func TestLongLookupDoesNotAllocate(t *testing.T) {
	x := mustIndex(t, 256)
	chain := make([]uint64, 1024)
	for i := range chain {
		chain[i] = splitmix(uint64(i) + 1)
	}
	for p := 0; p < 256; p++ {
		id, _ := x.AddPod(fmt.Sprint(p))
		_ = x.Register(id, TierGPU, chain[:64*(1+p%16)])
	}
	buf := make([]Match, 0, x.PodCapacity())
	allocs := testing.AllocsPerRun(200, func() { buf = x.Lookup(chain, buf) })
	if allocs != 0 {
		t.Fatalf("Lookup allocates %.1f times per call", allocs)
	}
	if len(buf) != 256 || buf[0].Blocks != 1024 || buf[255].Blocks != 64 {
		t.Fatalf("unexpected result: %d matches, first %v last %v", len(buf), buf[0], buf[len(buf)-1])
	}
}

// fingerprintTwin is a key other than h with h's shard and fingerprint:
// key*fib differs from h*fib only in its lowest bits, which neither keeps.
func fingerprintTwin(h uint64) uint64 {
	// inv is the inverse of fib modulo 2^64 (Newton's iteration).
	inv := uint64(fib)
	for range 5 {
		inv *= 2 - fib*inv
	}
	t := h + inv
	if fingerprint(t) != fingerprint(h) || shardOf(t) != shardOf(h) {
		t = h - inv
	}
	return t
}

func TestFingerprintTwin(t *testing.T) {
	for i := uint64(1); i < 1000; i++ {
		h := splitmix(i)
		d := fingerprintTwin(h)
		if d == h || fingerprint(d) != fingerprint(h) || shardOf(d) != shardOf(h) {
			t.Fatalf("twin of %#x: %#x", h, d)
		}
	}
}

// Answering a lookup's groups allocates nothing when dst has room.
func TestGroupsDoNotAllocate(t *testing.T) {
	x := mustIndex(t, 256)
	chain := make([]uint64, 128)
	for i := range chain {
		chain[i] = splitmix(uint64(i) + 1)
	}
	for p := 0; p < 256; p++ {
		id, _ := x.AddPod(fmt.Sprint(p))
		_ = x.Register(id, TierGPU, chain[:1+p%128])
	}
	g := new(Groups)
	buf := make([]Match, 0, x.PodCapacity())
	allocs := testing.AllocsPerRun(200, func() {
		x.LookupGroups(chain, g)
		buf = buf[:0]
		for !g.Done() {
			buf = g.Next(buf)
		}
	})
	if allocs != 0 {
		t.Fatalf("LookupGroups and Next allocate %.1f times per lookup", allocs)
	}
	if len(buf) != 256 || buf[0].Blocks != 128 || buf[255].Blocks != 1 {
		t.Fatalf("unexpected result: %d matches, first %v last %v", len(buf), buf[0], buf[len(buf)-1])
	}
}

// hintProbes plans positions strictly inside the chain, ascending and
// distinct, within its room, holding d-1 and d of every hinted depth
// while there is room for them.
func TestHintProbes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := int32(rapid.IntRange(2, 3000).Draw(t, "n"))
		depths := rapid.SliceOfN(rapid.Int32Range(1, n), 0, hintDepths).Draw(t, "depths")
		slices.Sort(depths)
		even := rapid.IntRange(-8, 8).Draw(t, "even")
		out := make([]int32, rapid.IntRange(0, lookupMaxRoundProbes).Draw(t, "room"))
		k := hintProbes(n, depths, even, out)
		got := out[:k]
		for i, p := range got {
			if p <= 0 || p >= n || (i > 0 && got[i-1] >= p) {
				t.Fatalf("positions %v for n=%d", got, n)
			}
		}
		var want []int32
		for _, d := range depths {
			for _, p := range []int32{d - 1, d} {
				if p > 0 && p < n && !slices.Contains(want, p) {
					want = append(want, p)
				}
			}
		}
		if len(want) <= len(out) {
			for _, p := range want {
				if !slices.Contains(got, p) {
					t.Fatalf("positions %v lack hinted %d (depths %v)", got, p, depths)
				}
			}
		}
	})
}
