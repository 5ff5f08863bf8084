// Package audittest holds test helpers for users of package audit: a manual
// clock that satisfies audit.Clock.
//
// Invariants: the clock's time moves only when the test calls Advance or
// Set (a step back included, to test the log's clamping); an After channel
// fires during the call that brings the clock to its deadline, never
// otherwise; WaitForWaiters lets a test wait until a goroutine is parked on
// the clock instead of sleeping.
//
// It is test scaffolding: only tests import it. It imports nothing of ours,
// not even audit, so the audit package's own (in-package) tests can use it
// too.
package audittest

import (
	"context"
	"sync"
	"time"
)

// Clock is a manual clock: time moves only by Advance, and After channels
// fire when Advance passes their deadline.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
	changed chan struct{} // closed and replaced when a waiter is added
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a clock set to now.
func NewClock(now time.Time) *Clock {
	return &Clock{now: now, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the time once Advance reaches d
// from now (immediately for d <= 0).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), ch: ch})
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance moves the clock forward (or back, for d < 0) and fires the
// waiters whose deadline it reached.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	clear(c.waiters[len(kept):])
	c.waiters = kept
}

// Set moves the clock to t (which may be earlier: a clock step back).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	d := t.Sub(c.now)
	c.mu.Unlock()
	c.Advance(d)
}

// Waiters returns how many After channels have not fired yet.
func (c *Clock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// WaitForWaiters blocks until at least n After channels are pending (a
// goroutine is parked on the clock) or ctx ends.
func (c *Clock) WaitForWaiters(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		got, changed := len(c.waiters), c.changed
		c.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
