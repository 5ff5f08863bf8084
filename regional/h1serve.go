package regional

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// h1Server serves HTTP/1.1 on the API listener: one goroutine per
// connection reads a request, runs the handler and writes its answer, in
// turn. It replaces net/http's server there because of what that server
// costs per request on these virtual CPUs. A bare Go proxy hop in front
// of scripts/proxyload's backend, the same code behind either server,
// held added p99 <= 1 ms up to 2,250 req/s behind net/http's server (0.46
// of a core at that rate) and up to 6,750 req/s behind a loop like this
// one (0.27 of a core at 3,000 req/s; docs/perf/proxy-tail.md). Most of
// the difference is the wakeups of other threads: net/http starts a
// goroutine per request to watch the client's connection while the
// handler runs, and stops it again with a past read deadline.
//
// What it keeps from net/http: the request is parsed by http.ReadRequest,
// the standard library's own parser (request line, header, and the body's
// framing: Content-Length, chunked, the Content-Length/Transfer-Encoding
// conflicts that smuggle requests), and the answer's header is written by
// http.Header.Write's sanitising writer. Around them it does what
// net/http's server does, and h1serve_diff_test.go holds it to that,
// request by request, with net/http's server as the reference:
//   - the request's line and header within MaxHeaderBytes+4096 bytes
//     (431), HTTP/1.x only (505; the HTTP/2 preface goes to the handler,
//     to close after), exactly one valid Host header on HTTP/1.1 (400),
//     valid header names and values (400), no transfer coding but
//     chunked (501);
//   - a kept-alive connection's next request starts with its first four
//     bytes (the first request's deadlines run from the connection's
//     start), and up to four CR or LF after a POST's body are skipped;
//   - Connection and Expect read as net/http reads them (tokens
//     separated by spaces, tabs or commas); a request line or header
//     line already malformed within the header limit is 400, not 431;
//   - Expect: 100-continue answered at the handler's first read of the
//     body, any other expectation refused (417);
//   - keep-alive by HTTP/1.1's and 1.0's rules and the handler's
//     Connection: close; a body the handler left unread, as the answer's
//     header goes out: drained up to 256 KiB (unless the answer is 413,
//     http.MaxBytesReader's refusal), or the connection closed
//     after the answer, its sending side first, and the close held back
//     500 ms so that the client reads the answer before any reset;
//   - Content-Length for an answer the handler completed within 4 KiB,
//     chunked otherwise (close-delimited for HTTP/1.0); Content-Type
//     sniffed when the handler set none; a Date header; no body for
//     HEAD, 1xx, 204 and 304; OPTIONS * answered 200 without the handler;
//   - a panicking handler's connection closed.
//
// The request's context ends when the handler returns, at a graceful
// stop's hand-back (BaseContext), or when the client goes away. The last
// is watched only once a request has run for WatchAfter (2 ms) with its
// body read (or from its body's end, if that comes later): a read of the
// connection that ends with the client's close or reset cancels the
// context; bytes that arrive instead (a pipelined request) stay buffered
// for the next request. A request answered sooner is never watched, the
// common case of the proxy's fast path, and costs nothing; an inference
// that takes longer pays one goroutine, as net/http's server has every
// request pay.
//
// Deadlines: the next request's first bytes within IdleTimeout, its line
// and header within ReadHeaderTimeout of them (of the connection's start
// for the first request), the whole request, body
// included, within ReadTimeout. No deadline bounds the answer, which
// streams as long as generation takes, and the client watch reads
// without one.
//
// Shutdown closes the listeners and the idle connections and waits for
// the requests in flight, whose connections close after their answer
// (Connection: close); Close cuts every connection.
type h1Server struct {
	Handler           http.Handler
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	// BaseContext, when set, is the parent of every request's context.
	BaseContext func(net.Listener) context.Context
	// ErrorLog, when set, is told of handler panics and failed handshakes.
	ErrorLog *slog.Logger
	// WatchAfter is how long a request runs before its client's
	// connection is watched for a close; 0 is watchAfter.
	WatchAfter time.Duration

	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*h1Conn]struct{}
	shutdown atomic.Bool
	done     chan struct{} // closed when the last connection goes, during a Shutdown
	closed   chan struct{} // closed by Close (closedCh)
}

// closedCh is closed when Close is called.
func (s *h1Server) closedCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed == nil {
		s.closed = make(chan struct{})
	}
	return s.closed
}

// headerLimit is how long a request's line and header may be, as
// net/http's server counts it (MaxHeaderBytes, 1 MB when 0, plus 4096).
func (s *h1Server) headerLimit() int {
	if s.MaxHeaderBytes > 0 {
		return s.MaxHeaderBytes + 4096
	}
	return http.DefaultMaxHeaderBytes + 4096
}

// Tunables of h1Server.
const (
	// h1BodyBuffer is how much of an answer is held before its header is
	// written: an answer the handler completes within it gets a
	// Content-Length.
	h1BodyBuffer = 4 << 10
	// h1DrainMax is how much of a request body the handler left unread is
	// read and dropped to keep the connection.
	h1DrainMax = 256 << 10
	// watchAfter is how long a request runs before its client's
	// connection is watched for a close.
	watchAfter = 2 * time.Millisecond
)

// Connection states (h1Conn.state).
const (
	h1Idle   int32 = iota // waiting for a request's first byte
	h1Active              // reading a request or answering it
	h1Closed              // closed, or being closed by Shutdown
)

// Serve accepts connections on ln and serves each until ln fails or the
// server is stopped; then it returns http.ErrServerClosed. It closes ln
// when it returns, as net/http's does, so that a listener no longer
// served refuses clients instead of queueing them.
func (s *h1Server) Serve(ln net.Listener) error {
	defer ln.Close()
	if !s.track(ln) {
		return http.ErrServerClosed
	}
	defer s.untrack(ln)
	base := context.Background()
	if s.BaseContext != nil {
		base = s.BaseContext(ln)
	}
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return http.ErrServerClosed
			}
			// Temporary, not Timeout: EMFILE and ENFILE are temporary
			// but no timeout, and returning on them would leave the
			// listener unserved for good.
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				// Out of file descriptors and the like: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		hc := &h1Conn{s: s, c: c, base: base, remote: c.RemoteAddr().String()}
		if !s.add(hc) {
			c.Close()
			return http.ErrServerClosed
		}
		go hc.serve()
	}
}

func (s *h1Server) track(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown.Load() {
		return false
	}
	if s.lns == nil {
		s.lns = map[net.Listener]struct{}{}
	}
	s.lns[ln] = struct{}{}
	return true
}

func (s *h1Server) untrack(ln net.Listener) {
	s.mu.Lock()
	delete(s.lns, ln)
	s.mu.Unlock()
}

func (s *h1Server) add(c *h1Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown.Load() {
		return false
	}
	if s.conns == nil {
		s.conns = map[*h1Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *h1Server) remove(c *h1Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if len(s.conns) == 0 && s.done != nil {
		close(s.done)
		s.done = nil
	}
	s.mu.Unlock()
}

// Shutdown stops the server gracefully: its listeners close, its idle
// connections close, and it waits until the requests in flight are
// answered (nil) or ctx ends (ctx's error; those requests go on, and
// Close cuts them).
func (s *h1Server) Shutdown(ctx context.Context) error {
	s.shutdown.Store(true)
	s.mu.Lock()
	for ln := range s.lns {
		ln.Close()
	}
	var done chan struct{}
	if len(s.conns) > 0 {
		if s.done == nil {
			s.done = make(chan struct{})
		}
		done = s.done
	}
	idle := make([]*h1Conn, 0, len(s.conns))
	for c := range s.conns {
		idle = append(idle, c)
	}
	s.mu.Unlock()
	for _, c := range idle {
		if c.state.CompareAndSwap(h1Idle, h1Closed) {
			c.c.Close()
		}
	}
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the server at once: its listeners and every connection close.
func (s *h1Server) Close() error {
	s.shutdown.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed == nil {
		s.closed = make(chan struct{})
	}
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.state.Store(h1Closed)
		c.c.Close()
	}
	return nil
}

// h1Conn is one client connection of an h1Server.
type h1Conn struct {
	s      *h1Server
	c      net.Conn
	base   context.Context
	remote string
	tls    *tls.ConnectionState
	state  atomic.Int32

	lastMethod string

	lr  h1LimitReader
	br  *bufio.Reader // nil between requests unless bytes are buffered
	bw  *bufio.Writer
	one [1]byte

	obuf []byte // the answer's first bytes (h1Response.buf), reused
	// header is the last answer's header map, cleared and kept for the
	// next answer (takeHeader): a map keeps its room, and a proxied
	// answer's header was a tenth of what a request allocated.
	header http.Header

	// The context of the request under way, and the base's error once
	// the base is done (baseDone): a request begun after it starts done.
	ctxMu   sync.Mutex
	ctx     *h1Ctx
	baseErr error

	// The client watch of the request under way (arm, watch, disarm).
	wmu      sync.Mutex
	wstate   int // watchOff, watchArmed, watchRunning
	wcancel  *h1Ctx
	wbody    *h1Body
	wtimer   *time.Timer
	wdone    chan struct{}
	wstopped bool // the running watch was stopped by its request's end
}

// h1LimitReader reads the connection, within a limit while a request's
// line and header are read, and returns first a byte read beforehand.
type h1LimitReader struct {
	c       net.Conn
	pending int // -1, or a byte read to wait for the request
	limit   int64
	hit     bool
}

func (r *h1LimitReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.pending >= 0 {
		p[0] = byte(r.pending)
		r.pending = -1
		r.limit--
		return 1, nil
	}
	if r.limit <= 0 {
		r.hit = true
		return 0, io.EOF
	}
	if int64(len(p)) > r.limit {
		p = p[:r.limit]
	}
	n, err := r.c.Read(p)
	r.limit -= int64(n)
	return n, err
}

var (
	h1Readers sync.Pool // *bufio.Reader, sized for the header limit
	h1Writers sync.Pool // *bufio.Writer
)

// reader returns the connection's reader, taking one from the pool.
func (hc *h1Conn) reader() *bufio.Reader {
	if hc.br != nil {
		return hc.br
	}
	size := hc.s.headerLimit()
	if v, _ := h1Readers.Get().(*bufio.Reader); v != nil && v.Size() == size {
		v.Reset(&hc.lr)
		hc.br = v
	} else {
		hc.br = bufio.NewReaderSize(&hc.lr, size)
	}
	return hc.br
}

// release hands the connection's buffers back to the pools when nothing
// is buffered in them.
func (hc *h1Conn) release() {
	if hc.br != nil && hc.br.Buffered() == 0 {
		hc.br.Reset(nil)
		h1Readers.Put(hc.br)
		hc.br = nil
	}
	if hc.bw != nil && hc.bw.Buffered() == 0 {
		hc.bw.Reset(nil)
		h1Writers.Put(hc.bw)
		hc.bw = nil
	}
}

func (hc *h1Conn) writer() *bufio.Writer {
	if hc.bw == nil {
		if v, _ := h1Writers.Get().(*bufio.Writer); v != nil {
			v.Reset(hc.c)
			hc.bw = v
		} else {
			hc.bw = bufio.NewWriterSize(hc.c, 8<<10)
		}
	}
	return hc.bw
}

func (hc *h1Conn) logf(msg string, args ...any) {
	if l := hc.s.ErrorLog; l != nil {
		l.Debug(msg, append(args, "remote", hc.remote)...)
	}
}

// serve answers the connection's requests until it closes.
func (hc *h1Conn) serve() {
	s := hc.s
	hc.lr = h1LimitReader{c: hc.c, pending: -1}
	stopBase := context.AfterFunc(hc.base, hc.baseDone)
	defer func() {
		stopBase()
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			hc.logf("http: panic serving", "panic", p)
		}
		hc.state.Store(h1Closed)
		hc.c.Close()
		if hc.br != nil {
			hc.br.Reset(nil)
		}
		hc.br = nil
		if hc.bw != nil {
			hc.bw.Reset(nil)
		}
		hc.bw = nil
		s.remove(hc)
	}()
	if tc, ok := hc.c.(*tls.Conn); ok {
		if s.ReadHeaderTimeout > 0 {
			_ = tc.SetDeadline(time.Now().Add(s.ReadHeaderTimeout))
		}
		if err := tc.HandshakeContext(hc.base); err != nil {
			hc.logf("http: TLS handshake error", "err", err)
			return
		}
		_ = tc.SetDeadline(time.Time{})
		st := tc.ConnectionState()
		hc.tls = &st
	}
	for first := true; ; first = false {
		// The first request's deadlines run from the connection's start;
		// the next ones' from their first bytes, which may take up to
		// IdleTimeout to come (as net/http's server does).
		t0 := time.Now()
		if first {
			hc.readWithin(t0, s.ReadHeaderTimeout)
		} else {
			hc.readWithin(t0, s.IdleTimeout)
		}
		// Wait for the next request without holding buffers.
		if hc.br == nil || hc.br.Buffered() == 0 {
			hc.release()
			if !hc.state.CompareAndSwap(h1Active, h1Idle) && hc.state.Load() != h1Idle {
				return
			}
			if s.shutdown.Load() {
				return
			}
			if n, _ := hc.c.Read(hc.one[:]); n == 0 {
				return
			}
			hc.lr.pending = int(hc.one[0])
		}
		if !hc.state.CompareAndSwap(h1Idle, h1Active) && hc.state.Load() != h1Active {
			return
		}
		if !hc.serveOne(first, t0) {
			return
		}
	}
}

// h1Error answers a request refused before its handler ran.
func (hc *h1Conn) h1Error(code int, text string) {
	msg := http.StatusText(code)
	if text != "" {
		msg += ": " + text
	}
	bw := hc.writer()
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n%d %s", code, http.StatusText(code), code, msg)
	_ = bw.Flush()
}

// readWithin sets the connection's read deadline d after t0; 0 is none.
func (hc *h1Conn) readWithin(t0 time.Time, d time.Duration) {
	if d > 0 {
		_ = hc.c.SetReadDeadline(t0.Add(d))
	} else {
		_ = hc.c.SetReadDeadline(time.Time{})
	}
}

// serveOne reads one request and answers it; it reports whether the
// connection stays open.
func (hc *h1Conn) serveOne(first bool, t0 time.Time) bool {
	s := hc.s
	hc.lr.limit = int64(s.headerLimit())
	hc.lr.hit = false
	br := hc.reader()
	if !first {
		// As net/http: a kept-alive connection's next request starts
		// with its first four bytes (a client that sends fewer and
		// leaves is not answered), and up to four CR or LF after a
		// POST's body are skipped (RFC 7230 3.5).
		peek, err := br.Peek(4)
		if err != nil {
			return false
		}
		if hc.lastMethod == http.MethodPost {
			n := 0
			for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
				n++
			}
			_, _ = br.Discard(n)
		}
		t0 = time.Now()
		hc.readWithin(t0, s.ReadHeaderTimeout)
	}
	hosts, host, err := hc.scanHeader(br)
	var req *http.Request
	fast := false // read by readRequestFast: its names and values are valid
	if err == nil {
		// The plain request without net/http's parser's allocations
		// (h1fast.go, held to it by its tests); the rest by it.
		req = new(http.Request)
		if fast = readRequestFast(br, req); !fast {
			req, err = http.ReadRequest(br)
		}
	}
	hc.lr.limit = 1<<63 - 1
	if err != nil {
		switch {
		case hc.lr.hit || errors.Is(err, bufio.ErrBufferFull):
			// net/http's parser meets a malformed line before the limit:
			// parse what came within it.
			if malformedWithin(br) {
				hc.h1Error(http.StatusBadRequest, "")
			} else {
				hc.h1Error(http.StatusRequestHeaderFieldsTooLarge, "")
			}
		case fmt.Sprintf("%T", err) == "*http.unsupportedTEError":
			// Its type is net/http's own; its message varies.
			hc.h1Error(http.StatusNotImplemented, "")
		case isClosedOrTimeout(err):
		default:
			hc.h1Error(http.StatusBadRequest, "")
		}
		return false
	}
	hc.lastMethod = req.Method
	// The HTTP/2 connection preface goes to the handler, to close after,
	// as net/http's server does when it does not speak HTTP/2 itself.
	h2Preface := req.Method == "PRI" && req.RequestURI == "*" && req.ProtoMajor == 2 && req.ProtoMinor == 0 && len(req.Header) == 0
	if req.ProtoMajor != 1 && !h2Preface {
		hc.h1Error(http.StatusHTTPVersionNotSupported, "unsupported protocol version")
		return false
	}
	if h2Preface {
		req.Close = true
	}
	switch {
	case hosts > 1:
		hc.h1Error(http.StatusBadRequest, "too many Host headers")
		return false
	case hosts == 0 && req.ProtoAtLeast(1, 1) && req.Method != http.MethodConnect && !h2Preface:
		hc.h1Error(http.StatusBadRequest, "missing required Host header")
		return false
	case hosts == 1 && !httpguts.ValidHostHeader(hostValue(req, host)):
		hc.h1Error(http.StatusBadRequest, "malformed Host header")
		return false
	}
	// readRequestFast takes only token names and values of visible
	// ASCII, spaces and tabs, which pass these checks: not looked at again.
	if !fast {
		if msg := invalidHeaderField(req.Header); msg != "" {
			hc.h1Error(http.StatusBadRequest, msg)
			return false
		}
	}
	hc.readWithin(t0, s.ReadTimeout)

	w := &h1Response{hc: hc, req: req, header: hc.takeHeader(), buf: hc.obuf[:0]}
	defer func() {
		clear(w.header) // let go of the answer's values while the connection idles
		hc.obuf, hc.header = w.buf[:0], w.header
	}()
	body := &h1Body{src: req.Body, w: w}
	w.body = body
	if req.ContentLength == 0 && len(req.TransferEncoding) == 0 {
		body.eof.Store(true)
	}
	if expect := req.Header.Get("Expect"); expect != "" {
		if !hasToken(expect, "100-continue") {
			w.header.Set("Connection", "close")
			w.closeAfter = true
			w.WriteHeader(http.StatusExpectationFailed)
			w.finish()
			return false
		}
		if req.ProtoAtLeast(1, 1) && !body.eof.Load() {
			body.expect = true
		}
	}
	req.Body = body
	req.RemoteAddr = hc.remote
	req.TLS = hc.tls
	ctx := hc.newCtx()
	// In place: the body fills in the trailers of the request it was
	// read with.
	*req = *req.WithContext(ctx)
	if conn := req.Header.Get("Connection"); req.ProtoAtLeast(1, 1) {
		w.closeAfter = req.Close || hasToken(conn, "close")
	} else {
		// HTTP/1.0 keeps the connection only when asked to.
		w.closeAfter = !hasToken(conn, "keep-alive") || hasToken(conn, "close")
	}
	w.closeAfter = w.closeAfter || s.shutdown.Load()
	hc.arm(ctx, body)
	func() {
		// Also when the handler panics (the panic then closes the
		// connection in serve).
		defer func() {
			hc.disarm()
			hc.endCtx(ctx)
		}()
		if req.RequestURI == "*" && req.Method == http.MethodOptions {
			optionsStar(w, req)
		} else {
			s.Handler.ServeHTTP(w, req)
		}
	}()
	w.finish()
	if w.closeAfter && !w.failed && (w.bodyLimitHit || !body.eof.Load()) {
		hc.closeWriteAndWait()
	}
	return !w.closeAfter && !w.failed && !s.shutdown.Load()
}

// closeWriteAndWait ends the connection's sending side and waits a
// moment before the close, as net/http's server does when it closes with
// some of a request unread: closing a socket with unread bytes resets
// it, and a reset can reach the client before the answer it just sent.
func (hc *h1Conn) closeWriteAndWait() {
	c := hc.c
	if cc, ok := c.(*cappedConn); ok {
		c = cc.Conn
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	t := time.NewTimer(rstAvoidanceDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-hc.s.closedCh():
	}
}

// rstAvoidanceDelay is how long closeWriteAndWait waits (net/http's).
const rstAvoidanceDelay = 500 * time.Millisecond

// settleBody decides, as the answer's header is written, what becomes of
// a request body the handler has not read to its end (net/http's rules):
// with 100-continue never sent, the connection closes; otherwise up to
// h1DrainMax of it is read and dropped, and past that the connection
// closes (Connection: close) after the answer. A body the handler closed
// is no exception: net/http's Close reads up to as much to keep the
// connection.
func (w *h1Response) settleBody() {
	b := w.body
	if b == nil || b.eof.Load() || w.closeAfter {
		return
	}
	switch {
	case w.status == http.StatusRequestEntityTooLarge:
		// http.MaxBytesReader refused the rest, which it tells
		// net/http's server (to close after the answer) through an
		// interface of net/http's own: a 413 with the body unread is
		// taken for that.
		w.bodyLimitHit, w.closeAfter = true, true
		return
	case b.expect && !b.continued:
		w.closeAfter = true
		return
	case w.req.ContentLength == 0:
		return
	case w.req.ContentLength > 0 && w.req.ContentLength-b.n >= h1DrainMax:
		w.bodyLimitHit, w.closeAfter = true, true
		return
	}
	n, err := io.CopyN(io.Discard, b.src, h1DrainMax+1)
	b.n += n
	switch {
	case err == nil:
		w.bodyLimitHit, w.closeAfter = true, true
	case err == io.EOF:
		b.eof.Store(true)
	default:
		w.closeAfter = true
	}
}

// optionsStar answers OPTIONS *, as net/http's server does: 200 with
// no body, and at most 4 KiB of the request's body read.
func optionsStar(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", "0")
	if r.ContentLength != 0 {
		mb := http.MaxBytesReader(w, r.Body, 4<<10)
		_, _ = io.Copy(io.Discard, mb)
	}
}

// malformedWithin reports whether the bytes buffered in br, the start of
// a request too long for the header limit, already fail to parse.
func malformedWithin(br *bufio.Reader) bool {
	buf, _ := br.Peek(br.Buffered())
	// Whole lines only: a line cut by the limit is not malformed.
	buf = buf[:bytes.LastIndexByte(buf, '\n')+1]
	_, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(buf)))
	return err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF)
}

// takeHeader returns an empty header map for an answer: the last
// answer's, which serveOne cleared and kept once its handler returned.
func (hc *h1Conn) takeHeader() http.Header {
	h := hc.header
	if h == nil {
		return http.Header{}
	}
	hc.header = nil
	return h
}

// scanHeader reads until the request's line and header are buffered in
// br (within br's size: the header limit) and counts its Host headers,
// which http.ReadRequest does not tell; host is the first one's value,
// its continuation lines (obs-fold) joined as net/textproto joins them.
//
// A line that arrives in pieces is searched for its end only in the bytes
// new since the last search (scanned): a header sent a byte at a time
// costs its length, not its square.
func (hc *h1Conn) scanHeader(br *bufio.Reader) (hosts int, host string, err error) {
	for off, scanned, first, inHost := 0, 0, true, false; ; {
		buf, _ := br.Peek(br.Buffered())
		for off < len(buf) {
			from := max(off, scanned)
			i := bytes.IndexByte(buf[from:], '\n')
			if i < 0 {
				scanned = len(buf)
				break
			}
			i += from - off
			line := buf[off : off+i]
			off += i + 1
			line = bytes.TrimSuffix(line, []byte("\r"))
			if first {
				first = false
				continue
			}
			if len(line) == 0 {
				return hosts, host, nil
			}
			if inHost && (line[0] == ' ' || line[0] == '\t') {
				// A continuation of the first Host header, part of the
				// value net/http's server validates (then malformed).
				host += " " + string(bytes.Trim(line, " \t"))
				continue
			}
			inHost = false
			if len(line) >= 5 && line[4] == ':' && bytes.EqualFold(line[:4], []byte("host")) {
				if hosts == 0 {
					host = string(bytes.Trim(line[5:], " \t"))
					inHost = true
				}
				hosts++
			}
		}
		if br.Buffered() == br.Size() {
			hc.lr.hit = true
			return 0, "", bufio.ErrBufferFull
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			if err == io.EOF {
				// The request was begun: it is cut, not absent.
				err = io.ErrUnexpectedEOF
			}
			return 0, "", err
		}
	}
}

// hasToken reports whether token is in the header value v, a list in
// which spaces, tabs and commas separate tokens, ignoring case: how
// net/http's server reads Connection and Expect (a space separates
// where httpguts.HeaderValuesContainsToken would not).
func hasToken(v, token string) bool {
	for start := 0; start < len(v); {
		for start < len(v) && isTokenSep(v[start]) {
			start++
		}
		end := start
		for end < len(v) && !isTokenSep(v[end]) {
			end++
		}
		if end > start && strings.EqualFold(v[start:end], token) {
			return true
		}
		start = end
	}
	return false
}

func isTokenSep(b byte) bool { return b == ' ' || b == ',' || b == '\t' }

// invalidHeaderField says what is wrong with the first invalid name or
// value in h, as net/http's server says it; "" if all are valid.
func invalidHeaderField(h http.Header) string {
	for k, vv := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return "invalid header name"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return "invalid header value"
			}
		}
	}
	return ""
}

// hostValue is the Host header to validate: the request's Host, which
// http.ReadRequest unfolds, unless an absolute URI set it.
func hostValue(req *http.Request, scanned string) string {
	if req.URL != nil && req.URL.Host != "" {
		return scanned
	}
	return req.Host
}

// isClosedOrTimeout reports an error that only says the client left or
// was too slow: such a connection is closed without an answer.
func isClosedOrTimeout(err error) bool {
	if err == io.EOF || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "read"
}

// Client watch states (h1Conn.wstate).
const (
	watchOff     = iota
	watchArmed   // the countdown runs
	watchPending // the countdown ended while the handler read the body
	watchRunning
)

// newCtx is the context of the request about to be served: done from the
// start if the base is.
func (hc *h1Conn) newCtx() *h1Ctx {
	hc.ctxMu.Lock()
	defer hc.ctxMu.Unlock()
	hc.ctx = newH1Ctx(hc.base, hc.baseErr)
	return hc.ctx
}

// endCtx ends the context of the request whose handler returned.
func (hc *h1Conn) endCtx(ctx *h1Ctx) {
	ctx.cancel(context.Canceled)
	hc.ctxMu.Lock()
	hc.ctx = nil
	hc.ctxMu.Unlock()
}

// baseDone ends the context of the request under way, and of every
// request after it, when the base is done.
func (hc *h1Conn) baseDone() {
	hc.ctxMu.Lock()
	hc.baseErr = hc.base.Err()
	ctx := hc.ctx
	hc.ctxMu.Unlock()
	if ctx != nil {
		ctx.cancel(hc.baseErr)
	}
}

// arm starts the countdown to watching the client of the request whose
// context is ctx.
func (hc *h1Conn) arm(ctx *h1Ctx, body *h1Body) {
	hc.wmu.Lock()
	hc.wcancel = ctx
	hc.wbody = body
	hc.wstate = watchArmed
	d := hc.s.WatchAfter
	if d <= 0 {
		d = watchAfter
	}
	if hc.wtimer == nil {
		hc.wtimer = time.AfterFunc(d, hc.watch)
	} else {
		hc.wtimer.Reset(d)
	}
	hc.wmu.Unlock()
}

// watch reads the client's connection while the request runs, once its
// body is read: a close or a reset cancels the request; bytes that come
// stay buffered for the next request.
func (hc *h1Conn) watch() {
	hc.wmu.Lock()
	if hc.wstate != watchArmed {
		hc.wmu.Unlock()
		return
	}
	if !hc.wbody.eof.Load() {
		// The handler still reads the body (and will see the client go
		// while it does): the watch starts when the body ends.
		hc.wstate = watchPending
		hc.wmu.Unlock()
		return
	}
	if hc.br == nil || hc.br.Buffered() > 0 {
		// The next request is already here.
		hc.wstate = watchOff
		hc.wmu.Unlock()
		return
	}
	hc.wstate = watchRunning
	hc.wstopped = false
	hc.wdone = make(chan struct{})
	cancel, done := hc.wcancel, hc.wdone
	_ = hc.c.SetReadDeadline(time.Time{})
	hc.wmu.Unlock()
	_, err := hc.br.Peek(1)
	hc.wmu.Lock()
	if err != nil && !hc.wstopped {
		cancel.cancel(context.Canceled)
	}
	hc.wmu.Unlock()
	close(done)
}

// bodyRead starts the client watch that waited for the request's body to
// be read.
func (hc *h1Conn) bodyRead() {
	hc.wmu.Lock()
	start := hc.wstate == watchPending
	if start {
		hc.wstate = watchArmed
	}
	hc.wmu.Unlock()
	if start {
		go hc.watch()
	}
}

// disarm stops the client watch of the request whose handler returned.
func (hc *h1Conn) disarm() {
	hc.wmu.Lock()
	switch hc.wstate {
	case watchArmed:
		hc.wtimer.Stop()
	case watchRunning:
		hc.wstopped = true
		done := hc.wdone
		_ = hc.c.SetReadDeadline(aLongTimeAgo)
		hc.wmu.Unlock()
		<-done
		hc.wmu.Lock()
		_ = hc.c.SetReadDeadline(time.Time{})
	}
	hc.wstate = watchOff
	hc.wmu.Unlock()
}

// h1Body is a request's body as its handler reads it: it answers
// Expect: 100-continue at the first read, and tells when it was read to
// the end.
type h1Body struct {
	src       io.ReadCloser
	w         *h1Response
	eof       atomic.Bool // read by the client watch
	expect    bool        // the client waits for 100 Continue
	continued bool        // it was sent
	closed    bool
	n         int64 // bytes read
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.eof.Load() {
		return 0, io.EOF
	}
	if b.expect && !b.continued {
		b.continued = true
		if !b.w.committed {
			bw := b.w.hc.writer()
			_, _ = bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			_ = bw.Flush()
		}
	}
	n, err := b.src.Read(p)
	b.n += int64(n)
	if err == io.EOF {
		b.eof.Store(true)
		b.w.hc.bodyRead()
	}
	return n, err
}

// Close ends the handler's reading; what is left is drained or the
// connection closed, after the handler returns.
func (b *h1Body) Close() error {
	b.closed = true
	return nil
}

// h1Response is an http.ResponseWriter and http.Flusher on an h1Conn.
type h1Response struct {
	hc     *h1Conn
	req    *http.Request
	header http.Header
	body   *h1Body

	wroteHeader bool // the handler chose its status
	committed   bool // the status line and header are written
	status      int
	buf         []byte // the answer's first bytes, until committed
	declared    int64  // the handler's Content-Length, or -1
	written     int64  // body bytes the handler wrote
	chunked     bool
	closeAfter  bool
	failed      bool // a write to the client failed
	// bodyLimitHit: the connection closes with some of the request's
	// body unread.
	bodyLimitHit bool
	// declaredCL is the Content-Length header's value as WriteHeader
	// took it (declared), which the answer is framed by.
	declaredCL string
}

func (w *h1Response) Header() http.Header { return w.header }

func (w *h1Response) WriteHeader(code int) {
	if w.wroteHeader {
		w.hc.logf("http: superfluous response.WriteHeader call", "code", code)
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// An informational answer goes out at once, with the header so far.
		bw := w.hc.writer()
		fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
		_ = w.header.Write(bw)
		_, _ = bw.WriteString("\r\n")
		if bw.Flush() != nil {
			w.failed = true
		}
		return
	}
	w.wroteHeader = true
	w.status = code
	w.declared = -1
	if cl := w.header.Get("Content-Length"); cl != "" {
		if v, err := strconv.ParseInt(cl, 10, 64); err == nil && v >= 0 {
			w.declared = v
			w.declaredCL = cl
		} else {
			w.hc.logf("http: invalid Content-Length written", "value", cl)
			w.header.Del("Content-Length")
		}
	}
}

// bodyAllowed reports whether the answer may have a body.
func (w *h1Response) bodyAllowed() bool {
	return !(w.status >= 100 && w.status <= 199 || w.status == http.StatusNoContent || w.status == http.StatusNotModified)
}

func (w *h1Response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !w.bodyAllowed() {
		return 0, http.ErrBodyNotAllowed
	}
	if w.failed {
		return 0, io.ErrClosedPipe
	}
	if w.declared >= 0 && w.written+int64(len(p)) > w.declared {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if !w.committed && len(w.buf)+len(p) <= h1BodyBuffer {
		w.buf = append(w.buf, p...)
		return len(p), nil
	}
	if !w.committed {
		w.commit(false, p)
	}
	if err := w.writeBody(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush sends what the handler wrote so far.
func (w *h1Response) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false, nil)
	}
	if w.failed {
		return
	}
	if err := w.hc.writer().Flush(); err != nil {
		w.fail()
	}
}

// FlushError is Flush that reports a failed write (http.ResponseController).
func (w *h1Response) FlushError() error {
	w.Flush()
	if w.failed {
		return io.ErrClosedPipe
	}
	return nil
}

func (w *h1Response) fail() {
	w.failed = true
	w.closeAfter = true
}

func (w *h1Response) writeBody(p []byte) error {
	if w.failed {
		return io.ErrClosedPipe
	}
	if w.req.Method == http.MethodHead {
		return nil // counted, not sent
	}
	bw := w.hc.writer()
	var err error
	if w.chunked {
		_, _ = bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
		_, _ = bw.WriteString("\r\n")
		_, _ = bw.Write(p)
		_, err = bw.WriteString("\r\n")
	} else {
		_, err = bw.Write(p)
	}
	if err != nil {
		w.fail()
	}
	return err
}

// commit writes the status line and header, and the buffered body.
// final: the handler has returned, so the buffer is the whole body; next
// is the write that did not fit in the buffer (its Content-Type is
// sniffed when the buffer is empty).
func (w *h1Response) commit(final bool, next []byte) {
	w.committed = true
	h := w.header
	req := w.req
	if httpguts.HeaderValuesContainsToken(h["Connection"], "close") || w.hc.s.shutdown.Load() {
		w.closeAfter = true
	}
	w.settleBody()
	keepAlive10 := !req.ProtoAtLeast(1, 1) && !w.closeAfter
	if w.bodyAllowed() {
		sniff := w.buf
		if len(sniff) == 0 {
			sniff = next
		}
		if _, ok := h["Content-Type"]; !ok && len(sniff) > 0 && h.Get("Content-Encoding") == "" {
			h.Set("Content-Type", http.DetectContentType(sniff))
		}
		// The Content-Length is the one WriteHeader took, which the
		// writes were held to: a handler may change its header map after
		// WriteHeader, which net/http ignores, and a length set or
		// changed since must not frame the answer (a shorter one would
		// leave the rest of the body to be read as the next answer).
		switch cl := h["Content-Length"]; {
		case w.declared < 0:
			h.Del("Content-Length")
		case len(cl) != 1 || cl[0] != w.declaredCL:
			h["Content-Length"] = []string{w.declaredCL}
		}
		switch {
		case w.declared >= 0:
		case final && w.req.Method == http.MethodHead && w.written == 0:
		case final:
			w.declared = w.written
			h.Set("Content-Length", strconv.FormatInt(w.written, 10))
		case req.Method == http.MethodHead:
		case req.ProtoAtLeast(1, 1):
			w.chunked = true
		default:
			// HTTP/1.0 without a length: the close ends the body.
			w.closeAfter = true
			keepAlive10 = false
		}
	} else {
		h.Del("Content-Length")
	}
	h.Del("Transfer-Encoding")
	if w.chunked {
		h.Set("Transfer-Encoding", "chunked")
	}
	if w.closeAfter {
		h.Set("Connection", "close")
	} else if keepAlive10 {
		h.Set("Connection", "keep-alive")
	}
	if _, ok := h["Date"]; !ok {
		h["Date"] = []string{httpDate()}
	}
	bw := w.hc.writer()
	_, _ = bw.WriteString("HTTP/1.1 ")
	_, _ = bw.WriteString(strconv.Itoa(w.status))
	_ = bw.WriteByte(' ')
	_, _ = bw.WriteString(http.StatusText(w.status))
	_, _ = bw.WriteString("\r\n")
	_ = h.Write(bw)
	if _, err := bw.WriteString("\r\n"); err != nil {
		w.fail()
	}
	if len(w.buf) > 0 {
		_ = w.writeBody(w.buf)
		w.buf = w.buf[:0]
	}
}

// finish completes the answer after the handler returned.
func (w *h1Response) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(true, nil)
	}
	if w.failed {
		return
	}
	if w.declared >= 0 && w.written < w.declared && w.req.Method != http.MethodHead && w.bodyAllowed() {
		// Shorter than it said: the client cannot find the end.
		w.closeAfter = true
	}
	bw := w.hc.writer()
	if w.chunked {
		_, _ = bw.WriteString("0\r\n\r\n")
	}
	if bw.Flush() != nil {
		w.fail()
	}
}

// httpDate is the Date header of now, formatted once a second.
func httpDate() string {
	now := time.Now().Unix()
	if d := dateCache.Load(); d != nil && d.sec == now {
		return d.s
	}
	d := &cachedDate{sec: now, s: time.Unix(now, 0).UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.s
}

type cachedDate struct {
	sec int64
	s   string
}

var dateCache atomic.Pointer[cachedDate]
