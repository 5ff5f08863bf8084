package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/regional"
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
	// The replica killed mid-run and started again: how many times, the
	// requests that failed while it was down other than those in flight on
	// it (0: its region kept serving), those in flight on it, and the hit
	// rate of the answers in equal windows before and after the kill.
	ReplicaKills                    int64   `json:"replica_kills"`
	ReplicaRestarts                 int64   `json:"replica_restarts"`
	RequestsFailedDuringReplicaLoss int64   `json:"requests_failed_during_replica_loss"`
	InflightLostOnReplicaKill       int64   `json:"inflight_lost_on_replica_kill"`
	HitRateBeforeReplicaKill        float64 `json:"hit_rate_before_replica_kill"`
	HitRateAfterReplicaKill         float64 `json:"hit_rate_after_replica_kill"`

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

// runner is one run's state.
type runner struct {
	cfg       Config
	out       io.Writer // the JSON or the region=URL lines
	info      io.Writer
	disp      io.Writer // the table and the summary
	dir       string
	keyFile   string // the audit HMAC key, for `audit query --tenant`
	log       *slog.Logger
	f         *fleet.Fleet
	infos     []regionInfo
	urls      map[string]string
	st        *stats
	dec       *decisions
	phase     phaseBox
	plan      string
	endpoints []string
	res       Result
	tails     sync.WaitGroup // audit log followers
	bal       *fleet.Balancer
	tailCtx   context.Context
	killed    struct {
		rep *fleet.Replica
		at  time.Time
	}
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
	r := &runner{cfg: cfg, out: out, info: cfg.Info, disp: out, plan: planText(cfg)}
	if r.info == nil {
		r.info = io.Discard
	}
	if cfg.JSON || cfg.NoTraffic {
		r.disp = r.info
	}
	closeLog, err := r.prepare()
	if err != nil {
		return r.res, fmt.Errorf("demo: %w", err)
	}
	defer closeLog()
	var closeOnce sync.Once
	var closeErr error
	closeFleet := func() error {
		closeOnce.Do(func() {
			if r.f == nil {
				return
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			closeErr = r.f.Close(cctx)
		})
		return closeErr
	}
	defer closeFleet()
	if err := r.start(ctx); err != nil {
		return r.res, fmt.Errorf("demo: start: %w", err)
	}

	// The status page's recent decisions come from the audit logs.
	r.st, r.dec = newStats(r.f.Policy, time.Now), newDecisions()
	tailCtx, stopTails := context.WithCancel(ctx)
	r.tailCtx = tailCtx
	defer func() { stopTails(); r.tails.Wait() }()
	for _, c := range r.f.Controllers() {
		r.follow(c)
	}
	if cfg.StatusAddr != "" {
		status, err := startStatus(cfg.StatusAddr, StatusHandler(r.snapshot))
		if err != nil {
			return r.res, fmt.Errorf("demo: status page: %w", err)
		}
		defer status.Close()
		r.res.StatusURL = status.URL()
	}
	r.endpoints = endpointLines(r.infos, r.res.StatusURL, r.f.AdminToken)
	if !cfg.Terminal || cfg.NoTraffic {
		fmt.Fprintln(r.disp, strings.Join(r.endpoints, "\n"))
	}

	var foErr error
	if cfg.NoTraffic {
		r.phase.set("no traffic: send your own")
		r.wait(ctx)
	} else {
		r.phase.set("traffic")
		foErr = r.traffic(ctx)
	}
	r.res.Elapsed = time.Since(r.st.start)
	return r.finish(ctx, foErr, closeFleet)
}

// follow shows a controller's audit records on the status page.
func (r *runner) follow(c *regional.Controller) {
	l := c.Audit()
	r.tails.Go(func() {
		if err := r.dec.follow(r.tailCtx, l); err != nil && r.tailCtx.Err() == nil {
			r.log.Warn("demo: audit tail stopped", "controller", c.ID(), "err", err)
		}
	})
}

// prepare makes the directory and the log.
func (r *runner) prepare() (closeLog func(), err error) {
	closeLog = func() {}
	r.dir = r.cfg.Dir
	if r.dir == "" {
		if r.dir, err = os.MkdirTemp("", "meridian-demo-"); err != nil {
			return closeLog, err
		}
	} else if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return closeLog, err
	}
	r.res = Result{Dir: r.dir, URLs: map[string]string{}}
	r.log = r.cfg.Logger
	if r.log == nil {
		lf, err := os.OpenFile(filepath.Join(r.dir, "demo.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return closeLog, err
		}
		closeLog = func() { _ = lf.Close() }
		r.log = slog.New(slog.NewTextHandler(lf, nil))
	}
	return closeLog, nil
}

// start brings the fleet up and keeps its audit HMAC key in Dir, so that
// `meridian audit query --tenant` works on the run's logs.
func (r *runner) start(ctx context.Context) error {
	fmt.Fprintf(r.disp, "Starting Meridian: %d regions (%s), %d controller replicas and %d simulated pods each, a Kafka-protocol broker, Raft and gossip on loopback (state in %s)...\n",
		len(regionNames), strings.Join(regionNames, ", "), r.cfg.Replicas, r.cfg.PodsPerRegion, r.dir)
	began := time.Now()
	hw := map[string]string{"us-east-1": "h100", "us-west-2": "h100", "eu-west-1": "h200"}
	var specs []fleet.RegionSpec
	for _, name := range regionNames {
		specs = append(specs, fleet.RegionSpec{Name: name, Pods: r.cfg.PodsPerRegion, Hardware: hw[name], CacheBlocks: r.cfg.CacheBlocks})
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	f, err := fleet.Start(sctx, fleet.Config{Regions: specs, Dir: r.dir, TimeScale: r.cfg.TimeScale, Logger: r.log, Tenants: demoTenants(),
		Replicas: r.cfg.Replicas})
	if err != nil {
		return err
	}
	r.f, r.urls = f, map[string]string{}
	r.keyFile = filepath.Join(r.dir, "audit-hmac.key")
	if err := os.WriteFile(r.keyFile, []byte(f.AuditKey), 0o600); err != nil {
		return err
	}
	for _, reg := range f.Regions {
		ri := regionInfo{name: reg.Name, url: reg.Controller.URL(), admin: reg.Controller.AdminURL(), replicas: reg.Replicas}
		for _, e := range reg.Engines {
			ri.pods = append(ri.pods, podInfo{name: e.Name(), hardware: e.Config().Hardware})
		}
		r.infos = append(r.infos, ri)
		r.urls[reg.Name] = ri.url
	}
	r.res.URLs = r.urls
	fmt.Fprintf(r.disp, "Ready in %.1f s.\n", time.Since(began).Seconds())
	return nil
}

// state is the region's state as its own controller sees it.
func (r *runner) state(region string) string {
	reg := r.f.Region(region)
	if reg == nil {
		return "?"
	}
	return reg.Controller.Global().State().RegionState(region).String()
}

// snapshot is the view of the figures now (the table, the status page).
func (r *runner) snapshot() Snapshot {
	s := r.st.snapshot(r.infos, r.state)
	for i, ri := range r.infos {
		for _, rep := range ri.replicas {
			rv := ReplicaView{ID: rep.ID, URL: rep.URL(), State: "down"}
			if c := rep.Controller(); c != nil {
				rv.State = "starting"
				if c.Ready() {
					rv.State = "ready"
				}
			}
			s.Regions[i].Replicas = append(s.Regions[i].Replicas, rv)
		}
	}
	s.Phase, s.Plan, s.Dir = r.phase.get(), r.plan, r.dir
	s.Decisions, s.AuditCounts = r.dec.snapshot()
	if r.cfg.FailoverAfter >= 0 && !r.cfg.NoTraffic {
		s.FailoverRegion = r.cfg.FailoverRegion
	}
	return s
}

// wait prints the controllers' URLs (no-traffic mode) and waits for the
// duration or the interruption.
func (r *runner) wait(ctx context.Context) {
	fmt.Fprintf(r.out, "ca=%s\n", r.f.PKI.CACert)
	for _, ri := range r.infos {
		fmt.Fprintf(r.out, "%s=%s\n", ri.name, ri.url)
	}
	for _, reg := range r.f.Regions {
		fmt.Fprintf(r.out, "raft.%s=%s\n", reg.Name, reg.Controller.Global().RaftAddr())
	}
	for _, t := range demoTenants() {
		fmt.Fprintf(r.out, "apikey.%s=%s\n", t.Name, r.f.APIKeys[t.Name])
	}
	fmt.Fprintf(r.info, "Try:\n  curl -N --cacert %s %s/v1/chat/completions -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' \\\n"+
		"    -d '{\"model\":\"%s\",\"max_tokens\":8,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}' -D -\n",
		r.f.PKI.CACert, r.urls["us-east-1"], r.f.APIKeys["eu-health"], enginesim.DefaultConfig().Model)
	fmt.Fprintln(r.info, "Waiting; interrupt (Ctrl-C) to stop.")
	if r.cfg.Duration <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTimer(r.cfg.Duration)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// traffic runs the generator, the live table and the failover until the
// duration has passed or ctx is done, then stops the traffic (requests in
// flight finish). It returns the failover's error.
func (r *runner) traffic(ctx context.Context) error {
	cfg := r.cfg
	base, ok := r.f.HTTP.Transport.(*http.Transport)
	if !ok {
		base = http.DefaultTransport.(*http.Transport)
	}
	tr := base.Clone()
	tr.MaxIdleConnsPerHost, tr.DisableCompression = 256, true
	hc := &http.Client{Transport: tr}
	defer hc.CloseIdleConnections()
	bal := r.f.NewBalancer(hc)
	defer bal.Close()
	r.bal = bal
	cl := &client{bal: bal, keys: r.f.APIKeys, model: enginesim.DefaultConfig().Model, now: time.Now}
	gen := &generator{c: cl, st: r.st, apps: newApps(cfg.Seed), regions: regionNames, seed: cfg.Seed,
		think: [2]time.Duration{300 * time.Millisecond, 2 * time.Second}}
	stop := make(chan struct{})
	genCtx, cancelGen := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelGen()
	genDone := make(chan struct{})
	go func() {
		defer close(genDone)
		gen.run(genCtx, stop, cfg.Sessions)
	}()

	sc := &screen{w: r.disp, terminal: cfg.Terminal}
	header := func() []string {
		return append([]string{fmt.Sprintf("Meridian demo · %s · t+%.0fs · %s", r.phase.get(), time.Since(r.st.start).Seconds(), r.plan)}, r.endpoints...)
	}
	sc.draw(r.snapshot(), header(), time.Now(), true)

	var endC, failC, killC, restartC <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		endC = t.C
	}
	if cfg.killsReplica() {
		t := time.NewTimer(cfg.ReplicaKillAfter)
		defer t.Stop()
		killC = t.C
	}
	var restartDone chan struct{} // closed when the killed replica is ready again
	if cfg.FailoverAfter >= 0 {
		t := time.NewTimer(cfg.FailoverAfter)
		defer t.Stop()
		failC = t.C
	}
	foCtx, cancelFO := context.WithCancel(ctx)
	defer cancelFO()
	var (
		moved  time.Duration
		foErr  error
		foDone chan struct{} // closed when the failover (and recovery) is over
	)
	tick := time.NewTicker(cfg.Refresh)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			r.st.event("interrupted")
			break loop
		case <-endC:
			break loop
		case <-failC:
			failC = nil
			r.phase.set("failover of " + cfg.FailoverRegion)
			fo := r.failover(cl, hc)
			recoverAt := time.Now().Add(cfg.FailoverFor)
			foDone = make(chan struct{})
			go func() {
				defer close(foDone)
				moved, foErr = fo.run(foCtx, recoverAt)
			}()
		case <-killC:
			killC = nil
			if rc := r.killReplica(); rc != nil {
				restartC = rc
			}
		case <-restartC:
			restartC = nil
			restartDone = r.restartReplica(ctx)
		case <-restartDone:
			restartDone = nil
		case <-foDone:
			foDone = nil
			r.phase.set(cfg.FailoverRegion + " recovered")
		case now := <-tick.C:
			sc.draw(r.snapshot(), header(), now, false)
		}
	}
	// Stop: no new requests; those in flight finish (bounded). A failover
	// still running finishes its measurement (each probe gives up after
	// probeWait) and recovers its region first: on a slow machine the run
	// may end before traffic has moved, and cutting the measurement short
	// would report a failover that did not move traffic. An interrupt
	// cancels it (foCtx is ctx's child).
	close(stop)
	if foDone != nil {
		<-foDone
	}
	cancelFO()
	if restartC != nil {
		// Interrupted while the replica was down: start it again, so that
		// its audit chain is sealed and verified with the others.
		restartDone = r.restartReplica(ctx)
	}
	if restartDone != nil {
		<-restartDone
	}
	select {
	case <-genDone:
	case <-time.After(20 * time.Second):
		cancelGen()
		<-genDone
	}
	r.res.FailoverMovedS = moved.Seconds()
	r.phase.set("done")
	sc.draw(r.snapshot(), header(), time.Now(), true)
	sc.done()
	if foErr != nil && !errors.Is(foErr, context.Canceled) {
		r.st.event("failover: %v", foErr)
		return foErr
	}
	return nil
}

// killReplica kills the last replica of cfg.ReplicaKillRegion abruptly and
// returns when to start it again (nil if it could not be killed).
func (r *runner) killReplica() <-chan time.Time {
	reg := r.f.Region(r.cfg.ReplicaKillRegion)
	rep := reg.Replicas[len(reg.Replicas)-1]
	// Recorded first: the requests in flight on it fail while Kill runs.
	at := time.Now()
	r.st.replicaKilled(rep.ID, at)
	if err := rep.Kill(); err != nil {
		r.st.event("replica %s not killed: %v", rep.ID, err)
		return nil
	}
	r.killed.rep, r.killed.at = rep, at
	r.phase.set("replica " + rep.ID + " down")
	return time.After(r.cfg.ReplicaDownFor)
}

// restartReplica starts the killed replica again; the channel is closed
// once it is ready (or could not start).
func (r *runner) restartReplica(ctx context.Context) chan struct{} {
	done := make(chan struct{})
	rep := r.killed.rep
	r.st.event("starting replica %s again: it rebuilds its index from the topic before it reports ready", rep.ID)
	go func() {
		defer close(done)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		began := time.Now()
		if err := rep.Start(sctx); err != nil {
			r.st.event("replica %s did not start again: %v", rep.ID, err)
			return
		}
		// Ready for the load balancer: its next probe sees /readyz 200.
		r.st.replicaRestarted(rep.ID, began, time.Now())
		if c := rep.Controller(); c != nil {
			r.follow(c)
		}
		r.phase.set("replica " + rep.ID + " back")
	}()
	return done
}

// failover prepares the failover of cfg.FailoverRegion, triggered through
// the admin API of a controller in another region.
func (r *runner) failover(cl *client, hc *http.Client) *failover {
	region := r.cfg.FailoverRegion
	other := regionNames[0]
	if other == region {
		other = regionNames[1]
	}
	return &failover{region: region, admin: global.NewClient(r.f.Region(other).Controller.AdminURL(), r.f.AdminToken, hc),
		c: cl, st: r.st, policy: r.f.Policy, regions: regionNames, now: time.Now, probeWait: 30 * time.Second,
		states: func() map[string]global.RegionState {
			m := map[string]global.RegionState{}
			for _, reg := range r.f.Regions {
				m[reg.Name] = reg.Controller.Global().State().RegionState(region)
			}
			return m
		}}
}

// phaseBox holds the phase's name for the display goroutines.
type phaseBox struct {
	mu sync.Mutex
	v  string
}

func (p *phaseBox) set(v string) { p.mu.Lock(); p.v = v; p.mu.Unlock() }
func (p *phaseBox) get() string  { p.mu.Lock(); defer p.mu.Unlock(); return p.v }
