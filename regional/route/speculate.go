package route

import (
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

	mu sync.Mutex
	// entries holds, per chain hash, the pods that computed it: the first
	// specInline in its slab entry, the rest in one of lists (only hashes
	// many pods computed, such as a shared system prompt's), which the
	// entry names (specEntry.more). entries, slab, ring and queue
	// hold no pointers: at 1<<20 hashes the collector has nothing to trace
	// in them (as one slice per record and one per hash, they were the
	// largest count of live objects in a proxying controller).
	entries map[uint64]int32 // hash -> its entry in slab
	slab    []*[specChunk]specEntry
	used    int32   // slab's entries ever handed out
	free    []int32 // of those, the unused ones
	// lists are the pods of hashes past their entries' specInline;
	// freeLists, those of lists no entry names (kept for their arrays).
	lists     [][]specPod
	freeLists []int32
	// ring holds the records' hashes back to back, in insertion order: the
	// oldest record's first hash at position start, size of them in all,
	// in chunks of specChunk: position p is ring[p/specChunk-first]
	// [p%specChunk]. Beside each hash it keeps where the hash's entry was
	// in slab when the record was made, so that renewing or expiring it
	// needs no map lookup while that still holds (an entry names its
	// hash: a freed and reused one does not pass for it). Chunks that
	// expiry leaves behind wait in spare to be reused, so that the ring
	// neither moves nor grows by more than a chunk while a request waits.
	ring  []*ringChunk
	first uint64
	spare []*ringChunk
	start uint64
	size  int
	queue specQueue // insertion order, for expiry
	// last is each pod's latest record still held: an Observe for the pod
	// finds the entries of the prefix its chain shares with that record
	// through the ring. A pod's next request mostly shares a long prefix
	// with its last (a system prompt, the turns so far), and those
	// renewals were two map lookups per block (the renewal and the
	// expiry of the record it renews), most of an Observe's time.
	last map[index.PodID]specSpan
}

// ringChunk is specChunk positions of the ring: the hash at each, and
// where its entry was in slab.
type ringChunk struct {
	h  [specChunk]uint64
	at [specChunk]int32
}

// specSpan is where a record's hashes are in the ring.
type specSpan struct {
	at uint64
	n  int
}

// specInline is how many pods of a hash its slab entry holds itself.
const specInline = 2

// specChunk is how many entries the slab, and how many hashes the ring,
// grows by: in chunks, so that growing copies nothing while a request
// waits.
const specChunk = 1 << 12

func (s *Speculation) entry(at int32) *specEntry {
	return &s.slab[uint32(at)/specChunk][uint32(at)%specChunk]
}

type specEntry struct {
	h    uint64 // the hash whose entry it is, while n > 0
	n    int    // pods inline; 0: free
	more int32  // 1 + the index in lists of the pods past pods; 0: none
	pods [specInline]specPod
}

// moreLocked is the pods of e past its inline ones.
func (s *Speculation) moreLocked(e *specEntry) []specPod {
	if e.more == 0 {
		return nil
	}
	return s.lists[e.more-1]
}

type specPod struct {
	id    index.PodID
	until int64 // unix nanos
}

// specRecord is one Observe: its hashes are ring's n positions from at.
type specRecord struct {
	until int64
	id    index.PodID
	at    uint64
	n     int
}

// NewSpeculation keeps entries for ttl, at most max chain hashes in all.
func NewSpeculation(ttl time.Duration, max int) *Speculation {
	return &Speculation{ttl: ttl, max: max, entries: map[uint64]int32{}, last: map[index.PodID]specSpan{}}
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
	for s.size+len(chain) > s.max && s.queue.n > 0 {
		s.dropFrontLocked()
	}
	if len(chain) > s.max {
		chain = chain[:s.max]
	}
	at := s.start + uint64(s.size)
	prev := s.last[pod] // n is 0 when the pod has no record held
	for i, h := range chain {
		s.setLocked(at+uint64(i), h, s.addLocked(h, s.hintLocked(prev, i, h), pod, until))
	}
	s.queue.push(specRecord{until: until, id: pod, at: at, n: len(chain)})
	s.size += len(chain)
	s.last[pod] = specSpan{at: at, n: len(chain)}
}

// setLocked writes h, whose entry is at, at ring position p, adding a
// chunk when p is past the last.
func (s *Speculation) setLocked(p, h uint64, at int32) {
	i := p/specChunk - s.first
	for i >= uint64(len(s.ring)) {
		var c *ringChunk
		if n := len(s.spare); n > 0 {
			c = s.spare[n-1]
			s.spare = s.spare[:n-1]
		} else {
			c = new(ringChunk)
		}
		s.ring = append(s.ring, c)
	}
	c := s.ring[i]
	c.h[p%specChunk], c.at[p%specChunk] = h, at
}

// slotLocked is the hash at ring position p and where its entry was.
func (s *Speculation) slotLocked(p uint64) (uint64, int32) {
	c := s.ring[p/specChunk-s.first]
	return c.h[p%specChunk], c.at[p%specChunk]
}

// hintLocked is where the entry of h, block i of a chain, may be: where
// it was when the record prev was made, if prev's block i is h; else -1.
func (s *Speculation) hintLocked(prev specSpan, i int, h uint64) int32 {
	if i < prev.n {
		if ph, at := s.slotLocked(prev.at + uint64(i)); ph == h {
			return at
		}
	}
	return -1
}

// findLocked returns the slab entry of h: at, when that is still h's
// (hint; -1 for none), else the map's.
func (s *Speculation) findLocked(h uint64, hint int32) (int32, bool) {
	if hint >= 0 {
		if e := s.entry(hint); e.n > 0 && e.h == h {
			return hint, true
		}
	}
	at, ok := s.entries[h]
	return at, ok
}

// addLocked renews pod's time on h, or adds pod to h's pods, and returns
// where h's entry is; hint is where it may be (findLocked).
func (s *Speculation) addLocked(h uint64, hint int32, pod index.PodID, until int64) int32 {
	at, ok := s.findLocked(h, hint)
	if !ok {
		if n := len(s.free); n > 0 {
			at = s.free[n-1]
			s.free = s.free[:n-1]
		} else {
			at = s.used
			s.used++
			if int(at)/specChunk == len(s.slab) {
				s.slab = append(s.slab, new([specChunk]specEntry))
			}
		}
		s.entries[h] = at
		s.entry(at).h = h
	}
	e := s.entry(at)
	if p := s.podLocked(h, e, pod); p != nil {
		p.until = until
		return at
	}
	if e.n < specInline {
		e.pods[e.n] = specPod{pod, until}
		e.n++
		return at
	}
	if e.more == 0 {
		if n := len(s.freeLists); n > 0 {
			e.more = s.freeLists[n-1] + 1
			s.freeLists = s.freeLists[:n-1]
		} else {
			s.lists = append(s.lists, nil)
			e.more = int32(len(s.lists))
		}
	}
	s.lists[e.more-1] = append(s.lists[e.more-1], specPod{pod, until})
	return at
}

// podLocked returns pod's place among the pods of h, whose entry is e, or
// nil.
func (s *Speculation) podLocked(h uint64, e *specEntry, pod index.PodID) *specPod {
	for i := range e.n {
		if e.pods[i].id == pod {
			return &e.pods[i]
		}
	}
	if e.n < specInline {
		return nil
	}
	more := s.moreLocked(e)
	for i := range more {
		if more[i].id == pod {
			return &more[i]
		}
	}
	return nil
}

func (s *Speculation) expireLocked(now int64) {
	for s.queue.n > 0 && s.queue.front().until <= now {
		s.dropFrontLocked()
	}
}

// dropFrontLocked drops the oldest record: removes its pod from its
// hashes, unless a later record renewed it.
func (s *Speculation) dropFrontLocked() {
	r := s.queue.pop()
	for p := r.at; p < r.at+uint64(r.n); p++ {
		h, at := s.slotLocked(p)
		s.removeLocked(h, at, r.id, r.until)
	}
	if l, ok := s.last[r.id]; ok && l.at == r.at {
		delete(s.last, r.id)
	}
	s.start += uint64(r.n)
	s.size -= r.n
	for len(s.ring) > 0 && (s.first+1)*specChunk <= s.start {
		s.spare = append(s.spare, s.ring[0])
		s.ring[0] = nil
		s.ring = s.ring[1:]
		s.first++
	}
}

// specQueue is the records in insertion order: a ring that grows by
// doubling and is otherwise never moved, so that at a steady rate of
// observations it neither copies nor allocates (a slice re-sliced from
// its front and appended to copies itself into a new array every so often,
// at 2,250 req/s a quarter-megabyte every second or so, and on fresh pages
// that copy took 3 ms of a request's time).
type specQueue struct {
	buf  []specRecord // len a power of two, or 0
	head int          // the oldest record's index in buf
	n    int
}

// specQueueMin is the room a queue starts with.
const specQueueMin = 16

func (q *specQueue) front() *specRecord { return &q.buf[q.head] }

func (q *specQueue) push(r specRecord) {
	if q.n == len(q.buf) {
		buf := make([]specRecord, max(specQueueMin, 2*len(q.buf)))
		k := copy(buf, q.buf[q.head:])
		copy(buf[k:], q.buf[:q.head])
		q.buf, q.head = buf, 0
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = r
	q.n++
}

// pop removes and returns the oldest record; the queue must not be empty.
// An emptied queue lets its array go.
func (q *specQueue) pop() specRecord {
	r := q.buf[q.head]
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	if q.n == 0 {
		*q = specQueue{}
	}
	return r
}

// removeLocked removes pod from h's pods if its time is not after until,
// keeping the others in order; hint is where h's entry may be
// (findLocked).
func (s *Speculation) removeLocked(h uint64, hint int32, pod index.PodID, until int64) {
	at, ok := s.findLocked(h, hint)
	if !ok {
		return
	}
	e := s.entry(at)
	more := s.moreLocked(e)
	i := 0
	for i < e.n && e.pods[i].id != pod {
		i++
	}
	if i < e.n {
		if e.pods[i].until > until {
			return
		}
		copy(e.pods[i:e.n], e.pods[i+1:e.n])
		e.n--
		if len(more) > 0 { // the first of the rest moves in
			e.pods[e.n] = more[0]
			e.n++
			more = more[1:]
		}
	} else {
		j := 0
		for j < len(more) && more[j].id != pod {
			j++
		}
		if j == len(more) || more[j].until > until {
			return
		}
		more = append(more[:j], more[j+1:]...)
	}
	switch {
	case len(more) > 0:
		s.lists[e.more-1] = more
	case e.more != 0:
		s.lists[e.more-1] = more[:0]
		s.freeLists = append(s.freeLists, e.more-1)
		e.more = 0
	case e.n == 0:
		*e = specEntry{}
		delete(s.entries, h)
		s.free = append(s.free, at)
	}
}

// pods calls f for each pod of h, in the order they were added, while f
// returns true.
func (s *Speculation) pods(h uint64, f func(p specPod) bool) {
	at, ok := s.entries[h]
	if !ok {
		return
	}
	e := s.entry(at)
	for i := range e.n {
		if !f(e.pods[i]) {
			return
		}
	}
	if e.n < specInline {
		return
	}
	for _, p := range s.moreLocked(e) {
		if !f(p) {
			return
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
		found := false
		s.pods(chain[i], func(p specPod) bool {
			found = p.until > t
			return !found
		})
		return found
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
	s.pods(chain[lo], func(p specPod) bool {
		if p.until > t {
			f(p.id, lo+1)
		}
		return true
	})
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
	prev := s.last[pod]
	for i, h := range chain {
		if at, ok := s.findLocked(h, s.hintLocked(prev, i, h)); ok {
			if p := s.podLocked(h, s.entry(at), pod); p != nil {
				p.until = 0 // expired; the record's expiry frees it
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
