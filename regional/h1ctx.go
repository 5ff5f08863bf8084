package regional

import (
	"context"
	"sync"
	"time"
)

// h1Ctx is the context of a request h1Server serves: done when its
// handler returns, when the client goes away, or when the server's base
// context is done (a graceful stop's hand-back). A context.WithCancel of
// the base did that before, at a cost on every request: a registration in
// the base's map of children (one map, and its mutex, shared by every
// request of the server) and, once a try's context (tryCtx) registered
// on the request's, a map of children of its own. The base is watched
// once per connection instead (h1Conn.baseDone), and what waits on the
// request is kept in a short list: tryCtx directly (notify), anything
// else through AfterFunc, which context.AfterFunc and the contexts derived
// from this one use.
//
// Its Deadline and Value are the base's (so context.Cause of it is its
// Err unless the base was cancelled with a cause, as for a
// context.WithCancel of the base).
type h1Ctx struct {
	base context.Context

	mu      sync.Mutex
	err     error         // why it is done; nil: not done
	done    chan struct{} // made when asked for, closed when done
	waiters []h1Waiter    // told once when done, then dropped
	inline  [2]h1Waiter   // waiters' first room
}

// h1Waiter is told when an h1Ctx it waits on is done. parentDone may not
// block, and may look at the context (it is called without its lock).
type h1Waiter interface{ parentDone() }

// newH1Ctx is a request's context under base; err, when not nil, is why
// it is done already (the base is).
func newH1Ctx(base context.Context, err error) *h1Ctx {
	c := &h1Ctx{base: base, err: err}
	c.waiters = c.inline[:0]
	return c
}

func (c *h1Ctx) Deadline() (time.Time, bool) { return c.base.Deadline() }
func (c *h1Ctx) Value(key any) any           { return c.base.Value(key) }

func (c *h1Ctx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *h1Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

// cancel makes c done with err, unless it is done already, and tells its
// waiters.
func (c *h1Ctx) cancel(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	waiters := c.waiters
	c.waiters = nil
	c.mu.Unlock()
	for _, w := range waiters {
		w.parentDone()
	}
}

// notify has w told when c is done, and reports whether it will be:
// false when c is done already (w is not told).
func (c *h1Ctx) notify(w h1Waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.waiters = append(c.waiters, w)
	return true
}

// unnotify undoes notify, and reports whether it did so before w was
// told.
func (c *h1Ctx) unnotify(w h1Waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.waiters {
		if x == w {
			last := len(c.waiters) - 1
			copy(c.waiters[i:], c.waiters[i+1:])
			c.waiters[last] = nil
			c.waiters = c.waiters[:last]
			return true
		}
	}
	return false
}

// AfterFunc calls f once c is done, unless stop is called first; stop
// reports whether it stopped f. The standard library calls it
// (context.AfterFunc, context.WithCancel and the like of c look for the
// method) with a function that cancels the context it derives. When c
// ends later, f is called as c is done (by cancel, without c's lock, and
// such an f does not block), not in a goroutine of its own: a context
// derived from c is done when c is, as a context.WithCancel's child is.
// When c is done already, f runs in a goroutine of its own, as
// context.AfterFunc's does: context.WithCancel and the like call
// AfterFunc holding the child's lock, which their f takes, so f may not
// run before AfterFunc returns (c can end between their look at Done
// and this call). Nothing else may call it.
func (c *h1Ctx) AfterFunc(f func()) (stop func() bool) {
	a := &h1AfterFunc{f: f}
	if !c.notify(a) {
		go f()
		return func() bool { return false }
	}
	return func() bool { return c.unnotify(a) }
}

// h1AfterFunc is a function AfterFunc runs.
type h1AfterFunc struct{ f func() }

func (a *h1AfterFunc) parentDone() { a.f() }
