package regional

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-llm/meridian/regional/reqbody"
)

// forwardOnce forwards chatBody to region "x" through f's server, within
// generous limits, and returns the attempt and the client's answer.
func forwardOnce(t *testing.T, f *serverFixture) (attempt, *httptest.ResponseRecorder) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	p := &parsed{raw: reqbody.Of([]byte(chatBody)), started: f.clock.Now()}
	lim := limits{connect: 10 * time.Second, firstByte: 30 * time.Second, within: 60 * time.Second}
	res := f.srv.forwardRemote(context.Background(), w, r, p, "x", "here", "d1", lim, func() {})
	return res, w
}

// hangUp is a controller that accepts connections and closes them at once
// (it died with its listener still bound), counting them.
func hangUp(t *testing.T) (addr string, accepts *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepts = new(atomic.Int64)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return "http://" + ln.Addr().String(), accepts
}

// A controller of the region that failed to answer is tried after those
// that answer, so one dead replica costs one request one failed try, not
// every request one (the forwards all succeed on the other replica).
func TestForwardTriesAnsweringControllersFirst(t *testing.T) {
	f := newServerFixture(t, nil, nil)
	dead, accepts := hangUp(t)
	live := httptest.NewServer(http.HandlerFunc(okJSON))
	t.Cleanup(live.Close)
	f.srv.SetTopology(Topology{Region: "here", HopToken: "t", Remotes: staticRemotes{"x": {dead, live.URL}}})
	for i := range 6 {
		res, w := forwardOnce(t, f)
		if res.err != nil || w.Code != http.StatusOK {
			t.Fatalf("forward %d: %v, %d %s", i, res.err, w.Code, w.Body)
		}
	}
	if n := accepts.Load(); n != 1 {
		t.Fatalf("the dead controller was tried %d times, want once", n)
	}

	// When every controller fails, the answer says what each came to,
	// not only the last one tried.
	dead2, _ := hangUp(t)
	f.srv.SetTopology(Topology{Region: "here", HopToken: "t", Remotes: staticRemotes{"x": {dead, dead2}}})
	res, _ := forwardOnce(t, f)
	if res.err == nil {
		t.Fatal("a forward to two dead controllers succeeded")
	}
	for _, want := range []string{"2 controllers tried", dead, dead2} {
		if !strings.Contains(res.err.Error(), want) {
			t.Errorf("the forward's error %q does not say %q", res.err, want)
		}
	}
}

// After a warm round, a forward to a controller rides the connection the
// probe left in the pool: no TLS handshake on the request path.
func TestWarmLinkCarriesTheNextForward(t *testing.T) {
	var conns atomic.Int64
	remote := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
			return
		}
		okJSON(w, r)
	}))
	remote.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	remote.StartTLS()
	t.Cleanup(remote.Close)
	pt := NewPeerTransport()
	roots := x509.NewCertPool()
	roots.AddCert(remote.Certificate())
	pt.TLSClientConfig = remote.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	pt.TLSClientConfig.RootCAs = roots
	t.Cleanup(pt.CloseIdleConnections)
	f := newServerFixture(t, nil, func(c *fixtureConfig) { c.peer = pt })
	f.srv.SetTopology(Topology{Region: "here", HopToken: "t", Remotes: staticRemotes{"x": {remote.URL}}})

	f.srv.links.warm(context.Background(), []string{remote.URL}, 30*time.Second)
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections after the warm round, want 1", n)
	}
	for i := range 3 {
		if res, w := forwardOnce(t, f); res.err != nil || w.Code != http.StatusOK {
			t.Fatalf("forward %d: %v, %d %s", i, res.err, w.Code, w.Body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections after the forwards, want the warm one only", n)
	}
}

// pipeListener hands the server ends of in-memory connections to an
// http.Server (for tests in a synctest bubble).
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// The first-byte bound of a forward runs from the connection being up: a
// connection that took most of its connect bound (a handshake on a busy
// CPU) leaves the remote the whole first-byte bound to answer. A
// connection later than the connect bound is still a connect timeout.
func TestForwardFirstByteBoundStartsWhenConnected(t *testing.T) {
	f := newServerFixture(t, nil, nil)
	lim := limits{connect: time.Second, firstByte: 2 * time.Second, within: time.Minute}
	try := func(t *testing.T, dial time.Duration) attempt {
		ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(1900 * time.Millisecond) // the remote's queue and prefill
			okJSON(w, r)
		})}
		go func() { _ = hs.Serve(ln) }()
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			time.Sleep(dial) // TCP and TLS
			c, s := net.Pipe()
			select {
			case ln.conns <- s:
				return c, nil
			case <-ln.done:
				return nil, errors.New("closed")
			}
		}}
		defer func() {
			time.Sleep(dial) // a dial given up on ends (fake time, in the bubble)
			tr.CloseIdleConnections()
			_ = hs.Close()
		}()
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		p := &parsed{raw: reqbody.Of([]byte(chatBody)), started: f.clock.Now()}
		res := f.srv.relay(context.Background(), &http.Client{Transport: tr}, w, r, p, "http://x/v1/chat/completions", nil, nil, "region x", lim, func(int) {})
		return res
	}
	synctest.Test(t, func(t *testing.T) {
		if res := try(t, 900*time.Millisecond); res.err != nil || res.status != http.StatusOK {
			t.Fatalf("connected in 0.9 s, answered 1.9 s later: %v (%s), status %d", res.err, res.kind, res.status)
		}
		if res := try(t, 1500*time.Millisecond); res.kind != "connect_timeout" || !res.retryable {
			t.Fatalf("connected in 1.5 s: %v (%s)", res.err, res.kind)
		}
	})
}
