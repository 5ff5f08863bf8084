package console

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// page is the console: one HTML file with its style and script inline.
//
//go:embed console.html
var page []byte

// Defaults of Config.
const (
	DefaultInterval = 5 * time.Second
	DefaultWindow   = 15 * time.Minute
)

// What the console keeps besides the series.
const (
	keepDecisions = 50
	keepFailovers = 50
	// podWindow is what the pods' rate and TTFT are measured over.
	podWindow = time.Minute
)

// Config configures a console.
type Config struct {
	// Controller and Region name the controller the console is on.
	Controller, Region string
	// Interval between two samples of the series; default 5s.
	Interval time.Duration
	// Window is how far back the series goes; default 15m. The series
	// holds Window/Interval points.
	Window time.Duration
	// Gatherer is the controller's metrics registry. Required.
	Gatherer prometheus.Gatherer
	// Live reads what the controller knows now (pods, regions, Raft,
	// gossip); nil: nothing.
	Live func(now time.Time) Live
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Gatherer == nil:
		return errors.New("console: Gatherer is required")
	case c.Interval < 0:
		return fmt.Errorf("console: Interval = %v: want > 0 (0: the default)", c.Interval)
	case c.Window < 0 || (c.Window > 0 && c.Window < c.Interval):
		return fmt.Errorf("console: Window = %v: want >= Interval (0: the default)", c.Window)
	}
	return nil
}

// reading is one reading of the counters, with its time.
type reading struct {
	at time.Time
	c  Counters
}

// Console is a controller's read-only console: the time series sampled
// from its metrics, the decisions and failovers it was told of, and the
// page and JSON that show them.
type Console struct {
	cfg Config
	now func() time.Time
	log *slog.Logger
	csp string

	series    *Ring[Point]
	recent    *Ring[reading] // the last minute's readings, for the pods
	decisions *Ring[Decision]
	failovers *Ring[Failover]

	mu        sync.Mutex // guards what follows
	prev      reading
	hasPrev   bool
	crossings map[string]int64 // by rule
	inbound   map[string]int64 // by rule
	rechecked int64            // refused at the re-check of a forwarded request
}

// New returns a console; Run samples its series.
func New(cfg Config) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Window == 0 {
		cfg.Window = max(DefaultWindow, cfg.Interval)
	}
	c := &Console{cfg: cfg, now: cfg.Now, log: cfg.Logger, csp: contentSecurityPolicy(page),
		series:    NewRing[Point](int(cfg.Window / cfg.Interval)),
		recent:    NewRing[reading](int(podWindow/cfg.Interval) + 1),
		decisions: NewRing[Decision](keepDecisions),
		failovers: NewRing[Failover](keepFailovers),
		crossings: map[string]int64{}, inbound: map[string]int64{}}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Run samples the series every Interval until ctx is done; the first
// reading is taken at once (a point needs two).
func (c *Console) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if err := c.Sample(c.now()); err != nil {
			c.log.Warn("console: sample skipped", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample reads the counters at now and adds the point of the interval
// since the previous reading to the series.
func (c *Console) Sample(now time.Time) error {
	cur, err := ReadCounters(c.cfg.Gatherer)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hasPrev {
		if !now.After(c.prev.at) {
			return nil // the clock did not move: nothing to measure
		}
		c.series.Push(pointBetween(c.prev, reading{now, cur}))
	}
	c.prev, c.hasPrev = reading{now, cur}, true
	c.recent.Push(c.prev)
	return nil
}

// pointBetween is what happened between two readings.
func pointBetween(a, b reading) Point {
	dt := b.at.Sub(a.at).Seconds()
	rate := func(x, y float64) float64 { return max(y-x, 0) / dt }
	p := Point{At: b.at, ReqPerS: rate(a.c.Requests, b.c.Requests), ErrPerS: rate(a.c.Errors, b.c.Errors),
		CrossPerS: rate(a.c.crossings(), b.c.crossings()), DeniedPerS: rate(a.c.Denied, b.c.Denied)}
	if prompt := b.c.PromptTokens - a.c.PromptTokens; prompt > 0 {
		h := min(max((b.c.CachedTokens-a.c.CachedTokens)/prompt, 0), 1)
		p.HitRate = &h
	}
	p.TTFTP50Ms, p.TTFTP95Ms = quantilesMs(b.c.TTFT.since(a.c.TTFT))
	return p
}

// quantilesMs are the median and p95 of h (seconds) in milliseconds.
func quantilesMs(h Histogram) (p50, p95 *float64) {
	if v, ok := h.Quantile(0.5); ok {
		ms := v * 1000
		p50 = &ms
	}
	if v, ok := h.Quantile(0.95); ok {
		ms := v * 1000
		p95 = &ms
	}
	return p50, p95
}

// Record adds a decision the controller recorded in its audit log.
func (c *Console) Record(d Decision) {
	c.decisions.Push(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch d.Kind {
	case "cross_region", "fallback":
		if d.Region != c.cfg.Region {
			c.crossings[d.Rule]++
		}
	case "forwarded_in":
		c.inbound[d.Rule]++
	case "residency_denied":
		if d.Origin != c.cfg.Region {
			c.rechecked++
		}
	}
}

// RecordFailover adds a change of a region's state.
func (c *Console) RecordFailover(f Failover) { c.failovers.Push(f) }

// State is everything the console shows, at now.
func (c *Console) State() State {
	now := c.now()
	s := State{Controller: c.cfg.Controller, Region: c.cfg.Region, Now: now,
		IntervalS: c.cfg.Interval.Seconds(), WindowS: c.cfg.Window.Seconds(), Series: c.series.Values()}
	if c.cfg.Live != nil {
		s.Live = c.cfg.Live(now)
	}
	s.Decisions, s.Failovers = c.decisions.Values(), c.failovers.Values()
	slices.Reverse(s.Decisions)
	slices.Reverse(s.Failovers)
	recent := c.recent.Values()
	c.mu.Lock()
	last, has := c.prev, c.hasPrev
	s.Residency = Residency{PolicyVersion: s.PolicyVersion, CrossingsByRule: cloneMap(c.crossings), ForwardedInByRule: cloneMap(c.inbound),
		RefusedAtRecheck: c.rechecked}
	c.mu.Unlock()
	if !has {
		return s
	}
	lc := last.c
	s.Residency.DenialsByRule, s.Residency.NoHealthyRegion = cloneMap(lc.DenialsBy), lc.NoRegion
	s.Residency.HopsRefused, s.Residency.AuditFailures = lc.HopsRefused, lc.AuditFails
	s.Totals = Totals{Requests: lc.Requests, Errors: lc.Errors, CrossRegion: lc.crossings(), Denied: lc.Denied}
	for _, v := range lc.ForwardedIn {
		s.Totals.ForwardedIn += v
	}
	if lc.PromptTokens > 0 {
		h := lc.CachedTokens / lc.PromptTokens
		s.Totals.HitRate = &h
	}
	// The pods over the last minute: the oldest reading kept against the
	// newest.
	if len(recent) > 1 {
		first := recent[0]
		dt := last.at.Sub(first.at).Seconds()
		for i := range s.Pods {
			p := &s.Pods[i]
			d := lc.PodTTFT[p.Name].since(first.c.PodTTFT[p.Name])
			if dt > 0 {
				p.ReqPerS = float64(d.Count) / dt
			}
			p.TTFTP50Ms, p.TTFTP95Ms = quantilesMs(d)
		}
	}
	// Crossings to and from each region; a region only the counters know
	// (gossip forgot it) still gets its row.
	seen := map[string]int{}
	for i, r := range s.Regions {
		seen[r.Name] = i
	}
	for _, name := range append(sortedKeys(lc.CrossTo), sortedKeys(lc.ForwardedIn)...) {
		if _, ok := seen[name]; !ok && name != "" && lc.CrossTo[name]+lc.ForwardedIn[name] > 0 {
			seen[name] = len(s.Regions)
			s.Regions = append(s.Regions, Region{Name: name})
		}
	}
	for i := range s.Regions {
		r := &s.Regions[i]
		r.CrossedTo, r.ForwardedFrom = lc.CrossTo[r.Name], lc.ForwardedIn[r.Name]
	}
	return s
}

func cloneMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Handler serves the console: GET /ui is the page (static: it holds no
// data, and asks for the admin token), GET /ui/api/state the state as
// JSON, behind auth (the admin API's bearer token).
func (c *Console) Handler(auth func(http.Handler) http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui", c.servePage)
	mux.HandleFunc("GET /ui/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui", http.StatusMovedPermanently)
	})
	mux.Handle("GET /ui/api/state", auth(http.HandlerFunc(c.serveState)))
	return mux
}

func (c *Console) servePage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", c.csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(page)
}

func (c *Console) serveState(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	_ = json.NewEncoder(w).Encode(c.State())
}

// contentSecurityPolicy lets the page load nothing from anywhere: its one
// inline script (by hash) and inline style, and fetches to its own origin.
func contentSecurityPolicy(page []byte) string {
	script := ""
	if _, rest, ok := strings.Cut(string(page), "<script>"); ok {
		script, _, _ = strings.Cut(rest, "</script>")
	}
	sum := sha256.Sum256([]byte(script))
	return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; style-src 'unsafe-inline'; " +
		"connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}
