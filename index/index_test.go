package index

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustIndex(t testing.TB, capacity int) *Index {
	t.Helper()
	x, err := New(Config{PodCapacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []int{64, 128, 256, 1024} {
		if err := (Config{PodCapacity: c}).Validate(); err != nil {
			t.Errorf("capacity %d: %v", c, err)
		}
	}
	for _, c := range []int{0, 63, 100, 1088, -64} {
		err := (Config{PodCapacity: c}).Validate()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("capacity %d: got %v, want ErrInvalidConfig", c, err)
		}
		if _, err := New(Config{PodCapacity: c}); err == nil {
			t.Errorf("New with capacity %d succeeded", c)
		}
	}
}

func TestShardLayout(t *testing.T) {
	if sz := unsafe.Sizeof(shard{}); sz%cacheLine != 0 || sz > 2*cacheLine {
		t.Fatalf("shard is %d bytes, not a multiple of %d (at most two)", sz, cacheLine)
	}
	// The fields lookups read and the writer state an insertion writes
	// lie in different 64-byte lines, the latter in one line.
	var s shardState
	if off := unsafe.Offsetof(s.tab) + unsafe.Sizeof(s.tab); off > 64 {
		t.Fatalf("the fields lookups read end at byte %d, past the first line", off)
	}
	if lo, hi := unsafe.Offsetof(s.mu), unsafe.Offsetof(s.cursor)+unsafe.Sizeof(s.cursor); lo != 64 || hi != 128 {
		t.Fatalf("the writer state is bytes [%d, %d), want [64, 128)", lo, hi)
	}
	x := mustIndex(t, 256)
	if addr := uintptr(unsafe.Pointer(&x.shards[0])); addr%64 != 0 {
		t.Fatalf("shard array at %#x is not cache-line aligned", addr)
	}
}

func TestFibonacciShardSpread(t *testing.T) {
	// Structured keys (consecutive integers, multiples of 256) still spread.
	for _, stride := range []uint64{1, 256, 1 << 20} {
		var counts [numShards]int
		const n = 256 * 200
		for i := uint64(1); i <= n; i++ {
			counts[shardOf(i*stride)]++
		}
		lo, hi := n, 0
		for _, c := range counts {
			lo, hi = min(lo, c), max(hi, c)
		}
		if lo < 100 || hi > 300 {
			t.Errorf("stride %d: shard loads between %d and %d, want near 200", stride, lo, hi)
		}
	}
}

func TestRefCountsAndTiers(t *testing.T) {
	x := mustIndex(t, 64)
	a, _ := x.AddPod("a")
	chain := []uint64{1, 2, 3}
	_ = x.Register(a, TierGPU, chain)
	_ = x.Register(a, TierGPU, chain[:1]) // duplicate announcement of block 1
	_ = x.Register(a, TierCPU, chain[1:2])
	if got := x.Lookup(chain, nil); len(got) != 1 || got[0].Blocks != 3 {
		t.Fatalf("lookup = %v", got)
	}
	if got := x.TierProfile(a, chain); got != (TierCounts{TierGPU: 3}) {
		t.Fatalf("profile = %v", got)
	}
	// Evicting an absent block or an absent tier is a no-op.
	_ = x.Evict(a, TierGPU, []uint64{99})
	_ = x.Evict(a, TierDisk, chain)
	// One GPU eviction of block 1 leaves the duplicate.
	_ = x.Evict(a, TierGPU, chain[:1])
	if got := x.Lookup(chain, nil); len(got) != 1 || got[0].Blocks != 3 {
		t.Fatalf("after one of two evictions: %v", got)
	}
	// Block 2 leaves GPU but stays on CPU.
	_ = x.Evict(a, TierGPU, chain[1:2])
	if got := x.TierProfile(a, chain); got != (TierCounts{TierGPU: 2, TierCPU: 1}) {
		t.Fatalf("profile = %v", got)
	}
	_ = x.Evict(a, TierGPU, chain[:1])
	if got := x.Lookup(chain, nil); len(got) != 0 {
		t.Fatalf("block 1 evicted, lookup = %v", got)
	}
	if st := x.Stats(); st.Blocks != 2 || st.PodBlocks[a.Slot()] != 2 {
		t.Fatalf("stats %+v", st)
	}
	if err := x.ClearPod(a); err != nil {
		t.Fatal(err)
	}
	if st := x.Stats(); st.Blocks != 0 || st.PodBlocks[a.Slot()] != 0 || st.Details != 0 {
		t.Fatalf("after clear: %+v", st)
	}
	if x.offloaded[a.Slot()].Load() != 0 {
		t.Fatal("offloaded count not reset by clear")
	}
}

func TestPodSlotsTwoPhaseRemoval(t *testing.T) {
	x := mustIndex(t, 64)
	ids := make([]PodID, 64)
	for i := range ids {
		var err error
		if ids[i], err = x.AddPod(fmt.Sprintf("p%d", i)); err != nil {
			t.Fatal(err)
		}
		_ = x.Register(ids[i], TierGPU, []uint64{uint64(1000 + i), 7})
	}
	if _, err := x.AddPod("extra"); !errors.Is(err, ErrFull) {
		t.Fatalf("65th pod: %v", err)
	}
	victim := ids[5]
	if err := x.RemovePod(victim); err != nil {
		t.Fatal(err)
	}
	// Dead at once: not returned, even though its bits are still set.
	for _, m := range x.Lookup([]uint64{7}, nil) {
		if m.Pod == victim {
			t.Fatal("removed pod returned")
		}
	}
	// Its slot is not reusable before the sweep.
	if _, err := x.AddPod("new"); !errors.Is(err, ErrFull) {
		t.Fatalf("slot reused before sweep: %v", err)
	}
	for p := x.SweepStep(3); p.Active || p.WaitingSlots > 0; p = x.SweepStep(3) {
	}
	nw, err := x.AddPod("new")
	if err != nil {
		t.Fatal(err)
	}
	if nw.Slot() != victim.Slot() || nw.Gen() == victim.Gen() {
		t.Fatalf("new pod %v, victim %v: want same slot, new generation", nw, victim)
	}
	if got := x.Lookup([]uint64{1005}, nil); len(got) != 0 {
		t.Fatalf("new pod inherited the old pod's block: %v", got)
	}
	if err := x.Register(victim, TierGPU, []uint64{1}); !errors.Is(err, ErrUnknownPod) {
		t.Fatalf("stale PodID registered: %v", err)
	}
	if _, ok := x.PodName(victim); ok {
		t.Fatal("stale PodID has a name")
	}
	if st := x.Stats(); st.Sweep.Passes != 1 || st.Sweep.FreedSlots != 1 {
		t.Fatalf("sweep stats %+v", st.Sweep)
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	x := mustIndex(t, 256)
	chain := make([]uint64, 64)
	for i := range chain {
		chain[i] = splitmix(uint64(i) + 1)
	}
	for p := 0; p < 256; p++ {
		id, _ := x.AddPod(fmt.Sprint(p))
		_ = x.Register(id, TierGPU, chain[:16*(1+p%4)])
	}
	buf := make([]Match, 0, x.PodCapacity())
	allocs := testing.AllocsPerRun(200, func() { buf = x.Lookup(chain, buf) })
	if allocs != 0 {
		t.Fatalf("Lookup allocates %.1f times per call", allocs)
	}
	if len(buf) != 256 || buf[0].Blocks != 64 || buf[255].Blocks != 16 {
		t.Fatalf("unexpected result: %d matches, first %v last %v", len(buf), buf[0], buf[len(buf)-1])
	}
}

// TestConcurrentStress runs writers, readers, a pod killer and the sweeper at
// once (run it under -race) and checks the invariants: a lookup started after
// RemovePod returned never returns that pod; no pod incarnation ever matches
// blocks only another incarnation registered; counts add up at quiescence.
// TestConcurrentStress runs with chains short enough for the sequential
// search and long enough for the parallel rounds.
func TestConcurrentStress(t *testing.T) {
	for _, n := range []int{24, lookupParallelFrom + 44} {
		t.Run(fmt.Sprint("chain=", n), func(t *testing.T) { testConcurrentStress(t, n) })
	}
}

func testConcurrentStress(t *testing.T, chainLen int) {
	const (
		capacity = 64
		pods     = 48
		rounds   = 300
	)
	x := mustIndex(t, capacity)
	ctx, cancel := context.WithCancel(context.Background())
	var sweeper sync.WaitGroup
	sweeper.Add(1)
	go func() {
		defer sweeper.Done()
		for ctx.Err() == nil {
			x.SweepStep(50)
		}
	}()

	// chainOf is the private chain of one pod incarnation.
	chainOf := func(id PodID) []uint64 {
		c := make([]uint64, chainLen)
		for i := range c {
			c[i] = splitmix(uint64(id)<<16 | uint64(i))
		}
		return c
	}
	shared := make([]uint64, chainLen) // every pod also holds a prefix of this
	for i := range shared {
		shared[i] = splitmix(1<<60 + uint64(i))
	}

	var clock atomic.Int64
	var killedAt sync.Map // PodID -> clock value after RemovePod returned
	var violations atomic.Int64
	report := func(format string, args ...any) {
		if violations.Add(1) <= 5 {
			t.Errorf(format, args...)
		}
	}

	// Each writer adds pod incarnations, registers, evicts, sometimes clears,
	// keeps up to 4 alive and removes the oldest beyond that.
	type survivor struct {
		private   []uint64
		sharedLen int
	}
	var writers sync.WaitGroup
	final := make([]map[PodID]survivor, 4)
	for w := 0; w < 4; w++ {
		writers.Add(1)
		final[w] = map[PodID]survivor{}
		go func(w int) {
			defer writers.Done()
			var kept []PodID
			remove := func(id PodID) {
				if err := x.RemovePod(id); err != nil {
					report("remove %v: %v", id, err)
				}
				killedAt.Store(id, clock.Add(1))
				delete(final[w], id)
			}
			for r := 0; r < rounds; r++ {
				id, err := x.AddPod(fmt.Sprintf("w%d-r%d", w, r))
				if errors.Is(err, ErrFull) {
					continue
				}
				c := chainOf(id)
				sharedLen := 1 + r%chainLen
				_ = x.Register(id, TierGPU, c)
				_ = x.Register(id, TierGPU, shared[:sharedLen])
				_ = x.Evict(id, TierGPU, c[chainLen/2:])
				if r%7 == 0 {
					_ = x.ClearPod(id)
					_ = x.Register(id, TierGPU, c[:chainLen/2])
					_ = x.Register(id, TierGPU, shared[:sharedLen])
				}
				if r%3 != 0 {
					remove(id)
					continue
				}
				final[w][id] = survivor{c[:chainLen/2], sharedLen}
				if kept = append(kept, id); len(kept) > 4 {
					remove(kept[0])
					kept = kept[1:]
				}
			}
		}(w)
	}

	// Readers check the invariants on every answer.
	var readers sync.WaitGroup
	stopReaders := make(chan struct{})
	for rd := 0; rd < 3; rd++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]Match, 0, capacity)
			for i := 0; ; i++ {
				select {
				case <-stopReaders:
					return
				default:
				}
				start := clock.Load()
				buf = x.Lookup(shared, buf)
				for _, m := range buf {
					if k, ok := killedAt.Load(m.Pod); ok && k.(int64) <= start {
						report("lookup started at %d returned %v, removed at %d", start, m.Pod, k)
					}
				}
				// Ask for the chain of some incarnation: only it may match.
				probe := PodID(uint64(1+i%5)<<16 | uint64(i%capacity))
				for _, m := range x.Lookup(chainOf(probe), buf) {
					if m.Pod != probe {
						report("%v matched blocks of %v", m.Pod, probe)
					}
				}
			}
		}()
	}
	writers.Wait()
	close(stopReaders)
	readers.Wait()
	cancel()
	sweeper.Wait()
	for p := x.SweepStep(1 << 20); p.Active || p.WaitingSlots > 0; p = x.SweepStep(1 << 20) {
	}

	// Quiescence: exactly the surviving incarnations' blocks remain.
	st := x.Stats()
	live, private, sharedMax := 0, 0, 0
	for w := range final {
		for id, sv := range final[w] {
			live++
			private += len(sv.private)
			sharedMax = max(sharedMax, sv.sharedLen)
			if got := st.PodBlocks[id.Slot()]; got != len(sv.private)+sv.sharedLen {
				t.Errorf("survivor %v holds %d blocks, want %d", id, got, len(sv.private)+sv.sharedLen)
			}
			got := x.Lookup(sv.private, nil)
			if len(got) != 1 || got[0].Pod != id || got[0].Blocks != len(sv.private) {
				t.Fatalf("survivor %v: lookup %v", id, got)
			}
		}
	}
	if st.LivePods != live {
		t.Fatalf("%d live pods, want %d", st.LivePods, live)
	}
	if st.Blocks != private+sharedMax {
		t.Fatalf("index holds %d blocks, want %d private + %d shared", st.Blocks, private, sharedMax)
	}
}

func TestAppendHashes(t *testing.T) {
	x := mustIndex(t, 64)
	a, _ := x.AddPod("a")
	b, _ := x.AddPod("b")
	_ = x.Register(a, TierGPU, []uint64{1, 2, 3, 4})
	_ = x.Register(b, TierGPU, []uint64{4, 5})
	_ = x.Evict(a, TierGPU, []uint64{2})
	got := x.AppendHashes(nil, nil)
	slices.Sort(got)
	if !slices.Equal(got, []uint64{1, 3, 4, 5}) {
		t.Fatalf("all hashes: %v", got)
	}
	_ = x.RemovePod(b) // dead before its sweep: its blocks are not listed
	got = x.AppendHashes(nil, func(h uint64) bool { return h != 1 })
	slices.Sort(got)
	if !slices.Equal(got, []uint64{3, 4}) {
		t.Fatalf("filtered, without the dead pod: %v", got)
	}
}

// TestFillMatchesNaive checks fill (the assembly on amd64) and fillSetGo
// against a plain loop over the slots, on sets with no bit, every bit,
// the first and last bits of words, and random bits, at 256 and 1,024 pods.
func TestFillMatchesNaive(t *testing.T) {
	for _, capacity := range []int{256, MaxPods} {
		x := mustIndex(t, capacity)
		for p := 0; p < capacity; p++ {
			if _, err := x.AddPod(fmt.Sprint("pod-", p)); err != nil {
				t.Fatal(err)
			}
		}
		w := capacity / 64
		full, ends := make([]uint64, w), make([]uint64, w)
		for i := range full {
			full[i], ends[i] = ^uint64(0), 1|1<<63
		}
		sets := [][]uint64{make([]uint64, w), full, ends}
		for i := 0; i < 200; i++ {
			set := make([]uint64, w)
			for q := range set {
				set[q] = splitmix(uint64(w*i + q))
				if i%3 == 0 {
					set[q] &= splitmix(uint64(w*i+q) + 1<<40) // sparser
				}
			}
			sets = append(sets, set)
		}
		for _, set := range sets {
			var want []Match
			for slot := 0; slot < capacity; slot++ {
				if set[slot/64]&(1<<(slot%64)) != 0 {
					want = append(want, Match{Pod: x.pods.id(slot), Blocks: 7})
				}
			}
			got := make([]Match, capacity+1)
			got[len(want)] = Match{Pod: 12345, Blocks: 6789} // must stay
			got = got[:x.pods.fill(got, set, 7)+1]
			if !slices.Equal(got[:len(got)-1], want) || got[len(got)-1] != (Match{Pod: 12345, Blocks: 6789}) {
				t.Fatalf("%d pods, set %x: fill wrote %v, want %v", capacity, set, got, want)
			}
			ref := make([]Match, capacity)
			ref = ref[:fillSetGo(unsafe.Pointer(unsafe.SliceData(ref)), x.pods.ids, set, 7)]
			if !slices.Equal(ref, want) {
				t.Fatalf("%d pods, set %x: fillSetGo wrote %v, want %v", capacity, set, ref, want)
			}
		}
	}
}
