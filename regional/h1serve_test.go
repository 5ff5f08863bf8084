package regional

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// startH1 serves h on a loopback h1Server and returns its address.
func startH1(t *testing.T, s *h1Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return ln.Addr().String()
}

// sendH1 dials addr, with a deadline for the whole test's exchange, and
// writes req; the connection closes with the test.
func sendH1(t *testing.T, addr, req string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitWatch yields until the server's only connection watches its client,
// or fails after a bound; the channel closes when that watch ends.
func waitWatch(t *testing.T, s *h1Server) <-chan struct{} {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		var done chan struct{}
		for c := range s.conns {
			c.wmu.Lock()
			if c.wstate == watchRunning {
				done = c.wdone
			}
			c.wmu.Unlock()
		}
		s.mu.Unlock()
		if done != nil {
			return done
		}
		runtime.Gosched()
	}
	t.Fatal("the client watch never started")
	return nil
}

// TestH1ServerWatchKeepsPipelinedRequest: a request that arrives while the
// previous one's client is watched is not lost: the watch leaves its bytes
// buffered, does not cancel the running request, and the next request is
// answered after it, in order.
func TestH1ServerWatchKeepsPipelinedRequest(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	s := &h1Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
		MaxHeaderBytes: 4096, WatchAfter: time.Nanosecond}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		started <- struct{}{}
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
				w.WriteHeader(499)
				return
			}
		}
		_, _ = io.WriteString(w, r.URL.Path+":"+string(body))
	})
	c := sendH1(t, startH1(t, s), "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
	<-started
	watched := waitWatch(t, s)
	if _, err := io.WriteString(c, "POST /next HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\ncde"); err != nil {
		t.Fatal(err)
	}
	// The watch ends when the next request's bytes reach it.
	select {
	case <-watched:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end when the next request came")
	}
	close(release)
	br := bufio.NewReader(c)
	for _, want := range []string{"/slow:ab", "/next:cde"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", want, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(got) != want {
			t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, got, want)
		}
	}
}

// waitWatchState yields until the server's only connection's watch is in
// state, or fails after a bound.
func waitWatchState(t *testing.T, s *h1Server, state int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		in := false
		for c := range s.conns {
			c.wmu.Lock()
			in = c.wstate == state
			c.wmu.Unlock()
		}
		s.mu.Unlock()
		if in {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("the client watch never reached state %d", state)
}

// TestH1ServerWatchCancelsOnClose: a watched request's context ends when its
// client closes the connection, also when the body was still being read
// as the countdown to watching ended (the watch then starts with the
// body's end).
func TestH1ServerWatchCancelsOnClose(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("body-after-countdown=%v", late), func(t *testing.T) {
			cancelled := make(chan error, 1)
			s := &h1Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
				MaxHeaderBytes: 4096, WatchAfter: time.Nanosecond}
			s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				select {
				case <-r.Context().Done():
					cancelled <- context.Cause(r.Context())
				case <-time.After(10 * time.Second):
					cancelled <- nil
				}
			})
			c, err := net.Dial("tcp", startH1(t, s))
			if err != nil {
				t.Fatal(err)
			}
			head, body := "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n", "ab"
			if late {
				// Half the body: the handler waits for the rest past the
				// countdown.
				head, body = head+body[:1], body[1:]
			}
			if _, err := io.WriteString(c, head); err != nil {
				t.Fatal(err)
			}
			if late {
				waitWatchState(t, s, watchPending)
				if _, err := io.WriteString(c, body); err != nil {
					t.Fatal(err)
				}
			} else if _, err := io.WriteString(c, body); err != nil {
				t.Fatal(err)
			}
			waitWatch(t, s)
			c.Close()
			if err := <-cancelled; err == nil {
				t.Fatal("the handler's context was not cancelled when its client closed")
			}
		})
	}
}

// TestH1ServerHeaderLimits: a request whose line and header exceed
// MaxHeaderBytes+4096 is answered 431 and the connection closed, also
// when it arrives pipelined behind a request that fits; one within the
// limit is served.
func TestH1ServerHeaderLimits(t *testing.T) {
	s := &h1Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
		MaxHeaderBytes: 4096}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr := startH1(t, s)
	for _, tc := range []struct {
		name  string
		pad   int
		codes []int
	}{
		{"fits", 6000, []int{200, 200}},
		{"too long", 9000, []int{200, 431}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := sendH1(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"+"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: "+strings.Repeat("a", tc.pad)+"\r\n\r\n")
			br := bufio.NewReader(c)
			for i, want := range tc.codes {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("answer %d: %v", i, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("answer %d: status %d, want %d", i, resp.StatusCode, want)
				}
			}
		})
	}
}

// emfileListener fails its first Accept as accept(2) does when the process
// is out of file descriptors, then accepts as its listener does.
type emfileListener struct {
	net.Listener
	failed atomic.Bool
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.failed.CompareAndSwap(false, true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestH1ServerAcceptSurvivesEMFILE: a temporary Accept error (EMFILE, out
// of file descriptors: a net.Error whose Temporary is true, Timeout false)
// does not end Serve, as it does not end net/http's: the listener is tried
// again and the next connection served.
func TestH1ServerAcceptSurvivesEMFILE(t *testing.T) {
	s := &h1Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
		MaxHeaderBytes: 4096}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var serveErr error
	served := make(chan struct{})
	go func() {
		serveErr = s.Serve(&emfileListener{Listener: ln})
		close(served)
	}()
	defer func() {
		_ = s.Close()
		_ = ln.Close()
		<-served
	}()
	c := sendH1(t, ln.Addr().String(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	type answer struct {
		code int
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- answer{0, err}
			return
		}
		resp.Body.Close()
		answered <- answer{resp.StatusCode, nil}
	}()
	select {
	case <-served:
		t.Fatalf("Serve returned %v after one EMFILE from Accept; want it to retry", serveErr)
	case a := <-answered:
		if a.err != nil || a.code != 200 {
			t.Fatalf("answer %d, %v; want 200", a.code, a.err)
		}
	}
}

// TestH1ServerLateContentLength: a Content-Length the handler sets after
// WriteHeader does not reach the answer's header (net/http writes the
// header as WriteHeader saw it): a chunked answer must not also carry a
// Content-Length (RFC 9112 6.1), which a client or proxy in between may
// frame the answer by instead.
func TestH1ServerLateContentLength(t *testing.T) {
	s := &h1Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
		MaxHeaderBytes: 4096}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.Header().Set("Content-Length", "1")
		_, _ = io.WriteString(w, strings.Repeat("b", 3*h1BodyBuffer))
	})
	c := sendH1(t, startH1(t, s), "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	tp := textproto.NewReader(bufio.NewReader(c))
	if _, err := tp.ReadLine(); err != nil {
		t.Fatal(err)
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		t.Fatal(err)
	}
	if cl := h.Values("Content-Length"); len(cl) > 0 {
		t.Fatalf("answer framed by Transfer-Encoding %q also carries Content-Length %q", h.Values("Transfer-Encoding"), cl)
	}
}

// oneByteReader hands out its text a byte per Read, as a client sending
// a header slowly does.
type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0], r.s = r.s[0], r.s[1:]
	return 1, nil
}

// slowHeader is a request whose header has a long line before two Host
// headers, the first folded.
func slowHeader(pad int) string {
	return "GET / HTTP/1.1\r\nX-Pad: " + strings.Repeat("a", pad) + "\r\nHost: a.example\r\n b\r\nHost: c\r\n\r\n"
}

// TestH1ScanHeaderInPieces: a header that arrives a byte at a time counts
// the same Host headers, with the same first value, as one that arrives
// whole.
func TestH1ScanHeaderInPieces(t *testing.T) {
	req := slowHeader(3000)
	var hc h1Conn
	wantHosts, wantHost, err := hc.scanHeader(bufio.NewReaderSize(strings.NewReader(req), 64<<10))
	if err != nil || wantHosts != 2 || wantHost != "a.example b" {
		t.Fatalf("whole: %d hosts, first %q, %v; want 2, \"a.example b\"", wantHosts, wantHost, err)
	}
	hosts, host, err := hc.scanHeader(bufio.NewReaderSize(&oneByteReader{req}, 64<<10))
	if err != nil || hosts != wantHosts || host != wantHost {
		t.Fatalf("a byte at a time: %d hosts, first %q, %v; whole: %d, %q", hosts, host, err, wantHosts, wantHost)
	}
}

// BenchmarkH1ScanHeaderByteAtATime: what scanning a 32 KiB header line
// that arrives a byte at a time costs.
func BenchmarkH1ScanHeaderByteAtATime(b *testing.B) {
	req := slowHeader(32 << 10)
	var hc h1Conn
	b.ReportAllocs()
	for range b.N {
		if _, _, err := hc.scanHeader(bufio.NewReaderSize(&oneByteReader{req}, 64<<10)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestH1ServerHeaderPerAnswer: a connection reuses its answers' header
// map, and a field one answer set is not in the next one's.
func TestH1ServerHeaderPerAnswer(t *testing.T) {
	s := &h1Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
		MaxHeaderBytes: 4096}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(w.Header()) != 0 {
			t.Errorf("%s: the answer's header starts with %v", r.URL.Path, w.Header())
		}
		w.Header().Set("X-Path", r.URL.Path)
		if r.URL.Path == "/first" {
			w.Header().Set("X-First", "1")
		}
		_, _ = io.WriteString(w, "ok")
	})
	c := sendH1(t, startH1(t, s), "GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	for _, path := range []string{"/first", "/second"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if got := resp.Header.Get("X-Path"); got != path {
			t.Errorf("answer to %s: X-Path %q", path, got)
		}
		if got, want := resp.Header.Get("X-First"), map[string]string{"/first": "1"}[path]; got != want {
			t.Errorf("answer to %s: X-First %q, want %q", path, got, want)
		}
	}
}
