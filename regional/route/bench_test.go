package route_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/route/routetest"
	"github.com/meridian-llm/meridian/regional/summary"
)

// BenchmarkDecide is the decision alone (no tokenization) at 256 pods; it
// reports the median and p99 of individual decisions.
func BenchmarkDecide(b *testing.B) {
	for _, depths := range []int{4, 16, 128} {
		b.Run(fmt.Sprintf("pods=256/blocks=128/depths=%d", depths), func(b *testing.B) {
			dec, r := routetest.Decider256(b, depths)
			lat := make([]time.Duration, 0, b.N)
			var d route.Decision
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				err := dec.DecideInto(r, &d)
				lat = append(lat, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			routetest.ReportPercentiles(b, lat, "")
			routetest.ReportMachineFloor(b, lat)
		})
	}
}

// BenchmarkPlace is the whole placement at 256 local pods and 3 or 10
// remote regions: the local decision, each remote region's candidate from
// its summary (a filter-based depth estimate over 1M blocks), and the cost
// comparison. Tokenization excluded. Reports the median and p99.
func BenchmarkPlace(b *testing.B) {
	for _, remotes := range []int{3, 10} {
		b.Run(fmt.Sprintf("pods=256/remotes=%d", remotes), func(b *testing.B) {
			dec, r := routetest.Decider256(b, 16)
			var sums []*summary.Summary
			for i := 0; i < remotes; i++ {
				hashes := make([]uint64, 0, 1<<20)
				hashes = append(hashes, r.Chain[:64*(i%2+1)]...)
				for j := len(hashes); j < 1<<20; j++ {
					hashes = append(hashes, splitmixBench(uint64(i)<<40|uint64(j)))
				}
				s, err := summary.Build(summary.Input{Region: fmt.Sprintf("remote-%d", i), Generation: 1, BuiltAt: time.Now(), BlockSize: 64,
					Models: []string{"m"}, Load: []summary.ProfileLoad{{Profile: "h100", Pods: 8, Running: 16, Slots: 2048}}}, hashes, summary.DefaultBuildConfig())
				if err != nil {
					b.Fatal(err)
				}
				sums = append(sums, s)
			}
			shares := gorgo.NewShareTracker(time.Minute)
			cands := make([]gorgo.Candidate, 0, remotes)
			lat := make([]time.Duration, 0, b.N)
			var pl route.Placement
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				now := t0
				cands = cands[:0]
				for j, s := range sums {
					c := s.Candidate(now, r.Chain, r.PromptTokens)
					c.RTTMs = float64(65 + 10*j)
					cands = append(cands, c)
				}
				if err := dec.PlaceInto(r, "home", true, cands, shares, &pl); err != nil {
					b.Fatal(err)
				}
				pl.Record(shares, now)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			routetest.ReportPercentiles(b, lat, "")
			routetest.ReportMachineFloor(b, lat)
		})
	}
}

func splitmixBench(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31) | 1
}

// BenchmarkBacklogMs is the region's mean backlog per pod, which a
// controller that may forward computes for every request (Trend.Note):
// one pass over the pods at 256 of them.
func BenchmarkBacklogMs(b *testing.B) {
	dec, _ := routetest.Decider256(b, 16)
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	sink := 0.0
	for i := 0; i < b.N; i++ {
		sink += dec.BacklogMs(now)
	}
	if sink < 0 {
		b.Fatal("negative backlog")
	}
}
