package regional

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// deadlineConn records whether its deadline was set in the past.
type deadlineConn struct {
	net.Conn
	broken atomic.Bool
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	if t.Before(time.Now()) {
		c.broken.Store(true)
	}
	return nil
}

// refTry is what tryCtx replaces: context.WithCancel of the parent, with
// context.AfterFunc breaking off the watched connection.
type refTry struct {
	ctx    context.Context
	cancel context.CancelFunc
	stopFn func() bool
}

func (r *refTry) watch(c net.Conn) {
	r.stopFn = context.AfterFunc(r.ctx, func() { _ = c.SetDeadline(aLongTimeAgo) })
}

// TestTryCtxLikeWithCancel: whatever happens to a try in whatever order
// (its parent is cancelled, its timer fires, connections are watched and
// unwatched, it ends), tryCtx's Err, Done and stop say what
// context.WithCancel's with context.AfterFunc say, and a connection's I/O
// is broken off exactly when stop says it was.
func TestTryCtxLikeWithCancel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		// The reference's parent is a context.WithCancel; the try's is
		// the same, or a request's h1Ctx cancelled with it.
		parent, cancelRef := context.WithCancel(context.Background())
		defer cancelRef()
		var gotParent context.Context = parent
		cancelParent := cancelRef
		if rapid.Bool().Draw(rt, "under_h1ctx") {
			h := newH1Ctx(context.Background(), nil)
			gotParent = h
			cancelParent = func() { h.cancel(context.Canceled); cancelRef() }
		}
		if rapid.Bool().Draw(rt, "parent_done_first") {
			cancelParent()
		}
		got := newTryCtx(gotParent)
		rctx, rcancel := context.WithCancel(parent)
		ref := &refTry{ctx: rctx, cancel: rcancel}
		var conn *deadlineConn
		watching := false
		ended := false
		for _, op := range rapid.SliceOfN(rapid.IntRange(0, 4), 1, 12).Draw(rt, "ops") {
			switch op {
			case 0:
				cancelParent()
			case 1: // the first-byte timer fires
				got.fire()
				ref.cancel()
			case 2:
				if watching {
					continue
				}
				conn = &deadlineConn{}
				got.watch(conn)
				ref.watch(conn)
				watching = true
			case 3:
				if !watching {
					continue
				}
				g, w := got.stop(), ref.stopFn()
				if g != w {
					rt.Fatalf("stop: %v, want %v", g, w)
				}
				if g == conn.broken.Load() {
					rt.Fatalf("stop %v, but connection broken off %v", g, conn.broken.Load())
				}
				watching = false
			case 4:
				got.end()
				ref.cancel()
				ended = true
			}
			if g, w := got.Err(), ref.ctx.Err(); !errors.Is(g, w) || (g == nil) != (w == nil) {
				rt.Fatalf("Err %v, want %v", g, w)
			}
			select {
			case <-got.Done():
				if ref.ctx.Err() == nil {
					rt.Fatal("done before the reference")
				}
			default:
				if ref.ctx.Err() != nil {
					rt.Fatal("not done with the reference")
				}
			}
		}
		if !ended {
			got.end()
		}
		if got.Err() == nil {
			rt.Fatal("ended, not done")
		}
	})
}

// A try whose parent is cancelled is done, through the parent's
// AfterFunc, and its watched connection is broken off.
func TestTryCtxFollowsParent(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	try := newTryCtx(parent)
	defer try.end()
	c := &deadlineConn{}
	try.watch(c)
	cancel()
	<-try.Done()
	if !errors.Is(try.Err(), context.Canceled) || !c.broken.Load() || try.stop() {
		t.Fatalf("err %v, broken %v", try.Err(), c.broken.Load())
	}
}
