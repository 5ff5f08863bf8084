package index

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
			c0, _, ok := processUsage()
			for b.Loop() {
				buf = f.x.Lookup(f.chain, buf)
			}
			reportCPUPerOp(b, c0, ok)
			if len(buf) != c.pods || buf[0].Blocks != c.blocks {
				b.Fatalf("wrong answer: %d pods, best %v", len(buf), buf[0])
			}
		})
	}
}

// reportCPUPerOp reports the process's CPU time since c0 (every thread,
// user and system) per op as cpu-ns/op, where the OS tells (ok). On a
// shared machine it is far steadier than ns/op: time spent waiting for a
// CPU that another process holds counts in ns/op and not in it. Work of
// the runtime's other threads counts in it too.
func reportCPUPerOp(b *testing.B, c0 time.Duration, ok bool) {
	c1, _, ok1 := processUsage()
	if ok && ok1 && b.N > 0 {
		b.ReportMetric(float64(c1-c0)/float64(b.N), "cpu-ns/op")
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

// rotatingFixture is an index of 256 pods holding prefixes of `chains`
// distinct query chains (pod p holds chain c to depth
// blocks*(1+(p+c)%depths)/depths, so every chain has `depths` distinct
// drop-off depths) plus backgroundRotating blocks of their own each: more
// than 1M indexed blocks, so the blocks a lookup reads are scattered over a
// table far larger than the CPU caches, as in a real region.
type rotatingFixture struct {
	x      *Index
	chains [][]uint64
	depths int
}

const (
	rotatingChains     = 256
	backgroundRotating = 4096 // per pod: 1M blocks at 256 pods
)

var (
	rotatingMu       sync.Mutex
	rotatingFixtures = map[string]*rotatingFixture{}
)

func rotatingFixtureFor(b *testing.B, blocks, depths int) *rotatingFixture {
	key := fmt.Sprint(blocks, depths)
	rotatingMu.Lock()
	defer rotatingMu.Unlock()
	if f, ok := rotatingFixtures[key]; ok {
		return f
	}
	f := newRotatingFixture(b, blocks, depths)
	rotatingFixtures[key] = f
	return f
}

func newRotatingFixture(b *testing.B, blocks, depths int) *rotatingFixture {
	x := mustIndex(b, 256)
	f := &rotatingFixture{x: x, chains: make([][]uint64, rotatingChains), depths: depths}
	for c := range f.chains {
		f.chains[c] = make([]uint64, blocks)
		for i := range f.chains[c] {
			f.chains[c][i] = splitmix(uint64(c+1)<<40 | uint64(i))
		}
	}
	bg := make([]uint64, backgroundRotating)
	for p := 0; p < 256; p++ {
		id, err := x.AddPod(fmt.Sprint("pod-", p))
		if err != nil {
			b.Fatal(err)
		}
		for c, chain := range f.chains {
			_ = x.Register(id, TierGPU, chain[:f.depth(p, c)])
		}
		for i := range bg {
			bg[i] = splitmix(uint64(p+1)<<32 | uint64(i) | 1<<62)
		}
		_ = x.Register(id, TierGPU, bg)
	}
	return f
}

// depth is how many blocks of chain c pod slot p holds.
func (f *rotatingFixture) depth(p, c int) int {
	n := len(f.chains[c])
	return n * (1 + (p+c)%f.depths) / f.depths
}

// check verifies a lookup of chain c against the construction.
func (f *rotatingFixture) check(b *testing.B, c int, got []Match) {
	if len(got) != 256 {
		b.Fatalf("chain %d: %d pods matched, want 256", c, len(got))
	}
	for _, m := range got {
		if want := f.depth(m.Pod.Slot(), c); m.Blocks != want {
			b.Fatalf("chain %d: pod %v matched %d blocks, want %d", c, m.Pod, m.Blocks, want)
		}
	}
}

// BenchmarkLookupRotating is BenchmarkLookup with the query rotating over
// 256 distinct chains in an index of more than 1M blocks: the blocks of
// one lookup are mostly not in the CPU caches, as when a region serves
// many different prompts (the single hot chain of BenchmarkLookup flatters
// by keeping everything it reads cached).
//
// All 256 chains fit the depth hint table (see hints), so after the first
// visit each lookup is a hinted one. The .../hints=off variants clear the
// chain's hint before each lookup, so they measure a lookup of a chain
// seen for the first time (or whose hint was overwritten).
func BenchmarkLookupRotating(b *testing.B) {
	for _, c := range []struct {
		blocks, depths int
		hintsOff       bool
	}{{64, 4, false}, {1024, 16, false}, {64, 4, true}, {1024, 16, true}} {
		name := fmt.Sprintf("pods=256/blocks=%d/depths=%d", c.blocks, c.depths)
		if c.hintsOff {
			name += "/hints=off"
		}
		b.Run(name, func(b *testing.B) {
			f := rotatingFixtureFor(b, c.blocks, c.depths)
			buf := make([]Match, 0, f.x.PodCapacity())
			for i := range f.chains {
				buf = f.x.Lookup(f.chains[i], buf)
				f.check(b, i, buf)
			}
			// Visit the chains in a scrambled order, so no hardware
			// prefetcher learns the sequence.
			order := make([]int, len(f.chains))
			for i := range order {
				order[i] = int(splitmix(uint64(i)) % uint64(len(f.chains)))
			}
			b.ReportAllocs()
			b.ResetTimer()
			c0, _, ok := processUsage()
			i := 0
			for b.Loop() {
				chain := f.chains[order[i&(len(order)-1)]]
				if c.hintsOff {
					f.x.hints.entry(chain[0]).key.Store(0)
				}
				buf = f.x.Lookup(chain, buf)
				i++
			}
			reportCPUPerOp(b, c0, ok)
		})
	}
}

// BenchmarkRegisterFromEmpty is a fresh controller catching up: each op
// registers registerFromEmptyBlocks new blocks, in 64-block batches, into
// an index built without ExpectedBlocks, so its tables grow all the way
// from empty. One writer goroutine per -cpu, each its own pod.
//
// Besides blocks/s (wall clock), it reports, where the OS tells, the
// process's CPU time (user and system, every thread: the writers, the GC,
// the page faults of new tables and slab) as cpu-blocks/s, blocks per
// CPU-second, which other processes on a shared machine disturb far less,
// and minor page faults per 1,000 blocks (faults/kblock).
func BenchmarkRegisterFromEmpty(b *testing.B) {
	const (
		batch                   = 64
		registerFromEmptyBlocks = 1 << 22
	)
	writers := runtime.GOMAXPROCS(0)
	b.ReportAllocs()
	var total, cpu time.Duration
	var faults int64
	usageOK := true
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		runtime.GC()
		x := mustIndex(b, 256)
		ids := make([]PodID, writers)
		for w := range ids {
			ids[w], _ = x.AddPod(fmt.Sprint("writer-", w))
		}
		b.StartTimer()
		c0, f0, ok0 := processUsage()
		t0 := time.Now()
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hashes := make([]uint64, batch)
				per := registerFromEmptyBlocks / writers
				for n := 0; n < per; n += batch {
					for j := range hashes {
						hashes[j] = splitmix(uint64(i)<<48 | uint64(w)<<40 | uint64(n+j))
					}
					if err := x.Register(ids[w], TierGPU, hashes); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		total += time.Since(t0)
		c1, f1, ok1 := processUsage()
		usageOK = usageOK && ok0 && ok1
		cpu += c1 - c0
		faults += f1 - f0
	}
	blocks := float64(b.N) * registerFromEmptyBlocks
	b.ReportMetric(blocks/total.Seconds(), "blocks/s")
	if usageOK && cpu > 0 {
		b.ReportMetric(blocks/cpu.Seconds(), "cpu-blocks/s")
		b.ReportMetric(float64(faults)/blocks*1000, "faults/kblock")
	}
}

// BenchmarkLookupUnderWrites measures single lookups (the rotating 64-block,
// 4-depth workload) while another goroutine registers 2M blocks per second
// into the same index (64-block batches, paced), and reports the median and
// 99th percentile latency of the lookups.
func BenchmarkLookupUnderWrites(b *testing.B) {
	const (
		rate  = 2_000_000 // blocks per second
		batch = 64
	)
	f := newRotatingFixture(b, 64, 4)
	writer, err := f.x.AddPod("writer")
	if err != nil {
		// The fixture uses all 256 slots: write as pod 0.
		writer = f.x.pods.id(0)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var written atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		hashes := make([]uint64, batch)
		start := time.Now()
		for n := 0; ; n += batch {
			select {
			case <-stop:
				return
			default:
			}
			// Pace: batch n is due at n/rate seconds after start (a sleep
			// lasts at least a timer tick, so batches come in bursts that
			// keep the average rate).
			due := start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			for j := range hashes {
				hashes[j] = splitmix(uint64(3)<<60 | uint64(n+j))
			}
			_ = f.x.Register(writer, TierGPU, hashes)
			written.Add(batch)
		}
	}()
	buf := make([]Match, 0, f.x.PodCapacity())
	lat := make([]time.Duration, 0, 1<<20)
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	i := 0
	for b.Loop() {
		c := f.chains[int(splitmix(uint64(i))%rotatingChains)]
		s := time.Now()
		buf = f.x.Lookup(c, buf)
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(s))
		}
		i++
	}
	elapsed := time.Since(t0)
	b.StopTimer()
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	}
	b.ReportMetric(float64(written.Load())/elapsed.Seconds(), "writes/s")
}

// BenchmarkGrowthPause is the pause a writer sees while tables grow: one
// writer registers growthPauseBlocks new blocks one call at a time into an
// index built without ExpectedBlocks, timing every call, once with the
// incremental growth and once with stop-the-world growth (the whole rehash
// in the insertion that passes 3/4 load, as before), in the same run.
//
// The figures to compare are about the growths into the largest table size
// that at least 64 shards reached (growth-slots slots):
//   - growth-start-ns, the median over those growths of the call that
//     started each: stop-the-world, the whole rehash; incremental, the
//     allocation of the new table;
//   - growth-step-p99-ns, the 99th percentile of the other calls that took
//     part in them (incremental: copying 256 slots each, the last one also
//     publishing; stop-the-world has none).
//
// The worst pause of a growth is the larger of the two. They are a median
// and a percentile rather than a maximum because on a busy machine the
// slowest single call is the one the scheduler preempted; max-ns (the
// slowest call of all) and p99.99-ns are reported too, as is p50-ns, a
// plain insertion.
func BenchmarkGrowthPause(b *testing.B) {
	const growthPauseBlocks = 1 << 22
	for _, c := range []struct {
		name string
		step int
	}{{"incremental", defaultGrowStep}, {"stop-the-world", stopTheWorld}} {
		b.Run("growth="+c.name, func(b *testing.B) {
			lat := make([]time.Duration, growthPauseBlocks)
			var total time.Duration
			var maxNs, p9999Ns, p50Ns, startNs, stepNs, slots float64
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				runtime.GC()
				x := mustIndex(b, 256)
				x.growStep = c.step
				id, err := x.AddPod("writer")
				if err != nil {
					b.Fatal(err)
				}
				// The calls that took part in growths, by the size
				// grown into: the ones that started a growth, the rest.
				starts := map[uint][]time.Duration{}
				steps := map[uint][]time.Duration{}
				h := make([]uint64, 1)
				b.StartTimer()
				for n := range lat {
					h[0] = splitmix(uint64(i)<<40 | uint64(n))
					s := &x.shards[shardOf(h[0])]
					before, growing := s.tab.Load(), s.next
					t0 := time.Now()
					_ = x.Register(id, TierGPU, h)
					d := time.Since(t0)
					lat[n] = d
					total += d
					switch after := s.tab.Load(); {
					case growing != nil:
						steps[growing.bits] = append(steps[growing.bits], d)
					case s.next != nil:
						starts[s.next.bits] = append(starts[s.next.bits], d)
					case before != nil && after.bits != before.bits:
						starts[after.bits] = append(starts[after.bits], d)
					}
				}
				b.StopTimer()
				var top uint
				for bits, ds := range starts {
					if len(ds) >= 64 && bits > top {
						top = bits
					}
				}
				if ds := starts[top]; len(ds) > 0 {
					slices.Sort(ds)
					startNs += float64(ds[len(ds)/2])
					slots += float64(uint64(1) << top)
				}
				if ds := steps[top]; len(ds) > 0 {
					slices.Sort(ds)
					stepNs += float64(ds[len(ds)*99/100])
				}
				slices.Sort(lat)
				maxNs += float64(lat[len(lat)-1])
				p9999Ns += float64(lat[len(lat)-len(lat)/10000])
				p50Ns += float64(lat[len(lat)/2])
				b.StartTimer()
			}
			n := float64(b.N)
			b.ReportMetric(startNs/n, "growth-start-ns")
			b.ReportMetric(stepNs/n, "growth-step-p99-ns")
			b.ReportMetric(slots/n, "growth-slots")
			b.ReportMetric(maxNs/n, "max-ns")
			b.ReportMetric(p9999Ns/n, "p99.99-ns")
			b.ReportMetric(p50Ns/n, "p50-ns")
			b.ReportMetric(n*growthPauseBlocks/total.Seconds(), "blocks/s")
		})
	}
}

// BenchmarkEvict is a pod evicting blocks spread over a large table: an
// index of 256 pods holding evictPodBlocks blocks each (1M blocks), and
// each op evicts all the blocks of one pod, in a scrambled order (not the
// order they were registered in, so neither their slots nor their slab
// entries are in sequence), in Evict calls of evictCall hashes. The pod's
// blocks are registered back with the timer stopped; the pods are evicted
// in turn, so the lines of an op's blocks were last touched 255 ops
// before. Reports blocks/s.
func BenchmarkEvict(b *testing.B) {
	const (
		pods           = 256
		evictPodBlocks = 4096
		evictCall      = 256
	)
	x := mustIndex(b, pods)
	ids := make([]PodID, pods)
	blocks := make([][]uint64, pods)
	for p := range ids {
		id, err := x.AddPod(fmt.Sprint("pod-", p))
		if err != nil {
			b.Fatal(err)
		}
		ids[p] = id
		blocks[p] = make([]uint64, evictPodBlocks)
		for i := range blocks[p] {
			blocks[p][i] = splitmix(uint64(p+1)<<32 | uint64(i))
		}
		for i := 0; i < evictPodBlocks; i += 64 {
			_ = x.Register(id, TierGPU, blocks[p][i:i+64])
		}
	}
	// The scrambled order: a fixed permutation of each pod's blocks.
	scrambled := make([][]uint64, pods)
	for p := range scrambled {
		s := append([]uint64(nil), blocks[p]...)
		for i := len(s) - 1; i > 0; i-- {
			j := int(splitmix(uint64(p)<<32|uint64(i)) % uint64(i+1))
			s[i], s[j] = s[j], s[i]
		}
		scrambled[p] = s
	}
	want := x.Stats().Blocks
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		p := n % pods
		for i := 0; i < evictPodBlocks; i += evictCall {
			if err := x.Evict(ids[p], TierGPU, scrambled[p][i:i+evictCall]); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if got := x.Stats().Blocks; got != want-evictPodBlocks {
			b.Fatalf("after evicting pod %d: %d blocks indexed, want %d", p, got, want-evictPodBlocks)
		}
		for i := 0; i < evictPodBlocks; i += 64 {
			_ = x.Register(ids[p], TierGPU, blocks[p][i:i+64])
		}
		b.StartTimer()
		n++
	}
	b.ReportMetric(float64(n)*evictPodBlocks/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkFill is writing answers alone (pods.fill, most of a lookup
// whose bitmaps are in cache): 4 groups of 64 pods of 256, every 4th
// slot each, as a 4-depth rotating lookup drops them; and 4 of a random
// half.
func BenchmarkFill(b *testing.B) {
	x := mustIndex(b, 256)
	for p := 0; p < 256; p++ {
		if _, err := x.AddPod(fmt.Sprint("pod-", p)); err != nil {
			b.Fatal(err)
		}
	}
	dst := make([]Match, 256)
	for _, c := range []struct {
		name string
		set  [4]uint64
	}{
		{"every4th", [4]uint64{0x1111111111111111, 0x1111111111111111, 0x1111111111111111, 0x1111111111111111}},
		{"random", [4]uint64{splitmix(1), splitmix(2), splitmix(3), splitmix(4)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for k := 1; k <= 4; k++ {
					x.pods.fill(dst, c.set[:], k)
				}
			}
		})
	}
}
