// Package routetest holds the fixtures the decision core's benchmarks share
// with the controller's: a 256-pod region whose pods hold prefixes of one
// query chain at several depths, and a percentile reporter. Test code only;
// it imports route, index and gorgo.
package routetest

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/route"
)

// Chain is n distinct block hashes that start with prefix (so two chains
// with the same prefix share nothing but that number).
func Chain(prefix uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = prefix<<32 | uint64(i+1)
	}
	return c
}

// Decider256 is a region of 256 pods; the returned request's chain is 128
// blocks (8k tokens at 64 tokens per block); pods hold prefixes of it at
// `depths` distinct depths, plus 1k blocks each of their own; loads vary.
func Decider256(tb testing.TB, depths int) (*route.Decider, *route.Request) {
	tb.Helper()
	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		tb.Fatal(err)
	}
	reg := route.NewRegistry(idx)
	c := Chain(1, 128)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 256; i++ {
		p, _, err := reg.Upsert(route.PodInfo{Name: fmt.Sprintf("pod-%03d", i), Endpoint: fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256), Model: "m", Profile: "h100"})
		if err != nil {
			tb.Fatal(err)
		}
		_ = idx.Register(p.ID, index.TierGPU, c[:128*(1+i%depths)/depths])
		_ = idx.Register(p.ID, index.TierGPU, Chain(uint64(1000+i), 1024))
		for k := rng.IntN(8); k > 0; k-- {
			n := rng.IntN(4000)
			p.Admit(n, time.Duration(n)*360*time.Microsecond, time.Now())
		}
	}
	model, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		tb.Fatal(err)
	}
	dec, err := route.NewDecider(route.DefaultConfig(), idx, reg, model, time.Now)
	if err != nil {
		tb.Fatal(err)
	}
	return dec, &route.Request{Model: "m", Chain: c, BlockSize: 64, PromptTokens: 128*64 + 10}
}

// ReportPercentiles reports the median and the 99th percentile of lat as
// prefix+"p50-ns" and prefix+"p99-ns".
func ReportPercentiles(b *testing.B, lat []time.Duration, prefix string) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), prefix+"p99-ns")
}

// ReportMachineFloor reports what this machine adds to a computation that
// does the same work every time: it times as many runs (at most 100,000)
// of an arithmetic loop sized to take about lat's median each (no memory traffic, no allocation) and
// reports their median and 99th percentile as floor-p50-ns and
// floor-p99-ns. Interrupts, scheduling and the other load of a shared
// machine stretch a few runs of anything; a benchmark's own p99 cannot be
// told apart from the floor's, so it is reported beside it, measured in the
// same run. Call it with the timer stopped.
func ReportMachineFloor(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	n := min(len(lat), 100_000)
	// Calibrate: the fastest of a few timings of a fixed count.
	const probe = 1 << 16
	var sink uint64
	best := time.Duration(1<<63 - 1)
	for range 5 {
		t0 := time.Now()
		sink += spin(probe)
		best = min(best, time.Since(t0))
	}
	iters := int(float64(probe) * float64(sorted[len(sorted)/2]) / float64(max(best, 1)))
	floor := make([]time.Duration, n)
	for i := range floor {
		t0 := time.Now()
		sink += spin(iters)
		floor[i] = time.Since(t0)
	}
	runtime.KeepAlive(sink)
	ReportPercentiles(b, floor, "floor-")
}

// spin is n steps of a linear congruential generator: pure arithmetic,
// each step depending on the last.
func spin(n int) uint64 {
	x := uint64(1)
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}
