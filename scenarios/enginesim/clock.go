package enginesim

import "time"

// Clock is the engine's only source of time. The real one is used in the
// server; tests run the engine inside a testing/synctest bubble, where the
// real clock's time is virtual and advances only when every goroutine of the
// bubble is blocked, so timing assertions are exact.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer from a Clock.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// RealClock is the Clock backed by package time.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer implements Clock.
func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }
