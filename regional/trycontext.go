package regional

import (
	"context"
	"net"
	"sync"
	"time"
)

// tryCtx is the context of one try at an upstream (relay): done when its
// parent (the client's request) is, or when the try is cancelled (its
// first-byte timer fired, or it is over). It also breaks off the blocked
// I/O of the pod connection podConns is using for it (watch), which
// context.AfterFunc did on a context.WithCancel of the parent: one object
// and its closure where those made about ten allocations per try.
//
// It is a context.Context: what is not podConns' own (a dial, an
// http.Client's transport) uses it as any other, its Done channel made
// when asked for. A context derived from it is cancelled through that
// channel (as from any context not the standard library's).
type tryCtx struct {
	parent context.Context
	// fire is t.cancel, made once: the function its timers run (the
	// parent tells parentDone).
	fire       func()
	stopParent func() bool // or, under an h1Ctx, h1.unnotify
	h1         *h1Ctx

	mu   sync.Mutex
	err  error         // why it is done; nil: not done
	done chan struct{} // made on demand (Done), closed when done
	conn net.Conn      // the connection watched, nil: none
	// broke: conn's I/O was broken off (its deadline set in the past).
	broke bool
}

// newTryCtx returns a try's context under parent; the caller ends it
// (end) when the try is over.
//
// Under a request of h1Server (an h1Ctx), it waits in the request's list
// (notify) rather than through context.AfterFunc, whose registration made
// the request's context a map of children.
func newTryCtx(parent context.Context) *tryCtx {
	t := &tryCtx{parent: parent}
	t.fire = t.cancel
	if h, ok := parent.(*h1Ctx); ok {
		t.h1 = h
		if !h.notify(t) {
			t.parentDone()
		}
		return t
	}
	t.stopParent = context.AfterFunc(parent, t.parentDone)
	return t
}

func (t *tryCtx) Deadline() (time.Time, bool) { return t.parent.Deadline() }
func (t *tryCtx) Value(key any) any           { return t.parent.Value(key) }

func (t *tryCtx) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.followLocked()
	return t.err
}

func (t *tryCtx) Done() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.followLocked()
	if t.done == nil {
		t.done = make(chan struct{})
		if t.err != nil {
			close(t.done)
		}
	}
	return t.done
}

// cancel ends the try: what context.CancelFunc does.
func (t *tryCtx) cancel() { t.cancelWith(context.Canceled) }

func (t *tryCtx) parentDone() { t.cancelWith(t.parent.Err()) }

func (t *tryCtx) cancelWith(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cancelLocked(err)
}

// followLocked is the try done if its parent is: the parent's AfterFunc
// runs in a goroutine of its own, a context.WithCancel's child is done
// with its parent, and so is the try whenever it is looked at.
func (t *tryCtx) followLocked() {
	if t.err == nil {
		if err := t.parent.Err(); err != nil {
			t.cancelLocked(err)
		}
	}
}

func (t *tryCtx) cancelLocked(err error) {
	if t.err != nil {
		return
	}
	t.err = err
	if t.done != nil {
		close(t.done)
	}
	if t.conn != nil && !t.broke {
		_ = t.conn.SetDeadline(aLongTimeAgo)
		t.broke = true
	}
}

// end is the try over: it no longer listens to its parent, and is done.
func (t *tryCtx) end() {
	if t.h1 != nil {
		t.h1.unnotify(t)
	} else {
		t.stopParent()
	}
	t.cancel()
}

// watch has c's blocked reads and writes broken off (its deadline set in
// the past) when the try is cancelled, at once if it is; stop undoes it.
// One connection at a time.
func (t *tryCtx) watch(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.conn, t.broke = c, false
	t.followLocked()
	if t.err != nil {
		_ = c.SetDeadline(aLongTimeAgo)
		t.broke = true
	}
}

// stop ends watch, and reports whether the connection's I/O was not
// broken off (as the stop function context.AfterFunc returns: false when
// its function has run).
func (t *tryCtx) stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.followLocked()
	ok := !t.broke
	t.conn, t.broke = nil, false
	return ok
}
