package regional

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/reqbody"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// ServerConfig configures the HTTP API and proxy.
type ServerConfig struct {
	// MaxBodyBytes caps a request body; larger ones get 413. Default 16 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// AllowPolicyOverride honours the X-Meridian-Policy header (round_robin,
	// least_loaded, session_hash, ttft) so a policy can be compared with
	// another through the same controller. Default false.
	AllowPolicyOverride bool `yaml:"allow_policy_override"`
	// MaxRetries is how many other pods a request is tried on when a pod
	// fails before its first byte. Default 2.
	MaxRetries int `yaml:"max_retries"`
	// RetryBackoff is the base delay before a retry (jittered, doubled per
	// attempt). Default 10ms.
	RetryBackoff time.Duration `yaml:"retry_backoff"`
	// FirstByteTimeout: a pod that sends no byte of its answer within it is
	// treated as failed (and the request retried elsewhere). Default 120s.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// Forward bounds each try at another region's controller.
	Forward ForwardConfig `yaml:"forward"`
	// Outlier is the passive health check.
	Outlier route.OutlierConfig `yaml:"outlier"`
	// Limits bound what clients can hold of the API listener (timeouts,
	// open connections); see ListenerConfig.
	Limits ListenerConfig `yaml:"limits"`
}

// DefaultServerConfig returns the defaults documented on ServerConfig.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{MaxBodyBytes: 16 << 20, MaxRetries: 2, RetryBackoff: 10 * time.Millisecond,
		FirstByteTimeout: 120 * time.Second, Forward: DefaultForwardConfig(), Outlier: route.DefaultOutlierConfig(), Limits: DefaultAPIListener()}
}

// ForwardConfig derives the timeouts of a forward to another region from
// what is expected of it, so that a region that does not answer (a
// partition that blackholes its packets) costs a request little before the
// next allowed region is tried:
//
//	connect    = max(ConnectMin, ConnectRTTs x RTT)        TCP and TLS up
//	first byte = RTT + FirstByteFactor x (expected time to first byte
//	             past the RTT: the remote's queue and prefill, from the
//	             cost model) + FirstByteMargin, at most first_byte_timeout
//
// and every try of a request, in any region, ends by Budget after it
// arrived.
type ForwardConfig struct {
	// ConnectRTTs and ConnectMin bound the connection; defaults 4 and
	// 1s (TCP and a mutual TLS handshake, whose CPU cost on a busy
	// controller can exceed a near region's few RTTs).
	ConnectRTTs float64       `yaml:"connect_rtts"`
	ConnectMin  time.Duration `yaml:"connect_min"`
	// FirstByteFactor and FirstByteMargin bound the wait for the first
	// byte; defaults 3 and 2s.
	FirstByteFactor float64       `yaml:"first_byte_factor"`
	FirstByteMargin time.Duration `yaml:"first_byte_margin"`
	// Budget is how long a request may wait for a first byte in all, across
	// the regions it is tried in; default 60s.
	Budget time.Duration `yaml:"budget"`
}

// DefaultForwardConfig returns the defaults documented on ForwardConfig.
func DefaultForwardConfig() ForwardConfig {
	return ForwardConfig{ConnectRTTs: 4, ConnectMin: time.Second, FirstByteFactor: 3,
		FirstByteMargin: 2 * time.Second, Budget: 60 * time.Second}
}

// Validate names the first field that is wrong.
func (c ForwardConfig) Validate() error {
	switch {
	case c.ConnectRTTs < 1 || c.ConnectMin <= 0:
		return fmt.Errorf("server config: forward.connect_rtts = %v, connect_min = %v: want >= 1 and > 0", c.ConnectRTTs, c.ConnectMin)
	case c.FirstByteFactor < 1 || c.FirstByteMargin < 0:
		return fmt.Errorf("server config: forward.first_byte_factor = %v, first_byte_margin = %v: want >= 1 and >= 0", c.FirstByteFactor, c.FirstByteMargin)
	case c.Budget <= 0:
		return fmt.Errorf("server config: forward.budget = %v: want > 0", c.Budget)
	}
	return nil
}

// limits are the timeouts of one try.
type limits struct {
	// connect bounds the connection (TCP and TLS); 0, or not below
	// firstByte: none beyond the first-byte one.
	connect time.Duration
	// firstByte bounds the wait for the first byte: from the connection
	// being up when connect bounds it (a handshake slowed by a busy CPU
	// does not eat the remote's time to answer), else from the start.
	firstByte time.Duration
	// within bounds the whole try, from its start (0: connect plus
	// firstByte): what is left of the request's budget.
	within time.Duration
}

// limits are the timeouts of a forward to a region rttMs away whose
// expected time to first byte is expectedMs (RTT included; the cost
// model's estimate), with left of the request's budget. An estimate that is
// unknown (not finite) waits up to capFirstByte.
func (c ForwardConfig) limits(rttMs, expectedMs float64, capFirstByte, left time.Duration) limits {
	ms := float64(time.Millisecond)
	if math.IsNaN(rttMs) || math.IsInf(rttMs, 0) || rttMs < 0 {
		rttMs = 0
	}
	l := limits{connect: max(c.ConnectMin, time.Duration(c.ConnectRTTs*rttMs*ms)), firstByte: capFirstByte}
	if fb := rttMs + c.FirstByteFactor*max(expectedMs-rttMs, 0); !math.IsNaN(fb) && fb*ms < float64(capFirstByte) {
		l.firstByte = min(time.Duration(fb*ms)+c.FirstByteMargin, capFirstByte)
	}
	l.firstByte = min(l.firstByte, left)
	l.connect = min(l.connect, l.firstByte)
	l.within = left
	return l
}

// Validate names the first field that is wrong.
func (c ServerConfig) Validate() error {
	switch {
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("server config: max_body_bytes = %d: want > 0", c.MaxBodyBytes)
	case c.MaxRetries < 0 || c.MaxRetries > 10:
		return fmt.Errorf("server config: max_retries = %d: want 0..10", c.MaxRetries)
	case c.RetryBackoff < 0 || c.FirstByteTimeout <= 0:
		return fmt.Errorf("server config: retry_backoff must be >= 0 and first_byte_timeout > 0")
	}
	if err := c.Forward.Validate(); err != nil {
		return err
	}
	switch {
	case c.Outlier.ConsecutiveFailures < 1 || c.Outlier.BaseEjection <= 0 || c.Outlier.MaxEjectionPercent < 0 || c.Outlier.MaxEjectionPercent > 100:
		return fmt.Errorf("server config: outlier: consecutive_failures >= 1, base_ejection > 0, max_ejection_percent 0..100")
	}
	return c.Limits.Validate("server config: limits")
}

// ReadinessFunc reports whether the controller is ready and why not, with
// details for /readyz.
type ReadinessFunc func() (ready bool, detail map[string]any)

// Server is the controller's HTTP API: the OpenAI-compatible proxy, the
// decision API, health and metrics.
type Server struct {
	cfg     ServerConfig
	dec     *route.Decider
	reg     *route.Registry
	prompts *Prompts
	calib   *gorgo.Calibrator
	client  *http.Client // to the pods
	// pods carries what goes to plain-http pods through client's
	// transport, when it can (podconn.go); nil: client does.
	pods *podConns
	// peerClient forwards to other regions' controllers.
	peerClient *http.Client
	auth       *ClientAuth
	log        *slog.Logger
	m          *routerMetrics
	// fwdHeaders holds forward's fields per pod name (podHeaders).
	fwdHeaders sync.Map
	ready      ReadinessFunc
	now        func() time.Time
	started    time.Time // when NewServer ran, on now's clock
	mux        *http.ServeMux
	topo       Topology
	id         string // this controller's id (X-Meridian-Controller)
	// handingBack is set when a graceful stop's grace period is over: the
	// requests still without an answer are cancelled and answered 503
	// shutting_down (retryable) instead of being cut.
	handingBack atomic.Bool
	// auditHealth: how the audit log's writes have been going (/readyz).
	auditHealth auditHealth
	// fwd is the prefill this controller forwarded to other regions that
	// their summaries cannot show yet.
	fwd route.Forwarded
	// links orders a region's controllers for a forward and keeps the
	// connections to them warm (peerlinks.go).
	links *peerLinks
	// bodies holds the buffers request bodies are read into.
	bodies reqbody.Pool
	// parsedPool holds parsed requests (newParsed, release).
	parsedPool sync.Pool
	// trend is this region's backlog over the recent past: a remote
	// candidate is charged its growth since the candidate's summary was
	// built (route.Trend).
	trend route.Trend
}

// ServerDeps is what a Server is given: the decision core, the prompt
// encoders and the rest of the controller it serves for.
type ServerDeps struct {
	Decider *route.Decider // required
	Prompts *Prompts       // required
	// Calibrator learns prefill rates from observed TTFT; nil: none.
	Calibrator *gorgo.Calibrator
	// Transport to the pods and remote controllers; nil: NewPodTransport.
	Transport http.RoundTripper
	// Logger; nil discards.
	Logger *slog.Logger
	// Metrics registers the router's metrics and is what /metrics serves.
	// Required.
	Metrics *prometheus.Registry
	// Ready answers /readyz; nil: always ready.
	Ready ReadinessFunc
	// Clock; nil: time.Now.
	Clock func() time.Time
	// Auth authenticates clients; nil: none (X-Tenant-Id and X-Data-Class
	// are believed as sent: an insecure controller only).
	Auth *ClientAuth
	// PeerTransport carries requests forwarded to other regions'
	// controllers (mutual TLS when the controller has TLS); nil: Transport.
	PeerTransport http.RoundTripper
	// ControllerID names this controller in the X-Meridian-Controller
	// header of the answers its pods give (with several replicas per
	// region, which one served); "": no header.
	ControllerID string
}

// NewServer builds the API.
func NewServer(cfg ServerConfig, deps ServerDeps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Decider == nil || deps.Prompts == nil || deps.Metrics == nil {
		return nil, errors.New("server: a decider, prompts and a metrics registry are required")
	}
	transport := deps.Transport
	if transport == nil {
		transport = NewPodTransport()
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := deps.Clock
	if now == nil {
		now = time.Now
	}
	reg := deps.Decider.Registry()
	m, err := newRouterMetrics(deps.Metrics, reg, now)
	if err != nil {
		return nil, err
	}
	peer := deps.PeerTransport
	if peer == nil {
		peer = transport
	}
	s := &Server{cfg: cfg, dec: deps.Decider, reg: reg, prompts: deps.Prompts, calib: deps.Calibrator, log: log, m: m,
		ready: deps.Ready, now: now, started: now(), client: &http.Client{Transport: transport}, peerClient: &http.Client{Transport: peer},
		auth: deps.Auth, mux: http.NewServeMux(), id: deps.ControllerID}
	if t, ok := transport.(*http.Transport); ok {
		s.pods = newPodConns(t)
	}
	s.links = newPeerLinks(s.peerClient, now)
	s.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, tokenize.Chat) })
	s.mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, tokenize.Completion) })
	s.mux.HandleFunc("POST /v1/route", s.serveRoute)
	s.mux.HandleFunc("GET /v1/models", s.serveModels)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", s.serveReady)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Metrics, promhttp.HandlerOpts{}))
	return s, nil
}

// NewPodTransport is an HTTP transport tuned for many long-lived streams to
// a few hundred pods on a local network.
func NewPodTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // pass bytes through as the pod sent them
		ResponseHeaderTimeout: 0,    // the first-byte timer covers it
		ForceAttemptHTTP2:     false,
		// A prompt goes to its pod in one write: at the default 4 KB a
		// 2k-token chat body took three system calls, each costly on
		// virtual CPUs.
		WriteBufferSize: 32 << 10,
	}
}

// Handle adds a handler to the server's mux (the controller mounts the
// global tier's admin API and the audit endpoints).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// apiError is an OpenAI-style error body.
type apiError struct {
	Error struct {
		Message       string `json:"message"`
		Type          string `json:"type"`
		Code          string `json:"code"`
		Param         string `json:"param,omitempty"`          // the request field at fault
		Rule          string `json:"rule,omitempty"`           // residency rule that decided
		PolicyVersion string `json:"policy_version,omitempty"` // residency policy version used
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, format string, args ...any) {
	var e apiError
	e.Error.Message = fmt.Sprintf(format, args...)
	e.Error.Code = code
	e.Error.Type = http.StatusText(status)
	switch {
	case status == http.StatusBadRequest || status == http.StatusRequestEntityTooLarge || status == http.StatusNotFound:
		e.Error.Type = "invalid_request_error"
	case status >= 500:
		e.Error.Type = "server_error"
	}
	writeJSON(w, status, e)
}

// retryAfter is the Retry-After of a 503, in seconds: long enough for an
// ejection, a summary or a failover to move on, short enough for a client's
// patience.
const retryAfter = "2"

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// parsed is a request ready to route.
type parsed struct {
	// raw is the body as it is relayed, in a pooled buffer: handed to
	// anything that may read it after the request is over (an
	// http.Client), it is taken with raw.Keep, else borrowed (see
	// reqbody). The handler releases it (Server.release).
	raw     reqbody.Body
	body    tokenize.Body // what routing reads of raw (borrowed from it)
	req     route.Request
	started time.Time
	// abort: part of an answer reached the client before its upstream
	// failed; the handler ends the response abnormally.
	abort bool
	// tenant and class are the identity residency decided on (from
	// authentication, or a hop's origin), forwarded with a hop.
	tenant, class string
	// tw is the handler's writer (serveInference), kept here to save an
	// allocation.
	tw trackWriter
	// dec is where Server.decide writes the decision, reusing its Top
	// slice from the request p served before (DecideInto): a retry's
	// decision overwrites the one before it, which serveLocal no longer
	// reads by then.
	dec route.Decision
	// prompt is the request's tokens and chain, encoded by parse (its
	// own memory: the pool keeps it).
	prompt Prompt
}

// maxPooledMessages is the most messages whose array a pooled parsed
// request keeps: chats run to tens of messages; an array of more is
// dropped (a body of up to the request limit can hold hundreds of
// thousands of tiny ones, tens of megabytes of array).
const maxPooledMessages = 256

// release gives p's body buffer back to the pool, unless it was kept,
// and p to the pool of parsed requests. The handler calls it when it is
// done with p; nothing of p or of the body is read after.
func (s *Server) release(p *parsed) {
	p.raw.Release()
	top, filtered, msgs := p.dec.Top[:0], p.dec.Filtered, p.body.Messages[:0]
	if cap(msgs) > maxPooledMessages {
		// One request of many messages would have every later
		// request that takes p keep its array, and clear all of it.
		msgs = nil
	}
	clear(msgs[:cap(msgs)])
	*p = parsed{} // drops what it pointed to: the body's strings, the prompt
	// Kept for the next request: the decision's Top and Filtered
	// (DecideInto) and the messages' array (tokenize.ParseBodyShared).
	p.dec.Top, p.dec.Filtered, p.body.Messages = top, filtered, msgs
	s.parsedPool.Put(p)
}

// newParsed takes a parsed request from the pool, empty.
func (s *Server) newParsed() *parsed {
	if p, ok := s.parsedPool.Get().(*parsed); ok {
		return p
	}
	return new(parsed)
}

// parse reads, validates and tokenizes a request; on failure it has written
// the error response and returns nil.
//
// The body is in a pooled buffer: the caller gives it back with
// s.release(p) when done with p.
func (s *Server) parse(w http.ResponseWriter, r *http.Request, k tokenize.Kind, api string) (ret *parsed) {
	p := s.newParsed()
	p.started = s.now()
	var err error
	p.raw, err = reqbody.Read(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), r.ContentLength, s.cfg.MaxBodyBytes, &s.bodies)
	defer func() {
		if ret == nil {
			s.release(p)
		}
	}()
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.fail(w, api, http.StatusRequestEntityTooLarge, "request_too_large", "request body exceeds %d bytes", s.cfg.MaxBodyBytes)
		} else {
			s.fail(w, api, http.StatusBadRequest, "invalid_request", "reading the request body: %v", err)
		}
		return nil
	}
	// The body as read: the messages' contents may share it (borrowed:
	// they are rendered into a new text and not kept). Rewrite leaves it
	// unchanged.
	raw := p.raw.Borrow()
	p.raw.Rewrite(dropReportingXargs)
	if err := tokenize.ParseBodyShared(raw, &p.body); err != nil {
		s.fail(w, api, http.StatusBadRequest, "invalid_json", "request body is not valid JSON: %v", err)
		return nil
	}
	if p.body.Model == "" {
		s.fail(w, api, http.StatusBadRequest, "invalid_request", "model: required")
		return nil
	}
	if !s.servesModel(p.body.Model, r.Header.Get(HeaderHop) != "") {
		// Decided here, from what this region's pods and the other
		// regions' summaries serve: nothing is forwarded or recorded.
		s.m.requests.WithLabelValues(api, "404").Inc()
		var e apiError
		e.Error.Message = fmt.Sprintf("The model %q does not exist or is not served by any region.", p.body.Model)
		e.Error.Type, e.Error.Code, e.Error.Param = "invalid_request_error", "model_not_found", "model"
		writeJSON(w, http.StatusNotFound, e)
		return nil
	}
	sessionID := capSessionID(r.Header.Get(HeaderSession))
	t0 := time.Now()
	prompt := &p.prompt
	err = s.prompts.EncodeInto(p.body.Model, k, &p.body.Request, sessionID, prompt)
	s.m.tokenizeTime.Observe(time.Since(t0).Seconds())
	if err != nil {
		if tokenize.IsInvalidPrompt(err) {
			s.fail(w, api, http.StatusBadRequest, "invalid_prompt", "%v", err)
		} else {
			s.fail(w, api, http.StatusInternalServerError, "tokenize_failed", "%v", err)
		}
		return nil
	}
	s.m.tokensReused.Add(float64(prompt.Reused))
	s.m.tokensEncoded.Add(float64(prompt.Tokens))
	p.req = route.Request{Model: p.body.Model, Chain: prompt.Chain, BlockSize: s.prompts.blockSize,
		PromptTokens: prompt.Tokens, SessionID: sessionID, RequestID: r.Header.Get("X-Request-Id"), Salted: p.body.CacheSalt != ""}
	if s.cfg.AllowPolicyOverride {
		if pol := r.Header.Get("X-Meridian-Policy"); pol != "" {
			if !slices.Contains(route.Policies, pol) {
				s.fail(w, api, http.StatusBadRequest, "invalid_policy", "X-Meridian-Policy %q: want one of %s", pol, strings.Join(route.Policies, ", "))
				return nil
			}
			p.req.Policy = pol
		}
	}
	return p
}

// servesModel reports whether model is served by a pod of this region (a
// pod that names no model serves any) or, unless the request was forwarded
// in (it is served here or nowhere), by another region. Knowing of no pod
// and no other region's models, it makes no claim (true): the decision
// then says what is missing.
func (s *Server) servesModel(model string, forwardedIn bool) bool {
	pods := s.reg.Pods()
	for _, p := range pods {
		if m := p.Info().Model; m == "" || m == model {
			return true
		}
	}
	known := len(pods) > 0
	if !forwardedIn && s.topo.Remotes != nil {
		serves, remoteKnown := s.topo.Remotes.Serves(model)
		if serves {
			return true
		}
		known = known || remoteKnown
	}
	return !known
}

func (s *Server) fail(w http.ResponseWriter, api string, status int, code, format string, args ...any) {
	s.m.request(api, status).Inc()
	writeError(w, status, code, format, args...)
}

// decide runs the decision and accounts for it.
func (s *Server) decide(p *parsed) (*route.Decision, error) {
	t0 := time.Now()
	d := &p.dec
	err := s.dec.DecideInto(&p.req, d)
	s.m.decisionTime.Observe(time.Since(t0).Seconds())
	if err != nil {
		return nil, err
	}
	s.m.decision(d.Policy, d.Reason).Inc()
	return d, nil
}

func (s *Server) decisionError(w http.ResponseWriter, api string, err error) {
	if s.refuseNotReady(w, api, err) {
		return
	}
	switch {
	case errors.Is(err, route.ErrNoPod), errors.Is(err, route.ErrNoHealthyPod):
		s.fail(w, api, http.StatusServiceUnavailable, "no_healthy_pod", "%v", err)
	default:
		s.fail(w, api, http.StatusInternalServerError, "decision_failed", "%v", err)
	}
}

// refuseNotReady answers a decision that found no pod (err is
// route.ErrNoPod, alone or from a placement) 503 replica_not_ready when
// this replica has not read its region's pods yet while its replicas serve
// them (it has just started; Server.behindPeers), and reports whether it
// did. It says another replica can serve the request, not that none can:
// nothing was done, so a client or load balancer may send it to another
// replica at once.
func (s *Server) refuseNotReady(w http.ResponseWriter, api string, err error) bool {
	if !errors.Is(err, route.ErrNoPod) {
		return false
	}
	behind, why := s.behindPeers()
	if !behind {
		return false
	}
	s.fail(w, api, http.StatusServiceUnavailable, "replica_not_ready",
		"this controller cannot serve yet, another replica of region %s can: %s", s.topo.Region, why)
	return true
}

// RouteResponse is the body of POST /v1/route: where the request should
// go. Region is this controller's region or, with Remote, the region to
// forward to (ForwardTo is one of its controllers); Decision is the pod
// decision in this region (when this region may serve); Cost explains a
// cross-region choice.
type RouteResponse struct {
	DecisionID string `json:"decision_id"`
	Region     string `json:"region,omitempty"`
	Remote     bool   `json:"remote,omitempty"`
	ForwardTo  string `json:"forward_to,omitempty"`
	*route.Decision
	Cost         json.RawMessage `json:"cost,omitempty"`
	PromptTokens int             `json:"prompt_tokens"`
	Blocks       int             `json:"blocks"`
	BlockSize    int             `json:"block_size"`
}

// serveRoute answers POST /v1/route: the same decision the proxy makes
// (residency, region state, cross-region placement, pod), without serving.
// It is a dry run: it explains, and writes neither the audit log nor the
// remote-share guardrail's window (a request that is then sent is decided,
// and recorded, by the controller that serves it). It only notes the
// session on the chosen pod, so that a gateway that sends the request there
// itself finds the session's next turn on the same pod.
func (s *Server) serveRoute(w http.ResponseWriter, r *http.Request) {
	kind := tokenize.Chat
	if r.URL.Query().Get("kind") == "completion" {
		kind = tokenize.Completion
	}
	p := s.parse(w, r, kind, "route")
	if p == nil {
		return
	}
	defer s.release(p)
	pr, ok := s.placeRequest(w, r, p, "route", true)
	if !ok {
		return
	}
	resp := RouteResponse{DecisionID: pr.decisionID, Region: s.topo.Region, PromptTokens: p.req.PromptTokens,
		Blocks: len(p.req.Chain), BlockSize: p.req.BlockSize}
	switch {
	case pr.pl == nil:
		d, err := s.decide(p)
		if err != nil {
			s.decisionError(w, "route", err)
			return
		}
		resp.Decision = d
	case !pr.pl.Remote:
		resp.Decision = pr.pl.Local
		resp.Cost = costJSON(pr.pl, pr.pl.Cost.Winner)
	default:
		pl := pr.pl
		resp.Region, resp.Remote, resp.Cost = pl.Region, true, costJSON(pl, pl.Cost.Winner)
		if addrs := s.topo.Remotes.ForwardAddrs(pl.Region); len(addrs) > 0 {
			resp.ForwardTo = addrs[0]
		}
	}
	if resp.Decision != nil && !resp.Remote {
		// The caller sends the request to this pod; the next decision of
		// its session should find it there.
		s.dec.Sessions().Note(p.req.SessionID, resp.Decision.PodName, s.now())
	}
	s.m.requests.WithLabelValues("route", "200").Inc()
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	}
	seen := map[string]bool{}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, p := range s.reg.Pods() {
		if m := p.Info().Model; m != "" && !seen[m] {
			seen[m] = true
			out.Data = append(out.Data, model{ID: m, Object: "model", OwnedBy: "meridian"})
		}
	}
	s.m.requests.WithLabelValues("models", "200").Inc()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	ready, detail := true, map[string]any{}
	if s.ready != nil {
		ready, detail = s.ready()
	}
	alive, known := s.servingPods()
	detail["pods"], detail["pods_known"] = alive, known
	if s.topo.Audit != nil {
		detail["audit"] = s.auditHealth.detail()
	}
	behind, why := s.behindPeers()
	switch {
	case behind:
		// The region has pods and this replica does not see them yet (it
		// is still reading their announcements after a start): a request
		// sent here now would be refused with "no pod serves this region"
		// while its replicas would serve it. Not ready, whatever other
		// regions could take.
		ready = false
		detail["pods_note"] = why
	case alive == 0 && s.topo.Remotes == nil:
		// Nothing can serve here, and there is nowhere to send it.
		ready = false
		detail["pods_note"] = "no pod can take a request"
	}
	status := http.StatusOK
	detail["ready"] = ready
	if !ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, detail)
}

// servingPods counts this region's pods that can take a request now (alive)
// among those it knows: live in the index (announced, not shut down), with
// an endpoint, not lapsed (its announcement ran out and it does not
// answer), not ejected (a pod that refuses connections is ejected at its
// first refusal).
func (s *Server) servingPods() (alive, known int) {
	now := s.now()
	pods := s.reg.Pods()
	for _, p := range pods {
		if s.dec.Alive(p) && p.Serving(now) {
			alive++
		}
	}
	return alive, len(pods)
}

// behindPeers reports whether this replica sees no pod that can take a
// request while another replica of the region sees some: it has not read
// their announcements yet, and would refuse what its replicas serve.
//
// A replica just started may not have heard from its replicas yet: while
// a live replica of the region (Topology.Replicas) has never reported, for
// at most peerReportFresh after the start, one that sees no pod counts as
// behind too (it cannot tell a region without pods from pods it has not
// read yet). A replica that reported once and went quiet does not hold it.
func (s *Server) behindPeers() (bool, string) {
	if alive, _ := s.servingPods(); alive > 0 {
		return false, ""
	}
	if peers := s.peersServing(); peers > 0 {
		return true, fmt.Sprintf("the region's other replicas see %d pods; this one sees none yet", peers)
	}
	if s.topo.Replicas == nil || s.now().Sub(s.started) > peerReportFresh {
		return false, ""
	}
	heard := map[string]bool{}
	for _, r := range s.reg.PeerReports() {
		heard[r.Peer] = true
	}
	for _, id := range s.topo.Replicas() {
		if !heard[id] {
			return true, fmt.Sprintf("this replica sees no pod and has not heard yet which pods replica %s sees", id)
		}
	}
	return false, ""
}

// peerReportFresh is how old a replica's report may be and still count
// in peersServing: replicas report every gossip.replica_interval (200 ms
// by default); one that has gone quiet without being declared dead (a
// partition) must not keep this one unready on pods it saw long ago.
const peerReportFresh = 10 * time.Second

// peersServing is the most pods any other replica of the region reports,
// in a fresh report, it sees serving (0: none, or no replica says).
func (s *Server) peersServing() int {
	n, now := 0, s.now()
	for _, r := range s.reg.PeerReports() {
		if now.Sub(r.At) <= peerReportFresh {
			n = max(n, r.Serving)
		}
	}
	return n
}

func newDecisionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
