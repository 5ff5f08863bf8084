package index

import (
	"slices"
	"sort"
)

// naive is the reference the index is tested against: block -> pod -> tier
// reference counts in plain maps, pods by name, and a lookup that scans every
// live pod along the chain until its first missing block.
type naive struct {
	blocks map[uint64]map[string]*tierCounts
	live   map[string]bool
}

func newNaive() *naive {
	return &naive{blocks: map[uint64]map[string]*tierCounts{}, live: map[string]bool{}}
}

func (n *naive) addPod(name string) { n.live[name] = true }

// removePod forgets the pod's blocks at once: what the index guarantees after
// the sweep, and what lookups see immediately through the alive mask.
func (n *naive) removePod(name string) {
	delete(n.live, name)
	n.clearPod(name)
}

func (n *naive) clearPod(name string) {
	for h, pods := range n.blocks {
		delete(pods, name)
		if len(pods) == 0 {
			delete(n.blocks, h)
		}
	}
}

func (n *naive) register(name string, tier Tier, hashes []uint64) {
	if !n.live[name] {
		return
	}
	for _, h := range hashes {
		if h == 0 {
			continue
		}
		pods := n.blocks[h]
		if pods == nil {
			pods = map[string]*tierCounts{}
			n.blocks[h] = pods
		}
		c := pods[name]
		if c == nil {
			c = &tierCounts{}
			pods[name] = c
		}
		if c[tier] < ^uint16(0) {
			c[tier]++
		}
	}
}

func (n *naive) evict(name string, tier Tier, hashes []uint64) {
	for _, h := range hashes {
		c := n.blocks[h][name]
		if c == nil || c[tier] == 0 {
			continue
		}
		c[tier]--
		if c.empty() {
			delete(n.blocks[h], name)
			if len(n.blocks[h]) == 0 {
				delete(n.blocks, h)
			}
		}
	}
}

func (n *naive) holds(name string, h uint64) bool { return n.blocks[h][name] != nil }

type namedMatch struct {
	Name   string
	Blocks int
}

// lookup is the consecutive scan: every live pod, along the chain, until the
// first block it does not hold. Sorted by blocks descending, then name.
func (n *naive) lookup(chain []uint64) []namedMatch {
	var out []namedMatch
	for name := range n.live {
		d := 0
		for d < len(chain) && n.holds(name, chain[d]) {
			d++
		}
		if d > 0 {
			out = append(out, namedMatch{name, d})
		}
	}
	sortNamed(out)
	return out
}

func (n *naive) tierProfile(name string, chain []uint64) TierCounts {
	var tc TierCounts
	for _, h := range chain {
		if c := n.blocks[h][name]; c != nil {
			tc[c.best()]++
		}
	}
	return tc
}

func (n *naive) podBlocks(name string) int {
	k := 0
	for _, pods := range n.blocks {
		if pods[name] != nil {
			k++
		}
	}
	return k
}

func sortNamed(m []namedMatch) {
	sort.Slice(m, func(i, j int) bool {
		if m[i].Blocks != m[j].Blocks {
			return m[i].Blocks > m[j].Blocks
		}
		return m[i].Name < m[j].Name
	})
}

// closed reports whether every pod's blocks along q are a prefix of it:
// then Lookup must answer exactly what lookup does.
func (n *naive) closed(q []uint64) bool {
	for name := range n.live {
		gap := false
		for _, h := range q {
			switch held := n.holds(name, h); {
			case held && gap:
				return false
			case !held:
				gap = true
			}
		}
	}
	return true
}

// checkNaiveLookup checks an index's answer for q, named and sorted as
// lookup sorts, against the reference: equal to the consecutive scan when
// every pod's blocks along q are a prefix of it, and otherwise the
// documented weaker answer: the same pods, each at a depth d with c <= d
// (c its consecutive-scan depth), holding H_{d-1} and not holding H_d.
func checkNaiveLookup(t fataler, ref *naive, q []uint64, got []namedMatch) {
	t.Helper()
	want := ref.lookup(q)
	if ref.closed(q) {
		if !slices.Equal(got, want) {
			t.Fatalf("lookup of %d blocks, prefix-closed:\n index %v\n naive %v", len(q), got, want)
		}
		return
	}
	if len(got) != len(want) {
		t.Fatalf("lookup of %d blocks, pods differ:\n index %v\n naive %v", len(q), got, want)
	}
	c := map[string]int{}
	for _, w := range want {
		c[w.Name] = w.Blocks
	}
	for _, g := range got {
		cd, ok := c[g.Name]
		if !ok {
			t.Fatalf("index returned %q, which the naive scan does not", g.Name)
		}
		d := g.Blocks
		if d < cd || d > len(q) || !ref.holds(g.Name, q[d-1]) || (d < len(q) && ref.holds(g.Name, q[d])) {
			t.Fatalf("pod %q: index depth %d, consecutive depth %d: not a drop point", g.Name, d, cd)
		}
	}
}
