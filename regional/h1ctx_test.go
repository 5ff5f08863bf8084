package regional

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

type ctxKey struct{}

// waitFor fails the test unless ch is closed (or sent on) within a bound.
func waitFor(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
}

// TestH1CtxLikeWithCancel: whatever is done to a request's context in
// whatever order (cancelled, functions registered with context.AfterFunc
// and stopped, contexts derived from it), h1Ctx says what a
// context.WithCancel of the same base says: Err, Done, context.Cause, the
// base's values, what each stop reports, which functions run, and when
// the derived contexts are done.
func TestH1CtxLikeWithCancel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		// A base that can be cancelled (not cancelled here), as the
		// controller's is.
		live, stopBase := context.WithCancel(context.Background())
		defer stopBase()
		base := context.WithValue(live, ctxKey{}, "v")
		got := newH1Ctx(base, nil)
		ref, cancelRef := context.WithCancel(base)
		defer cancelRef()
		type registered struct {
			gotStop, refStop func() bool
			gotRan, refRan   chan struct{}
			stopped          bool
		}
		var funcs []*registered
		var derived [][2]context.Context
		cancelled := false
		for _, op := range rapid.SliceOfN(rapid.IntRange(0, 3), 1, 12).Draw(rt, "ops") {
			switch op {
			case 0:
				got.cancel(context.Canceled)
				cancelRef()
				cancelled = true
			case 1:
				r := &registered{gotRan: make(chan struct{}), refRan: make(chan struct{})}
				r.gotStop = context.AfterFunc(got, func() { close(r.gotRan) })
				r.refStop = context.AfterFunc(ref, func() { close(r.refRan) })
				funcs = append(funcs, r)
			case 2:
				if len(funcs) == 0 {
					continue
				}
				r := funcs[rapid.IntRange(0, len(funcs)-1).Draw(rt, "which")]
				if g, w := r.gotStop(), r.refStop(); g != w {
					rt.Fatalf("stop: %v, want %v", g, w)
				} else if g {
					r.stopped = true
				}
			case 3:
				g, cg := context.WithTimeout(got, time.Hour)
				w, cw := context.WithTimeout(ref, time.Hour)
				defer cg()
				defer cw()
				derived = append(derived, [2]context.Context{g, w})
			}
			if g, w := got.Err(), ref.Err(); !errors.Is(g, w) || (g == nil) != (w == nil) {
				rt.Fatalf("Err %v, want %v", g, w)
			}
			if g, w := context.Cause(got), context.Cause(ref); !errors.Is(g, w) || (g == nil) != (w == nil) {
				rt.Fatalf("Cause %v, want %v", g, w)
			}
			select {
			case <-got.Done():
				if !cancelled {
					rt.Fatal("done before it was cancelled")
				}
			default:
				if cancelled {
					rt.Fatal("not done once cancelled")
				}
			}
			for _, d := range derived {
				if g, w := d[0].Err(), d[1].Err(); !errors.Is(g, w) || (g == nil) != (w == nil) {
					rt.Fatalf("derived context: Err %v, want %v", g, w)
				}
			}
			if got.Value(ctxKey{}) != "v" {
				rt.Fatal("the base's value is lost")
			}
		}
		got.cancel(context.Canceled)
		cancelRef()
		for _, r := range funcs {
			if r.stopped {
				select {
				case <-r.gotRan:
					rt.Fatal("a stopped function ran")
				default:
				}
				continue
			}
			waitFor(t, r.gotRan, "a function registered and not stopped")
		}
		for _, d := range derived {
			waitFor(t, d[0].Done(), "a context derived from the request's")
			if !errors.Is(d[0].Err(), context.Canceled) {
				rt.Fatalf("derived context: %v", d[0].Err())
			}
		}
	})
}

// A try under an h1Ctx waits in its list, not through context.AfterFunc:
// cancelled with the request (its watched connection broken off), and gone
// from the list once it ends.
func TestTryCtxUnderH1Ctx(t *testing.T) {
	req := newH1Ctx(context.Background(), nil)
	try := newTryCtx(req)
	if try.stopParent != nil || len(req.waiters) != 1 {
		t.Fatalf("the try registered through context.AfterFunc (%d waiting)", len(req.waiters))
	}
	c := &deadlineConn{}
	try.watch(c)
	req.cancel(context.Canceled)
	if !errors.Is(try.Err(), context.Canceled) || !c.broken.Load() || try.stop() {
		t.Fatalf("err %v, broken %v", try.Err(), c.broken.Load())
	}
	try.end()

	req = newH1Ctx(context.Background(), nil)
	for range 3 {
		newTryCtx(req).end()
	}
	if len(req.waiters) != 0 {
		t.Fatalf("%d tries still waiting after they ended", len(req.waiters))
	}
	req.cancel(context.Canceled)
	if try := newTryCtx(req); !errors.Is(try.Err(), context.Canceled) {
		t.Fatalf("a try begun under a done request: %v", try.Err())
	}
}

// When the server's base context is done (a graceful stop's hand-back),
// the request under way is cancelled, and a request that comes after on
// the same connection starts cancelled.
func TestH1ServerBaseEndsRequests(t *testing.T) {
	base, handBack := context.WithCancel(context.Background())
	started := make(chan struct{}, 2)
	errs := make(chan error, 2)
	var n atomic.Int32
	s := &h1Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
		MaxHeaderBytes: 4096, BaseContext: func(net.Listener) context.Context { return base }}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if n.Add(1) == 1 {
			started <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}
		errs <- r.Context().Err()
		w.Header().Set("Content-Length", "2")
		_, _ = io.WriteString(w, "ok")
	})
	const req = "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
	c := sendH1(t, startH1(t, s), req)
	waitFor(t, started, "the first request")
	handBack()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the request under way when the base ended: %v, want cancelled", err)
	}
	buf := make([]byte, 4096)
	if k, err := c.Read(buf); err != nil || !strings.Contains(string(buf[:k]), "200 OK") {
		t.Fatalf("first answer: %q %v", buf[:k], err)
	}
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("a request after the base ended: %v, want cancelled from the start", err)
	}
}

// endingBase is a base context whose Value ends a request's context the
// first time it is asked: context.WithCancel and the like of the request's
// context look up a value (in propagateCancel) after they have looked at
// Done and before they call its AfterFunc, so the request ends just
// between the two, as when the client goes while the handler derives a
// context.
type endingBase struct {
	context.Context
	end func()
}

func (b *endingBase) Value(key any) any {
	if f := b.end; f != nil {
		b.end = nil
		f()
	}
	return b.Context.Value(key)
}

// TestH1CtxDerivedAsItEnds: a context derived from a request's context
// while the request ends is done, and deriving it does not hang (an
// AfterFunc that ran its function inline there deadlocked on the derived
// context's own lock).
func TestH1CtxDerivedAsItEnds(t *testing.T) {
	derive := map[string]func(context.Context) (context.Context, func()){
		"WithCancel": func(p context.Context) (context.Context, func()) {
			return context.WithCancel(p)
		},
		"WithCancelCause": func(p context.Context) (context.Context, func()) {
			ctx, cancel := context.WithCancelCause(p)
			return ctx, func() { cancel(nil) }
		},
		"WithTimeout": func(p context.Context) (context.Context, func()) {
			return context.WithTimeout(p, time.Hour)
		},
	}
	for name, d := range derive {
		t.Run(name, func(t *testing.T) {
			base := &endingBase{Context: context.Background()}
			c := newH1Ctx(base, nil)
			base.end = func() { c.cancel(context.Canceled) }
			derived := make(chan struct{})
			go func() {
				defer close(derived)
				ctx, cancel := d(c)
				defer cancel()
				<-ctx.Done()
			}()
			waitFor(t, derived, "a context derived as the request ends, done")
			if base.end != nil {
				t.Fatal("the request did not end while the context was derived")
			}
		})
	}
}

// TestH1CtxAfterFuncWhenDone: a function registered on a request's
// context that is done runs, and its stop says it could not stop it.
func TestH1CtxAfterFuncWhenDone(t *testing.T) {
	c := newH1Ctx(context.Background(), context.Canceled)
	ran := make(chan struct{})
	stop := c.AfterFunc(func() { close(ran) })
	waitFor(t, ran, "the function of a done context's AfterFunc")
	if stop() {
		t.Fatal("stop reported it stopped a function that ran")
	}
}
