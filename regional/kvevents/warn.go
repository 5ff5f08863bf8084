package kvevents

import (
	"log/slog"
	"sync"
	"time"
)

// WarnLimiter logs each kind of warning at most once per interval and says,
// with the next one it lets through, how many of that kind it suppressed.
// The ingester and the ZMQ bridge log malformed input through one, so a
// flood of bad events costs a counter increment each, not a log line.
// Kinds must come from a bounded set (decode-error reasons, endpoints,
// topics): each kind seen keeps one map entry.
type WarnLimiter struct {
	log      *slog.Logger
	every    time.Duration
	now      func() time.Time
	mu       sync.Mutex
	last     map[string]time.Time
	suppress map[string]int
}

// NewWarnLimiter returns a limiter that logs to log at most once per every
// for each kind, reading the time from now (time.Now when nil).
func NewWarnLimiter(log *slog.Logger, every time.Duration, now func() time.Time) *WarnLimiter {
	if now == nil {
		now = time.Now
	}
	return &WarnLimiter{log: log, every: every, now: now, last: map[string]time.Time{}, suppress: map[string]int{}}
}

// Warn logs msg with args at warn level unless kind was logged within the
// interval, in which case it only counts it.
func (l *WarnLimiter) Warn(kind, msg string, args ...any) {
	l.mu.Lock()
	now := l.now()
	if t, ok := l.last[kind]; ok && now.Sub(t) < l.every {
		l.suppress[kind]++
		l.mu.Unlock()
		return
	}
	n := l.suppress[kind]
	l.last[kind], l.suppress[kind] = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed_since_last", n)
	}
	l.log.Warn(msg, args...)
}
