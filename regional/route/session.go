package route

import (
	"sync"
	"time"
)

// Sessions remembers, per session id (the X-Session-Id header), the pod the
// session was placed on and how many of its requests are in flight. A new
// session is placed by cost (load and cache), then kept there by an affinity
// bonus; a "thick" session — more concurrent requests than the threshold —
// loses the bonus for the excess, so its extra requests spread by load
// instead of piling onto one pod. Entries expire after TTL; at most Max are
// kept (the least recently used go first).
type Sessions struct {
	mu  sync.Mutex
	m   map[string]*session
	ttl time.Duration
	max int
}

type session struct {
	pod      string
	inflight int
	last     time.Time
}

// NewSessions makes a table with the given TTL and size bound.
func NewSessions(ttl time.Duration, max int) *Sessions {
	return &Sessions{m: map[string]*session{}, ttl: ttl, max: max}
}

// Pinned returns the session's pod and its in-flight requests, if known and
// not expired.
func (s *Sessions) Pinned(id string, now time.Time) (pod string, inflight int, ok bool) {
	if id == "" {
		return "", 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[id]
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
	e, ok := s.m[id]
	if !ok {
		if len(s.m) >= s.max {
			s.evictLocked(now)
		}
		e = &session{}
		s.m[id] = e
	}
	if e.inflight == 0 || e.pod == "" {
		e.pod = pod
	}
	e.inflight++
	e.last = now
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[id]; ok {
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
		var oldest string
		var at time.Time
		for id, e := range s.m {
			if e.inflight == 0 && (oldest == "" || e.last.Before(at)) {
				oldest, at = id, e.last
			}
		}
		if oldest == "" {
			return // every session is busy: let the table exceed its bound
		}
		delete(s.m, oldest)
	}
}
