package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/residency"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// Result is what a run measured. Its JSON form is the --json output.
type Result struct {
	Requests            int64   `json:"requests"`              // generator requests sent
	Errors              int64   `json:"errors"`                // transport failures and unexpected answers
	HitRate             float64 `json:"hit_rate"`              // cached prompt tokens / prompt tokens, 0..1
	TTFTP50Ms           float64 `json:"ttft_p50_ms"`           // client-side, streamed, every answer
	TTFTP95Ms           float64 `json:"ttft_p95_ms"`           // idem
	CrossRegionForwards int64   `json:"cross_region_forwards"` // answered by another region than the one entered
	ResidencyDenials    int64   `json:"residency_denials"`     // 451 residency_denied
	ResidencyViolations int64   `json:"residency_violations"`  // served outside the regions the policy allows
	FailoverMovedS      float64 `json:"failover_moved_s"`      // trigger returned -> every movable probe served elsewhere; 0 without a failover
	AuditRecords        int64   `json:"audit_records"`         // records in every controller's audit log
	AuditVerified       bool    `json:"audit_verified"`        // the chains verify against the Raft checkpoints

	Dir         string            `json:"-"` // where the run's state was kept
	StatusURL   string            `json:"-"` // the status page ("" without one)
	URLs        map[string]string `json:"-"` // region -> controller URL
	Refused     int64             `json:"-"` // 503 residency_no_healthy_region
	Probes      int64             `json:"-"`
	Elapsed     time.Duration     `json:"-"`
	AuditIssues []string          `json:"-"` // what verify found
	EUPHI       PHIView           `json:"-"` // where the EU health tenant's PHI entered and was served
	ErrorKinds  map[string]int64  `json:"-"` // errors by kind (transport, unexpected_refusal, status_502, ...)
	Events      []Event           `json:"-"` // the story: failover, recovery, the first errors of each kind
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Run starts the system, drives it as configured and reports. It writes
// the live table and the summary to out (in JSON mode only the Result, the
// table then going to cfg.Info; in no-traffic mode one "region=URL" line
// per controller). It returns when cfg.Duration has passed or ctx is done
// (an interruption is not an error: the run ends as usual, with a summary).
func Run(ctx context.Context, cfg Config, out io.Writer) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	info := cfg.Info
	if info == nil {
		info = io.Discard
	}
	disp := out // the table and the summary
	if cfg.JSON || cfg.NoTraffic {
		disp = info
	}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "meridian-demo-")
		if err != nil {
			return Result{}, fmt.Errorf("demo: %w", err)
		}
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, fmt.Errorf("demo: %w", err)
	}
	res := Result{Dir: dir, URLs: map[string]string{}}
	log := cfg.Logger
	if log == nil {
		lf, err := os.OpenFile(filepath.Join(dir, "demo.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return res, fmt.Errorf("demo: %w", err)
		}
		defer lf.Close()
		log = slog.New(slog.NewTextHandler(lf, nil))
	}
	policy, err := residency.Parse("policy.yaml", fleet.ExamplePolicy)
	if err != nil {
		return res, fmt.Errorf("demo: policy: %w", err)
	}
	hmacKey := randomHex(32)
	keyFile := filepath.Join(dir, "audit-hmac.key")
	if err := os.WriteFile(keyFile, []byte(hmacKey), 0o600); err != nil {
		return res, fmt.Errorf("demo: %w", err)
	}

	fmt.Fprintf(disp, "Starting Meridian: 3 regions (%s), %d simulated pods each, a Kafka-protocol broker, Raft and gossip on loopback (state in %s)...\n",
		strings.Join(regionNames, ", "), cfg.PodsPerRegion, dir)
	began := time.Now()
	hw := map[string]string{"us-east-1": "h100", "us-west-2": "h100", "eu-west-1": "h200"}
	var specs []fleet.RegionSpec
	for _, r := range regionNames {
		specs = append(specs, fleet.RegionSpec{Name: r, Pods: cfg.PodsPerRegion, Hardware: hw[r], CacheBlocks: cfg.CacheBlocks})
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	f, err := fleet.Start(sctx, fleet.Config{Regions: specs, Dir: dir, TimeScale: cfg.TimeScale, Logger: log,
		Controller: func(_ string, c *regional.Config) { c.Audit.HMACKey = hmacKey }})
	cancel()
	if err != nil {
		return res, fmt.Errorf("demo: start: %w", err)
	}
	var closeOnce sync.Once
	closeFleet := func() error {
		var err error
		closeOnce.Do(func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			err = f.Close(cctx)
		})
		return err
	}
	defer closeFleet()

	var infos []regionInfo
	urls := map[string]string{}
	for _, r := range f.Regions {
		ri := regionInfo{name: r.Name, url: r.Controller.URL(), admin: r.Controller.AdminURL()}
		for _, e := range r.Engines {
			ri.pods = append(ri.pods, podInfo{name: e.Name(), hardware: e.Config().Hardware})
		}
		infos = append(infos, ri)
		urls[r.Name] = ri.url
	}
	res.URLs = urls
	state := func(region string) string {
		r := f.Region(region)
		if r == nil {
			return "?"
		}
		return r.Controller.Global().State().RegionState(region).String()
	}
	st := newStats(policy, time.Now)
	dec := newDecisions()
	var tails sync.WaitGroup
	tailCtx, stopTails := context.WithCancel(ctx)
	defer func() { stopTails(); tails.Wait() }()
	for _, r := range f.Regions {
		l := r.Controller.Audit()
		tails.Go(func() {
			if err := dec.follow(tailCtx, l); err != nil {
				log.Warn("demo: audit tail stopped", "region", r.Name, "err", err)
			}
		})
	}

	plan := planText(cfg)
	phase := &phaseBox{v: "traffic"}
	if cfg.NoTraffic {
		phase.set("no traffic: send your own")
	}
	snapshot := func() Snapshot {
		s := st.snapshot(infos, state)
		s.Phase, s.Plan, s.Dir = phase.get(), plan, dir
		s.Decisions, s.AuditCounts = dec.snapshot()
		if cfg.FailoverAfter >= 0 && !cfg.NoTraffic {
			s.FailoverRegion = cfg.FailoverRegion
		}
		return s
	}
	var status *statusServer
	if cfg.StatusAddr != "" {
		if status, err = startStatus(cfg.StatusAddr, StatusHandler(snapshot)); err != nil {
			return res, fmt.Errorf("demo: status page: %w", err)
		}
		defer status.Close()
		res.StatusURL = status.URL()
	}
	endpoints := endpointLines(infos, res.StatusURL, dir, f.AdminToken)
	fmt.Fprintf(disp, "Ready in %.1f s.\n", time.Since(began).Seconds())
	if !cfg.Terminal || cfg.NoTraffic {
		fmt.Fprintln(disp, strings.Join(endpoints, "\n"))
	}

	if cfg.NoTraffic {
		for _, ri := range infos {
			fmt.Fprintf(out, "%s=%s\n", ri.name, ri.url)
		}
		fmt.Fprintf(info, "Try:\n  curl -N %s/v1/chat/completions -H 'X-Tenant-Id: eu-health' -H 'X-Data-Class: phi' -H 'Content-Type: application/json' \\\n"+
			"    -d '{\"model\":\"%s\",\"max_tokens\":8,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}' -D -\n",
			urls["us-east-1"], enginesim.DefaultConfig().Model)
		fmt.Fprintln(info, "Waiting; interrupt (Ctrl-C) to stop.")
		wait := ctx.Done()
		if cfg.Duration > 0 {
			t := time.NewTimer(cfg.Duration)
			defer t.Stop()
			select {
			case <-wait:
			case <-t.C:
			}
		} else {
			<-wait
		}
		res.Elapsed = time.Since(st.start)
		return finish(ctx, cfg, f, st, &res, out, disp, nil, dir, keyFile, endpoints, closeFleet)
	}

	// Traffic.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true, IdleConnTimeout: 30 * time.Second}}
	defer hc.CloseIdleConnections()
	cl := &client{hc: hc, urls: urls, model: enginesim.DefaultConfig().Model, now: time.Now}
	gen := &generator{c: cl, st: st, apps: newApps(cfg.Seed), regions: regionNames, seed: cfg.Seed,
		think: [2]time.Duration{300 * time.Millisecond, 2 * time.Second}}
	stop := make(chan struct{})
	genCtx, cancelGen := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelGen()
	var genWG sync.WaitGroup
	genWG.Go(func() { gen.run(genCtx, stop, cfg.Sessions) })

	sc := &screen{w: disp, terminal: cfg.Terminal}
	header := func() []string {
		return append([]string{fmt.Sprintf("Meridian demo · %s · t+%.0fs · %s", phase.get(), time.Since(st.start).Seconds(), plan)}, endpoints...)
	}
	sc.draw(snapshot(), header(), time.Now(), true)

	var endC, failC <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		endC = t.C
	}
	if cfg.FailoverAfter >= 0 {
		t := time.NewTimer(cfg.FailoverAfter)
		defer t.Stop()
		failC = t.C
	}
	foCtx, cancelFO := context.WithCancel(ctx)
	defer cancelFO()
	var foWG sync.WaitGroup
	var moved time.Duration
	var foErr error
	foDone := make(chan struct{})
	tick := time.NewTicker(cfg.Refresh)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			st.event("interrupted")
			break loop
		case <-endC:
			break loop
		case <-failC:
			failC = nil
			phase.set("failover of " + cfg.FailoverRegion)
			other := regionNames[0]
			if other == cfg.FailoverRegion {
				other = regionNames[1]
			}
			fo := &failover{region: cfg.FailoverRegion, admin: global.NewClient(f.Region(other).Controller.AdminURL(), f.AdminToken, hc),
				c: cl, st: st, policy: policy, regions: regionNames, now: time.Now, probeWait: 30 * time.Second,
				states: func() map[string]global.RegionState {
					m := map[string]global.RegionState{}
					for _, r := range f.Regions {
						m[r.Name] = r.Controller.Global().State().RegionState(cfg.FailoverRegion)
					}
					return m
				}}
			recoverAt := time.Now().Add(cfg.FailoverFor)
			foWG.Go(func() {
				defer close(foDone)
				moved, foErr = fo.run(foCtx, recoverAt)
			})
		case <-foDone:
			foDone = nil
			phase.set(cfg.FailoverRegion + " recovered")
		case now := <-tick.C:
			sc.draw(snapshot(), header(), now, false)
		}
	}
	// Stop: no new requests; those in flight finish (bounded).
	close(stop)
	cancelFO()
	foWG.Wait()
	waited := make(chan struct{})
	go func() { genWG.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		cancelGen()
		<-waited
	}
	res.Elapsed = time.Since(st.start)
	res.FailoverMovedS = moved.Seconds()
	phase.set("done")
	sc.draw(snapshot(), header(), time.Now(), true)
	sc.done()
	if foErr != nil && !errors.Is(foErr, context.Canceled) {
		st.event("failover: %v", foErr)
	}
	return finish(ctx, cfg, f, st, &res, out, disp, foErr, dir, keyFile, endpoints, closeFleet)
}

// finish seals and verifies the audit logs, fills the result, prints the
// summary (or the JSON) and closes the fleet.
func finish(ctx context.Context, cfg Config, f *fleet.Fleet, st *stats, res *Result, out, disp io.Writer, foErr error,
	dir, keyFile string, endpoints []string, closeFleet func() error) (Result, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	auditDir := filepath.Join(dir, "audit")
	ar, aerr := sealAndVerify(actx, f, auditDir, filepath.Join(dir, "checkpoints.jsonl"))
	res.AuditRecords, res.AuditVerified, res.AuditIssues = ar.records, ar.verified, ar.problems

	st.mu.Lock()
	res.Requests, res.Errors, res.CrossRegionForwards = st.requests, st.errs, st.forwards
	res.ResidencyDenials, res.ResidencyViolations, res.Refused, res.Probes = st.denials, st.violations, st.refused, st.probes
	res.HitRate = ratio(st.cached, st.prompt)
	all := sortedCopy(st.ttfts)
	res.ErrorKinds = maps.Clone(st.errorKinds)
	res.Events = slices.Clone(st.events)
	res.EUPHI = PHIView{Entered: maps.Clone(st.phi.entered), Served: maps.Clone(st.phi.served), Refused: st.phi.refused}
	st.mu.Unlock()
	res.TTFTP50Ms, res.TTFTP95Ms = percentile(all, 0.5), percentile(all, 0.95)

	writeSummary(disp, cfg, res, ar, auditDir, keyFile, endpoints)
	var errs []error
	if cfg.JSON {
		b, err := json.Marshal(res)
		if err != nil {
			errs = append(errs, err)
		} else if _, err := fmt.Fprintf(out, "%s\n", b); err != nil {
			errs = append(errs, err)
		}
	}
	if aerr != nil {
		errs = append(errs, aerr)
	}
	if foErr != nil && !errors.Is(foErr, context.Canceled) {
		errs = append(errs, foErr)
	}
	if err := closeFleet(); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return *res, fmt.Errorf("demo: %w", err)
	}
	return *res, nil
}

func writeSummary(w io.Writer, cfg Config, res *Result, ar auditReport, auditDir, keyFile string, endpoints []string) {
	if w == nil {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nSummary after %.0f s\n", res.Elapsed.Seconds())
	if !cfg.NoTraffic {
		var kinds []string
		for _, k := range slices.Sorted(maps.Keys(res.ErrorKinds)) {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, res.ErrorKinds[k]))
		}
		errs := fmt.Sprint(res.Errors)
		if len(kinds) > 0 {
			errs += " (" + strings.Join(kinds, ", ") + ")"
		}
		fmt.Fprintf(&b, "  requests %d · errors %s · hit rate %.1f%% · TTFT p50 %s, p95 %s (client side, streamed)\n",
			res.Requests, errs, 100*res.HitRate, fmtMs(res.TTFTP50Ms), fmtMs(res.TTFTP95Ms))
		fmt.Fprintf(&b, "  cross-region forwards %d · residency denials %d · no healthy region %d · residency violations %d\n",
			res.CrossRegionForwards, res.ResidencyDenials, res.Refused, res.ResidencyViolations)
		fmt.Fprintf(&b, "  %s\n", phiLine(res.EUPHI))
		for _, e := range res.Events {
			if strings.HasPrefix(e.Text, "error (") || strings.HasPrefix(e.Text, "RESIDENCY VIOLATION") {
				fmt.Fprintf(&b, "    %s %s\n", fmtAt(e.At), e.Text)
			}
		}
		if res.FailoverMovedS > 0 {
			fmt.Fprintf(&b, "  failover of %s: every request that may be served elsewhere was, %.3f s after the trigger returned\n",
				cfg.FailoverRegion, res.FailoverMovedS)
		}
	}
	verdict := "verified against the checkpoints committed in Raft"
	if !res.AuditVerified {
		verdict = "NOT verified"
		if len(ar.problems) > 0 {
			verdict += ": " + strings.Join(ar.problems[:min(3, len(ar.problems))], "; ")
		}
	}
	fmt.Fprintf(&b, "  audit: %d records, %s\n", res.AuditRecords, verdict)
	fmt.Fprintf(&b, "\nWhere to look next (kept in %s):\n", res.Dir)
	fmt.Fprintf(&b, "  meridian audit query --dir %s --kind cross_region\n", auditDir)
	fmt.Fprintf(&b, "  meridian audit query --dir %s --kind residency_denied --json\n", auditDir)
	fmt.Fprintf(&b, "  meridian audit query --dir %s --tenant eu-health --hmac-key-file %s\n", auditDir, keyFile)
	fmt.Fprintf(&b, "  meridian audit verify --dir %s --checkpoints %s\n", auditDir, ar.checkpoints)
	fmt.Fprintf(&b, "  logs: %s\n", filepath.Join(res.Dir, "demo.log"))
	fmt.Fprintf(&b, "While a demo runs (meridian demo --duration 0 keeps it up until Ctrl-C), these answered:\n")
	for _, l := range endpoints {
		fmt.Fprintf(&b, "%s\n", l)
	}
	_, _ = io.WriteString(w, b.String())
}

// endpointLines lists where to look while the demo runs.
func endpointLines(infos []regionInfo, statusURL, dir, token string) []string {
	var lines []string
	if statusURL != "" {
		lines = append(lines, "  status page  "+statusURL)
	}
	for _, ri := range infos {
		lines = append(lines, fmt.Sprintf("  %-11s  api %s  metrics %s/metrics  admin %s", ri.name, ri.url, ri.url, ri.admin))
	}
	if len(infos) > 0 {
		lines = append(lines, fmt.Sprintf("  failover     meridian failover status --admin %s --token %s", infos[0].admin, token))
	}
	return lines
}

func planText(cfg Config) string {
	if cfg.NoTraffic {
		return "no traffic generator"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d sessions", cfg.Sessions)
	if cfg.FailoverAfter >= 0 {
		fmt.Fprintf(&b, ", failover of %s at t+%.0fs, recovery at t+%.0fs", cfg.FailoverRegion, cfg.FailoverAfter.Seconds(), (cfg.FailoverAfter + cfg.FailoverFor).Seconds())
	}
	if cfg.Duration > 0 {
		fmt.Fprintf(&b, ", end at t+%.0fs", cfg.Duration.Seconds())
	} else {
		b.WriteString(", until interrupted")
	}
	return b.String()
}

// phaseBox holds the phase's name for the display goroutines.
type phaseBox struct {
	mu sync.Mutex
	v  string
}

func (p *phaseBox) set(v string) { p.mu.Lock(); p.v = v; p.mu.Unlock() }
func (p *phaseBox) get() string  { p.mu.Lock(); defer p.mu.Unlock(); return p.v }
