package enginesim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Faults are failures injected into requests, set in Config and switched at
// run time with POST /admin/faults (the body is this struct in JSON; it
// replaces the current faults). A request draws at most one fault, checked
// in this order: error, stall, die; the "next N" counters are used before
// the rates.
type Faults struct {
	// ErrorNext answers the next N requests with HTTP 500.
	ErrorNext int `json:"error_next,omitempty"`
	// ErrorRate answers this fraction of requests (0..1) with HTTP 500.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// StallNext makes the next N requests hang before their first byte.
	StallNext int `json:"stall_next,omitempty"`
	// StallRate makes this fraction of requests (0..1) hang likewise.
	StallRate float64 `json:"stall_rate,omitempty"`
	// StallFor is how long a stall lasts, e.g. "2s" (engine clock, not
	// scaled by TimeScale); 0 (or absent) = until released (POST
	// /admin/faults/release, or Close), or the client gives up.
	StallFor Duration `json:"stall_for,omitempty"`
	// DieNext makes the next N requests lose their connection.
	DieNext int `json:"die_next,omitempty"`
	// DieRate makes this fraction of requests (0..1) lose their connection.
	DieRate float64 `json:"die_rate,omitempty"`
	// DieAfterChunks is how many SSE chunks a dying streaming request sends
	// before its connection is closed; 0 closes it before any byte. A
	// non-streaming request that dies gets no response at all.
	DieAfterChunks int `json:"die_after_chunks,omitempty"`
}

func (f Faults) validate() error {
	rates := []struct {
		name string
		v    float64
	}{{"ErrorRate", f.ErrorRate}, {"StallRate", f.StallRate}, {"DieRate", f.DieRate}}
	for _, r := range rates {
		if r.v < 0 || r.v > 1 {
			return fmt.Errorf("%s %v: must be within [0, 1]", r.name, r.v)
		}
	}
	counts := []struct {
		name string
		v    int
	}{{"ErrorNext", f.ErrorNext}, {"StallNext", f.StallNext}, {"DieNext", f.DieNext}, {"DieAfterChunks", f.DieAfterChunks}}
	for _, n := range counts {
		if n.v < 0 {
			return fmt.Errorf("%s %d: must be >= 0", n.name, n.v)
		}
	}
	if f.StallFor < 0 {
		return fmt.Errorf("StallFor %v: must be >= 0", time.Duration(f.StallFor))
	}
	return nil
}

// Duration is a time.Duration written in JSON as a string such as "1.5s".
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON accepts a duration string ("250ms") or a number of
// nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration %s: want a string such as \"1s\" or nanoseconds", b)
	}
	*d = Duration(n)
	return nil
}

// faultKind is what a request drew.
type faultKind uint8

const (
	faultNone faultKind = iota
	faultError
	faultStall
	faultDie
)

func (k faultKind) String() string {
	return [...]string{"none", "error", "stall", "die"}[k]
}

// faultState holds the current faults and the stall release channel.
type faultState struct {
	mu      sync.Mutex
	f       Faults
	rng     *rand.Rand
	release chan struct{} // closed to release current stalls
}

func newFaultState(f Faults, seed uint64) *faultState {
	return &faultState{f: f, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), release: make(chan struct{})}
}

// draw picks the fault of one request and consumes a "next N" if used.
func (s *faultState) draw() (faultKind, Faults, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.f
	kind := faultNone
	switch {
	case s.f.ErrorNext > 0:
		s.f.ErrorNext--
		kind = faultError
	case s.f.ErrorRate > 0 && s.rng.Float64() < s.f.ErrorRate:
		kind = faultError
	case s.f.StallNext > 0:
		s.f.StallNext--
		kind = faultStall
	case s.f.StallRate > 0 && s.rng.Float64() < s.f.StallRate:
		kind = faultStall
	case s.f.DieNext > 0:
		s.f.DieNext--
		kind = faultDie
	case s.f.DieRate > 0 && s.rng.Float64() < s.f.DieRate:
		kind = faultDie
	}
	return kind, f, s.release
}

func (s *faultState) get() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f
}

func (s *faultState) set(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f = f
}

// releaseStalls ends every stall in progress.
func (s *faultState) releaseStalls() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.release)
	s.release = make(chan struct{})
}
