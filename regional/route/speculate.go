package route

import (
	"slices"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/index"
)

// Speculation remembers, for a short time, which pod has just computed which
// prefix: when a pod sends the first byte of an answer, its prefill is done
// and the engine holds the prompt's blocks — but its KV events reach the
// index only after the engine's batching, Kafka and ingestion, a few hundred
// milliseconds later. Requests for the same prefix arriving in that window
// would otherwise see no warm pod and be spread across cold ones (llm-d adds
// "speculative" index entries for the same reason). Entries expire after
// TTL, or as soon as the index confirms the pod holds the prefix (from then
// on only the index, which also sees evictions, is believed); the index
// stays exactly what the engines announced.
type Speculation struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	entries map[uint64][]specPod // chain hash -> pods that computed it
	queue   []specRecord         // insertion order, for expiry
	size    int
}

type specPod struct {
	id    index.PodID
	until int64 // unix nanos
}

type specRecord struct {
	until  int64
	id     index.PodID
	hashes []uint64
}

// NewSpeculation keeps entries for ttl, at most max chain hashes in all.
func NewSpeculation(ttl time.Duration, max int) *Speculation {
	return &Speculation{ttl: ttl, max: max, entries: map[uint64][]specPod{}}
}

// Observe records that pod has computed the prefix chain (whole: every
// block of it), at now.
func (s *Speculation) Observe(pod index.PodID, chain []uint64, now time.Time) {
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
			s.entries[h] = append(pods, specPod{pod, until})
		}
	}
	s.queue = append(s.queue, specRecord{until, pod, hs})
	s.size += len(hs)
}

func (s *Speculation) expireLocked(now int64) {
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
// renewed it.
func (s *Speculation) dropLocked(r specRecord) {
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
// prefix-closed along chain), and the pods that computed it are reported.
func (s *Speculation) Match(chain []uint64, now time.Time, f func(pod index.PodID, blocks int)) {
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
// also see the pod evict them), so the speculation about them is dropped.
func (s *Speculation) Confirmed(pod index.PodID, chain []uint64) {
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

// Len is the number of chain hashes remembered.
func (s *Speculation) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}
