package gossip

import (
	"testing"
	"time"

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
		var wantGen, wantHash uint64
		for _, i := range order {
			if err := n.receive(bodies[i], "pull"); err != nil {
				rt.Fatal(err)
			}
		}
		// The naive answer: the maximum over the set received.
		for _, i := range order {
			s, _ := summary.Decode(bodies[i])
			if g, hh := s.Generation, bodyHash(bodies[i]); newer(g, hh, wantGen, wantHash) {
				wantGen, wantHash = g, hh
			}
		}
		got := n.regions["us-west-2"]
		if got.s.Generation != wantGen || got.hash != wantHash {
			rt.Fatalf("held (%d, %x), want (%d, %x)", got.s.Generation, got.hash, wantGen, wantHash)
		}
	})
}
