package regional

// Differential tests of h1Server against net/http's server, the naive
// reference: both serve the same handler with the same limits on loopback,
// a raw client sends both the same bytes, and what a client can observe
// (and what the handler saw, echoed in the answer) must be the same.

import (
	"bufio"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Limits both servers run with. ReadHeaderTimeout is short because a
// mutated request can leave both servers waiting for a header that never
// ends; diffGuard, the client's deadline on every connection, is well
// above every server timeout, so "both gave up" is seen as such and never
// as a client timeout.
const (
	diffReadHeaderTimeout = 2 * time.Second
	diffReadTimeout       = 3 * time.Second
	diffIdleTimeout       = 5 * time.Second
	diffMaxHeaderBytes    = 4096
	diffGuard             = 10 * time.Second
)

// diffServer is what the tests need of either server.
type diffServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// diffKinds names the two servers: the reference first.
var diffKinds = []string{"net/http", "h1Server"}

// diffStd is net/http's server with its connections counted: a
// connection's goroutine can outlive Close by up to 500 ms (its
// closeWriteAndWait), and the package's goleak check must not see it.
type diffStd struct {
	*http.Server
	conns sync.WaitGroup
}

// newDiffServer returns an unstarted server of the kind with the shared
// limits, and a function that waits until its connections' goroutines
// are gone (after Close).
func newDiffServer(kind string, h http.Handler) (diffServer, func()) {
	if kind == "net/http" {
		s := &diffStd{}
		s.Server = &http.Server{
			Handler:           h,
			ReadHeaderTimeout: diffReadHeaderTimeout,
			ReadTimeout:       diffReadTimeout,
			IdleTimeout:       diffIdleTimeout,
			MaxHeaderBytes:    diffMaxHeaderBytes,
			ErrorLog:          log.New(io.Discard, "", 0), // panics of /panic
			ConnState: func(_ net.Conn, st http.ConnState) {
				switch st {
				case http.StateNew:
					s.conns.Add(1)
				case http.StateClosed, http.StateHijacked:
					s.conns.Done()
				}
			},
		}
		return s, s.conns.Wait
	}
	return &h1Server{
		Handler:           h,
		ReadHeaderTimeout: diffReadHeaderTimeout,
		ReadTimeout:       diffReadTimeout,
		IdleTimeout:       diffIdleTimeout,
		MaxHeaderBytes:    diffMaxHeaderBytes,
	}, func() {}
}

// diffTarget is a started server as the client sees it.
type diffTarget struct {
	kind string
	addr string
	tls  *tls.Config // the client's, nil for plain TCP
}

// diffRunning is a server started by startDiff.
type diffRunning struct {
	diffTarget
	srv  diffServer
	done chan struct{} // closed when Serve returned
	err  error         // what Serve returned, once done
}

// served waits (within diffGuard) for Serve to return and returns its error.
func (r *diffRunning) served(tb testing.TB) error {
	tb.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(diffGuard):
		tb.Fatalf("%s: Serve did not return", r.kind)
		return nil
	}
}

// startDiff serves a new server of the kind on a loopback listener (TLS
// when srvTLS is set) until the test ends; then it closes the server,
// checks that Serve returned http.ErrServerClosed, and waits for the
// server's connections to be gone.
func startDiff(tb testing.TB, kind string, h http.Handler, srvTLS, cliTLS *tls.Config) *diffRunning {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv, connsGone := newDiffServer(kind, h)
	r := &diffRunning{diffTarget: diffTarget{kind: kind, addr: ln.Addr().String(), tls: cliTLS}, srv: srv, done: make(chan struct{})}
	if srvTLS != nil {
		ln = tls.NewListener(ln, srvTLS)
	}
	go func() {
		r.err = srv.Serve(ln)
		close(r.done)
	}()
	tb.Cleanup(func() {
		_ = srv.Close()
		if err := r.served(tb); !errors.Is(err, http.ErrServerClosed) {
			tb.Errorf("%s: Serve returned %v, want http.ErrServerClosed", kind, err)
		}
		gone := make(chan struct{})
		go func() {
			connsGone()
			close(gone)
		}()
		select {
		case <-gone:
		case <-time.After(diffGuard):
			tb.Errorf("%s: connections still open %v after Close", kind, diffGuard)
		}
	})
	return r
}

// startDiffPair starts both servers with handler h.
func startDiffPair(tb testing.TB, h http.Handler, srvTLS, cliTLS *tls.Config) (ref, h1 diffTarget) {
	tb.Helper()
	ref = startDiff(tb, diffKinds[0], h, srvTLS, cliTLS).diffTarget
	h1 = startDiff(tb, diffKinds[1], h, srvTLS, cliTLS).diffTarget
	return ref, h1
}

// diffDial connects to the target; every read and write on the connection
// is bounded by diffGuard from now.
func diffDial(tg diffTarget) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", tg.addr, diffGuard)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(diffGuard))
	if tg.tls == nil {
		return c, nil
	}
	tc := tls.Client(c, tg.tls)
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// diffHandler is the one handler both servers run. Every answer it makes
// carries X-Diff-Handler, so an answer of the server itself (400, 431,
// 501, 505, 417, 100 Continue) is told apart. Most paths echo a summary of
// the request (diffSummary); the others exercise one feature of the
// ResponseWriter each.
func diffHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Diff-Handler", "1")
	switch r.URL.Path {
	case "/probe":
		_, _ = io.WriteString(w, "probe")
	case "/limited":
		// As the controller reads a prompt: through http.MaxBytesReader,
		// 413 past its limit, which then tells the server (through an
		// interface net/http does not export) to close after the answer.
		if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64)); err != nil {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		_, _ = io.WriteString(w, "ok")
		return
	case "/noread":
		_, _ = io.WriteString(w, diffSummary(r, false))
	case "/closebody":
		// Closes the body unread, as a handler's deferred Close does
		// when it answers without reading.
		_ = r.Body.Close()
		_, _ = io.WriteString(w, diffSummary(r, false))
	case "/typed":
		w.Header().Set("Content-Type", "application/x-diff")
		_, _ = io.WriteString(w, diffSummary(r, true))
	case "/length":
		s := diffSummary(r, true)
		w.Header().Set("Content-Length", strconv.Itoa(len(s)))
		_, _ = io.WriteString(w, s)
	case "/short":
		// Declares more than it writes: the client cannot find the end.
		w.Header().Set("Content-Length", "100")
		_, _ = io.WriteString(w, "short")
	case "/late-length":
		// Changes Content-Length after WriteHeader, which then has no
		// effect: the answer is framed by the length declared before.
		s := diffSummary(r, true)
		w.Header().Set("Content-Length", strconv.Itoa(len(s)))
		w.WriteHeader(http.StatusOK)
		w.Header().Set("Content-Length", "1")
		_, _ = io.WriteString(w, s)
	case "/late-length-big":
		// Sets a Content-Length after WriteHeader and writes more than
		// either server buffers: the answer is chunked, without it.
		w.WriteHeader(http.StatusOK)
		w.Header().Set("Content-Length", "1")
		for i := range 64 {
			_, _ = fmt.Fprintf(w, "line %02d %s\n", i, strings.Repeat("b", 1000))
		}
	case "/close":
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, diffSummary(r, true))
	case "/flush":
		f, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no http.Flusher", http.StatusInternalServerError)
			return
		}
		for i := range 16 {
			_, _ = fmt.Fprintf(w, "part %02d %s\n", i, strings.Repeat("f", 1000))
			f.Flush()
		}
	case "/big":
		// Larger than either server buffers before it must choose framing.
		for i := range 64 {
			_, _ = fmt.Fprintf(w, "line %02d %s\n", i, strings.Repeat("b", 1000))
		}
	case "/empty":
	case "/204", "/304":
		code, _ := strconv.Atoi(r.URL.Path[1:])
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "no body allowed")
	case "/early":
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		_, _ = io.WriteString(w, diffSummary(r, true))
	case "/sniff":
		_, _ = io.WriteString(w, "<html><body>sniffed</body></html>")
	case "/panic":
		panic("diff test: handler panics")
	case "/panic-after-write":
		_, _ = io.WriteString(w, "partial")
		panic("diff test: handler panics after a write")
	case "/error":
		http.Error(w, "diff test: refused by the handler", http.StatusForbidden)
	default:
		_, _ = io.WriteString(w, diffSummary(r, true))
	}
}

// diffSummary is a canonical account of what the handler saw; readBody
// reads the body (and then the trailer) into it.
func diffSummary(r *http.Request, readBody bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "method=%q uri=%q url=%q proto=%q host=%q\n", r.Method, r.RequestURI, r.URL.String(), r.Proto, r.Host)
	for _, k := range slices.Sorted(maps.Keys(r.Header)) {
		fmt.Fprintf(&b, "header %q=%q\n", k, r.Header[k])
	}
	fmt.Fprintf(&b, "contentLength=%d transferEncoding=%q close=%v\n", r.ContentLength, r.TransferEncoding, r.Close)
	if readBody {
		body, err := io.ReadAll(r.Body)
		fmt.Fprintf(&b, "body=%s err=%s\n", diffBytes(body), diffErr(err))
		for _, k := range slices.Sorted(maps.Keys(r.Trailer)) {
			fmt.Fprintf(&b, "trailer %q=%q\n", k, r.Trailer[k])
		}
	} else {
		b.WriteString("body unread\n")
	}
	fmt.Fprintf(&b, "remoteAddr=%v tls=%v\n", r.RemoteAddr != "", r.TLS != nil && r.TLS.HandshakeComplete)
	return b.String()
}

// diffBytes shows a body: short ones quoted, long ones by length and hash.
func diffBytes(p []byte) string {
	if len(p) <= 200 {
		return strconv.Quote(string(p))
	}
	return fmt.Sprintf("%d bytes sha256 %x", len(p), sha256.Sum256(p))
}

// diffErr shows an error without what legitimately differs between the two
// servers' connections (addresses and ports).
func diffErr(err error) string {
	var ne net.Error
	var oe *net.OpError
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &oe):
		return "net " + oe.Op + " error"
	}
	return strconv.Quote(err.Error())
}

// diffResp is one answer as the client saw it.
type diffResp struct {
	Status  int
	Handler bool // the handler wrote it
	// When the handler wrote it:
	Summary     string // the body
	BodyErr     string // how reading the body ended, when not cleanly
	ContentType string
	Framing     string // how the body was delimited
	Connection  string // the Connection header
}

// diffResult is everything the client saw on one connection.
type diffResult struct {
	Resps []diffResp
	// End is what the connection did after the answers: "open" (a probe
	// request was answered), "closed", "hang" (nothing within diffGuard)
	// or "malformed: ..." (an answer the client could not parse).
	End string
}

func (r diffResult) String() string {
	var b strings.Builder
	for i, a := range r.Resps {
		fmt.Fprintf(&b, "  answer %d: %d handler=%v", i, a.Status, a.Handler)
		if a.Handler {
			fmt.Fprintf(&b, " content-type=%q framing=%s connection=%q", a.ContentType, a.Framing, a.Connection)
			if a.BodyErr != "" {
				fmt.Fprintf(&b, " body-error=%s", a.BodyErr)
			}
			fmt.Fprintf(&b, "\n    %s", strings.ReplaceAll(strings.TrimSuffix(a.Summary, "\n"), "\n", "\n    "))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  then: %s", r.End)
	return b.String()
}

// finals returns the statuses of the final (non-1xx) answers.
func (r diffResult) finals() []int {
	var s []int
	for _, a := range r.Resps {
		if a.Status >= 200 {
			s = append(s, a.Status)
		}
	}
	return s
}

// diffEnd classifies a read or write error that ended the exchange.
func diffEnd(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return "closed"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "hang"
	}
	return "malformed: " + err.Error()
}

// diffMethod is the method of the first request in raw, as far as the
// client must know it to read the answer (a HEAD answer has no body).
func diffMethod(raw string) string {
	if strings.HasPrefix(raw, "HEAD ") {
		return http.MethodHead
	}
	return http.MethodGet
}

// readDiffResp reads one answer and its body.
func readDiffResp(br *bufio.Reader, method string) (diffResp, error) {
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		return diffResp{}, err
	}
	body, berr := io.ReadAll(resp.Body)
	resp.Body.Close()
	a := diffResp{Status: resp.StatusCode, Handler: resp.Header.Get("X-Diff-Handler") == "1"}
	if method == http.MethodHead && !a.Handler && resp.StatusCode >= 400 && resp.Header.Get("Content-Length") == "" {
		// Both servers' own error answers carry a body delimited by the
		// close, whatever the method they could not parse.
		_, err := io.Copy(io.Discard, br)
		return a, cmp.Or(err, io.EOF)
	}
	if a.Handler {
		a.Summary = string(body)
		if len(body) > 4096 {
			a.Summary = diffBytes(body)
		}
		a.ContentType = resp.Header.Get("Content-Type")
		a.Connection = strings.Join(resp.Header.Values("Connection"), ", ")
		if resp.Close {
			// http.ReadResponse takes "close" out of the header into Close.
			a.Connection = strings.TrimPrefix(a.Connection+", close", ", ")
		}
		switch {
		case slices.Contains(resp.TransferEncoding, "chunked"):
			a.Framing = "chunked"
		case resp.ContentLength >= 0:
			a.Framing = "content-length " + strconv.FormatInt(resp.ContentLength, 10)
		default:
			a.Framing = "until close"
		}
		if n := len(body); n > 2<<10 && n <= 4<<10 && a.Framing != "until close" {
			// net/http's server buffers 2 KiB of an answer before it must
			// choose, h1Server 4 KiB: a complete answer in between is
			// chunked by one and has a Content-Length from the other, and
			// the client reads the same body either way.
			a.Framing = "chunked or content-length"
		}
		if berr != nil {
			a.BodyErr = diffEnd(berr)
		}
	}
	if berr != nil {
		return a, berr
	}
	if resp.StatusCode >= 200 && resp.ContentLength < 0 && !slices.Contains(resp.TransferEncoding, "chunked") &&
		method != http.MethodHead && resp.StatusCode != 204 && resp.StatusCode != 304 {
		// The body ran to the connection's end.
		return a, io.EOF
	}
	return a, nil
}

// diffExchange is what a client sends on one connection.
type diffExchange struct {
	// steps are written in turn; after each but the last the client reads
	// one answer before it writes the next (Expect: 100-continue).
	steps []string
	// finals is how many final (non-1xx) answers to read; 0 is 1.
	finals int
	// probe: once the answers are read, send another request to see
	// whether the connection stayed open. Without it the client half-closes
	// its side after the last step and reads until the server closes.
	probe bool
}

// runDiff sends ex to the target and returns what the client saw.
func runDiff(tg diffTarget, ex diffExchange) diffResult {
	var res diffResult
	c, err := diffDial(tg)
	if err != nil {
		res.End = "dial: " + err.Error()
		return res
	}
	defer c.Close()
	method := diffMethod(strings.Join(ex.steps, ""))

	// The writer runs beside the reader: a server may answer and close
	// while a large body is still being written.
	next := make(chan struct{}, len(ex.steps))
	wrote := make(chan error, 1)
	go func() {
		var err error
		for i, s := range ex.steps {
			if i > 0 {
				if _, ok := <-next; !ok {
					break
				}
			}
			if _, err = io.WriteString(c, s); err != nil {
				break
			}
		}
		if err == nil && !ex.probe {
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			}
		}
		wrote <- err
	}()
	defer func() {
		c.Close()
		<-wrote
	}()

	br := bufio.NewReader(c)
	pending := len(ex.steps) - 1
	want := max(ex.finals, 1)
	if !ex.probe {
		want = 16 // half-closed: read until the server closes
	}
	for finals := 0; finals < want && len(res.Resps) < 2*want+2; {
		a, err := readDiffResp(br, method)
		if a.Status != 0 {
			res.Resps = append(res.Resps, a)
			if a.Status >= 200 {
				finals++
			}
		}
		if pending > 0 {
			next <- struct{}{}
			pending--
		}
		if err != nil {
			res.End = diffEnd(err)
			break
		}
	}
	close(next)
	if res.End != "" || !ex.probe {
		if res.End == "" {
			res.End = "open"
		}
		return res
	}
	// Probe: wait until the request is written (or failed), then ask once more.
	if err := <-wrote; err != nil {
		wrote <- err
		res.End = diffEnd(err)
		return res
	}
	wrote <- nil
	if _, err := io.WriteString(c, "GET /probe HTTP/1.1\r\nHost: probe\r\n\r\n"); err != nil {
		res.End = diffEnd(err)
		return res
	}
	a, err := readDiffResp(br, http.MethodGet)
	switch {
	case err != nil && a.Status == 0:
		res.End = diffEnd(err)
	case a.Status == 200 && a.Summary == "probe":
		res.End = "open"
	default:
		res.End = fmt.Sprintf("open, but the probe got %d %q", a.Status, a.Summary)
	}
	return res
}

// runDiffBoth runs ex against both servers at once.
func runDiffBoth(ref, h1 diffTarget, ex diffExchange) (want, got diffResult) {
	var wg sync.WaitGroup
	wg.Go(func() { want = runDiff(ref, ex) })
	wg.Go(func() { got = runDiff(h1, ex) })
	wg.Wait()
	return want, got
}

// diffCase is one request sequence of the table.
type diffCase struct {
	name string
	diffExchange
	// status, when set, is the first final status both must answer: a
	// check of the test's premise against the reference as much as of
	// h1Server.
	status int
}

// diffOne is a case of a single write, answered once, probed after.
func diffOne(name, raw string, status int) diffCase {
	return diffCase{name: name, diffExchange: diffExchange{steps: []string{raw}, finals: 1, probe: true}, status: status}
}

const (
	diffHost     = "Host: x\r\n"
	diffLargeLen = 1 << 20 // more than either server drains of an unread body
)

func diffCases() []diffCase {
	large := strings.Repeat("L", diffLargeLen)
	small := strings.Repeat("s", 1000)
	return []diffCase{
		diffOne("GET simple", "GET /echo?q=1&r=%20 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nX-Multi: a\r\nX-Multi: b\r\n\r\n", 200),
		diffOne("POST content-length", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello", 200),
		diffOne("POST content-length zero", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: 0\r\n\r\n", 200),
		diffOne("POST without length", "POST /echo HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("POST chunked", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 200),
		diffOne("POST chunked with trailers", "POST /echo HTTP/1.1\r\n"+diffHost+"Trailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n", 200),
		diffOne("POST chunked with an undeclared trailer", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n", 200),
		diffOne("POST chunked with extension", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0\r\n\r\n", 200),
		diffOne("POST chunked uppercase", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200),
		diffOne("POST chunked malformed size", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 200),
		diffOne("POST chunked bare LF", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n", 200),
		diffOne("content-length and transfer-encoding", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: 30\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", 200),
		diffOne("transfer-encoding and content-length", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 200),
		diffOne("content-length and transfer-encoding on HTTP/1.0", "POST /echo HTTP/1.0\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 200),
		diffOne("two content-lengths that differ", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
		diffOne("two identical content-lengths", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 200),
		diffOne("content-length list", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: 3, 3\r\n\r\nabc", 400),
		diffOne("negative content-length", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: -1\r\n\r\n", 400),
		diffOne("invalid content-length", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: 1x\r\n\r\nabc", 400),
		diffOne("plus-signed content-length", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: +3\r\n\r\nabc", 400),
		diffOne("transfer-encoding gzip, chunked", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
		diffOne("transfer-encoding unknown", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: bogus\r\n\r\n", 501),
		diffOne("transfer-encoding identity", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc", 501),
		diffOne("two transfer-encoding headers", "POST /echo HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
		diffOne("transfer-encoding on HTTP/1.0", "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n", 200),
		diffOne("HTTP/1.0 without keep-alive", "GET /echo HTTP/1.0\r\n\r\n", 200),
		diffOne("HTTP/1.0 keep-alive", "GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 200),
		diffOne("HTTP/1.0 keep-alive and a token after a space", "GET /echo HTTP/1.0\r\nConnection: keep-alive x-other\r\n\r\n", 200),
		diffOne("HTTP/1.0 keep-alive streamed answer", "GET /flush HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 200),
		diffOne("HTTP/1.0 keep-alive empty answer", "GET /empty HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 200),
		diffOne("HTTP/1.1 connection close", "GET /echo HTTP/1.1\r\n"+diffHost+"Connection: close\r\n\r\n", 200),
		diffOne("HTTP/1.1 connection keep-alive, close", "GET /echo HTTP/1.1\r\n"+diffHost+"Connection: keep-alive, close\r\n\r\n", 200),
		diffOne("missing Host on HTTP/1.1", "GET /echo HTTP/1.1\r\n\r\n", 400),
		diffOne("empty Host on HTTP/1.1", "GET /echo HTTP/1.1\r\nHost:\r\n\r\n", 200),
		diffOne("missing Host on HTTP/1.0", "GET /echo HTTP/1.0\r\n\r\n", 200),
		diffOne("two Host headers", "GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 0),
		diffOne("Host with invalid characters", "GET /echo HTTP/1.1\r\nHost: a b<c>\r\n\r\n", 400),
		diffOne("Host with port and userinfo", "GET /echo HTTP/1.1\r\nHost: user@x:8080\r\n\r\n", 0),
		diffOne("Host IPv6 literal", "GET /echo HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", 200),
		diffOne("header name with space before colon", "GET /echo HTTP/1.1\r\n"+diffHost+"X-Bad : v\r\n\r\n", 400),
		diffOne("header name with invalid character", "GET /echo HTTP/1.1\r\n"+diffHost+"X(Bad): v\r\n\r\n", 400),
		diffOne("header without colon", "GET /echo HTTP/1.1\r\n"+diffHost+"NoColon\r\n\r\n", 400),
		diffOne("obs-fold line folding", "GET /echo HTTP/1.1\r\n"+diffHost+"X-Fold: a\r\n  b\r\n\r\n", 0),
		diffOne("obs-fold on Host", "GET /echo HTTP/1.1\r\nHost: x\r\n y\r\n\r\n", 0),
		diffOne("header value with NUL", "GET /echo HTTP/1.1\r\n"+diffHost+"X-Nul: a\x00b\r\n\r\n", 400),
		diffOne("header value with bare CR", "GET /echo HTTP/1.1\r\n"+diffHost+"X-CR: a\rb\r\n\r\n", 400),
		diffOne("header value with DEL and high bytes", "GET /echo HTTP/1.1\r\n"+diffHost+"X-Bytes: a\x7fb\xffc\r\n\r\n", 0),
		diffOne("header lines ending in bare LF", "GET /echo HTTP/1.1\n"+diffHost+"X-LF: v\n\n", 200),
		diffOne("header block within MaxHeaderBytes+4096", "GET /echo HTTP/1.1\r\n"+diffHost+"X-Pad: "+strings.Repeat("p", 7000)+"\r\n\r\n", 200),
		diffOne("header block beyond MaxHeaderBytes+4096", "GET /echo HTTP/1.1\r\n"+diffHost+"X-Pad: "+strings.Repeat("p", 9000)+"\r\n\r\n", 431),
		diffOne("malformed header line before the limit is reached", "GET /echo HTTP/1.1\r\n"+diffHost+"X(Bad): v\r\nX-Pad: "+strings.Repeat("p", 9000)+"\r\n\r\n", 400),
		diffOne("invalid method before an oversized header", "G(T /echo HTTP/1.1\r\n"+diffHost+"X-Pad: "+strings.Repeat("p", 9000)+"\r\n\r\n", 400),
		diffOne("many small headers beyond the limit", "GET /echo HTTP/1.1\r\n"+diffHost+strings.Repeat("X-Many: v\r\n", 900)+"\r\n", 431),
		diffOne("request line too long", "GET /"+strings.Repeat("u", 9000)+" HTTP/1.1\r\n"+diffHost+"\r\n", 431),
		diffOne("malformed request line", "GET\r\n"+diffHost+"\r\n", 400),
		diffOne("lowercase method", "get /echo HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("invalid method token", "G(T /echo HTTP/1.1\r\n"+diffHost+"\r\n", 400),
		diffOne("PRI * HTTP/2.0 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 0),
		diffOne("HTTP/2.0 GET", "GET /echo HTTP/2.0\r\n"+diffHost+"\r\n", 505),
		diffOne("HTTP/3.0 GET", "GET /echo HTTP/3.0\r\n"+diffHost+"\r\n", 505),
		diffOne("HTTP/0.9 GET", "GET /echo HTTP/0.9\r\n"+diffHost+"\r\n", 505),
		diffOne("HTTP/1.2 GET", "GET /echo HTTP/1.2\r\n"+diffHost+"\r\n", 200),
		diffOne("lowercase http version", "GET /echo http/1.1\r\n"+diffHost+"\r\n", 400),
		diffOne("absolute-form URI", "POST http://x/v1?a=b HTTP/1.1\r\nHost: y\r\nContent-Length: 2\r\n\r\nhi", 200),
		diffOne("absolute-form URI with invalid Host header", "GET http://x/v1 HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
		diffOne("absolute-form URI with obs-fold on Host", "GET http://x/v1 HTTP/1.1\r\nHost: a\r\n b\r\n\r\n", 400),
		diffOne("absolute-form URI without Host header", "GET http://x/v1 HTTP/1.1\r\n\r\n", 400),
		diffOne("path with fragment and dot segments", "GET /a/../echo/./b?x#frag HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 200),
		diffOne("CONNECT without Host", "CONNECT example.com:443 HTTP/1.1\r\n\r\n", 200),
		diffOne("OPTIONS *", "OPTIONS * HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("Expect 100-continue in one write, handler reads", "POST /echo HTTP/1.1\r\n"+diffHost+"Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", 200),
		{name: "Expect 100-continue, body after 100 Continue", diffExchange: diffExchange{
			steps:  []string{"POST /echo HTTP/1.1\r\n" + diffHost + "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", "hello"},
			finals: 1, probe: true}, status: 200},
		{name: "Expect 100-continue, chunked body after 100 Continue", diffExchange: diffExchange{
			steps:  []string{"POST /echo HTTP/1.1\r\n" + diffHost + "Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"},
			finals: 1, probe: true}, status: 200},
		diffOne("Expect 100-continue, handler does not read", "POST /noread HTTP/1.1\r\n"+diffHost+"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", 200),
		diffOne("Expect 100-continue without a body", "GET /echo HTTP/1.1\r\n"+diffHost+"Expect: 100-continue\r\n\r\n", 200),
		diffOne("Expect 100-continue on HTTP/1.0", "POST /echo HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", 200),
		diffOne("Expect 100-Continue mixed case", "POST /echo HTTP/1.1\r\n"+diffHost+"Expect: 100-Continue\r\nContent-Length: 5\r\n\r\nhello", 200),
		diffOne("Expect 100-continue among other tokens", "POST /echo HTTP/1.1\r\n"+diffHost+"Expect: 100-continue, x-other\r\nContent-Length: 5\r\n\r\nhello", 200),
		diffOne("Expect 100-continue and a token after a space", "POST /echo HTTP/1.1\r\n"+diffHost+"Expect: 100-continue x-other\r\nContent-Length: 5\r\n\r\nhello", 200),
		diffOne("Expect something else", "POST /echo HTTP/1.1\r\n"+diffHost+"Expect: the-unexpected\r\nContent-Length: 5\r\n\r\nhello", 417),
		{name: "pipelined GET and POST", diffExchange: diffExchange{
			steps:  []string{"GET /echo?n=1 HTTP/1.1\r\n" + diffHost + "\r\nPOST /echo?n=2 HTTP/1.1\r\n" + diffHost + "Content-Length: 3\r\n\r\nabc"},
			finals: 2, probe: true}, status: 200},
		{name: "pipelined behind Connection: close", diffExchange: diffExchange{
			steps:  []string{"GET /echo?n=1 HTTP/1.1\r\n" + diffHost + "Connection: close\r\n\r\nGET /echo?n=2 HTTP/1.1\r\n" + diffHost + "\r\n"},
			finals: 2, probe: true}, status: 200},
		{name: "pipelined behind a bad request", diffExchange: diffExchange{
			steps:  []string{"GET /echo HTTP/1.1\r\n\r\nGET /echo?n=2 HTTP/1.1\r\n" + diffHost + "\r\n"},
			finals: 2, probe: true}, status: 400},
		{name: "CRLF after a POST body", diffExchange: diffExchange{
			steps:  []string{"POST /echo HTTP/1.1\r\n" + diffHost + "Content-Length: 3\r\n\r\nabc\r\nGET /echo?n=2 HTTP/1.1\r\n" + diffHost + "\r\n"},
			finals: 2, probe: true}, status: 200},
		diffOne("body shorter than Content-Length (ReadTimeout)", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: 10\r\n\r\nhello", 200),
		diffOne("header never ends (ReadHeaderTimeout)", "GET /echo HTTP/1.1\r\n"+diffHost, 0),
		{name: "header cut by the client's half-close", diffExchange: diffExchange{
			steps: []string{"GET /echo HTTP/1.1\r\n" + diffHost}}},
		{name: "request line cut by the client's half-close", diffExchange: diffExchange{
			steps: []string{"GET /echo HT"}}},
		{name: "three bytes as the first request, then the client's half-close", diffExchange: diffExchange{
			steps: []string{"GET"}}, status: 400},
		{name: "stray bytes then the client's half-close", diffExchange: diffExchange{
			steps: []string{"GET /echo HTTP/1.1\r\n" + diffHost + "\r\n\n\r\n"}}, status: 200},
		{name: "body cut by the client's half-close", diffExchange: diffExchange{
			steps: []string{"POST /echo HTTP/1.1\r\n" + diffHost + "Content-Length: 10\r\n\r\nhello"}}, status: 200},
		{name: "chunked body cut by the client's half-close", diffExchange: diffExchange{
			steps: []string{"POST /echo HTTP/1.1\r\n" + diffHost + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"}}, status: 200},
		{name: "two requests then the client's half-close", diffExchange: diffExchange{
			steps: []string{"GET /echo?n=1 HTTP/1.1\r\n" + diffHost + "\r\nGET /echo?n=2 HTTP/1.1\r\n" + diffHost + "\r\n"}}, status: 200},
		diffOne("HTTP/1.0 keep-alive, handler does not read a small body", "POST /noread HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1000\r\n\r\n"+small, 200),
		diffOne("handler closes a small body unread", "POST /closebody HTTP/1.1\r\n"+diffHost+"Content-Length: 1000\r\n\r\n"+small, 200),
		diffOne("handler closes a small chunked body unread", "POST /closebody HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\n3e8\r\n"+small+"\r\n0\r\n\r\n", 200),
		diffOne("handler closes a large body unread", "POST /closebody HTTP/1.1\r\n"+diffHost+"Content-Length: "+strconv.Itoa(diffLargeLen)+"\r\n\r\n"+large, 200),
		diffOne("handler closes a large chunked body unread", "POST /closebody HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\n"+strconv.FormatInt(diffLargeLen, 16)+"\r\n"+large+"\r\n0\r\n\r\n", 200),
		diffOne("CRLF before the first request", "\r\nGET /echo HTTP/1.1\r\n"+diffHost+"\r\n", 400),
		diffOne("handler does not read a small body", "POST /noread HTTP/1.1\r\n"+diffHost+"Content-Length: 1000\r\n\r\n"+small, 200),
		diffOne("handler does not read a large body", "POST /noread HTTP/1.1\r\n"+diffHost+"Content-Length: "+strconv.Itoa(diffLargeLen)+"\r\n\r\n"+large, 200),
		diffOne("handler does not read a large chunked body", "POST /noread HTTP/1.1\r\n"+diffHost+"Transfer-Encoding: chunked\r\n\r\n"+strconv.FormatInt(diffLargeLen, 16)+"\r\n"+large+"\r\n0\r\n\r\n", 200),
		diffOne("body within http.MaxBytesReader's limit", "POST /limited HTTP/1.1\r\n"+diffHost+"Content-Length: 10\r\n\r\n0123456789", 200),
		diffOne("body past http.MaxBytesReader's limit", "POST /limited HTTP/1.1\r\n"+diffHost+"Content-Length: 1000\r\n\r\n"+small, 413),
		diffOne("large body past http.MaxBytesReader's limit", "POST /limited HTTP/1.1\r\n"+diffHost+"Content-Length: "+strconv.Itoa(diffLargeLen)+"\r\n\r\n"+large, 413),
		diffOne("handler reads a large body", "POST /echo HTTP/1.1\r\n"+diffHost+"Content-Length: "+strconv.Itoa(diffLargeLen)+"\r\n\r\n"+large, 200),
		diffOne("HEAD", "HEAD /echo HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("HEAD with a typed answer", "HEAD /typed HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("HEAD of an empty answer", "HEAD /empty HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("HEAD of a large answer", "HEAD /big HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("streamed answer with Flush", "GET /flush HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("large answer without Flush", "GET /big HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("large answer to HTTP/1.0", "GET /big HTTP/1.0\r\n\r\n", 200),
		diffOne("handler writes nothing", "GET /empty HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("handler sets Content-Length", "GET /length HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("handler writes less than its Content-Length", "GET /short HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("handler changes Content-Length after WriteHeader", "GET /late-length HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("handler sets Content-Length after WriteHeader, large answer", "GET /late-length-big HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("handler sets Connection: close", "GET /close HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("handler sets Content-Type", "GET /typed HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("status 204", "GET /204 HTTP/1.1\r\n"+diffHost+"\r\n", 204),
		diffOne("status 304", "GET /304 HTTP/1.1\r\n"+diffHost+"\r\n", 304),
		diffOne("103 Early Hints then 200", "GET /early HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("sniffed HTML", "GET /sniff HTTP/1.1\r\n"+diffHost+"\r\n", 200),
		diffOne("handler panics", "GET /panic HTTP/1.1\r\n"+diffHost+"\r\n", 0),
		diffOne("handler panics after a write", "GET /panic-after-write HTTP/1.1\r\n"+diffHost+"\r\n", 0),
		diffOne("http.Error", "GET /error HTTP/1.1\r\n"+diffHost+"\r\n", 403),
	}
}

// compareDiff reports how got (h1Server) differs from want (net/http).
func compareDiff(t *testing.T, raw []string, want, got diffResult) {
	t.Helper()
	if diffEqual(want, got) {
		return
	}
	t.Errorf("h1Server differs from net/http\nrequest: %s\nnet/http:\n%v\nh1Server:\n%v", diffQuote(strings.Join(raw, "")), want, got)
}

// diffQuote quotes a request for a message, its first 600 bytes.
func diffQuote(req string) string {
	if len(req) > 600 {
		return fmt.Sprintf("%q... (%d bytes)", req[:600], len(req))
	}
	return strconv.Quote(req)
}

// diffEqual compares two results field by field. Not compared, because
// they differ legitimately: the Date header, header order, and the body
// and headers of the servers' own answers (400, 431, 417, 100 Continue:
// only their status counts; diffResp keeps no more); and, for an answer
// of 2 to 4 KiB, chunked versus Content-Length framing (readDiffResp).
func diffEqual(a, b diffResult) bool {
	return a.End == b.End && slices.Equal(a.Resps, b.Resps)
}

// TestH1ServerLikeNetHTTP proves that for each request sequence of the
// table a client sees the same from h1Server as from net/http's server
// with the same limits: the statuses, what the handler saw, the answer's
// Content-Type, framing and Connection header, and whether the connection
// stays open.
func TestH1ServerLikeNetHTTP(t *testing.T) {
	ref, h1 := startDiffPair(t, http.HandlerFunc(diffHandler), nil, nil)
	for _, tc := range diffCases() {
		t.Run(tc.name, func(t *testing.T) {
			want, got := runDiffBoth(ref, h1, tc.diffExchange)
			t.Logf("net/http:\n%v", want)
			if f := want.finals(); tc.status != 0 && (len(f) == 0 || f[0] != tc.status) {
				t.Errorf("net/http answered %v, the case expects %d first", f, tc.status)
			}
			compareDiff(t, tc.steps, want, got)
		})
	}
}

// TestH1ServerLikeNetHTTPOverTLS proves the same for some of the cases
// over TLS (tls.NewListener around both listeners), where the handler
// must also see a completed handshake in r.TLS.
func TestH1ServerLikeNetHTTPOverTLS(t *testing.T) {
	srvTLS, cliTLS := diffTLSConfigs(t)
	ref, h1 := startDiffPair(t, http.HandlerFunc(diffHandler), srvTLS, cliTLS)
	names := []string{
		"GET simple", "POST chunked with trailers", "Expect 100-continue, body after 100 Continue",
		"pipelined GET and POST", "handler does not read a large body", "streamed answer with Flush",
		"HTTP/1.0 without keep-alive", "missing Host on HTTP/1.1", "handler panics",
	}
	ran := 0
	for _, tc := range diffCases() {
		if !slices.Contains(names, tc.name) {
			continue
		}
		ran++
		t.Run(tc.name, func(t *testing.T) {
			want, got := runDiffBoth(ref, h1, tc.diffExchange)
			for _, a := range got.Resps {
				if a.Handler && strings.HasPrefix(a.Summary, "method=") && !strings.Contains(a.Summary, "tls=true") {
					t.Errorf("h1Server's handler did not see a completed handshake:\n%s", a.Summary)
				}
			}
			compareDiff(t, tc.steps, want, got)
		})
	}
	if ran != len(names) {
		t.Errorf("ran %d of the %d cases named for TLS: a name no longer matches the table", ran, len(names))
	}
}

// diffTLSConfigs returns a server configuration with a fresh self-signed
// ECDSA P-256 certificate for 127.0.0.1, and a client one that trusts it.
func diffTLSConfigs(t *testing.T) (srv, cli *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "h1serve diff test"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	srv = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}},
		MinVersion:   tls.VersionTLS12,
	}
	cli = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	return srv, cli
}

// FuzzH1ServerLikeNetHTTP proves, for mutated request bytes, that both
// servers answer with the same statuses (or both close without one) and
// that whenever the handler ran it saw the same request. The client
// half-closes after writing, so every input ends within the servers'
// timeouts; diffGuard bounds it regardless.
func FuzzH1ServerLikeNetHTTP(f *testing.F) {
	for _, tc := range diffCases() {
		raw := strings.Join(tc.steps, "")
		if len(raw) > 16<<10 {
			continue // the large bodies add nothing for the mutator
		}
		f.Add([]byte(raw))
	}
	ref, h1 := startDiffPair(f, http.HandlerFunc(diffHandler), nil, nil)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ex := diffExchange{steps: []string{string(raw)}}
		want, got := runDiffBoth(ref, h1, ex)
		if !diffAgree(want, got) {
			t.Errorf("h1Server differs from net/http\nrequest: %s\nnet/http:\n%v\nh1Server:\n%v", diffQuote(string(raw)), want, got)
		}
	})
}

// diffAgree is the fuzz test's comparison: the same statuses in the same
// order, and the same summary wherever the handler answered.
//
// One difference is normalised: the servers' own 400 and 431, as the
// last answer before both close, count as the same answer. Which of them
// net/http gives a header with a malformed line near MaxHeaderBytes+4096
// depends on how far its 4 KiB read-ahead has gone when its parser meets
// the line (a header that ends within the limit but is followed by more
// bytes than the limit gets 431 even when the bad line comes early);
// h1Server reads the whole header first. Both refuse the request before
// the handler and close. The table keeps the direction h1Server could
// match ("malformed header line before the limit is reached", "invalid
// method before an oversized header").
func diffAgree(a, b diffResult) bool {
	if len(a.Resps) != len(b.Resps) {
		return false
	}
	for i := range a.Resps {
		x, y := a.Resps[i], b.Resps[i]
		if x.Handler != y.Handler || x.Summary != y.Summary {
			return false
		}
		if x.Status != y.Status && !(!x.Handler && i == len(a.Resps)-1 && a.End == "closed" && b.End == "closed" &&
			min(x.Status, y.Status) == http.StatusBadRequest && max(x.Status, y.Status) == http.StatusRequestHeaderFieldsTooLarge) {
			return false
		}
	}
	return (a.End == "hang") == (b.End == "hang")
}

// diffGate is a handler's side of a test's control: it tells when the
// handler started and what its request's context did.
type diffGate struct {
	started chan struct{}
	release chan struct{}
	outcome chan string
}

func newDiffGate() *diffGate {
	return &diffGate{started: make(chan struct{}, 1), release: make(chan struct{}), outcome: make(chan string, 1)}
}

// handler reads the body, says it started and waits for the release, its
// context's end or diffGuard; it answers with what happened.
func (g *diffGate) handler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	g.started <- struct{}{}
	var what string
	select {
	case <-g.release:
		what = "released, context " + diffErr(r.Context().Err())
	case <-r.Context().Done():
		what = "context done: " + diffErr(r.Context().Err())
	case <-time.After(diffGuard):
		what = "guard fired"
	}
	g.outcome <- what
	w.Header().Set("X-Diff-Handler", "1")
	_, _ = io.WriteString(w, what)
}

// waitDiff waits for ch within diffGuard.
func waitDiff[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(diffGuard):
		t.Fatalf("no %s within %v", what, diffGuard)
	}
	var zero T
	return zero
}

// TestH1ServerCancelsOnClientGone proves, for both servers, that a
// handler's context ends when its client closes the connection after
// sending the whole request, and that it does not end while the client
// stays: a handler released by the test finds its context alive and its
// answer reaches the client.
func TestH1ServerCancelsOnClientGone(t *testing.T) {
	for _, kind := range diffKinds {
		for _, req := range []string{
			"GET /wait HTTP/1.1\r\n" + diffHost + "\r\n",
			"POST /wait HTTP/1.1\r\n" + diffHost + "Content-Length: 5\r\n\r\nhello",
		} {
			method := req[:strings.IndexByte(req, ' ')]
			t.Run(kind+"/client goes/"+method, func(t *testing.T) {
				g := newDiffGate()
				tg := startDiff(t, kind, http.HandlerFunc(g.handler), nil, nil).diffTarget
				c, err := diffDial(tg)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				waitDiff(t, g.started, "handler start")
				c.Close()
				if got := waitDiff(t, g.outcome, "handler outcome"); !strings.HasPrefix(got, "context done") {
					t.Fatalf("handler: %s; want its context done when the client went away", got)
				}
			})
			t.Run(kind+"/client stays/"+method, func(t *testing.T) {
				g := newDiffGate()
				tg := startDiff(t, kind, http.HandlerFunc(g.handler), nil, nil).diffTarget
				c, err := diffDial(tg)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				waitDiff(t, g.started, "handler start")
				close(g.release)
				if got := waitDiff(t, g.outcome, "handler outcome"); got != "released, context nil" {
					t.Fatalf("handler: %s; want it released with its context alive", got)
				}
				a, err := readDiffResp(bufio.NewReader(c), http.MethodGet)
				if err != nil || a.Status != 200 || a.Summary != "released, context nil" {
					t.Fatalf("answer %d %q, %v; want 200 %q", a.Status, a.Summary, err, "released, context nil")
				}
			})
		}
	}
}

// waitListenerClosed dials addr until a dial is refused, which tells that
// a Shutdown under way has closed the listener. A dial that still
// connects is closed at once.
func waitListenerClosed(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(diffGuard)
	for i := 0; time.Now().Before(deadline); i++ {
		c, err := net.DialTimeout("tcp", addr, diffGuard)
		if err != nil {
			return
		}
		c.Close()
		runtime.Gosched()
	}
	t.Fatal("the listener was not closed")
}

// startWaiting starts a kind of server whose handler waits on a gate,
// and sends it one request, returning once the handler has started.
func startWaiting(t *testing.T, kind string) (*diffGate, *diffRunning, net.Conn) {
	t.Helper()
	g := newDiffGate()
	run := startDiff(t, kind, http.HandlerFunc(g.handler), nil, nil)
	c, err := diffDial(run.diffTarget)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /wait HTTP/1.1\r\n"+diffHost+"\r\n"); err != nil {
		c.Close()
		t.Fatal(err)
	}
	waitDiff(t, g.started, "handler start")
	return g, run, c
}

// TestH1ServerShutdown proves, for both servers, Shutdown's contract: an
// idle kept-alive connection is closed; a request in flight when Shutdown
// starts is answered 200 and its connection then closed, and Shutdown
// returns nil only after that; Shutdown whose context has already expired
// while a request is in flight returns context.DeadlineExceeded; Serve
// returns http.ErrServerClosed.
func TestH1ServerShutdown(t *testing.T) {
	for _, kind := range diffKinds {
		t.Run(kind+"/idle connection", func(t *testing.T) {
			run := startDiff(t, kind, http.HandlerFunc(diffHandler), nil, nil)
			c, err := diffDial(run.diffTarget)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			if _, err := io.WriteString(c, "GET /probe HTTP/1.1\r\n"+diffHost+"\r\n"); err != nil {
				t.Fatal(err)
			}
			if a, err := readDiffResp(br, http.MethodGet); err != nil || a.Status != 200 {
				t.Fatalf("answer %d, %v; want 200", a.Status, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), diffGuard)
			defer cancel()
			if err := run.srv.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v, want nil", err)
			}
			if _, err := br.ReadByte(); diffEnd(err) != "closed" {
				t.Fatalf("idle connection after Shutdown: read %v, want it closed", err)
			}
			if err := run.served(t); !errors.Is(err, http.ErrServerClosed) {
				t.Fatalf("Serve: %v, want http.ErrServerClosed", err)
			}
		})
		t.Run(kind+"/request in flight", func(t *testing.T) {
			g, run, c := startWaiting(t, kind)
			defer c.Close()
			shut := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), diffGuard)
				defer cancel()
				shut <- run.srv.Shutdown(ctx)
			}()
			waitListenerClosed(t, run.addr)
			select {
			case err := <-shut:
				t.Fatalf("Shutdown returned %v while a request was in flight", err)
			default:
			}
			close(g.release)
			br := bufio.NewReader(c)
			a, err := readDiffResp(br, http.MethodGet)
			if a.Status != 200 || a.Summary != "released, context nil" {
				t.Fatalf("answer %d %q, %v; want 200 %q", a.Status, a.Summary, err, "released, context nil")
			}
			if err == nil {
				_, err = br.ReadByte()
			}
			if diffEnd(err) != "closed" {
				t.Fatalf("connection after its answer during Shutdown: %v, want it closed", err)
			}
			if err := waitDiff(t, shut, "Shutdown's return"); err != nil {
				t.Fatalf("Shutdown: %v, want nil", err)
			}
			if err := run.served(t); !errors.Is(err, http.ErrServerClosed) {
				t.Fatalf("Serve: %v, want http.ErrServerClosed", err)
			}
		})
		t.Run(kind+"/expired context", func(t *testing.T) {
			g, run, c := startWaiting(t, kind)
			defer c.Close()
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			defer cancel()
			if err := run.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Shutdown: %v, want context.DeadlineExceeded", err)
			}
			close(g.release)
			if a, err := readDiffResp(bufio.NewReader(c), http.MethodGet); a.Status != 200 {
				t.Fatalf("answer %d, %v; want 200", a.Status, err)
			}
			if err := run.served(t); !errors.Is(err, http.ErrServerClosed) {
				t.Fatalf("Serve: %v, want http.ErrServerClosed", err)
			}
		})
	}
}

// brokenListener's Accept fails for good; it counts its Close calls.
type brokenListener struct {
	net.Listener
	closes atomic.Int32
}

var errDiffBroken = errors.New("diff test: the listener is broken")

func (l *brokenListener) Accept() (net.Conn, error) { return nil, errDiffBroken }

func (l *brokenListener) Close() error {
	l.closes.Add(1)
	return l.Listener.Close()
}

// TestH1ServerServeClosesListener proves, for both servers, that Serve
// returns a listener's lasting Accept error and closes the listener: a
// client is then refused at once, not left waiting in the listener's
// backlog for a server that no longer accepts.
func TestH1ServerServeClosesListener(t *testing.T) {
	for _, kind := range diffKinds {
		t.Run(kind, func(t *testing.T) {
			srv, connsGone := newDiffServer(kind, http.HandlerFunc(diffHandler))
			defer connsGone()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			bl := &brokenListener{Listener: ln}
			defer ln.Close()
			if err := srv.Serve(bl); !errors.Is(err, errDiffBroken) {
				t.Fatalf("Serve returned %v, want %v", err, errDiffBroken)
			}
			if bl.closes.Load() == 0 {
				t.Fatal("Serve returned without closing its listener")
			}
		})
	}
}
