package sim

import (
	"testing"

	"pgregory.net/rapid"
)

// naiveChain is chainOf's reference: expand the segments to one (segment,
// offset) pair per token, cut into blocks, and give each block an id that
// depends on its parent and its exact token list.
func naiveChain(segs []segment, bs int) []string {
	type tok struct {
		seg uint64
		off int
	}
	var toks []tok
	for _, s := range segs {
		for i := range s.n {
			toks = append(toks, tok{s.id, i})
		}
	}
	var out []string
	parent := ""
	for i := 0; i < len(toks); i += bs {
		block := toks[i:min(i+bs, len(toks))]
		key := parent + "|"
		for _, t := range block {
			key += string(rune('a'+t.seg)) + string(rune(t.off)) // exact content
		}
		if len(block) < bs {
			key += "partial"
		}
		out = append(out, key)
		parent = key
	}
	return out
}

// TestChainOfMatchesNaive: two synthetic prompts share a block hash at
// position i exactly when the naive token-level expansion says their first
// i+1 blocks are equal.
func TestChainOfMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 8).Draw(t, "blockSize")
		gen := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) segment {
			return segment{id: uint64(rapid.IntRange(0, 3).Draw(t, "id")), n: rapid.IntRange(1, 12).Draw(t, "n")}
		}), 1, 5)
		a, b := gen.Draw(t, "a"), gen.Draw(t, "b")
		ha, hb := chainOf(a, bs, nil), chainOf(b, bs, nil)
		na, nb := naiveChain(a, bs), naiveChain(b, bs)
		if len(ha) != len(na) || len(hb) != len(nb) {
			t.Fatalf("lengths %d %d, naive %d %d", len(ha), len(hb), len(na), len(nb))
		}
		for i := range min(len(ha), len(hb)) {
			if (ha[i] == hb[i]) != (na[i] == nb[i]) {
				t.Fatalf("block %d: hashes equal %v, naive blocks equal %v", i, ha[i] == hb[i], na[i] == nb[i])
			}
		}
		for _, h := range append(ha, hb...) {
			if h == 0 {
				t.Fatal("a zero hash (never an index key)")
			}
		}
	})
}

// TestTraceRequestsAttributes: a conversation's requests share origin and
// attributes, and the shares come out near the configured ones.
func TestTraceRequestsAttributes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Trace = conversationTrace(t)
	cfg.Workload.OriginShares = []float64{0.5, 0.3, 0.2}
	reqs := traceRequests(&cfg, cfg.Workload.Trace)
	byConv := map[string]*request{}
	origins := make([]int, 3)
	for _, r := range reqs {
		if first, ok := byConv[r.session]; ok {
			if first.origin != r.origin || first.attrs.DataClass != r.attrs.DataClass || first.attrs.Tenant != r.attrs.Tenant {
				t.Fatalf("conversation %s: attributes differ between its requests", r.session)
			}
			continue
		}
		byConv[r.session] = r
		origins[r.origin]++
	}
	for i, want := range cfg.Workload.OriginShares {
		got := float64(origins[i]) / float64(len(byConv))
		if got < want-0.03 || got > want+0.03 {
			t.Errorf("origin %s: share %.3f of %d conversations, want %.2f", cfg.Fleet.Regions[i], got, len(byConv), want)
		}
	}
}
