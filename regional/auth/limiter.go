package auth

import (
	"container/list"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"time"
)

// LimiterConfig bounds a Limiter.
type LimiterConfig struct {
	// MaxKeys is the most names tracked at once. Default 100000; at least
	// Shards. A name evicted (least recently seen first) starts again with
	// a full bucket, so with more active names than MaxKeys the limit errs
	// on the permissive side. A name whose bucket is full again costs
	// nothing to evict.
	MaxKeys int
	// Shards spread the names over independently locked tables. Default 16.
	Shards int
}

// DefaultLimiterConfig returns the defaults documented on LimiterConfig.
func DefaultLimiterConfig() LimiterConfig { return LimiterConfig{MaxKeys: 100_000, Shards: 16} }

// Validate checks the bounds; errors name the field.
func (c LimiterConfig) Validate() error {
	if c.Shards < 1 || c.Shards > 1024 {
		return fmt.Errorf("limiter: Shards = %d: want 1..1024", c.Shards)
	}
	if c.MaxKeys < c.Shards {
		return fmt.Errorf("limiter: MaxKeys = %d: want at least Shards (%d)", c.MaxKeys, c.Shards)
	}
	return nil
}

// Limiter is a token bucket per name, kept as the generic cell rate
// algorithm: per name one "theoretical arrival time" (TAT). With interval
// T = 1/rate and tolerance tau = T*(burst-1), a request at now is allowed
// iff max(TAT, now) - now <= tau, and then TAT = max(TAT, now) + T; a
// refused request waits max(TAT, now) - now - tau. This is exactly a
// bucket of burst tokens refilled at rate (limiter_naive_test.go checks it
// against one), in integer nanoseconds. It is safe for concurrent use, has
// no goroutines, and Allow does not allocate for a known name.
type Limiter struct {
	seed   maphash.Seed
	shards []limiterShard
}

type limiterShard struct {
	mu  sync.Mutex
	max int
	m   map[string]*list.Element // of *bucket
	lru list.List                // front: most recently seen
}

type bucket struct {
	name string
	tat  int64 // unix ns
}

// NewLimiter returns an empty Limiter.
func NewLimiter(cfg LimiterConfig) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{seed: maphash.MakeSeed(), shards: make([]limiterShard, cfg.Shards)}
	for i := range l.shards {
		l.shards[i].max = cfg.MaxKeys / cfg.Shards
		l.shards[i].m = map[string]*list.Element{}
	}
	return l, nil
}

// gcra returns the interval and tolerance of a limit, in ns.
func gcra(rl RateLimit) (interval, tau int64) {
	interval = int64(math.Round(float64(time.Second) / rl.RequestsPerSecond))
	if interval < 1 {
		interval = 1
	}
	burst := int64(rl.Burst)
	if burst <= 0 {
		burst = max(1, int64(math.Ceil(rl.RequestsPerSecond)))
	}
	return interval, interval * (burst - 1)
}

// Allow takes one request of name under limit rl at now. It returns false
// and how long to wait (for Retry-After) when the bucket is empty. An
// unlimited rl always allows and tracks nothing. now must not go backwards
// for a name (use a monotonic clock).
func (l *Limiter) Allow(name string, rl RateLimit, now time.Time) (ok bool, retryAfter time.Duration) {
	if rl.Unlimited() {
		return true, 0
	}
	interval, tau := gcra(rl)
	t := now.UnixNano()
	s := &l.shards[maphash.String(l.seed, name)%uint64(len(l.shards))]
	s.mu.Lock()
	defer s.mu.Unlock()
	var b *bucket
	if el, found := s.m[name]; found {
		s.lru.MoveToFront(el)
		b = el.Value.(*bucket)
	} else {
		for len(s.m) >= s.max {
			old := s.lru.Back()
			s.lru.Remove(old)
			delete(s.m, old.Value.(*bucket).name)
		}
		b = &bucket{name: name, tat: t}
		s.m[name] = s.lru.PushFront(b)
	}
	tat := max(b.tat, t)
	if wait := tat - t - tau; wait > 0 {
		return false, time.Duration(wait)
	}
	b.tat = tat + interval
	return true, 0
}

// Len is the number of names tracked.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
