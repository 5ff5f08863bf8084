package gossip

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/regional/summary"
)

// TestMergeOrderIndependent: whatever order and however often bodies of a
// region arrive (pulls, push/pull, duplicates), the node ends up holding
// the same one: the highest generation, ties broken by body hash — so every
// controller converges on the same summary.
func TestMergeOrderIndependent(t *testing.T) {
	now := time.Now()
	var bodies [][]byte
	for gen := uint64(1); gen <= 4; gen++ {
		for variant := range 2 { // two controllers' summaries of one generation
			s, err := summary.Build(summary.Input{Region: "us-west-2", Generation: gen, BuiltAt: now.Add(time.Duration(variant)), BlockSize: 64},
				hashesFor("v"+string(rune('a'+variant)), 50+variant), summary.DefaultBuildConfig())
			if err != nil {
				t.Fatal(err)
			}
			b, _ := s.MarshalBinary()
			bodies = append(bodies, b)
		}
	}
	rapid.Check(t, func(rt *rapid.T) {
		order := rapid.SliceOfN(rapid.IntRange(0, len(bodies)-1), 1, 20).Draw(rt, "order")
		n := bareNode(t, testConfig(t, "a", "us-east-1", "unused"), &now)
		for _, i := range order {
			if err := n.receive(bodies[i], "pull"); err != nil {
				rt.Fatal(err)
			}
		}
		// The naive answer, computed without the node's own ordering: the
		// largest (generation, body hash) pair over the set received.
		type version struct{ gen, hash uint64 }
		var received []version
		for _, i := range order {
			s, _ := summary.Decode(bodies[i])
			received = append(received, version{s.Generation, xxhash.Sum64(bodies[i])})
		}
		want := slices.MaxFunc(received, func(a, b version) int {
			return cmp.Or(cmp.Compare(a.gen, b.gen), cmp.Compare(a.hash, b.hash))
		})
		got := n.regions["us-west-2"]
		if got.s.Generation != want.gen || got.hash != want.hash {
			rt.Fatalf("held (%d, %x), want (%d, %x)", got.s.Generation, got.hash, want.gen, want.hash)
		}
	})
}
