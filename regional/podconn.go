package regional

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// podConns is the controller's client to plain-http pods: HTTP/1.1 over
// kept-alive connections, each request written and its answer read by the
// goroutine that serves it. http.Transport runs a reader and a writer
// goroutine per connection and hands every request and answer between them
// and the caller over channels; on these virtual CPUs each handoff is a
// wakeup that cost about 100 us of latency and of CPU per proxied request
// (the proxy's largest cost after tokenizing). What goes over the wire is
// what the transport would send (the request is serialized by
// http.Request.Write, as the transport does, and the answer read by
// http.ReadResponse), and it keeps the transport's connection rules for
// the settings NewPodTransport uses; anything else (https pods, another
// transport, a request the transport would refuse) goes through the
// transport (Server.roundTrip).
//
// On Linux its connections are read and written with raw system calls
// (rawIO, as the controller's client connections are), which keeps the
// runtime's monitor thread asleep.
//
// A connection goes back to the pool only when its answer was read to the
// end and the pod did not ask to close it; before reuse it is checked for
// a close or stray bytes from the pod, as the transport's reader notices
// them while it is idle.
type podConns struct {
	maxIdle, maxIdlePerHost int
	idleTimeout             time.Duration

	mu        sync.Mutex
	idle      map[string][]*podConn // by dial address, most recently used last
	nidle     int
	lastSweep time.Time
}

// podConn is one connection to a pod.
type podConn struct {
	conn      net.Conn
	rw        io.ReadWriter // conn's I/O: rawReadWriter
	idle      *idleCheck    // connAlive(conn), without allocating
	br        *bufio.Reader // reads conn through limit
	addr      string
	idleSince time.Time
	// limit is how many more bytes br may read from conn: an answer's
	// header may not be longer than the transport allows.
	limit int64
}

// podReader reads a podConn's connection within its limit, as the
// transport does.
type podReader struct{ pc *podConn }

func (r podReader) Read(p []byte) (int, error) {
	pc := r.pc
	if pc.limit <= 0 {
		return 0, fmt.Errorf("read limit of %d bytes exhausted", maxResponseHeader)
	}
	if int64(len(p)) > pc.limit {
		p = p[:pc.limit]
	}
	n, err := pc.rw.Read(p)
	pc.limit -= int64(n)
	return n, err
}

// newPodConns returns the client for pods reached through t, or nil when
// t has settings it does not implement (a proxy, its own dialer, no
// keep-alives, compression, timeouts of its own) or the platform cannot
// check an idle connection (see connAlive).
func newPodConns(t *http.Transport) *podConns {
	//lint:ignore SA1019 a transport with the deprecated Dial set dials its own way: podConns must not take its requests
	if t.Proxy != nil || t.DialContext != nil || t.Dial != nil || t.DisableKeepAlives || !t.DisableCompression ||
		t.ResponseHeaderTimeout != 0 || t.ExpectContinueTimeout != 0 || t.MaxConnsPerHost != 0 ||
		t.MaxResponseHeaderBytes != 0 || t.OnProxyConnectResponse != nil || t.GetProxyConnectHeader != nil ||
		len(t.ProxyConnectHeader) > 0 || !canCheckIdle {
		return nil
	}
	c := &podConns{maxIdle: t.MaxIdleConns, maxIdlePerHost: t.MaxIdleConnsPerHost, idleTimeout: t.IdleConnTimeout,
		idle: map[string][]*podConn{}}
	if c.maxIdlePerHost == 0 {
		c.maxIdlePerHost = http.DefaultMaxIdleConnsPerHost
	}
	return c
}

// maxResponseHeader is the transport's default limit on a response's
// header, 1xx answers included (Transport.MaxResponseHeaderBytes).
const maxResponseHeader = 10 << 20

// eligible reports whether roundTrip can send req: plain http, a body it
// can replay, and headers the transport would accept (the transport
// refuses the others with its own error: those go to it).
func (c *podConns) eligible(req *http.Request) bool {
	if c == nil || req.URL.Scheme != "http" || req.URL.Host == "" || req.Method != http.MethodPost ||
		req.GetBody == nil || req.ContentLength < 0 || req.Close || req.Host != req.URL.Host {
		return false
	}
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// wireBufs hold serialized requests while they are written.
var wireBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// roundTrip sends req (eligible) and returns the pod's answer, as
// http.Transport.RoundTrip would. The answer's body must be closed.
func (c *podConns) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	wire := wireBufs.Get().(*bytes.Buffer)
	defer func() {
		if wire.Cap() <= 1<<20 {
			wire.Reset()
			wireBufs.Put(wire)
		}
	}()
	wire.Reset()
	if err := req.Write(wire); err != nil {
		return nil, err
	}
	return c.send(ctx, dialAddr(req), req, wire.Bytes(), httptrace.ContextClientTrace(ctx))
}

// post sends wire, a POST serialized by appendPost, to the pod at addr
// (host:port) and returns its answer, as roundTrip does. The caller may
// reuse wire once it returns.
func (c *podConns) post(ctx context.Context, addr string, wire []byte) (*http.Response, error) {
	return c.send(ctx, addr, postRequest, wire, nil)
}

// postRequest is what http.ReadResponse is told of the request a pod
// answers when only its serialized form exists: a POST (it reads nothing
// else of it).
var postRequest = &http.Request{Method: http.MethodPost}

// send writes wire, req serialized, on a connection to addr and reads the
// answer's header, dialling again when a kept-alive connection turns out
// closed before anything reached the pod.
func (c *podConns) send(ctx context.Context, addr string, req *http.Request, wire []byte, tr *httptrace.ClientTrace) (*http.Response, error) {
	for {
		pc, reused, err := c.get(ctx, addr)
		if err != nil {
			return nil, err
		}
		if tr != nil && tr.GotConn != nil {
			// What the transport tells its tracer (relay's connect
			// timer listens for it).
			tr.GotConn(httptrace.GotConnInfo{Conn: pc.conn, Reused: reused})
		}
		resp, err := c.exchange(ctx, pc, req, wire)
		if err == nil {
			return resp, nil
		}
		var nw nothingWritten
		if reused && errors.As(err, &nw) && ctx.Err() == nil {
			// The pod closed a kept-alive connection as the request
			// was being written: nothing reached it, so the
			// transport's rule applies, send it again.
			continue
		}
		if errors.As(err, &nw) {
			err = nw.err
		}
		return nil, err
	}
}

// nothingWritten is a write that failed before any byte went out.
type nothingWritten struct{ err error }

func (e nothingWritten) Error() string { return e.err.Error() }
func (e nothingWritten) Unwrap() error { return e.err }

// exchange writes the serialized request on pc and reads the answer's
// header. On error pc is closed.
func (c *podConns) exchange(ctx context.Context, pc *podConn, req *http.Request, wire []byte) (*http.Response, error) {
	// A cancelled request (the client went, the first-byte timer fired)
	// breaks off a blocked write or read, as the transport does; the
	// connection is not reused after.
	var stop stopper
	if t, ok := ctx.(*tryCtx); ok {
		t.watch(pc.conn) // relay's try: without an AfterFunc of its own
		stop = t
	} else {
		stop = afterFuncStop(context.AfterFunc(ctx, func() { _ = pc.conn.SetDeadline(aLongTimeAgo) }))
	}
	fail := func(err error) (*http.Response, error) {
		stop.stop()
		_ = pc.conn.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	if n, err := pc.rw.Write(wire); err != nil {
		if n == 0 {
			err = nothingWritten{err}
		}
		return fail(err)
	}
	pc.limit = maxResponseHeader
	resp, err := readResponse(pc.br, req)
	if pc.limit <= 0 {
		err = fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w",
			fmt.Errorf("net/http: server response headers exceeded %d bytes; aborted", maxResponseHeader))
	}
	if err != nil {
		return fail(err)
	}
	pc.limit = math.MaxInt64 // no limit on the body
	resp.Body = &podBody{c: c, pc: pc, ctx: ctx, stop: stop, body: resp.Body, keep: !resp.Close}
	return resp, nil
}

// readResponse reads the final answer to req, skipping informational
// (1xx) ones other than 101, with the transport's errors.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if _, err := br.Peek(1); err != nil {
		// A pod that closed the connection without answering.
		return nil, err
	}
	for {
		if resp, ok := fastResponse(br, req); ok {
			return resp, nil // a final answer, never 1xx
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", err)
		}
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
	}
}

// stopper ends the breaking off of a connection's I/O when its request is
// cancelled, and reports whether that was in time (its I/O was not broken
// off): the stop function of context.AfterFunc.
type stopper interface{ stop() bool }

type afterFuncStop func() bool

func (f afterFuncStop) stop() bool { return f() }

// podBody is an answer's body: read to the end and closed, its connection
// goes back to the pool.
type podBody struct {
	c      *podConns
	pc     *podConn
	ctx    context.Context
	stop   stopper
	body   io.ReadCloser
	eof    bool
	keep   bool
	closed bool
}

func (b *podBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.eof = true
	case err != nil && b.ctx.Err() != nil:
		err = b.ctx.Err()
	}
	return n, err
}

func (b *podBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	_ = b.body.Close()
	if b.stop.stop() && b.eof && b.keep && b.pc.br.Buffered() == 0 {
		b.c.put(b.pc)
	} else {
		_ = b.pc.conn.Close()
	}
	return nil
}

// dialAddr is the host:port the transport dials for req's URL.
func dialAddr(req *http.Request) string {
	port := req.URL.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(req.URL.Hostname(), port)
}

// get returns an idle connection to addr that the pod has not closed, or a
// new one.
func (c *podConns) get(ctx context.Context, addr string) (*podConn, bool, error) {
	now := time.Now()
	for {
		c.mu.Lock()
		list := c.idle[addr]
		if len(list) == 0 {
			c.mu.Unlock()
			break
		}
		pc := list[len(list)-1]
		list[len(list)-1] = nil
		c.idle[addr] = list[:len(list)-1]
		c.nidle--
		c.mu.Unlock()
		if (c.idleTimeout > 0 && now.Sub(pc.idleSince) > c.idleTimeout) || !pc.idle.check() {
			_ = pc.conn.Close()
			continue
		}
		return pc, true, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	pc := &podConn{conn: conn, rw: rawReadWriter(conn), idle: newIdleCheck(conn), addr: addr}
	pc.br = bufio.NewReaderSize(podReader{pc}, 4<<10)
	return pc, false, nil
}

// put keeps pc for the next request to its pod, within the pool's bounds.
func (c *podConns) put(pc *podConn) {
	now := time.Now()
	pc.idleSince = now
	var drop []*podConn
	c.mu.Lock()
	list := c.idle[pc.addr]
	if len(list) >= c.maxIdlePerHost || (c.maxIdle > 0 && c.nidle >= c.maxIdle) {
		drop = append(drop, pc)
	} else {
		c.idle[pc.addr] = append(list, pc)
		c.nidle++
	}
	if c.idleTimeout > 0 && now.Sub(c.lastSweep) > c.idleTimeout/2 {
		// Connections idle past the timeout are closed here, now and
		// then, rather than by a timer each: pods that left do not keep
		// their connections open for long.
		c.lastSweep = now
		for addr, list := range c.idle {
			kept := list[:0]
			for _, old := range list {
				if now.Sub(old.idleSince) > c.idleTimeout {
					drop = append(drop, old)
					c.nidle--
				} else {
					kept = append(kept, old)
				}
			}
			clear(list[len(kept):])
			if len(kept) == 0 {
				delete(c.idle, addr)
			} else {
				c.idle[addr] = kept
			}
		}
	}
	c.mu.Unlock()
	for _, old := range drop {
		_ = old.conn.Close()
	}
}

// CloseIdleConnections closes the connections no request is using.
func (c *podConns) CloseIdleConnections() {
	if c == nil {
		return
	}
	c.mu.Lock()
	idle := c.idle
	c.idle, c.nidle = map[string][]*podConn{}, 0
	c.mu.Unlock()
	for _, list := range idle {
		for _, pc := range list {
			_ = pc.conn.Close()
		}
	}
}

// aLongTimeAgo is a deadline that has passed: it breaks off blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)
