package console

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// routerMetrics are the series of the controller that the console reads,
// registered under the controller's names and labels (regional/metrics.go).
type routerMetrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	prompt   prometheus.Counter
	cached   prometheus.Counter
	ttft     *prometheus.HistogramVec
	cross    *prometheus.CounterVec
	in       *prometheus.CounterVec
	denials  *prometheus.CounterVec
	noRegion prometheus.Counter
	hops     *prometheus.CounterVec
}

var ttftBuckets = prometheus.ExponentialBuckets(0.005, 1.6, 20)

func newRouterMetrics(t *testing.T) *routerMetrics {
	t.Helper()
	m := &routerMetrics{reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRequests}, []string{"route", "code"}),
		prompt:   prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrompt}),
		cached:   prometheus.NewCounter(prometheus.CounterOpts{Name: metricCached}),
		ttft:     prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricTTFT, Buckets: ttftBuckets}, []string{"pod"}),
		cross:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricCross}, []string{"to"}),
		in:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricForwardedIn}, []string{"from"}),
		denials:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricDenials}, []string{"rule"}),
		noRegion: prometheus.NewCounter(prometheus.CounterOpts{Name: metricNoRegion}),
		hops:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricHopsRefused}, []string{"reason"}),
	}
	m.reg.MustRegister(m.requests, m.prompt, m.cached, m.ttft, m.cross, m.in, m.denials, m.noRegion, m.hops)
	return m
}

// naiveQuantile is the exact q-quantile (nearest rank) of values.
func naiveQuantile(values []float64, q float64) float64 {
	s := slices.Clone(values)
	slices.Sort(s)
	k := max(int(math.Ceil(q*float64(len(s))))-1, 0)
	return s[k]
}

// bucketOf is the bucket [lo, hi] of bounds that holds v.
func bucketOf(bounds []float64, v float64) (lo, hi float64) {
	for _, b := range bounds {
		if v <= b {
			return lo, b
		}
		lo = b
	}
	return lo, math.Inf(1)
}

// TestHistogramQuantile: the estimate from the controller's TTFT buckets
// lies in the bucket that holds the exact quantile of the observations.
func TestHistogramQuantile(t *testing.T) {
	m := newRouterMetrics(t)
	var vals []float64
	for i := range 500 {
		v := 0.004 + 0.3*math.Pow(float64(i%97)/97, 3) + float64(i%7)*0.01
		vals = append(vals, v)
		m.ttft.WithLabelValues([]string{"a", "b"}[i%2]).Observe(v)
	}
	c, err := ReadCounters(m.reg)
	if err != nil {
		t.Fatal(err)
	}
	if c.TTFT.Count != 500 || c.PodTTFT["a"].Count != 250 {
		t.Fatalf("merged %d, pod a %d", c.TTFT.Count, c.PodTTFT["a"].Count)
	}
	for _, q := range []float64{0.5, 0.9, 0.95, 0.99} {
		got, ok := c.TTFT.Quantile(q)
		exact := naiveQuantile(vals, q)
		lo, hi := bucketOf(ttftBuckets, exact)
		if !ok || got < lo || got > hi {
			t.Errorf("q%.2f: %.4f, exact %.4f in bucket [%.4f, %.4f]", q, got, exact, lo, hi)
		}
	}
	if _, ok := (Histogram{}).Quantile(0.5); ok {
		t.Error("an empty histogram has a quantile")
	}
}

// TestSampleSeries: each point is what happened between two readings;
// figures with nothing to measure are null.
func TestSampleSeries(t *testing.T) {
	m := newRouterMetrics(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	con, err := New(Config{Controller: "c1", Region: "us-east-1", Gatherer: m.reg, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Sample(t0); err != nil {
		t.Fatal(err)
	}
	// 10 s: 40 answers of which 5 refused (451) and 2 failed, 3 crossings,
	// 8,000 prompt tokens of which 6,000 cached, first bytes at 100 ms.
	m.requests.WithLabelValues("chat", "200").Add(33)
	m.requests.WithLabelValues("chat", "451").Add(5)
	m.requests.WithLabelValues("completions", "502").Add(2)
	m.requests.WithLabelValues("models", "200").Add(100) // not traffic
	m.cross.WithLabelValues("eu-west-1").Add(3)
	m.prompt.Add(8000)
	m.cached.Add(6000)
	for range 30 {
		m.ttft.WithLabelValues("p0").Observe(0.1)
	}
	if err := con.Sample(t0.Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// Another 10 s with nothing at all.
	if err := con.Sample(t0.Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	s := con.State()
	if len(s.Series) != 2 {
		t.Fatalf("%d points, want 2", len(s.Series))
	}
	p := s.Series[0]
	if p.ReqPerS != 4 || p.ErrPerS != 0.2 || p.DeniedPerS != 0.5 || p.CrossPerS != 0.3 {
		t.Errorf("rates %+v", p)
	}
	if p.HitRate == nil || *p.HitRate != 0.75 {
		t.Errorf("hit rate %v, want 0.75", p.HitRate)
	}
	lo, hi := bucketOf(ttftBuckets, 0.1)
	if p.TTFTP50Ms == nil || *p.TTFTP50Ms < 1000*lo || *p.TTFTP50Ms > 1000*hi || p.TTFTP95Ms == nil {
		t.Errorf("TTFT p50 %v, want within [%v, %v] ms", p.TTFTP50Ms, 1000*lo, 1000*hi)
	}
	q := s.Series[1]
	if q.ReqPerS != 0 || q.HitRate != nil || q.TTFTP50Ms != nil || q.TTFTP95Ms != nil {
		t.Errorf("an idle interval: %+v", q)
	}
	if s.Totals.Requests != 40 || s.Totals.Errors != 2 || s.Totals.Denied != 5 || s.Totals.CrossRegion != 3 {
		t.Errorf("totals %+v", s.Totals)
	}
	// A reading at the same time adds no point.
	if err := con.Sample(t0.Add(20 * time.Second)); err != nil || len(con.State().Series) != 2 {
		t.Errorf("a reading at an unchanged time added a point (%v)", err)
	}
}

// TestSeriesWindow: the series keeps Window/Interval points whatever runs
// through it, the newest, in order.
func TestSeriesWindow(t *testing.T) {
	m := newRouterMetrics(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	con, err := New(Config{Gatherer: m.reg, Interval: time.Second, Window: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 35 {
		m.requests.WithLabelValues("chat", "200").Add(float64(i))
		if err := con.Sample(t0.Add(time.Duration(i) * time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	s := con.State()
	if len(s.Series) != 10 || s.WindowS != 10 || s.IntervalS != 1 {
		t.Fatalf("%d points over %v s every %v s", len(s.Series), s.WindowS, s.IntervalS)
	}
	for i, p := range s.Series {
		want := 25 + i // the interval ending at reading 25+i added 25+i requests
		if !p.At.Equal(t0.Add(time.Duration(want)*time.Second)) || p.ReqPerS != float64(want) {
			t.Errorf("point %d: %v %v, want t+%ds %d/s", i, p.At, p.ReqPerS, want, want)
		}
	}
}

// TestRunSamplesOnItsTicker: Run takes a reading at once and one per
// Interval, and returns when its context ends (fake time: synctest).
func TestRunSamplesOnItsTicker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newRouterMetrics(t)
		con, err := New(Config{Gatherer: m.reg, Interval: time.Second, Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- con.Run(ctx) }()
		synctest.Wait() // the first reading is taken
		for range 5 {
			m.requests.WithLabelValues("chat", "200").Add(2)
			time.Sleep(time.Second)
			synctest.Wait()
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		s := con.State()
		if len(s.Series) != 5 {
			t.Fatalf("%d points after 5 intervals", len(s.Series))
		}
		for _, p := range s.Series {
			if p.ReqPerS != 2 {
				t.Errorf("point %v: %v req/s, want 2", p.At, p.ReqPerS)
			}
		}
	})
}

// TestStateResidencyAndPods: decisions and failovers come back newest
// first and bounded; crossings are counted by rule, refusals at the
// re-check apart; the pods get the last minute's rate and TTFT, the
// regions the crossings to and from them.
func TestStateResidencyAndPods(t *testing.T) {
	m := newRouterMetrics(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	live := func(time.Time) Live {
		return Live{Ready: true, PolicyVersion: "v3", Pods: []Pod{{Name: "p0", State: "serving"}, {Name: "p1", State: "ejected"}},
			Regions: []Region{{Name: "us-east-1", Local: true}, {Name: "eu-west-1", Live: true}}}
	}
	con, err := New(Config{Region: "us-east-1", Gatherer: m.reg, Interval: 10 * time.Second, Live: live})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Sample(t0); err != nil {
		t.Fatal(err)
	}
	for range 60 {
		m.ttft.WithLabelValues("p0").Observe(0.05)
	}
	m.cross.WithLabelValues("eu-west-1").Add(7)
	m.in.WithLabelValues("ap-southeast-1").Add(2) // a region gossip no longer shows
	m.denials.WithLabelValues("embargo").Add(4)
	m.denials.WithLabelValues("default")
	m.hops.WithLabelValues("bad_token").Add(1)
	if err := con.Sample(t0.Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for i := range keepDecisions + 10 {
		d := Decision{Time: t0.Add(time.Duration(i) * time.Millisecond), Kind: "cross_region", Origin: "us-east-1", Region: "eu-west-1", Rule: "eu-phi"}
		switch i % 5 {
		case 1:
			d.Kind, d.Rule = "forwarded_in", "public"
		case 2:
			d.Kind, d.Region = "fallback", "us-east-1" // served here after all: no crossing
		case 3:
			d.Kind, d.Region, d.Rule = "residency_denied", "", "embargo"
		case 4:
			d.Kind, d.Origin, d.Region, d.Rule = "residency_denied", "eu-west-1", "", "phi-home" // refused at the re-check
		}
		con.Record(d)
	}
	con.RecordFailover(Failover{Time: t0, Region: "eu-west-1", To: "failed", Index: 10})
	con.RecordFailover(Failover{Time: t0.Add(time.Second), Region: "eu-west-1", From: "failed", To: "active", Index: 12})

	s := con.State()
	if len(s.Decisions) != keepDecisions || s.Decisions[0].Time.Before(s.Decisions[1].Time) {
		t.Errorf("%d decisions, newest first: %v then %v", len(s.Decisions), s.Decisions[0].Time, s.Decisions[1].Time)
	}
	r := s.Residency
	if r.CrossingsByRule["eu-phi"] != 12 || r.ForwardedInByRule["public"] != 12 || r.RefusedAtRecheck != 12 || len(r.CrossingsByRule) != 1 {
		t.Errorf("crossings %v, forwarded in %v, refused at re-check %d", r.CrossingsByRule, r.ForwardedInByRule, r.RefusedAtRecheck)
	}
	if r.DenialsByRule["embargo"] != 4 || r.HopsRefused != 1 || r.PolicyVersion != "v3" {
		t.Errorf("residency %+v", r)
	}
	if len(s.Failovers) != 2 || s.Failovers[0].To != "active" {
		t.Errorf("failovers %+v", s.Failovers)
	}
	p0 := s.Pods[0]
	if p0.ReqPerS != 2 || p0.TTFTP50Ms == nil || s.Pods[1].TTFTP50Ms != nil {
		t.Errorf("pods %+v %+v", p0, s.Pods[1])
	}
	byName := map[string]Region{}
	for _, g := range s.Regions {
		byName[g.Name] = g
	}
	if byName["eu-west-1"].CrossedTo != 7 || byName["ap-southeast-1"].ForwardedFrom != 2 || len(s.Regions) != 3 {
		t.Errorf("regions %+v", s.Regions)
	}
}

// TestHandler: the page is served to anyone and loads nothing from
// elsewhere (its CSP allows its one script by hash); the state needs the
// token.
func TestHandler(t *testing.T) {
	m := newRouterMetrics(t)
	con, err := New(Config{Controller: "c1", Region: "eu-west-1", Gatherer: m.reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Sample(time.Now()); err != nil {
		t.Fatal(err)
	}
	const token = "0123456789abcdef0123456789abcdef"
	auth := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+token {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewTLSServer(con.Handler(auth))
	defer srv.Close()
	hc := srv.Client()
	get := func(path string, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		buf := make([]byte, 32<<10)
		for {
			n, err := res.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return res, []byte(b.String())
	}

	res, body := get("/ui", nil)
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	page := string(body)
	// Self-contained: no address anywhere but the SVG namespace the
	// script creates elements in.
	if urls := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`).FindAllString(strings.ReplaceAll(page, "http://www.w3.org/2000/svg", ""), -1); len(urls) > 0 {
		t.Errorf("the page names addresses: %v", urls)
	}
	for _, tag := range []string{"<link", "<img", "<iframe", "src="} {
		if strings.Contains(page, tag) {
			t.Errorf("the page has %s", tag)
		}
	}
	csp := res.Header.Get("Content-Security-Policy")
	_, script, _ := strings.Cut(page, "<script>")
	script, _, _ = strings.Cut(script, "</script>")
	sum := sha256.Sum256([]byte(script))
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") ||
		strings.Count(page, "<script") != 1 {
		t.Errorf("CSP %q does not allow exactly the page's one script", csp)
	}
	for _, id := range []string{"c-rate", "c-hit", "c-ttft", "regions", "pods", "health", "residency", "failovers", "decisions"} {
		if !strings.Contains(page, `id="`+id+`"`) {
			t.Errorf("the page has no #%s", id)
		}
	}
	if res, _ := get("/ui/", nil); res.Request.URL.Path != "/ui" {
		t.Errorf("/ui/ ends at %s", res.Request.URL.Path)
	}

	if res, _ := get("/ui/api/state", nil); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("state without the token: %d", res.StatusCode)
	}
	if res, _ := get("/ui/api/state", map[string]string{"Authorization": "Bearer wrong"}); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("state with a wrong token: %d", res.StatusCode)
	}
	res, body = get("/ui/api/state", map[string]string{"Authorization": "Bearer " + token})
	if res.StatusCode != 200 || res.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("state: %d %v", res.StatusCode, res.Header)
	}
	var s State
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	if s.Controller != "c1" || s.Region != "eu-west-1" || s.WindowS != DefaultWindow.Seconds() || s.IntervalS != DefaultInterval.Seconds() {
		t.Errorf("state %+v", s)
	}
	if res, _ := get("/ui/api/nothing", map[string]string{"Authorization": "Bearer " + token}); res.StatusCode != http.StatusNotFound {
		t.Errorf("unknown path: %d", res.StatusCode)
	}
}

// TestConcurrentUse: sampling, recording and reading the state at once
// (run with -race).
func TestConcurrentUse(t *testing.T) {
	m := newRouterMetrics(t)
	con, err := New(Config{Gatherer: m.reg, Interval: time.Second, Window: 20 * time.Second,
		Live: func(time.Time) Live { return Live{Pods: []Pod{{Name: "p0"}}} }})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			m.requests.WithLabelValues("chat", "200").Inc()
			m.ttft.WithLabelValues("p0").Observe(0.01)
			if err := con.Sample(t0.Add(time.Duration(i) * time.Second)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Go(func() {
		for i := range 200 {
			con.Record(Decision{Kind: "cross_region", Region: "x", Rule: "r"})
			con.RecordFailover(Failover{Index: uint64(i)})
		}
	})
	for range 4 {
		wg.Go(func() {
			for range 100 {
				s := con.State()
				if len(s.Series) > 20 || len(s.Decisions) > keepDecisions || len(s.Failovers) > keepFailovers {
					t.Error("unbounded state")
					return
				}
				if _, err := json.Marshal(s); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if s := con.State(); len(s.Series) != 20 || s.Residency.CrossingsByRule["r"] != 200 {
		t.Errorf("%d points, %d crossings", len(s.Series), s.Residency.CrossingsByRule["r"])
	}
}

func TestConfigValidate(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, c := range []Config{{}, {Gatherer: reg, Interval: -1}, {Gatherer: reg, Interval: time.Minute, Window: time.Second}} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
