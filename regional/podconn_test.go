package regional

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// rawPod is a pod on loopback that records each request's bytes as they
// arrived and answers with a script: the raw bytes to send back, and
// whether to close the connection after.
type rawPod struct {
	ln      net.Listener
	accepts atomic.Int32
	mu      sync.Mutex
	conns   []net.Conn
	got     [][]byte
	answer  func(n int) (raw string, closeAfter bool)
	wg      sync.WaitGroup
	closed  chan struct{} // a value each time the pod has closed a connection
}

func newRawPod(t testing.TB, answer func(n int) (string, bool)) *rawPod {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPod{ln: ln, answer: answer, closed: make(chan struct{}, 64)}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepts.Add(1)
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *rawPod) serve(c net.Conn) {
	defer func() {
		_ = c.Close()
		select {
		case p.closed <- struct{}{}:
		default:
		}
	}()
	br := bufio.NewReader(c)
	for {
		var rec bytes.Buffer
		req, err := http.ReadRequest(bufio.NewReader(io.TeeReader(br, &rec)))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		// What the tee read past this request's end belongs to the
		// next one: the client sends one request at a time here.
		p.mu.Lock()
		p.got = append(p.got, rec.Bytes())
		n := len(p.got)
		p.mu.Unlock()
		raw, closeAfter := p.answer(n)
		if _, err := io.WriteString(c, raw); err != nil || closeAfter {
			return
		}
	}
}

func (p *rawPod) url() string { return "http://" + p.ln.Addr().String() + "/v1/chat/completions" }

// requests returns what the pod received, its own address replaced by
// "pod".
func (p *rawPod) requests() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out [][]byte
	for _, r := range p.got {
		out = append(out, bytes.ReplaceAll(r, []byte(p.ln.Addr().String()), []byte("pod")))
	}
	return out
}

// outcome is what a caller of Server.roundTrip sees of one request: the
// answer (status, headers, body, read error) or the error, as the relay
// reports it (withoutAddress).
type outcome struct {
	status  int
	header  http.Header
	body    string
	readErr string
	err     string
}

func (o outcome) String() string {
	return fmt.Sprintf("status %d header %v body %q readErr %q err %q", o.status, o.header, o.body, o.readErr, o.err)
}

func roundTripOutcome(s *Server, url string, hdr http.Header, body string) outcome {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return outcome{err: err.Error()}
	}
	// The relay's request body is a *bytes.Reader; strings.Reader is
	// replayable too.
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := s.roundTrip(s.client, req)
	if err != nil {
		return outcome{err: withoutAddress(err).Error()}
	}
	return readOutcome(resp)
}

// readOutcome reads resp to its end and closes it.
func readOutcome(resp *http.Response) outcome {
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	o := outcome{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if rerr != nil {
		o.readErr = rerr.Error()
	}
	return o
}

// postOutcome is roundTripOutcome through Server.postToPod, which builds
// no http.Request; a request it does not send is an error "not posted".
func postOutcome(s *Server, url string, hdr http.Header, body string) outcome {
	resp, err := s.postToPod(context.Background(), s.client, nil, url, hdr, func(string) bool { return true }, nil, []byte(body))
	if err == errNotPosted || err == errRedirected {
		return outcome{err: "not posted: " + err.Error()}
	}
	if err != nil {
		return outcome{err: withoutAddress(err).Error()}
	}
	return readOutcome(resp)
}

// testServers returns a Server that reaches pods through http.Transport
// alone (the reference) and one that uses podConns, with the same
// transport settings.
func testServers(t *testing.T) (ref, fast *Server) {
	t.Helper()
	rt, ft := NewPodTransport(), NewPodTransport()
	t.Cleanup(rt.CloseIdleConnections)
	ref = &Server{client: &http.Client{Transport: rt}}
	fast = &Server{client: &http.Client{Transport: ft}, pods: newPodConns(ft)}
	if fast.pods == nil {
		t.Skip("podConns is not used on this platform")
	}
	t.Cleanup(fast.pods.CloseIdleConnections)
	return ref, fast
}

// TestPodConnsLikeTransport sends the same requests through http.Client
// (NewPodTransport) and through podConns to pods answering in the ways
// pods answer, and well or badly formed: the pod must receive the same
// bytes and the caller see the same answer or error.
func TestPodConnsLikeTransport(t *testing.T) {
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"e\r\ndata: {\"a\":1}\n\n\r\n" + "e\r\ndata: {\"b\":2}\n\n\r\n" + "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
	cases := map[string]string{
		"ok":             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}",
		"sse":            sse,
		"continue":       "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
		"early hints":    "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\nhi",
		"close":          "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
		"no answer":      "",
		"short body":     "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..",
		"short chunks":   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
		"until close":    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it",
		"no content":     "HTTP/1.1 204 No Content\r\n\r\n",
		"server error":   "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nbusy",
		"http/1.0":       "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
		"garbage":        "HELLO\r\n\r\n",
		"bad header":     "HTTP/1.1 200 OK\r\nNo Colon Here\r\n\r\n",
		"bad length":     "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nhi",
		"half status":    "HTTP/1.1 2",
		"many 1xx":       strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", 7) + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"gzip untouched": "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nxyz",
	}
	headers := []http.Header{
		{"Content-Type": {"application/json"}},
		{"Content-Type": {"application/json"}, "User-Agent": {"openai-python/1.0"}, "X-Meridian-Pod": {"p1"},
			"X-Multi": {"a", "b"}, "Accept": {"text/event-stream"}, "X-Space": {"  padded  "}},
		{"User-Agent": {""}, "Expect": {"100-continue"}},
	}
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("hello ", 3000) + `"}]}`
	for name, raw := range cases {
		for hi, hdr := range headers {
			t.Run(fmt.Sprintf("%s/headers=%d", name, hi), func(t *testing.T) {
				ref, fast := testServers(t)
				rp := newRawPod(t, func(int) (string, bool) { return raw, true })
				fp := newRawPod(t, func(int) (string, bool) { return raw, true })
				pp := newRawPod(t, func(int) (string, bool) { return raw, true })
				want := roundTripOutcome(ref, rp.url(), hdr, body)
				got := roundTripOutcome(fast, fp.url(), hdr, body)
				if got.String() != want.String() {
					t.Errorf("answer:\n got %v\nwant %v", got, want)
				}
				if g, w := fp.requests(), rp.requests(); len(g) != len(w) || (len(g) > 0 && !bytes.Equal(g[0], w[0])) {
					t.Errorf("the pod received:\n got %q\nwant %q", g, w)
				}
				// And without an http.Request (Server.postToPod).
				if got := postOutcome(fast, pp.url(), hdr, body); got.String() != want.String() {
					t.Errorf("posted, answer:\n got %v\nwant %v", got, want)
				}
				if g, w := pp.requests(), rp.requests(); len(g) != len(w) || (len(g) > 0 && !bytes.Equal(g[0], w[0])) {
					t.Errorf("posted, the pod received:\n got %q\nwant %q", g, w)
				}
			})
		}
	}
}

// TestPodConnsReuse: answers read to the end leave their connection for
// the next request; one the pod closes while idle, or asks to close, is
// not used again, and no request fails for it.
func TestPodConnsReuse(t *testing.T) {
	_, fast := testServers(t)
	ok := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
	t.Run("kept alive", func(t *testing.T) {
		p := newRawPod(t, func(int) (string, bool) { return ok, false })
		for i := 0; i < 5; i++ {
			if o := roundTripOutcome(fast, p.url(), nil, "{}"); o.status != 200 || o.body != "hi" || o.err != "" {
				t.Fatalf("request %d: %v", i, o)
			}
		}
		if n := p.accepts.Load(); n != 1 {
			t.Errorf("%d connections for 5 requests in turn, want 1", n)
		}
	})
	t.Run("closed while idle", func(t *testing.T) {
		// The pod answers and closes: the next request finds the
		// connection closed and dials again.
		p := newRawPod(t, func(int) (string, bool) { return ok, true })
		for i := 0; i < 3; i++ {
			if o := roundTripOutcome(fast, p.url(), nil, "{}"); o.status != 200 || o.err != "" {
				t.Fatalf("request %d: %v", i, o)
			}
			// The next request goes once the pod has closed (on
			// loopback its FIN is here when close returns): sent
			// before, it would race the close, through the
			// transport as well.
			<-p.closed
		}
		if n := p.accepts.Load(); n != 3 {
			t.Errorf("%d connections, want 3", n)
		}
	})
	t.Run("asked to close", func(t *testing.T) {
		p := newRawPod(t, func(int) (string, bool) {
			return "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi", false
		})
		for i := 0; i < 3; i++ {
			if o := roundTripOutcome(fast, p.url(), nil, "{}"); o.status != 200 || o.err != "" {
				t.Fatalf("request %d: %v", i, o)
			}
		}
		if n := p.accepts.Load(); n != 3 {
			t.Errorf("%d connections, want 3", n)
		}
	})
	t.Run("body left unread", func(t *testing.T) {
		p := newRawPod(t, func(int) (string, bool) { return ok, false })
		for i := 0; i < 2; i++ {
			req, _ := http.NewRequest(http.MethodPost, p.url(), strings.NewReader("{}"))
			resp, err := fast.roundTrip(fast.client, req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
		}
		if n := p.accepts.Load(); n != 2 {
			t.Errorf("%d connections, want 2 (a body closed unread closes its connection)", n)
		}
	})
}

// TestPodConnsCancel: a cancelled request breaks off a pod that does not
// answer, with the context's error, as through the transport.
func TestPodConnsCancel(t *testing.T) {
	ref, fast := testServers(t)
	for _, s := range []*Server{ref, fast} {
		stall, held := make(chan struct{}), make(chan struct{}, 1)
		p := newRawPod(t, func(int) (string, bool) { held <- struct{}{}; <-stall; return "", true })
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url(), strings.NewReader("{}"))
		done := make(chan error, 1)
		go func() {
			resp, err := s.roundTrip(s.client, req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		<-held // the pod holds the request
		cancel()
		err := <-done
		close(stall)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("pods=%v: error %v, want context.Canceled", s.pods != nil, err)
		}
	}
}

// TestPodConnsRefused: a pod that is not listening is refused with the
// transport's error (the relay ejects it at once on ECONNREFUSED).
func TestPodConnsRefused(t *testing.T) {
	ref, fast := testServers(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/v1/chat/completions"
	_ = ln.Close()
	want := roundTripOutcome(ref, url, nil, "{}")
	got := roundTripOutcome(fast, url, nil, "{}")
	if got.String() != want.String() || !strings.Contains(got.err, "refused") {
		t.Errorf("got %v, want %v (refused)", got, want)
	}
}

// TestPodConnsEligible: what podConns does not send goes to the transport.
func TestPodConnsEligible(t *testing.T) {
	tr := NewPodTransport()
	c := newPodConns(tr)
	if c == nil {
		t.Skip("podConns is not used on this platform")
	}
	mk := func(url string, h http.Header) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
		for k, v := range h {
			req.Header[k] = v
		}
		return req
	}
	for _, tc := range []struct {
		req  *http.Request
		want bool
	}{
		{mk("http://10.0.0.1:8000/v1/chat/completions", nil), true},
		{mk("https://10.0.0.1:8000/v1/chat/completions", nil), false},
		{mk("http://10.0.0.1:8000/v1/chat/completions", http.Header{"X-Bad": {"a\x00b"}}), false},
		{mk("http://10.0.0.1:8000/v1/chat/completions", http.Header{"Bad Name": {"x"}}), false},
	} {
		if got := c.eligible(tc.req); got != tc.want {
			t.Errorf("%s %v: eligible %v, want %v", tc.req.URL, tc.req.Header, got, tc.want)
		}
	}
	withProxy := NewPodTransport()
	withProxy.Proxy = http.ProxyFromEnvironment
	if newPodConns(withProxy) != nil {
		t.Error("a transport with a proxy: podConns used")
	}
	compress := NewPodTransport()
	compress.DisableCompression = false
	if newPodConns(compress) != nil {
		t.Error("a transport that decompresses: podConns used")
	}
}

// TestPodConnsHeaderLimit: an answer whose header is longer than the
// transport accepts fails as it does through the transport.
func TestPodConnsHeaderLimit(t *testing.T) {
	ref, fast := testServers(t)
	raw := "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 11<<20) + "\r\nContent-Length: 0\r\n\r\n"
	want := roundTripOutcome(ref, newRawPod(t, func(int) (string, bool) { return raw, true }).url(), nil, "{}")
	got := roundTripOutcome(fast, newRawPod(t, func(int) (string, bool) { return raw, true }).url(), nil, "{}")
	if got.String() != want.String() || want.err == "" {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

// TestPodConnsTellTheTracer: as through the transport, a request's
// httptrace GotConn hook hears of its connection, new then reused (relay's
// connect timer arms the first-byte bound on it).
func TestPodConnsTellTheTracer(t *testing.T) {
	for _, name := range []string{"transport", "podConns"} {
		t.Run(name, func(t *testing.T) {
			ref, fast := testServers(t)
			s := ref
			if name == "podConns" {
				s = fast
			}
			p := newRawPod(t, func(int) (string, bool) { return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", false })
			var reused []bool
			for i := 0; i < 2; i++ {
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					GotConn: func(info httptrace.GotConnInfo) { reused = append(reused, info.Reused) },
				})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url(), strings.NewReader("{}"))
				resp, err := s.roundTrip(s.client, req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			if fmt.Sprint(reused) != "[false true]" {
				t.Errorf("GotConn heard reused=%v, want [false true]", reused)
			}
		})
	}
}

// TestIdleCheckLikeConnAlive: a connection's idleCheck, checked again and
// again, says what connAlive says of it: alive while idle, not once the
// peer sent bytes unasked or closed it.
func TestIdleCheckLikeConnAlive(t *testing.T) {
	if !canCheckIdle {
		t.Skip("no idle check on this platform")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (client, server net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	both := func(c net.Conn, k *idleCheck, want bool) {
		t.Helper()
		for i := 0; i < 3; i++ {
			if got, ref := k.check(), connAlive(c); got != ref || got != want {
				t.Fatalf("check %d: idleCheck %v, connAlive %v, want %v", i, got, ref, want)
			}
		}
	}
	waitReadable := func(c net.Conn) {
		// The peer's bytes or close have arrived once a peek sees them.
		for connAlive(c) {
			runtime.Gosched()
		}
	}
	c, s := pair()
	k := newIdleCheck(c)
	both(c, k, true)
	_, _ = s.Write([]byte("x")) // stray bytes
	waitReadable(c)
	both(c, k, false)
	c.Close()
	s.Close()

	c, s = pair()
	k = newIdleCheck(c)
	both(c, k, true)
	s.Close()
	waitReadable(c)
	both(c, k, false)
	c.Close()
	both(c, k, false) // closed here too
}
