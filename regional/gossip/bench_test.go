package gossip

import (
	"fmt"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/summary"
)

// BenchmarkViewCandidates: the remote half of a routing decision — read
// the view, estimate each remote region's cached prefix from its 64 KiB
// summary of 1M blocks, fill its gorgo candidate priced at its soonest
// pool — for a 100k-token chain
// (1,562 blocks), with 3 and 10 remote regions.
func BenchmarkViewCandidates(b *testing.B) {
	for _, regions := range []int{3, 10} {
		b.Run(fmt.Sprintf("regions=%d", regions), func(b *testing.B) {
			v := &RegionsView{Local: "home", byName: map[string]int{}}
			now := time.Now()
			var chain []uint64
			for i := range regions {
				name := fmt.Sprintf("region-%02d", i)
				hs := hashesFor(name, 1_000_000)
				if i == 0 {
					chain = hs[:1562]
				}
				s, err := summary.Build(summary.Input{Region: name, Generation: 1, BuiltAt: now, BlockSize: 64,
					Load: []summary.ProfileLoad{{Profile: "h100", Pods: 8}}}, hs, summary.DefaultBuildConfig())
				if err != nil {
					b.Fatal(err)
				}
				v.Regions = append(v.Regions, RegionView{Region: name, Summary: s, ReceivedAt: now, Live: true, Alive: 1,
					RTT: 65 * time.Millisecond, RTTSource: RTTDirect})
				v.byName[name] = i
			}
			var n Node
			n.view.Store(v)
			dst := make([]gorgo.Candidate, 0, regions)
			m, err := gorgo.New(gorgo.DefaultConfig())
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				dst = n.View().Candidates(now, "", chain, 100_000, nil, m, dst[:0])
			}
			if len(dst) != regions {
				b.Fatalf("%d candidates", len(dst))
			}
		})
	}
}
