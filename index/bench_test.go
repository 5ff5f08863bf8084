package index

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// lookupFixture is an index and the naive reference holding the same state:
// pods pods hold prefixes of one query chain of `blocks` blocks at `depths`
// distinct depths (pod p at depth blocks*(1+p%depths)/depths), and each pod
// also holds `background` blocks of its own, so the tables are not trivially
// small.
type lookupFixture struct {
	x     *Index
	ref   *naive
	chain []uint64
}

const backgroundPerPod = 1024

var (
	fixturesMu sync.Mutex
	fixtures   = map[string]*lookupFixture{}
)

func lookupFixtureFor(b *testing.B, pods, blocks, depths int) *lookupFixture {
	key := fmt.Sprint(pods, blocks, depths)
	fixturesMu.Lock()
	defer fixturesMu.Unlock()
	if f, ok := fixtures[key]; ok {
		return f
	}
	x := mustIndex(b, 256)
	f := &lookupFixture{x: x, ref: newNaive(), chain: make([]uint64, blocks)}
	for i := range f.chain {
		f.chain[i] = splitmix(uint64(i) + 1)
	}
	bg := make([]uint64, backgroundPerPod)
	for p := 0; p < pods; p++ {
		name := fmt.Sprint("pod-", p)
		id, err := x.AddPod(name)
		if err != nil {
			b.Fatal(err)
		}
		f.ref.addPod(name)
		d := blocks * (1 + p%depths) / depths
		_ = x.Register(id, TierGPU, f.chain[:d])
		f.ref.register(name, TierGPU, f.chain[:d])
		for i := range bg {
			bg[i] = splitmix(uint64(p+1)<<32 | uint64(i))
		}
		_ = x.Register(id, TierGPU, bg)
		f.ref.register(name, TierGPU, bg)
	}
	fixtures[key] = f
	return f
}

var lookupCases = []struct{ pods, blocks, depths int }{
	{256, 64, 4},
	{256, 1024, 16},
}

func BenchmarkLookup(b *testing.B) {
	for _, c := range lookupCases {
		b.Run(fmt.Sprintf("pods=%d/blocks=%d/depths=%d", c.pods, c.blocks, c.depths), func(b *testing.B) {
			f := lookupFixtureFor(b, c.pods, c.blocks, c.depths)
			buf := make([]Match, 0, f.x.PodCapacity())
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				buf = f.x.Lookup(f.chain, buf)
			}
			if len(buf) != c.pods || buf[0].Blocks != c.blocks {
				b.Fatalf("wrong answer: %d pods, best %v", len(buf), buf[0])
			}
		})
	}
}

func BenchmarkNaiveLookup(b *testing.B) {
	for _, c := range lookupCases[:1] {
		b.Run(fmt.Sprintf("pods=%d/blocks=%d/depths=%d", c.pods, c.blocks, c.depths), func(b *testing.B) {
			f := lookupFixtureFor(b, c.pods, c.blocks, c.depths)
			var res []namedMatch
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				res = f.ref.lookup(f.chain)
			}
			if len(res) != c.pods || res[0].Blocks != c.blocks {
				b.Fatalf("wrong answer: %d pods", len(res))
			}
		})
	}
}

// BenchmarkLookupParallel shows that readers scale: no lock, no shared write.
func BenchmarkLookupParallel(b *testing.B) {
	f := lookupFixtureFor(b, 256, 64, 4)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]Match, 0, f.x.PodCapacity())
		for pb.Next() {
			buf = f.x.Lookup(f.chain, buf)
		}
	})
}

// BenchmarkRegister measures block registrations per second: each goroutine
// (one per -cpu) owns a pod and registers batches of 64 new blocks, the size
// of a KV event from a 1k-token prefill at block size 16. "presized" is an
// index configured with ExpectedBlocks for 16M blocks (more than a run
// registers); "grow" starts empty and doubles its tables as it fills.
func BenchmarkRegister(b *testing.B) {
	for _, c := range []struct {
		name     string
		expected int
	}{{"presized", 16 << 20}, {"grow", 0}} {
		b.Run(c.name, func(b *testing.B) {
			const batch = 64
			x, err := New(Config{PodCapacity: 256, ExpectedBlocks: c.expected})
			if err != nil {
				b.Fatal(err)
			}
			var next atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				g := next.Add(1)
				id, err := x.AddPod(fmt.Sprint("writer-", g))
				if err != nil {
					b.Error(err)
					return
				}
				hashes := make([]uint64, batch)
				var n uint64
				for pb.Next() {
					for i := range hashes {
						n++
						hashes[i] = splitmix(g<<40 | n)
					}
					if err := x.Register(id, TierGPU, hashes); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)*batch/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkMemory builds an index of n distinct blocks (each held by one of
// 256 pods, registered as 64-block chains; or of 1,024 pods, the most an
// index holds: docs/capacity.md) and reports the heap it holds per block,
// measured by the runtime after a GC, and the index's own estimate.
func BenchmarkMemory(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
		pods int
	}{{"1M", 1 << 20, 256}, {"10M", 10 << 20, 256}, {"1M/pods=1024", 1 << 20, 1024}} {
		b.Run("blocks="+c.name, func(b *testing.B) {
			var perBlock, estimate float64
			b.ReportAllocs()
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				x := mustIndex(b, c.pods)
				ids := make([]PodID, c.pods)
				for p := range ids {
					ids[p], _ = x.AddPod(fmt.Sprint(p))
				}
				chain := make([]uint64, 64)
				for i := 0; i < c.n; i += len(chain) {
					for j := range chain {
						chain[j] = splitmix(uint64(i + j + 1))
					}
					_ = x.Register(ids[(i/64)%c.pods], TierGPU, chain)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				st := x.Stats()
				if st.Blocks != c.n {
					b.Fatalf("indexed %d blocks, want %d", st.Blocks, c.n)
				}
				perBlock = float64(after.HeapAlloc-before.HeapAlloc) / float64(c.n)
				estimate = float64(st.Bytes) / float64(c.n)
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perBlock, "B/block")
			b.ReportMetric(estimate, "est-B/block")
		})
	}
}
