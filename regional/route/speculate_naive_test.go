package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/index"
	"pgregory.net/rapid"
)

// naiveSpeculation is the reference Speculation is checked against: one
// slice of pods per hash and one slice of hashes per record, the layout
// it had before it was made pointer-free.
type naiveSpeculation struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	entries map[uint64][]naiveSpecPod // chain hash -> pods that computed it
	queue   []naiveSpecRecord         // insertion order, for expiry
	size    int
}

type naiveSpecPod struct {
	id    index.PodID
	until int64 // unix nanos
}

type naiveSpecRecord struct {
	until  int64
	id     index.PodID
	hashes []uint64
}

func newNaiveSpeculation(ttl time.Duration, max int) *naiveSpeculation {
	return &naiveSpeculation{ttl: ttl, max: max, entries: map[uint64][]naiveSpecPod{}}
}

// Observe records that pod has computed the prefix chain (whole: every
func (s *naiveSpeculation) Observe(pod index.PodID, chain []uint64, now time.Time) {
	if s == nil || len(chain) == 0 {
		return
	}
	until := now.Add(s.ttl).UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now.UnixNano())
	for s.size+len(chain) > s.max && len(s.queue) > 0 {
		s.dropLocked(s.queue[0])
		s.queue = s.queue[1:]
	}
	if len(chain) > s.max {
		chain = chain[:s.max]
	}
	hs := slices.Clone(chain)
	for _, h := range hs {
		pods := s.entries[h]
		found := false
		for i := range pods {
			if pods[i].id == pod {
				pods[i].until, found = until, true
			}
		}
		if !found {
			s.entries[h] = append(pods, naiveSpecPod{pod, until})
		}
	}
	s.queue = append(s.queue, naiveSpecRecord{until, pod, hs})
	s.size += len(hs)
}

func (s *naiveSpeculation) expireLocked(now int64) {
	n := 0
	for n < len(s.queue) && s.queue[n].until <= now {
		s.dropLocked(s.queue[n])
		n++
	}
	if n > 0 {
		s.queue = s.queue[n:]
	}
}

// dropLocked removes a record's pod from its hashes, unless a later record
func (s *naiveSpeculation) dropLocked(r naiveSpecRecord) {
	s.size -= len(r.hashes)
	for _, h := range r.hashes {
		pods := s.entries[h]
		for i := range pods {
			if pods[i].id == r.id && pods[i].until <= r.until {
				pods = slices.Delete(pods, i, i+1)
				break
			}
		}
		if len(pods) == 0 {
			delete(s.entries, h)
		} else {
			s.entries[h] = pods
		}
	}
}

// Match calls f for each pod that recently computed a prefix of chain, with
// the number of leading blocks: the deepest block any such pod computed is
// found by binary search (entries are whole chains, so presence is
func (s *naiveSpeculation) Match(chain []uint64, now time.Time, f func(pod index.PodID, blocks int)) {
	if s == nil || len(chain) == 0 {
		return
	}
	t := now.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	live := func(i int) bool {
		for _, p := range s.entries[chain[i]] {
			if p.until > t {
				return true
			}
		}
		return false
	}
	if !live(0) {
		return
	}
	lo, hi := 0, len(chain) // live(lo), !live(hi) (hi == len: past the end)
	for hi-lo > 1 {
		m := (lo + hi) / 2
		if live(m) {
			lo = m
		} else {
			hi = m
		}
	}
	for _, p := range s.entries[chain[lo]] {
		if p.until > t {
			f(p.id, lo+1)
		}
	}
}

// Confirmed tells the speculation that the index now shows pod holding the
// first blocks of chain: from then on the index is authoritative (it will
func (s *naiveSpeculation) Confirmed(pod index.PodID, chain []uint64) {
	if s == nil || len(chain) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range chain {
		pods := s.entries[h]
		for i := range pods {
			if pods[i].id == pod {
				pods[i].until = 0 // expired; the record's expiry frees it
				break
			}
		}
	}
}

func (s *naiveSpeculation) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// TestSpeculationMatchesNaive: under any sequence of observations,
// confirmations and expiries, with chains that share prefixes and a bound
// small enough to drop records and wrap the ring, the speculation reports
// what the naive one does, in the same order, and holds as many hashes.
func TestSpeculationMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		ttl := time.Duration(rapid.IntRange(1, 50).Draw(rt, "ttl")) * time.Millisecond
		bound := rapid.IntRange(1, 300).Draw(rt, "max")
		fast, naive := NewSpeculation(ttl, bound), newNaiveSpeculation(ttl, bound)
		// Chains over a small alphabet of hashes, each a prefix of a
		// longer one or not: presence stays prefix-closed only when
		// observed chains are whole, as the decider observes them.
		roots := rapid.SliceOfN(rapid.SliceOfN(rapid.Uint64Range(0, 40), 1, 120), 1, 6).Draw(rt, "roots")
		chain := func(label string) []uint64 {
			r := roots[rapid.IntRange(0, len(roots)-1).Draw(rt, label+"-root")]
			return r[:rapid.IntRange(1, len(r)).Draw(rt, label+"-len")]
		}
		clock := time.Unix(1000, 0)
		for step := range rapid.IntRange(1, 200).Draw(rt, "steps") {
			pod := index.PodID(rapid.IntRange(1, 6).Draw(rt, "pod"))
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0, 1:
				c := chain("observe")
				fast.Observe(pod, c, clock)
				naive.Observe(pod, c, clock)
			case 2:
				c := chain("confirm")
				fast.Confirmed(pod, c)
				naive.Confirmed(pod, c)
			case 3:
				clock = clock.Add(time.Duration(rapid.IntRange(0, 30).Draw(rt, "advance")) * time.Millisecond)
			}
			c := chain("match")
			type hit struct {
				pod    index.PodID
				blocks int
			}
			var got, want []hit
			fast.Match(c, clock, func(p index.PodID, b int) { got = append(got, hit{p, b}) })
			naive.Match(c, clock, func(p index.PodID, b int) { want = append(want, hit{p, b}) })
			if !slices.Equal(got, want) {
				rt.Fatalf("step %d: Match %v = %v, naive %v", step, c, got, want)
			}
			if fast.Len() != naive.Len() {
				rt.Fatalf("step %d: Len %d, naive %d", step, fast.Len(), naive.Len())
			}
			if used := int(fast.used) - len(fast.free); used != len(fast.entries) || len(fast.entries) != len(naive.entries) {
				rt.Fatalf("step %d: %d hashes in %d slab entries in use; naive %d hashes", step, len(fast.entries), used, len(naive.entries))
			}
		}
	})
}

// BenchmarkSpeculationObserve: a proxying controller's use, each answer
// observed and the next request matched: 128-block chains that share a
// 120-block prefix, at the decider's bound (1<<20 hashes), beside the
// naive layout; the answers come from 8 pods in turn, or all from one
// (as behind scripts/proxy-vs-nginx, whose one backend sends no KV
// events).
func BenchmarkSpeculationObserve(b *testing.B) {
	type spec interface {
		Observe(index.PodID, []uint64, time.Time)
		Match([]uint64, time.Time, func(index.PodID, int))
	}
	for _, impl := range []struct {
		name string
		new  func() spec
	}{
		{"layout=flat", func() spec { return NewSpeculation(10*time.Second, 1<<20) }},
		{"layout=naive", func() spec { return newNaiveSpeculation(10*time.Second, 1<<20) }},
	} {
		for _, pods := range []int{8, 1} {
			b.Run(fmt.Sprintf("%s/pods=%d", impl.name, pods), func(b *testing.B) {
				s := impl.new()
				chain := make([]uint64, 128)
				for i := range chain {
					chain[i] = uint64(i + 1)
				}
				clock := time.Unix(1000, 0)
				b.ReportAllocs()
				for i := range b.N {
					for j := 120; j < 128; j++ {
						chain[j] = uint64(i)<<8 | uint64(j)
					}
					clock = clock.Add(100 * time.Microsecond)
					s.Observe(index.PodID(i%pods), chain, clock)
					s.Match(chain, clock, func(index.PodID, int) {})
				}
			})
		}
	}
}

// TestSpeculationManyHashes: past one slab chunk of hashes, and through
// entries freed by expiry and handed out again, the speculation still
// reports what the naive one does.
func TestSpeculationManyHashes(t *testing.T) {
	const bound = 1 << 15
	fast, naive := NewSpeculation(time.Second, bound), newNaiveSpeculation(time.Second, bound)
	rng := rand.New(rand.NewPCG(1, 2))
	clock := time.Unix(1000, 0)
	var chains [][]uint64
	for round := range 5 {
		for i := range 200 {
			c := make([]uint64, 1+rng.IntN(100))
			for j := range c {
				c[j] = rng.Uint64N(1 << 40)
			}
			if i > 0 && rng.IntN(4) == 0 { // shares a prefix with an earlier chain
				prev := chains[rng.IntN(len(chains))]
				copy(c, prev[:min(len(prev), len(c)/2)])
			}
			chains = append(chains, c)
			pod := index.PodID(1 + rng.IntN(5))
			fast.Observe(pod, c, clock)
			naive.Observe(pod, c, clock)
			clock = clock.Add(2 * time.Millisecond)
		}
		for i, c := range chains {
			var got, want []string
			fast.Match(c, clock, func(p index.PodID, b int) { got = append(got, fmt.Sprint(p, b)) })
			naive.Match(c, clock, func(p index.PodID, b int) { want = append(want, fmt.Sprint(p, b)) })
			if !slices.Equal(got, want) {
				t.Fatalf("round %d chain %d: Match %v, naive %v", round, i, got, want)
			}
		}
		if fast.Len() != naive.Len() || len(fast.entries) != len(naive.entries) || int(fast.used)-len(fast.free) != len(fast.entries) {
			t.Fatalf("round %d: %d hashes (%d entries, %d used, %d free); naive %d hashes (%d entries)",
				round, fast.Len(), len(fast.entries), fast.used, len(fast.free), naive.Len(), len(naive.entries))
		}
		if len(fast.ring) > fast.size/specChunk+2 || len(fast.ring)+len(fast.spare) > bound/specChunk+2 {
			t.Fatalf("round %d: %d hashes in %d ring chunks, %d spare", round, fast.size, len(fast.ring), len(fast.spare))
		}
		if round == 0 && len(fast.slab) < 2 {
			t.Fatalf("round 0: %d hashes fit one slab chunk; the test must cross one", len(fast.entries))
		}
		// The first half of this round expires at the next Observe, or
		// all of it at once, which leaves several ring chunks spare.
		clock = clock.Add([]time.Duration{700 * time.Millisecond, 1500 * time.Millisecond}[round%2])
	}
}

// TestSpecQueueMatchesSlice checks the records' ring against a slice used
// as a queue: the same records come out in the same order, across growth
// while the ring wraps and after it empties.
func TestSpecQueueMatchesSlice(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var q specQueue
		var want []specRecord
		next := uint64(0)
		for step := range rapid.IntRange(1, 400).Draw(rt, "steps") {
			if len(want) > 0 && rapid.IntRange(0, 2).Draw(rt, "op") == 0 {
				got := q.pop()
				if got != want[0] {
					rt.Fatalf("step %d: pop %+v, want %+v", step, got, want[0])
				}
				want = want[1:]
			} else {
				r := specRecord{until: int64(next), id: index.PodID(next % 7), at: next * 3, n: int(next % 5)}
				next++
				q.push(r)
				want = append(want, r)
			}
			if q.n != len(want) {
				rt.Fatalf("step %d: %d records, want %d", step, q.n, len(want))
			}
			if len(want) > 0 && *q.front() != want[0] {
				rt.Fatalf("step %d: front %+v, want %+v", step, *q.front(), want[0])
			}
		}
	})
}
