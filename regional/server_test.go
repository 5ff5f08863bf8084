package regional

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// fakePod is an OpenAI-compatible upstream whose behaviour a test scripts.
type fakePod struct {
	srv     *httptest.Server
	calls   atomic.Int64
	handler atomic.Pointer[http.HandlerFunc]
}

func newFakePod(t testing.TB, h http.HandlerFunc) *fakePod {
	p := &fakePod{}
	p.set(h)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.calls.Add(1)
		(*p.handler.Load())(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePod) set(h http.HandlerFunc) { p.handler.Store(&h) }

func okJSON(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"x","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`)
}

type serverFixture struct {
	idx   *index.Index
	reg   *route.Registry
	dec   *route.Decider
	clock *testClock
	srv   *Server
	url   string
	prom  *prometheus.Registry
	pods  []*fakePod
	ready atomic.Bool
	calib *gorgo.Calibrator // with fixtureConfig.calibrate
}

// fixtureConfig is what a server test may change before the fixture starts.
type fixtureConfig struct {
	server   ServerConfig
	decision route.Config
	// auth authenticates clients (nil: headers are believed); tls, when
	// set, serves the API over it through the controller's own listener
	// (serve), as a secure controller does.
	auth *ClientAuth
	tls  *tls.Config
	// peer carries forwards to other regions' controllers (nil: the pod
	// transport).
	peer http.RoundTripper
	// calibrate feeds served requests to a Calibrator (serverFixture.calib).
	calibrate bool
	// transport carries requests to the pods (nil: NewPodTransport).
	transport http.RoundTripper
	// poisonBodies overwrites request body buffers as they go back to
	// their pool (reqbody.Pool.Poison).
	poisonBodies bool
}

// testClock is a fixture's clock, which a test moves while the server
// reads it.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock on by d.
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newServerFixture(t testing.TB, handlers []http.HandlerFunc, mut func(*fixtureConfig)) *serverFixture {
	t.Helper()
	idx, _ := index.New(index.DefaultConfig())
	f := &serverFixture{idx: idx, reg: route.NewRegistry(idx), clock: &testClock{t: time.Unix(1000, 0)}}
	fc := fixtureConfig{server: DefaultServerConfig(), decision: route.DefaultConfig()}
	fc.server.RetryBackoff = 0
	fc.server.Outlier.BaseEjection = time.Second
	if mut != nil {
		mut(&fc)
	}
	for i, h := range handlers {
		fp := newFakePod(t, h)
		f.pods = append(f.pods, fp)
		if _, _, err := f.reg.Upsert(route.PodInfo{Name: fmt.Sprintf("pod-%d", i), Endpoint: fp.srv.URL, Model: "m", Profile: "h100"}); err != nil {
			t.Fatal(err)
		}
	}
	model, _ := gorgo.New(gorgo.DefaultConfig())
	var err error
	if f.dec, err = route.NewDecider(fc.decision, idx, f.reg, model, f.clock.Now); err != nil {
		t.Fatal(err)
	}
	prompts, err := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 16, 100)
	if err != nil {
		t.Fatal(err)
	}
	if fc.calibrate {
		f.calib = gorgo.NewCalibrator(model, gorgo.CalibratorConfig{MinSamples: 3})
	}
	cfg := fc.server
	f.prom = prometheus.NewRegistry()
	f.ready.Store(true)
	f.srv, err = NewServer(cfg, ServerDeps{Decider: f.dec, Prompts: prompts, Metrics: f.prom,
		Ready: func() (bool, map[string]any) { return f.ready.Load(), map[string]any{"ingest": "x"} }, Clock: f.clock.Now,
		Auth: fc.auth, PeerTransport: fc.peer, Calibrator: f.calib, Transport: fc.transport})
	if err != nil {
		t.Fatal(err)
	}
	f.srv.bodies.Poison = fc.poisonBodies
	// The controller's API server, as Open starts it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lm, err := newListenerMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	hs, l := serveAPI(ln, DefaultAPIListener(), fc.tls, syncedHandler(f.srv), lm, slog.New(slog.DiscardHandler))
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	f.url = "http://" + ln.Addr().String()
	if fc.tls != nil {
		f.url = "https://" + ln.Addr().String()
	}
	return f
}

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello there, how are you today?"}]}`

func TestServerBadRequests(t *testing.T) {
	f := newServerFixture(t, []http.HandlerFunc{okJSON}, func(c *fixtureConfig) { c.server.MaxBodyBytes = 1024 })
	cases := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"invalid json", "/v1/chat/completions", `{"model":`, 400, "invalid_json"},
		{"no model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request"},
		{"no messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, "invalid_prompt"},
		{"bad prompt", "/v1/completions", `{"model":"m","prompt":{"a":1}}`, 400, "invalid_prompt"},
		{"too large", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, 413, "request_too_large"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found"},
		{"unknown model, route", "/v1/route", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found"},
	}
	for _, c := range cases {
		resp, b := post(t, f.url+c.path, c.body)
		var e apiError
		_ = json.Unmarshal(b, &e)
		if resp.StatusCode != c.status || e.Error.Code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, resp.StatusCode, b, c.status, c.code)
		}
	}
	if f.pods[0].calls.Load() != 0 {
		t.Fatal("a bad request reached a pod")
	}
	// No healthy pod: 503.
	f.reg.Remove("pod-0")
	resp, b := post(t, f.url+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 503 || !strings.Contains(string(b), "no_healthy_pod") {
		t.Fatalf("no pod: %d %s", resp.StatusCode, b)
	}
	if got := testutil.ToFloat64(f.srv.m.requests.WithLabelValues("chat", "413")); got != 1 {
		t.Fatalf("413 counted %v times", got)
	}
	if got := testutil.ToFloat64(f.srv.m.requests.WithLabelValues("chat", "404")); got != 1 {
		t.Fatalf("404 counted %v times", got)
	}
}

func TestServerRouteAPIAndModels(t *testing.T) {
	f := newServerFixture(t, []http.HandlerFunc{okJSON, okJSON}, nil)
	resp, b := post(t, f.url+"/v1/route", chatBody)
	var rr RouteResponse
	if err := json.Unmarshal(b, &rr); err != nil || resp.StatusCode != 200 {
		t.Fatalf("route: %d %s", resp.StatusCode, b)
	}
	if rr.DecisionID == "" || rr.Decision.PodName == "" || rr.Decision.Endpoint == "" || rr.PromptTokens == 0 || len(rr.Decision.Top) == 0 {
		t.Fatalf("route response incomplete: %s", b)
	}
	resp, b = post(t, f.url+"/v1/route?kind=completion", `{"model":"m","prompt_token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	if err := json.Unmarshal(b, &rr); err != nil || resp.StatusCode != 200 || rr.PromptTokens != 17 || rr.Blocks != 1 {
		t.Fatalf("route completion: %d %s", resp.StatusCode, b)
	}
	for _, p := range f.pods {
		if p.calls.Load() != 0 {
			t.Fatal("/v1/route proxied the request")
		}
	}
	r, err := http.Get(f.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(b), `"id":"m"`) {
		t.Fatalf("models: %s", b)
	}
	f.ready.Store(false)
	r, _ = http.Get(f.url + "/readyz")
	r.Body.Close()
	if r.StatusCode != 503 {
		t.Fatalf("readyz while not ready: %d", r.StatusCode)
	}
}

// Each answered request feeds the calibrator as an observation of its
// profile, not of its pod: a replica sees only the requests it served, and
// pod rates each replica learnt apart would make them decide differently.
func TestServerCalibratesTheProfile(t *testing.T) {
	f := newServerFixture(t, []http.HandlerFunc{okJSON, okJSON}, func(fc *fixtureConfig) { fc.calibrate = true })
	for i := range 12 {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"%s"}]}`, strings.Repeat("word ", 20*(i+1)))
		resp, b := post(t, f.url+"/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	fits := f.calib.Fits()
	if len(fits) != 1 || fits[0].Pod != "" || fits[0].Pooled || fits[0].Samples != 12 {
		t.Fatalf("fits %+v, want one of the profile with 12 samples", fits)
	}
}

// A pod that fails before its first byte is retried elsewhere; after 5
// failures it is ejected; the client never sees the failures.
func TestServerRetriesAndEjects(t *testing.T) {
	broken := func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }
	// Round-robin: every pod in turn, so pod-0 fails once per round.
	f := newServerFixture(t, []http.HandlerFunc{broken, okJSON, okJSON, okJSON, okJSON, okJSON, okJSON, okJSON, okJSON, okJSON},
		func(c *fixtureConfig) { c.decision.Policy = route.PolicyRoundRobin })
	for i := 0; i < 80; i++ {
		resp, b := post(t, f.url+"/v1/chat/completions", chatBody)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		if resp.Header.Get("X-Meridian-Pod") == "pod-0" {
			t.Fatal("answered by the broken pod")
		}
	}
	p0, _ := f.reg.Get("pod-0")
	if !p0.Ejected(f.clock.Now()) {
		t.Fatalf("broken pod not ejected after %d calls", f.pods[0].calls.Load())
	}
	if got := f.pods[0].calls.Load(); got != 5 {
		t.Fatalf("broken pod called %d times, want 5 (ejected after 5 consecutive failures)", got)
	}
	// Healed and readmitted after the ejection time.
	f.pods[0].set(okJSON)
	f.clock.Add(2 * time.Second)
	served := false
	for i := 0; i < 40 && !served; i++ {
		resp, _ := post(t, f.url+"/v1/chat/completions", chatBody)
		served = resp.Header.Get("X-Meridian-Pod") == "pod-0"
	}
	if !served {
		t.Fatal("healed pod never readmitted")
	}
}

// A stalled pod (no first byte) is abandoned after the first-byte timeout and
// the request retried elsewhere.
func TestServerStalledPod(t *testing.T) {
	release := make(chan struct{})
	stall := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	f := newServerFixture(t, []http.HandlerFunc{stall, okJSON}, func(c *fixtureConfig) {
		// Long enough that the healthy pod always answers within it on a
		// loaded machine; the stalled one never answers.
		c.server.FirstByteTimeout = 2 * time.Second
		c.decision.Policy = route.PolicyRoundRobin
	})
	defer close(release)
	for i := 0; i < 4; i++ {
		resp, b := post(t, f.url+"/v1/chat/completions", chatBody)
		if resp.StatusCode != 200 || resp.Header.Get("X-Meridian-Pod") != "pod-1" {
			t.Fatalf("request %d: %d %s from %s", i, resp.StatusCode, b, resp.Header.Get("X-Meridian-Pod"))
		}
	}
	if got := testutil.ToFloat64(f.srv.m.upstreamErrors.WithLabelValues("first_byte_timeout")); got < 1 {
		t.Fatal("stall not counted")
	}
}

// The stream reaches the client chunk by chunk as the pod sends it, and a
// client that goes away cancels the pod's request.
func TestServerStreamsUnbufferedAndCancels(t *testing.T) {
	next := make(chan struct{})
	cancelled := make(chan struct{})
	streamer := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; ; i++ {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			fl.Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				close(cancelled)
				return
			}
		}
	}
	f := newServerFixture(t, []http.HandlerFunc{streamer}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(chatBody))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: {\"i\":%d}\n", i) {
			t.Fatalf("chunk %d: %q %v", i, line, err)
		}
		if _, err := br.ReadString('\n'); err != nil { // blank line
			t.Fatal(err)
		}
		// The pod sends chunk i+1 only now: had the proxy buffered, this
		// read would have blocked forever.
		next <- struct{}{}
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("client cancellation did not reach the pod")
	}
}

func TestServerUsageSniffer(t *testing.T) {
	sse := newUsageSniffer(true)
	stream := "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\ndata: [DONE]\n\n"
	for i := 0; i < len(stream); i += 7 { // split anywhere
		sse.write([]byte(stream[i:min(i+7, len(stream))]))
	}
	if u := sse.result(); u == nil || u.PromptTokens != 100 || u.PromptTokensDetails.CachedTokens != 64 {
		t.Fatalf("sse usage %+v", u)
	}
	js := newUsageSniffer(false)
	js.write([]byte(`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}`))
	if u := js.result(); u == nil || u.PromptTokensDetails.CachedTokens != 3 {
		t.Fatalf("json usage %+v", u)
	}
	if u := newUsageSniffer(false).result(); u != nil {
		t.Fatal("usage from nothing")
	}
}

func TestParseKVUsage(t *testing.T) {
	text := "# HELP vllm:kv_cache_usage_perc x\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\nvllm:kv_cache_usage_perc_other 9\nvllm:num_requests_running 3\n"
	v, err := parseKVUsage(strings.NewReader(text))
	if err != nil || v != 0.25 {
		t.Fatalf("parse: %v %v", v, err)
	}
	if _, err := parseKVUsage(strings.NewReader("nothing here\n")); err == nil {
		t.Fatal("no sample accepted")
	}
}

// TestScrapeOnce: a pod's KV-cache utilisation comes from its /metrics;
// when the metrics stop answering, the pod loses it instead of keeping a
// stale penalty.
func TestScrapeOnce(t *testing.T) {
	var broken atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if broken.Load() || r.URL.Path != "/metrics" {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.93\n")
	}))
	defer srv.Close()
	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg := route.NewRegistry(idx)
	p, _, err := reg.Upsert(route.PodInfo{Name: "p", Endpoint: srv.URL + "/", Model: "m", Profile: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := NewScraper(reg, srv.Client(), time.Second, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc.ScrapeOnce(context.Background())
	if got := p.Load().KVUtil; got != 0.93 {
		t.Fatalf("after a scrape: kv util %v, want 0.93", got)
	}
	broken.Store(true)
	sc.ScrapeOnce(context.Background())
	if got := p.Load().KVUtil; got != 0 {
		t.Fatalf("after a failed scrape: kv util %v, want 0", got)
	}
}

// dieAfter is a pod that sends the start of an answer, then its process
// dies: the connection closes without the end of the response.
func dieAfter(contentType, start string, contentLength int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", contentType)
		if contentLength > 0 {
			w.Header().Set("Content-Length", fmt.Sprint(contentLength))
		}
		fmt.Fprint(w, start)
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}
}

// A pod that dies mid-stream: the client gets an OpenAI-style error event
// and a broken transfer, never a clean end of stream; a non-streamed answer
// that breaks off is a 502 with its cause. Both are counted.
func TestServerMidStreamFailure(t *testing.T) {
	f := newServerFixture(t, []http.HandlerFunc{dieAfter("text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n", 0)}, nil)
	resp, err := http.Post(f.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "\"Hel\"") {
		t.Fatalf("stream start: %d %q", resp.StatusCode, body)
	}
	if !strings.Contains(string(body), "event: error\ndata: {\"error\":") || !strings.Contains(string(body), `"code":"upstream_failed"`) {
		t.Fatalf("no error event in %q", body)
	}
	if rerr == nil {
		t.Fatalf("the truncated stream ended cleanly: %q", body)
	}
	if got := testutil.ToFloat64(f.srv.m.truncated.WithLabelValues("stream")); got != 1 {
		t.Fatalf("truncated streams counted %v", got)
	}

	f = newServerFixture(t, []http.HandlerFunc{dieAfter("application/json", `{"id":"x","choi`, 400)}, nil)
	resp, b := post(t, f.url+"/v1/chat/completions", chatBody)
	var e apiError
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode != http.StatusBadGateway || e.Error.Code != "upstream_failed" || !strings.Contains(e.Error.Message, "before its answer was complete") {
		t.Fatalf("broken body: %d %s", resp.StatusCode, b)
	}
	if got := testutil.ToFloat64(f.srv.m.truncated.WithLabelValues("body")); got != 1 {
		t.Fatalf("truncated bodies counted %v", got)
	}
}

// A pod whose connection is refused (its process is gone) is ejected at
// once and the request goes to the next pod without delay and without
// spending the retry budget; with no pod left, 502 names the attempts, and
// /readyz counts only pods that can take a request (503, Retry-After).
func TestServerRefusedPodEjectedAtOnce(t *testing.T) {
	f := newServerFixture(t, []http.HandlerFunc{okJSON, okJSON}, func(c *fixtureConfig) {
		c.server.MaxRetries = 0
		c.decision.Policy = route.PolicyRoundRobin
	})
	f.pods[0].srv.Close() // pod-0's port now refuses connections
	for i := range 4 {
		resp, b := post(t, f.url+"/v1/chat/completions", chatBody)
		if resp.StatusCode != 200 || resp.Header.Get("X-Meridian-Pod") != "pod-1" {
			t.Fatalf("request %d: %d %s from %q", i, resp.StatusCode, b, resp.Header.Get("X-Meridian-Pod"))
		}
	}
	if p0, _ := f.reg.Get("pod-0"); !p0.Ejected(f.clock.Now()) {
		t.Fatal("the refusing pod is not ejected")
	}
	if got := testutil.ToFloat64(f.srv.m.upstreamErrors.WithLabelValues("refused")); got != 1 {
		t.Fatalf("refusals counted %v, want 1 (ejected at the first)", got)
	}
	_, b := get(t, f.url+"/readyz")
	if !strings.Contains(string(b), `"pods":1`) || !strings.Contains(string(b), `"pods_known":2`) {
		t.Fatalf("readyz with one pod gone: %s", b)
	}

	f.pods[1].srv.Close()
	resp, b := post(t, f.url+"/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "every pod tried failed before answering (1 attempts") {
		t.Fatalf("no pod left: %d %s", resp.StatusCode, b)
	}
	resp, b = get(t, f.url+"/readyz")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"pods":0`) {
		t.Fatalf("readyz with every pod gone: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	// A decision with no pod at all is a 503 that says when to come back.
	resp, b = post(t, f.url+"/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("no healthy pod: %d %v %s", resp.StatusCode, resp.Header, b)
	}
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// A whole answer goes to the client in one piece with its length, even
// when the pod sent it chunked: nothing is flushed before it is complete.
// Sizes about relay's read buffer (32 KiB) and past it.
func TestServerWholeAnswerHasLength(t *testing.T) {
	for _, pad := range []int{0, 32<<10 - 100, 32<<10 - 80, 32 << 10, 100 << 10} {
		answer := `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi` + strings.Repeat("i", pad) + `"}}]}`
		chunked := func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			for rest := answer; len(rest) > 0; {
				n := min(len(rest), 10+len(rest)/3)
				fmt.Fprint(w, rest[:n])
				w.(http.Flusher).Flush()
				rest = rest[n:]
			}
		}
		f := newServerFixture(t, []http.HandlerFunc{chunked}, nil)
		resp, err := http.Post(f.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != answer {
			t.Fatalf("%d bytes: got %d, %d bytes, %v", len(answer), resp.StatusCode, len(body), err)
		}
		if resp.ContentLength != int64(len(answer)) || len(resp.TransferEncoding) != 0 {
			t.Fatalf("Content-Length %d, Transfer-Encoding %v: want %d and none", resp.ContentLength, resp.TransferEncoding, len(answer))
		}
	}
}

// Parsed requests and their decisions are pooled: what one request set
// (a policy override, its prompt, its decision's candidates) never shows
// in the next one's. Two kinds of request alternate; each answer must be
// the one its kind gave first.
func TestPooledRequestsStartClean(t *testing.T) {
	f := newServerFixture(t, []http.HandlerFunc{okJSON, okJSON, okJSON}, func(fc *fixtureConfig) { fc.server.AllowPolicyOverride = true })
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	long := `{"model":"m","prompt_token_ids":[` + strings.Join(ids, ",") + `]}`
	type kind struct {
		url, body string
		hdr       []string
	}
	kinds := []kind{
		{f.url + "/v1/route?kind=completion", long, []string{"X-Meridian-Policy", route.PolicyRoundRobin}},
		{f.url + "/v1/route", chatBody, nil},
	}
	first := make([]RouteResponse, len(kinds))
	for i := range 10 {
		k := i % len(kinds)
		resp, b := post(t, kinds[k].url, kinds[k].body, kinds[k].hdr...)
		var rr RouteResponse
		if err := json.Unmarshal(b, &rr); err != nil || resp.StatusCode != 200 || rr.Decision == nil {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		if i < len(kinds) {
			first[k] = rr
			continue
		}
		want := first[k]
		if rr.Policy != want.Policy || rr.PromptTokens != want.PromptTokens || rr.Blocks != want.Blocks ||
			rr.Candidates != want.Candidates || len(rr.Top) != len(want.Top) {
			t.Fatalf("request %d (kind %d): policy %q, %d tokens, %d blocks, %d candidates, %d scored; its kind first gave %q, %d, %d, %d, %d",
				i, k, rr.Policy, rr.PromptTokens, rr.Blocks, rr.Candidates, len(rr.Top),
				want.Policy, want.PromptTokens, want.Blocks, want.Candidates, len(want.Top))
		}
	}
	if first[0].Policy != route.PolicyRoundRobin || first[1].Policy == route.PolicyRoundRobin || first[0].Blocks != 2 {
		t.Fatalf("the kinds do not differ as the test needs: policies %q and %q, %d blocks", first[0].Policy, first[1].Policy, first[0].Blocks)
	}
}

// A request whose pod died mid-stream is ended abnormally; the pooled
// state that says so must not end the next request, answered in full, the
// same way.
func TestPooledRequestsAfterAbort(t *testing.T) {
	die := dieAfter("text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n", 0)
	f := newServerFixture(t, []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Die") != "" {
			die(w, r)
			return
		}
		okJSON(w, r)
	}}, nil)
	for i := range 6 {
		req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(chatBody))
		dies := i%2 == 0
		if dies {
			req.Header.Set("X-Test-Die", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case dies && rerr == nil:
			t.Fatalf("request %d: its pod died mid-stream, yet the answer ended cleanly: %q", i, body)
		case !dies && (rerr != nil || resp.StatusCode != 200):
			t.Fatalf("request %d, after an aborted one: status %d, read error %v, body %q", i, resp.StatusCode, rerr, body)
		}
	}
}

// TestReleaseBoundsPooledMessages: a parsed request given back keeps its
// messages' array for the next request when it is a chat's size, and
// drops it when one request had many messages (a body of tiny messages
// up to the size limit is hundreds of thousands of them: every later
// request taking that parsed request would hold and clear them all).
func TestReleaseBoundsPooledMessages(t *testing.T) {
	f := newServerFixture(t, []http.HandlerFunc{okJSON}, nil)
	body := func(n int) []byte {
		return []byte(`{"model":"m","messages":[` + strings.Repeat(`{"role":"user"},`, n-1) + `{"role":"user"}]}`)
	}
	for _, tc := range []struct {
		messages int
		kept     bool
	}{
		{1, true}, {40, true}, {maxPooledMessages / 2, true},
		{maxPooledMessages + 1, false}, {500_000, false},
	} {
		p := f.srv.newParsed()
		p.body.Messages = nil // the array is the parse's own
		if err := tokenize.ParseBodyShared(body(tc.messages), &p.body); err != nil {
			t.Fatal(err)
		}
		if len(p.body.Messages) != tc.messages {
			t.Fatalf("parsed %d messages of %d", len(p.body.Messages), tc.messages)
		}
		f.srv.release(p) // p is read below only: nothing else takes from the pool
		kept := p.body.Messages
		switch {
		case len(kept) != 0:
			t.Fatalf("%d messages: the kept array has %d entries, want none", tc.messages, len(kept))
		case tc.kept && cap(kept) < tc.messages:
			t.Fatalf("%d messages: array of %d kept, want the array reused", tc.messages, cap(kept))
		case !tc.kept && cap(kept) > maxPooledMessages:
			t.Fatalf("%d messages: a pooled parsed request keeps an array of %d", tc.messages, cap(kept))
		}
		for i, m := range kept[:cap(kept)] {
			if m != (tokenize.Message{}) {
				t.Fatalf("%d messages: kept message %d not cleared: %+v", tc.messages, i, m)
			}
		}
	}
}
