package regional

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// credentialHeaders carry a client's credential for this controller: with
// client authentication on, they go neither to pods nor to other regions'
// controllers.
var credentialHeaders = map[string]bool{"Authorization": true, "X-Api-Key": true}

// hopHeaders are not forwarded (RFC 9110 section 7.6.1).
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true,
}

// attempt is the outcome of one try at a pod or a remote controller.
type attempt struct {
	wrote     bool // bytes reached the client: no retry possible
	retryable bool // failed before the first byte
	status    int
	kind      string // failure kind for metrics
	err       error
	ttft      time.Duration
	usage     *usage
}

// notSent reports whether the attempt failed before the request reached the
// upstream (the connection was refused): retrying it duplicates no work, so
// it costs nothing of the request's retry budget.
func (a attempt) notSent() bool { return a.kind == "refused" }

func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, k tokenize.Kind) {
	api := "chat"
	if k == tokenize.Completion {
		api = "completions"
	}
	p := s.parse(w, r, k, api)
	if p == nil {
		return
	}
	defer s.release(p) // also when the response is aborted (below)
	tw := &p.tw
	tw.ResponseWriter = w
	s.routeAndServe(tw, r, p, api)
	if !tw.wrote && s.handingBack.Load() {
		// The controller is stopping and its grace period is over: the
		// request got no byte of an answer, so the client may send it
		// again, to another replica.
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Connection", "close")
		s.fail(w, api, http.StatusServiceUnavailable, "shutting_down",
			"this controller is shutting down and did not answer within its grace period: retry (another replica takes it)")
		return
	}
	if p.abort {
		// The upstream failed after part of its answer reached the client:
		// end the response abnormally (no final chunk), so the client sees
		// a broken transfer rather than a complete, truncated answer.
		panic(http.ErrAbortHandler)
	}
}

// localResult is what trying this region's pods came to.
type localResult struct {
	answered bool  // the client has its answer (or an error written by serveLocal)
	attempts int   // pods tried
	err      error // why no pod could be decided on, when attempts is 0
	last     error // the last attempt's failure
}

// serveLocal serves the request on this region's pods: first on the pod
// already decided (if any), then, while a pod fails before its first byte,
// on others. A pod that refused the connection is ejected at once and the
// next one tried without delay or cost; other failures cost one of the
// request's MaxRetries retries and back off. Unless it answered, it has
// written nothing: the caller may try another region, or says why not.
func (s *Server) serveLocal(w http.ResponseWriter, r *http.Request, p *parsed, api string, first *route.Decision) localResult {
	var tried []*route.Pod
	var lr localResult
	retries := 0
	for {
		d := first
		first = nil
		if d == nil {
			p.req.Exclude = tried
			var err error
			if d, err = s.decide(p); err != nil {
				lr.err = err
				return lr
			}
		}
		lr.attempts++
		res := s.forward(r.Context(), w, r, p, d)
		if res.err == nil || res.wrote || !res.retryable || r.Context().Err() != nil ||
			(!res.notSent() && retries >= s.cfg.MaxRetries) {
			s.finish(w, api, p, d, res)
			lr.answered = true
			return lr
		}
		lr.last = fmt.Errorf("pod %s: %w", d.PodName, res.err)
		s.m.retries.Inc()
		s.log.Info("retrying on another pod", "pod", d.PodName, "kind", res.kind, "err", res.err)
		tried = append(tried, d.Pod)
		if res.notSent() {
			continue
		}
		backoff := s.cfg.RetryBackoff << retries
		retries++
		if backoff > 0 {
			backoff = backoff/2 + rand.N(backoff/2+1)
			t := time.NewTimer(backoff)
			select {
			case <-r.Context().Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
}

// localFailed answers a request this region's pods could not serve and no
// other region took: 503 when no pod could be decided on, 502 when every
// pod tried failed before answering.
func (s *Server) localFailed(w http.ResponseWriter, api string, lr localResult) {
	if lr.attempts == 0 {
		s.decisionError(w, api, lr.err)
		return
	}
	s.fail(w, api, http.StatusBadGateway, "upstream_failed", "every pod tried failed before answering (%d attempts; last: %v)", lr.attempts, lr.last)
}

// finish records the outcome of the final attempt and answers the client if
// nothing was written yet.
func (s *Server) finish(w http.ResponseWriter, api string, p *parsed, d *route.Decision, res attempt) {
	switch {
	case res.err == nil:
		s.m.request(api, res.status).Inc()
	case res.wrote:
		// Mid-stream failure: the client got a truncated answer, ended
		// abnormally (see relay).
		s.m.requests.WithLabelValues(api, "truncated").Inc()
		p.abort = true
	case errors.Is(res.err, context.Canceled):
		s.m.requests.WithLabelValues(api, "499").Inc()
	default:
		s.fail(w, api, http.StatusBadGateway, "upstream_failed", "pod %s: %v", d.PodName, res.err)
	}
	if res.usage != nil {
		s.observeUsage(p, d, res.usage)
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		// Guarded: the arguments cost allocations even when the record
		// is dropped.
		s.log.Debug("routed", "pod", d.PodName, "policy", d.Policy, "reason", d.Reason, "matched_blocks", d.MatchedBlocks,
			"predicted_cached", d.CachedTokens, "prompt_tokens", p.req.PromptTokens, "ttft", res.ttft, "status", res.status)
	}
}

func (s *Server) observeUsage(p *parsed, d *route.Decision, u *usage) {
	if u.PromptTokensDetails == nil {
		return
	}
	reported := u.PromptTokensDetails.CachedTokens
	s.m.promptTokens.Add(float64(u.PromptTokens))
	s.m.reported.Add(float64(reported))
	s.m.predicted.Add(float64(d.CachedTokens))
	diff := d.CachedTokens - reported
	if diff < 0 {
		diff = -diff
	}
	s.m.predictionErr.Observe(float64(diff))
}

// forward sends the request to the decided pod and streams its answer back
// (see relay), with the pod's accounting: in-flight ticket, outlier
// detection, speculation, TTFT and calibration.
func (s *Server) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, p *parsed, d *route.Decision) (res attempt) {
	pod := d.Pod
	info := pod.Info()
	rate, _ := s.dec.Model().Rate(info.Profile)
	pendingAhead := route.BacklogTokens(pod, s.now(), rate)
	ticket := s.dec.Admit(d)
	defer func() {
		ticket.Done(s.now())
		ok := res.err == nil && res.status < 500
		if res.err != nil && errors.Is(res.err, context.Canceled) && ctx.Err() != nil {
			ok = true // the client went away: not the pod's fault
		}
		switch {
		case res.kind == "refused":
			// Nothing listens at the pod's address: it is gone, not slow.
			if s.reg.Eject(pod, s.now(), s.cfg.Outlier) {
				s.m.ejections.Inc()
				s.log.Warn("pod ejected: connection refused", "pod", pod.Name)
			}
		case s.reg.Report(pod, ok, s.now(), s.cfg.Outlier):
			s.m.ejections.Inc()
			s.log.Warn("pod ejected", "pod", pod.Name, "after", s.cfg.Outlier.ConsecutiveFailures)
		}
		if res.kind != "" {
			s.m.upstreamErrors.WithLabelValues(res.kind).Inc()
		}
	}()
	if info.Endpoint == "" {
		return attempt{retryable: true, kind: "connect", err: fmt.Errorf("pod %s has no endpoint", pod.Name)}
	}
	ph := s.podHeaders(pod.Name)
	out := [4]headerField{{"X-Meridian-Pod", ph.pod}, {"X-Meridian-Predicted-Cached-Tokens", []string{strconv.Itoa(d.CachedTokens)}},
		{"X-Meridian-Region", ph.region}, {HeaderController, ph.controller}}
	nout := 3
	if s.id != "" {
		nout = 4
	}
	return s.relay(ctx, s.client, w, r, p, ph.urlFor(info.Endpoint, r.URL.Path), ph.add, out[:nout], ph.who,
		limits{firstByte: s.cfg.FirstByteTimeout}, func(status int) {
			ttft := s.now().Sub(p.started)
			ticket.FirstByte(s.now())
			pod.Contact(s.now())
			if status == http.StatusOK {
				s.dec.Speculation().Observe(pod.ID, p.req.Chain, s.now())
			}
			s.m.ttftOf(pod.Name).Observe(ttft.Seconds())
			if s.calib != nil && status == http.StatusOK {
				// Per profile, not per pod: a replica learns only from the
				// requests it served, and per-pod rates learnt apart would
				// make a region's replicas decide differently
				// (TestReplicasDecideAlike).
				s.calib.Observe(gorgo.Observation{Profile: info.Profile, UncachedTokens: d.Uncached, CachedTokens: d.CachedTokens,
					PendingPrefillTokens: pendingAhead, TTFTMs: float64(ttft) / float64(time.Millisecond)})
			}
		})
}

// relay posts the request body to url (with the client's headers, minus
// hop-by-hop ones, plus add) and streams the answer back with out's
// fields added to its headers (the values are shared, not copied). Nothing is written to the client until the upstream's first
// body byte has arrived (firstByte is called then), so an upstream that
// fails or stalls before answering can be retried elsewhere; from then on
// the client sees the upstream's answer byte for byte, flushed as it comes.
func (s *Server) relay(ctx context.Context, client *http.Client, w http.ResponseWriter, r *http.Request, p *parsed, url string, add http.Header, out []headerField, who string, lim limits, firstByte func(status int)) (res attempt) {
	try := newTryCtx(ctx)
	defer try.end()
	var uctx context.Context = try
	var timer *time.Timer // the first-byte timer
	var ct *connectTimer
	if lim.connect > 0 && lim.connect < lim.firstByte {
		// The connection (TCP and TLS) must be up within lim.connect: a
		// peer whose packets are blackholed is given up on in a few RTTs.
		// The first-byte bound runs from then on (startTryTimers).
		ct, timer = startTryTimers(lim, try.fire)
		defer ct.t.Stop()
		uctx = httptrace.WithClientTrace(uctx, &httptrace.ClientTrace{GotConn: ct.gotConn})
	} else {
		timer = time.AfterFunc(lim.firstByte, try.fire)
	}
	defer timer.Stop()

	keep := keepRelayed
	if s.auth != nil {
		keep = keepRelayedNoCredential
	}
	// postToPod copies the body into the request it writes: borrowed.
	resp, err := s.postToPod(uctx, client, ct, url, r.Header, keep, add, p.raw.Borrow())
	if err == errNotPosted || err == errRedirected {
		redirected := err == errRedirected
		// The client's transport may read the body after this request
		// is over: kept, its buffer is not reused (reqbody).
		var ureq *http.Request
		ureq, err = http.NewRequestWithContext(uctx, http.MethodPost, url, bytes.NewReader(p.raw.Keep()))
		if err != nil {
			return attempt{kind: "connect", err: err}
		}
		for k, vs := range r.Header {
			if keep(k) {
				ureq.Header[k] = vs
			}
		}
		for k, vs := range add {
			ureq.Header[k] = vs
		}
		if redirected {
			// The pod answered a redirect: client follows it, from
			// the start, as roundTrip has it do.
			resp, err = client.Do(ureq)
		} else {
			resp, err = s.roundTrip(client, ureq)
		}
	}
	if err != nil {
		if ct != nil && ct.fired.Load() && ctx.Err() == nil {
			timer.Stop()
			return attempt{retryable: true, kind: "connect_timeout", err: fmt.Errorf("%s: no connection within %v", who, lim.connect)}
		}
		return s.upstreamErr(ctx, timer, lim, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return attempt{retryable: true, status: resp.StatusCode, kind: "status_5xx", err: fmt.Errorf("%s answered %s", who, resp.Status)}
	}
	bufp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bufp)
	buf := *bufp
	n, rerr := resp.Body.Read(buf)
	if n == 0 && rerr != nil && rerr != io.EOF {
		return s.upstreamErr(ctx, timer, lim, rerr)
	}
	if !timer.Stop() {
		// The first-byte timer fired while the first bytes were being
		// read: the upstream's context is cancelled, so the rest of the
		// answer would fail mid-stream. Nothing has reached the client
		// yet: a first-byte timeout, retryable.
		if ctx.Err() != nil {
			return attempt{err: ctx.Err()}
		}
		return attempt{retryable: true, kind: "first_byte_timeout", err: fmt.Errorf("%s: no answer within %v", who, lim.firstByte)}
	}
	res.ttft, res.status = s.now().Sub(p.started), resp.StatusCode
	firstByte(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	sniff := newUsageSniffer(sse)

	// A whole (non-streamed) answer is read before any of it is sent, so
	// an upstream that fails half way is a 502 with its cause, not a
	// truncated body under a 200. Past maxSniff it is streamed after all.
	var held []byte
	if !sse {
		// Into buf's room first: most answers fit, and are sent from it
		// without a copy.
		for rerr == nil && n < len(buf) {
			var m int
			m, rerr = resp.Body.Read(buf[n:])
			n += m
		}
		for rerr == nil && len(held)+n <= maxSniff {
			held = append(held, buf[:n]...)
			n, rerr = resp.Body.Read(buf)
		}
		if rerr != nil && rerr != io.EOF {
			if ctx.Err() != nil {
				return attempt{err: ctx.Err(), status: resp.StatusCode}
			}
			s.m.truncated.WithLabelValues("body").Inc()
			return attempt{status: resp.StatusCode, kind: "mid_stream", err: fmt.Errorf("%s failed before its answer was complete: %w", who, rerr)}
		}
	}

	whole := !sse && rerr == io.EOF
	if whole {
		// The whole answer is in hand: send it in one write with its
		// length, rather than chunked and flushed piece by piece.
		if held == nil {
			held = buf[:n] // read before buf goes back to relayBufs
		} else {
			held = append(held, buf[:n]...)
		}
		n = 0
	}
	for k, vs := range resp.Header {
		if !hopHeaders[k] {
			w.Header()[k] = vs
		}
	}
	for _, f := range out {
		w.Header()[f.key] = f.values
	}
	if whole {
		w.Header().Set("Content-Length", strconv.Itoa(len(held)))
	}
	w.WriteHeader(resp.StatusCode)
	res.wrote = true
	flusher, _ := w.(http.Flusher)
	if len(held) > 0 {
		if whole {
			sniff.keep(held) // held is not written again: no copy
		} else {
			sniff.write(held)
		}
		if _, werr := w.Write(held); werr != nil {
			res.err, res.kind = werr, ""
			return res
		}
	}
	for {
		if n > 0 {
			sniff.write(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				res.err, res.kind = werr, ""
				return res
			}
			if flusher != nil && rerr != io.EOF {
				// Not the last piece (read with the answer's end): that
				// goes out with the response's end, in one write, as
				// the handler returns (at once): a write fewer per
				// streamed answer.
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				res.err = ctx.Err()
				return res
			}
			res.err, res.kind = fmt.Errorf("%s failed mid-stream: %w", who, rerr), "mid_stream"
			if sse {
				// Tell the client in the stream's own terms (OpenAI's
				// error event); the response is then ended abnormally.
				s.m.truncated.WithLabelValues("stream").Inc()
				_, _ = w.Write(sseError(res.err))
				if flusher != nil {
					flusher.Flush()
				}
			} else {
				s.m.truncated.WithLabelValues("body").Inc()
			}
			return res
		}
		n, rerr = resp.Body.Read(buf)
	}
	res.usage = sniff.result()
	return res
}

// keepRelayed reports whether a client's header field goes on to the
// upstream: not hop-by-hop, not one of the hop's own;
// keepRelayedNoCredential, when the controller checks credentials: nor the
// client's credential for it.
func keepRelayed(k string) bool {
	return !hopHeaders[k] && !strings.HasPrefix(k, "X-Meridian-Hop")
}

func keepRelayedNoCredential(k string) bool { return keepRelayed(k) && !credentialHeaders[k] }

// forwardHeaders are the fields forward adds for one pod, made once: the
// header to the pod (read, never written), the values of the client's
// answer fields (each of capacity one, so an append copies) and the
// pod's name in errors.
type forwardHeaders struct {
	add                     http.Header
	pod, region, controller []string
	who                     string
	url                     atomic.Pointer[podURL] // the last urlFor made
}

// podURL is a pod's URL for a request's path.
type podURL struct{ endpoint, path, url string }

// urlFor is the pod's endpoint joined with the request's path, made once
// for as long as neither changes.
func (ph *forwardHeaders) urlFor(endpoint, path string) string {
	if u := ph.url.Load(); u != nil && u.endpoint == endpoint && u.path == path {
		return u.url
	}
	u := &podURL{endpoint: endpoint, path: path, url: strings.TrimRight(endpoint, "/") + path}
	ph.url.Store(u)
	return u.url
}

// podHeaders returns the fields forward adds for the pod named name. They
// are kept for every pod name seen, as the metrics' children are.
func (s *Server) podHeaders(name string) *forwardHeaders {
	if v, ok := s.fwdHeaders.Load(name); ok {
		if ph := v.(*forwardHeaders); ph.region[0] == s.topo.Region && ph.controller[0] == s.id {
			return ph
		}
	}
	ph := &forwardHeaders{add: http.Header{"X-Meridian-Pod": {name}}, pod: []string{name}, region: []string{s.topo.Region},
		controller: []string{s.id}, who: "pod " + name}
	s.fwdHeaders.Store(name, ph)
	return ph
}

// roundTrip sends req with client, or, when client is the pods' and the
// request is one podConns sends as client's transport would, with
// s.pods. Either way the answer is what client.Do would return.
func (s *Server) roundTrip(client *http.Client, req *http.Request) (*http.Response, error) {
	if client != s.client || !s.pods.eligible(req) {
		return client.Do(req)
	}
	resp, err := s.pods.roundTrip(req)
	if err != nil {
		return nil, &neturl.Error{Op: "Post", URL: req.URL.Redacted(), Err: err}
	}
	if followsRedirect(resp) {
		// client follows redirects (a pod that answers one has done no
		// work): let it, from the start.
		_ = resp.Body.Close()
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, gerr
		}
		req.Body = body
		return client.Do(req)
	}
	return resp, nil
}

// errNotPosted: postToPod cannot send this request; the caller sends it
// as an http.Request. errRedirected: the pod answered a redirect, which
// the caller has its client follow.
var (
	errNotPosted  = errors.New("not posted")
	errRedirected = errors.New("redirected")
)

// postToPod sends a relayed request to a plain-http pod through s.pods
// without building an http.Request (podwire.go), when it can: client is
// the pods', no connect timer listens for the connection, and appendPost
// can write it. Otherwise it returns errNotPosted. The answer, or error,
// is what roundTrip would return, but for an answer the client would
// follow: errRedirected, its body closed.
func (s *Server) postToPod(ctx context.Context, client *http.Client, ct *connectTimer, url string, in http.Header, keep func(string) bool, add http.Header, body []byte) (*http.Response, error) {
	if client != s.client || s.pods == nil || ct != nil {
		return nil, errNotPosted
	}
	host, path, ok := podTarget(url)
	if !ok {
		return nil, errNotPosted
	}
	var stack [16]headerField
	fields := podFields(stack[:0], in, keep, add)
	bp := postBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 1<<20 {
			postBufs.Put(bp)
		}
	}()
	wire, ok := appendPost((*bp)[:0], host, path, fields, body)
	*bp = wire
	if !ok {
		return nil, errNotPosted
	}
	resp, err := s.pods.post(ctx, host, wire)
	if err != nil {
		return nil, &neturl.Error{Op: "Post", URL: url, Err: err}
	}
	if followsRedirect(resp) {
		_ = resp.Body.Close()
		return nil, errRedirected
	}
	return resp, nil
}

// postBufs hold requests to pods while they are written.
var postBufs = sync.Pool{New: func() any { return new([]byte) }}

// followsRedirect reports whether an http.Client (without CheckRedirect)
// would follow resp, the answer to a POST with a replayable body.
func followsRedirect(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return resp.Header.Get("Location") != ""
	}
	return false
}

// connectTimer cancels a try whose connection is not up in time, and
// starts the first-byte timer once it is.
type connectTimer struct {
	t     *time.Timer
	fired atomic.Bool
	// firstByte is the try's first-byte timer, armed at the start for the
	// longest the try may take (connect + firstByte, within its budget)
	// and re-armed for lim.firstByte when the connection is up.
	firstByte *time.Timer
	lim       limits
	start     time.Time
}

// startTryTimers starts the timers of a try whose connection is bounded
// (lim.connect): cancel runs when the connection is not up within
// lim.connect, or when no first byte came within lim.firstByte of the
// connection, or when lim.within is over.
func startTryTimers(lim limits, cancel context.CancelFunc) (*connectTimer, *time.Timer) {
	c := &connectTimer{lim: lim, start: time.Now()}
	longest := lim.connect + lim.firstByte
	if lim.within > 0 {
		longest = min(longest, lim.within)
	}
	c.firstByte = time.AfterFunc(longest, cancel)
	c.t = time.AfterFunc(lim.connect, func() { c.fired.Store(true); cancel() })
	return c, c.firstByte
}

func (c *connectTimer) gotConn(httptrace.GotConnInfo) {
	if !c.t.Stop() {
		return // too late: the try is cancelled
	}
	d := c.lim.firstByte
	if c.lim.within > 0 {
		d = min(d, c.lim.within-time.Since(c.start))
	}
	if c.firstByte.Stop() {
		c.firstByte.Reset(max(d, 0))
	}
}

// sseError is an OpenAI-style error event for a stream that cannot go on.
func sseError(err error) []byte {
	var e apiError
	e.Error.Message = err.Error()
	e.Error.Type, e.Error.Code = "server_error", "upstream_failed"
	b, _ := json.Marshal(e)
	out := append([]byte("\nevent: error\ndata: "), b...)
	return append(out, "\n\n"...)
}

// relayBufs holds the 32 KiB buffers responses are copied through, so a
// proxied request does not leave one behind for the collector.
var relayBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (s *Server) upstreamErr(ctx context.Context, timer *time.Timer, lim limits, err error) attempt {
	if ctx.Err() != nil {
		return attempt{err: ctx.Err()}
	}
	if !timer.Stop() {
		return attempt{retryable: true, kind: "first_byte_timeout", err: fmt.Errorf("no answer within %v", lim.firstByte)}
	}
	// What reaches a client names the failure, not the upstream's address
	// (a pod's or another region's controller's): that is logged here.
	s.log.Debug("upstream unreachable", "err", err)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return attempt{retryable: true, kind: "refused", err: withoutAddress(err)}
	}
	return attempt{retryable: true, kind: "connect", err: withoutAddress(err)}
}

// withoutAddress strips the request URL and the dialled address off a
// transport error ("Post https://10.0.0.7:8080/...: dial tcp
// 10.0.0.7:8080: connect: connection refused" becomes "connect:
// connection refused"), keeping what it wraps.
func withoutAddress(err error) error {
	var ue *neturl.Error
	if errors.As(err, &ue) && ue.Err != nil {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	return err
}

// trackWriter records whether anything of the answer was written.
type trackWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackWriter) WriteHeader(code int) {
	t.wrote = true
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}

func (t *trackWriter) Flush() {
	if f, ok := t.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (t *trackWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }
