package route

import (
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Sessions remembers, per session id (the X-Session-Id header), the pod the
// session was placed on and how many of its requests are in flight. A new
// session is placed by cost (load and cache), then kept there by an affinity
// bonus; a "thick" session — more concurrent requests than the threshold —
// loses the bonus for the excess, so its extra requests spread by load
// instead of piling onto one pod. Entries expire after TTL; at most Max are
// kept (the least recently used go first).
//
// Sessions are kept by SessionKey, a 64-bit hash of the id, which is also
// what the replicas of a region exchange: with ShareWithPeers each request
// begun here is queued as a Pin (TakePins drains the queue for the other
// replicas) and NotePeer takes theirs, so that the next turn of a session
// finds its pod whichever replica it reaches.
//
// The pins of two replicas converge: each pin carries a stamp (the unix
// nanoseconds of the placement, at least one past the stamp of the pin it
// replaced here), and of two pins of a session the later stamp wins, equal
// stamps the lower pod name. Two replicas that place a session at once on
// different pods (two dry runs of /v1/route, a client retrying through the
// other replica) therefore agree on one of the two pods after one exchange,
// instead of each taking the other's and staying crossed; and a pin that
// arrives after a newer one does not undo it.
type Sessions struct {
	mu  sync.Mutex
	m   map[uint64]*session
	ttl time.Duration
	max int

	outMax  int   // ShareWithPeers' bound; 0: pins are not queued
	out     []Pin // pins begun here since the last TakePins
	dropped int64 // pins dropped from a full queue
}

// Pin is a session placed on a pod, as exchanged between replicas.
type Pin struct {
	Key uint64 // SessionKey of the session id
	Pod string
	// Stamp orders the pins of a session (see Sessions): unix ns of the
	// placement, or more. 0: unknown (a replica of an older version), the
	// pin is taken as the latest.
	Stamp int64
}

// SessionKey is the key a session id is kept (and exchanged) by.
func SessionKey(id string) uint64 { return xxhash.Sum64String(id) }

type session struct {
	pod      string
	inflight int
	last     time.Time
	stamp    int64 // of the pin that set pod (Pin.Stamp)
}

// NewSessions makes a table with the given TTL and size bound.
func NewSessions(ttl time.Duration, max int) *Sessions {
	return &Sessions{m: map[uint64]*session{}, ttl: ttl, max: max}
}

// ShareWithPeers queues, from now on, every session begun or noted here as
// a Pin for TakePins, at most max of them between two calls (the oldest go
// first when the queue is full).
func (s *Sessions) ShareWithPeers(max int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outMax = max
}

// DroppedPins is how many pins were dropped from a full queue, ever.
func (s *Sessions) DroppedPins() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// TakePins appends the pins queued since the last call to dst (each
// session once, with its latest pod) and empties the queue. It also
// returns how many pins were dropped from a full queue, ever.
func (s *Sessions) TakePins(dst []Pin) ([]Pin, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := len(dst)
	for i := len(s.out) - 1; i >= 0; i-- {
		dup := false
		for _, p := range dst[start:] {
			if p.Key == s.out[i].Key {
				dup = true
				break
			}
		}
		if !dup {
			dst = append(dst, s.out[i])
		}
	}
	s.out = s.out[:0]
	return dst, s.dropped
}

// Pinned returns the session's pod and its in-flight requests, if known and
// not expired.
func (s *Sessions) Pinned(id string, now time.Time) (pod string, inflight int, ok bool) {
	if id == "" {
		return "", 0, false
	}
	key := SessionKey(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok || (e.inflight == 0 && now.Sub(e.last) > s.ttl) {
		return "", 0, false
	}
	return e.pod, e.inflight, true
}

// Begin records a request of the session routed to pod. The session is
// (re)pinned to pod unless it is already pinned elsewhere with requests in
// flight (a thick session's overflow does not move the pin).
func (s *Sessions) Begin(id, pod string, now time.Time) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.beginLocked(SessionKey(id), pod, now)
	if s.outMax > 0 {
		if len(s.out) >= s.outMax {
			n := copy(s.out, s.out[len(s.out)/2:])
			s.dropped += int64(len(s.out) - n)
			s.out = s.out[:n]
		}
		s.out = append(s.out, Pin{Key: SessionKey(id), Pod: e.pod, Stamp: e.stamp})
	}
}

func (s *Sessions) beginLocked(key uint64, pod string, now time.Time) *session {
	e, ok := s.m[key]
	if !ok {
		if len(s.m) >= s.max {
			s.evictLocked(now)
		}
		e = &session{}
		s.m[key] = e
	}
	if e.inflight == 0 || e.pod == "" {
		e.pod = pod
	}
	e.inflight++
	e.last = now
	e.stamp = max(now.UnixNano(), e.stamp+1)
	return e
}

// NotePeer takes a pin from another replica of the region: the session
// is pinned to its pod, unless the pin here is later (a greater stamp, or
// an equal stamp and a lower pod name) or the session has requests in
// flight here on another pod. It is not queued for the peers again; but a
// later pin refused for requests in flight here is answered with this
// pod, stamped after it, so that the peers follow the session's requests
// instead of each keeping its own pod.
func (s *Sessions) NotePeer(p Pin, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[p.Key]
	if !ok {
		if len(s.m) >= s.max {
			s.evictLocked(now)
		}
		e = &session{}
		s.m[p.Key] = e
	}
	e.last = now
	switch {
	case e.pod == "":
	case p.Stamp == 0: // unstamped: the latest, as it is the last heard
	case p.Stamp < e.stamp || (p.Stamp == e.stamp && p.Pod >= e.pod):
		return // the pin here is the later one
	}
	if e.inflight == 0 || e.pod == "" || e.pod == p.Pod {
		e.pod, e.stamp = p.Pod, p.Stamp
		return
	}
	e.stamp = max(e.stamp, p.Stamp) + 1
	if s.outMax > 0 && len(s.out) < s.outMax {
		s.out = append(s.out, Pin{Key: p.Key, Pod: e.pod, Stamp: e.stamp})
	}
}

// Note pins the session to pod without counting a request, unless it has
// requests in flight elsewhere: for a decision whose request this
// controller will not see (POST /v1/route), so the session's next decision
// finds it.
func (s *Sessions) Note(id, pod string, now time.Time) {
	s.Begin(id, pod, now)
	s.End(id, now)
}

// End records that a request of the session finished.
func (s *Sessions) End(id string, now time.Time) {
	if id == "" {
		return
	}
	key := SessionKey(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[key]; ok {
		if e.inflight > 0 {
			e.inflight--
		}
		e.last = now
	}
}

// Len is the number of sessions remembered.
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// evictLocked drops expired idle sessions, then, if still full, the least
// recently used idle tenth.
func (s *Sessions) evictLocked(now time.Time) {
	for id, e := range s.m {
		if e.inflight == 0 && now.Sub(e.last) > s.ttl {
			delete(s.m, id)
		}
	}
	for len(s.m) >= s.max {
		var oldest uint64
		var at time.Time
		found := false
		for key, e := range s.m {
			if e.inflight == 0 && (!found || e.last.Before(at)) {
				oldest, at, found = key, e.last, true
			}
		}
		if !found {
			return // every session is busy: let the table exceed its bound
		}
		delete(s.m, oldest)
	}
}
