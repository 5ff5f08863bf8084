package index

import (
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"
)

// stopTheWorld is a growth step larger than any table: the whole rehash
// happens in the insertion that passes 3/4 load, as the index grew before
// growth was incremental. It is the reference incremental growth is checked
// against.
const stopTheWorld = math.MaxInt

// fataler is what the checks need of *testing.T and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkShard verifies the structure of shard si of x: every slot of the
// published table names a live entry of this shard whose key has the slot's
// fingerprint, no entry twice, every probe run unbroken, as many slots as
// entries; and during a growth, that the growing table is itself well formed
// and holds exactly the published slots before the cursor.
func checkShard(t fataler, x *Index, si int) {
	t.Helper()
	s := &x.shards[si]
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab.Load()
	if tab == nil {
		if s.n != 0 || s.next != nil {
			t.Fatalf("shard %d: no table but n=%d, next=%v", si, s.n, s.next != nil)
		}
		return
	}
	checkRuns(t, tab, fmt.Sprintf("shard %d published", si))
	seen := map[uint32]bool{}
	for j := range tab.slots {
		v := tab.slots[j].Load()
		if v == 0 {
			continue
		}
		e := uint32(v) - 1
		if e >= s.used {
			t.Fatalf("shard %d slot %d: entry %d beyond the slab (%d used)", si, j, e, s.used)
		}
		if seen[e] {
			t.Fatalf("shard %d: entry %d linked twice", si, e)
		}
		seen[e] = true
		key := tab.word(e, x.stride, 0).Load()
		if key == 0 || fingerprint(key) != uint32(v>>32) || shardOf(key) != uint64(si) {
			t.Fatalf("shard %d slot %d: entry %d holds key %#x, which does not belong there", si, j, e, key)
		}
	}
	if len(seen) != int(s.n) {
		t.Fatalf("shard %d: %d slots in use, n = %d", si, len(seen), s.n)
	}
	free := 0
	for e := uint32(0); e < s.used; e++ {
		if tab.word(e, x.stride, 0).Load() == 0 {
			free++
		} else if !seen[e] {
			t.Fatalf("shard %d: entry %d holds a key but no slot names it", si, e)
		}
	}
	if free != len(s.free) {
		t.Fatalf("shard %d: %d zeroed entries, %d on the free list", si, free, len(s.free))
	}
	if s.next == nil {
		return
	}
	if s.next.bits != tab.bits+1 || s.cursor >= uint64(len(tab.slots)) {
		t.Fatalf("shard %d: growing %d bits -> %d bits, cursor %d", si, tab.bits, s.next.bits, s.cursor)
	}
	checkRuns(t, s.next, fmt.Sprintf("shard %d growing", si))
	var want, got []uint64
	for j := range s.cursor {
		if v := tab.slots[j].Load(); v != 0 {
			want = append(want, v)
		}
	}
	for j := range s.next.slots {
		if v := s.next.slots[j].Load(); v != 0 {
			got = append(got, v)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("shard %d: growing table holds %d slots, the published table has %d before cursor %d",
			si, len(got), len(want), s.cursor)
	}
}

// checkRuns verifies linear probing's invariant: no empty slot between a
// slot's home and the slot.
func checkRuns(t fataler, tab *table, what string) {
	t.Helper()
	mask := uint64(len(tab.slots) - 1)
	for j := range uint64(len(tab.slots)) {
		v := tab.slots[j].Load()
		if v == 0 {
			continue
		}
		for k := uint64(uint32(v>>32)>>(32-tab.bits)) & mask; k != j; k = (k + 1) & mask {
			if tab.slots[k].Load() == 0 {
				t.Fatalf("%s: slot %d is empty inside the probe run of slot %d", what, k, j)
			}
		}
	}
}

// growthModel applies the same writes to an index that grows by a drawn
// step, to one that grows stop-the-world, and to the naive reference, and
// checks after each that every key ever used reads the same in all three.
type growthModel struct {
	inc, stw *Index
	incIDs   []PodID
	stwIDs   []PodID
	names    []string
	ref      *naive
	gen      keyGen
	keys     []uint64 // every key ever registered, in order
	// chains are the query chains: each is new keys a pod registered in
	// one or more calls, continuing its own earlier ones (owner[c] is
	// the pod), so they stay prefix-closed until an eviction, a clear or
	// another pod's registration of some of their keys breaks that.
	chains  [][]uint64
	owner   []int
	buf     [maxWords]uint64
	matches [2][]Match
}

func newGrowthModel(t *rapid.T) *growthModel {
	step := rapid.SampledFrom([]int{1, 2, 3, 4, 7, 32, defaultGrowStep}).Draw(t, "step")
	inc, err := New(Config{PodCapacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	stw, err := New(Config{PodCapacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	m := &growthModel{
		inc: inc,
		stw: stw,
		ref: newNaive(),
		gen: keyGen{next: rapid.Uint64().Draw(t, "seed"), sameShard: rapid.Bool().Draw(t, "sameShard")},
	}
	m.inc.growStep = step
	m.stw.growStep = stopTheWorld
	for p := range 3 {
		name := fmt.Sprint("pod-", p)
		a, err := m.inc.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.stw.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		m.incIDs, m.stwIDs, m.names = append(m.incIDs, a), append(m.stwIDs, b), append(m.names, name)
		m.ref.addPod(name)
	}
	return m
}

func (m *growthModel) pod(t *rapid.T) int { return rapid.IntRange(0, len(m.names)-1).Draw(t, "pod") }

// someKeys draws keys already used, or none when there are none.
func (m *growthModel) someKeys(t *rapid.T) []uint64 {
	if len(m.keys) == 0 {
		return nil
	}
	n := rapid.IntRange(1, 64).Draw(t, "n")
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = m.keys[rapid.IntRange(0, len(m.keys)-1).Draw(t, "key")]
	}
	return ks
}

func (m *growthModel) registerNew(t *rapid.T) {
	m.registerChain(t, rapid.IntRange(1, 96).Draw(t, "new"))
}

// registerLong registers a chain long enough for Lookup to search it in
// parallel rounds (lookupParallelFrom blocks or more).
func (m *growthModel) registerLong(t *rapid.T) {
	m.registerChain(t, rapid.IntRange(lookupParallelFrom, 2*lookupParallelFrom).Draw(t, "long"))
}

// registerChain has a pod register n new keys, continuing one of its
// chains or starting a new one.
func (m *growthModel) registerChain(t *rapid.T, n int) {
	p := m.pod(t)
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = m.gen.key()
	}
	m.keys = append(m.keys, ks...)
	var mine []int
	for c, o := range m.owner {
		if o == p {
			mine = append(mine, c)
		}
	}
	if len(mine) > 0 && rapid.Bool().Draw(t, "extend") {
		c := rapid.SampledFrom(mine).Draw(t, "chain")
		m.chains[c] = append(m.chains[c], ks...)
	} else {
		m.chains = append(m.chains, ks)
		m.owner = append(m.owner, p)
	}
	m.register(t, p, ks)
}

func (m *growthModel) registerOld(t *rapid.T) {
	m.register(t, m.pod(t), m.someKeys(t))
}

func (m *growthModel) register(t *rapid.T, p int, ks []uint64) {
	if err := m.inc.Register(m.incIDs[p], TierGPU, ks); err != nil {
		t.Fatal(err)
	}
	if err := m.stw.Register(m.stwIDs[p], TierGPU, ks); err != nil {
		t.Fatal(err)
	}
	m.ref.register(m.names[p], TierGPU, ks)
}

func (m *growthModel) evict(t *rapid.T) {
	p, ks := m.pod(t), m.someKeys(t)
	if err := m.inc.Evict(m.incIDs[p], TierGPU, ks); err != nil {
		t.Fatal(err)
	}
	if err := m.stw.Evict(m.stwIDs[p], TierGPU, ks); err != nil {
		t.Fatal(err)
	}
	m.ref.evict(m.names[p], TierGPU, ks)
}

func (m *growthModel) clearPod(t *rapid.T) {
	p := m.pod(t)
	if err := m.inc.ClearPod(m.incIDs[p]); err != nil {
		t.Fatal(err)
	}
	if err := m.stw.ClearPod(m.stwIDs[p]); err != nil {
		t.Fatal(err)
	}
	m.ref.clearPod(m.names[p])
}

// check reads every key ever used, and one never used, from both indexes
// (while the incremental one may be mid-growth) and checks the structure of
// every shard those keys live in.
func (m *growthModel) check(t *rapid.T) {
	touched := map[int]bool{}
	for _, k := range append(m.keys, m.gen.next^0x5555) {
		var want uint64
		for p, name := range m.names {
			if m.ref.holds(name, k) {
				want |= 1 << m.incIDs[p].Slot()
			}
		}
		for _, x := range []*Index{m.inc, m.stw} {
			ok := x.load(k, m.buf[:1])
			if ok != (want != 0) || m.buf[0] != want {
				t.Fatalf("key %#x (growth step %d): present %v bitmap %b, want %b", k, x.growStep, ok, m.buf[0], want)
			}
		}
		touched[int(shardOf(k))] = true
	}
	for si := range touched {
		checkShard(t, m.inc, si)
		checkShard(t, m.stw, si)
	}
	for _, c := range m.chains {
		m.checkLookup(t, c)
		m.checkLookup(t, c[:(len(c)+1)/2])
	}
}

// checkLookup looks q up in both indexes, which must answer identically,
// and checks the answer against the naive scan (see checkNaiveLookup).
func (m *growthModel) checkLookup(t *rapid.T, q []uint64) {
	var got [2][]namedMatch
	for k, x := range []*Index{m.inc, m.stw} {
		m.matches[k] = x.Lookup(q, m.matches[k][:0])
		for _, r := range m.matches[k] {
			got[k] = append(got[k], namedMatch{m.names[r.Pod.Slot()], r.Blocks})
		}
	}
	if !slices.Equal(got[0], got[1]) {
		t.Fatalf("lookup of %d blocks (growth step %d): %v, stop-the-world growth %v", len(q), m.inc.growStep, got[0], got[1])
	}
	sortNamed(got[0])
	checkNaiveLookup(t, m.ref, q, got[0])
}

// Incremental growth answers every read and every lookup exactly as
// stop-the-world growth does, and as the naive reference does (lookups:
// exactly where the chain is prefix-closed, by the drop-point property
// where not), after every registration, eviction and clear, while they
// start, advance and finish growths (and, at steps below 4, fill the
// table before a growth completes), with the tables well formed throughout.
//
// The model runs on one goroutine and the index starts none, so the race
// detector finds nothing here and makes each check ~14 times dearer:
// under it the property runs a fifth of rapid's checks, and make test runs
// the full count in its race-free step, compiled with checkptr (what -race
// adds for this package's unsafe code).
func TestPropertyGrowthMatchesStopTheWorld(t *testing.T) {
	if raceEnabled {
		fewerRapidChecks(t, 5)
	}
	rapid.Check(t, growthProperty)
}

// fewerRapidChecks divides rapid's number of checks by div for the rest of
// the test, unless -rapid.checks or RAPID_CHECKS chose it.
func fewerRapidChecks(t *testing.T, div int) {
	t.Helper()
	if _, ok := os.LookupEnv("RAPID_CHECKS"); ok {
		return
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	f := flag.Lookup("rapid.checks")
	if set || f == nil {
		return
	}
	was := f.Value.String()
	n, err := strconv.Atoi(was)
	if err != nil {
		t.Fatalf("rapid.checks %q: %v", was, err)
	}
	if err := f.Value.Set(strconv.Itoa(max(1, n/div))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Value.Set(was) })
}

func growthProperty(t *rapid.T) {
	m := newGrowthModel(t)
	t.Repeat(map[string]func(*rapid.T){
		"registerNew":  m.registerNew,
		"registerLong": m.registerLong,
		"registerOld":  m.registerOld,
		"evict":        m.evict,
		"clearPod":     m.clearPod,
		"":             m.check,
	})
}

// FuzzGrowth is the property above driven by the fuzzer (go test -fuzz).
func FuzzGrowth(f *testing.F) { f.Fuzz(rapid.MakeFuzz(growthProperty)) }

// TestLookupsDuringGrowth checks every read between the insertions of a
// growth, one slot copied per insertion, and evicts while growths are in
// progress so deletions move slots across the cursor and across the end of
// the table.
func TestLookupsDuringGrowth(t *testing.T) {
	x := mustIndex(t, 64)
	x.growStep = 1
	pod, err := x.AddPod("p")
	if err != nil {
		t.Fatal(err)
	}
	gen := keyGen{sameShard: true}
	held := map[uint64]bool{}
	var keys []uint64
	var buf [1]uint64
	midGrowth := 0
	for i := range 3000 {
		k := gen.key()
		keys = append(keys, k)
		held[k] = true
		if err := x.Register(pod, TierGPU, []uint64{k}); err != nil {
			t.Fatal(err)
		}
		if i%3 == 2 { // evict an older key, a third of the time
			old := keys[int(splitmix(uint64(i))%uint64(len(keys)))]
			if err := x.Evict(pod, TierGPU, []uint64{old}); err != nil {
				t.Fatal(err)
			}
			delete(held, old)
		}
		if x.shards[0].next != nil {
			midGrowth++
		}
		if i%7 != 0 && x.shards[0].next == nil {
			continue
		}
		for _, k := range keys {
			if ok := x.load(k, buf[:]); ok != held[k] {
				t.Fatalf("after %d insertions: key %#x present %v, want %v", i+1, k, ok, held[k])
			}
		}
		checkShard(t, x, 0)
	}
	if midGrowth < 500 {
		t.Fatalf("only %d of 3000 insertions left a growth in progress", midGrowth)
	}
}

// lookupWriterChain looks up a piece of a writer's keys, keys[a:b] with a
// drawn from the held ones (up to 2*lookupParallelFrom blocks, so both
// Lookup's searches run), while the writer goes on. The writer registers
// its keys in order and evicts from the front, moving lo before it evicts
// and hi after each batch, so along keys[a:b] its pod holds a prefix that
// only grows: from at least min(b, hi)-a blocks when the lookup starts to
// at most min(b, hi+batch)-a when it ends, if a >= lo after it (else
// keys were evicted meanwhile and the answer is not checked). Binary
// searches over a prefix that grows meanwhile still end at a depth within
// those bounds, and no other pod holds those keys.
func lookupWriterChain(x *Index, id PodID, keys []uint64, lo, hi *atomic.Int64, batch int, n uint64, res *[]Match) error {
	lo1, hi1 := lo.Load(), hi.Load()
	if hi1 <= lo1 {
		return nil
	}
	r := splitmix(n ^ 0x5bd1e995)
	a := lo1 + int64(r%uint64(hi1-lo1))
	b := min(a+1+int64((r>>32)%(2*lookupParallelFrom)), int64(len(keys)))
	*res = x.Lookup(keys[a:b], *res)
	lo2, hi2 := lo.Load(), hi.Load()
	if a < lo2 {
		return nil
	}
	minD, maxD := int(min(b, hi1)-a), int(min(b, hi2+int64(batch))-a)
	if got := *res; len(got) != 1 || got[0].Pod != id || got[0].Blocks < minD || got[0].Blocks > maxD {
		return fmt.Errorf("writer %v keys [%d, %d) answered %v, want %d to %d blocks (held [%d, %d) before, [%d, %d) after)",
			id, a, b, got, minD, maxD, lo1, hi1, lo2, hi2)
	}
	return nil
}

// TestGrowthUnderConcurrentWriters runs writers that register and evict
// in one shard (so its table grows, and shrinks its load, all the time)
// against readers that check, without locks, that every key registered
// before their read and not evicted until after it is found, that keys
// never registered are not, that a stable chain keeps its answer, and that
// lookups of the writers' own chains, which grow and shrink as the readers
// search them, answer within what the writers held from the start to the
// end of the lookup (lookupWriterChain). Run under -race it also checks
// the publication of the growing table.
func TestGrowthUnderConcurrentWriters(t *testing.T) {
	for _, step := range []int{2, 32, defaultGrowStep} {
		t.Run(fmt.Sprint("step=", step), func(t *testing.T) {
			concurrentGrowth(t, step)
		})
	}
}

func concurrentGrowth(t *testing.T, step int) {
	const (
		writers = 3
		perW    = 12000
		window  = 3000 // each writer keeps at most this many keys
		batch   = 16
	)
	x := mustIndex(t, 64)
	x.growStep = step
	stable, err := x.AddPod("stable")
	if err != nil {
		t.Fatal(err)
	}
	gen := keyGen{next: 1 << 40, sameShard: true}
	chain := make([]uint64, 100)
	for i := range chain {
		chain[i] = gen.key()
	}
	if err := x.Register(stable, TierGPU, chain); err != nil {
		t.Fatal(err)
	}
	absent := make([]uint64, 100)
	for i := range absent {
		absent[i] = gen.key()
	}
	type writer struct {
		id     PodID
		keys   []uint64
		lo, hi atomic.Int64 // keys[lo:hi] are held; lo moves before evicting
	}
	ws := make([]*writer, writers)
	for w := range ws {
		id, err := x.AddPod(fmt.Sprint("writer-", w))
		if err != nil {
			t.Fatal(err)
		}
		ws[w] = &writer{id: id, keys: make([]uint64, perW)}
		for i := range ws[w].keys {
			ws[w].keys[i] = gen.key()
		}
	}

	var writersWG, readersWG sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, writers+2)
	for _, w := range ws {
		writersWG.Add(1)
		go func() {
			defer writersWG.Done()
			for i := 0; i < perW; i += batch {
				if err := x.Register(w.id, TierGPU, w.keys[i:i+batch]); err != nil {
					errs <- err
					return
				}
				w.hi.Store(int64(i + batch))
				if lo := w.lo.Load(); i+batch-int(lo) > window {
					newLo := int64(i + batch - window/2)
					w.lo.Store(newLo)
					if err := x.Evict(w.id, TierGPU, w.keys[lo:newLo]); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	for r := range 2 {
		readersWG.Add(1)
		go func() {
			defer readersWG.Done()
			var bm [1]uint64
			res := make([]Match, 0, 64)
			for n := uint64(r) << 32; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				w := ws[n%writers]
				hi := w.hi.Load()
				if hi > 0 {
					i := int64(splitmix(n) % uint64(hi))
					ok := x.load(w.keys[i], bm[:])
					if lo := w.lo.Load(); i >= lo && (!ok || bm[0]&(1<<w.id.Slot()) == 0) {
						errs <- fmt.Errorf("writer %v key %d of [%d, %d) not found (bitmap %b)", w.id, i, lo, hi, bm[0])
						return
					}
				}
				if x.load(absent[n%uint64(len(absent))], bm[:]) {
					errs <- fmt.Errorf("a key never registered was found")
					return
				}
				if n%16 == 0 {
					res = x.Lookup(chain, res)
					if len(res) != 1 || res[0].Pod != stable || res[0].Blocks != len(chain) {
						errs <- fmt.Errorf("stable chain answered %v", res)
						return
					}
				}
				if n%16 == 8 {
					if err := lookupWriterChain(x, w.id, w.keys, &w.lo, &w.hi, batch, n, &res); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	writersWG.Wait()
	close(done)
	readersWG.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkShard(t, x, 0)
	var bm [1]uint64
	for _, w := range ws {
		for i, k := range w.keys {
			held := int64(i) >= w.lo.Load()
			if ok := x.load(k, bm[:]); ok != held {
				t.Fatalf("writer %v key %d: present %v, want %v", w.id, i, ok, held)
			}
		}
	}
}
