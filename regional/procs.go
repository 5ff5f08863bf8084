package regional

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"time"
)

// RuntimeConfig is how the Go runtime of a `meridian controller` process
// runs. Run applies it (the binary's entry); controllers that tests open
// side by side in one process leave the runtime alone.
type RuntimeConfig struct {
	// MaxProcs is GOMAXPROCS, how many threads run Go code at once.
	//
	// 0 (the default) adapts it to the load of a controller without
	// cross-region components (raft, gossip, audit, policy_file): 1 while
	// the process uses under 0.3 of a core for 2s, back to the Go
	// runtime's default (the CPUs it may use, within its cgroup's limit)
	// as soon as it uses 0.6 of a core over 100ms or 5% of its goroutines
	// keep waiting 1ms or more to run for 0.5s (its thread gets too little
	// of a busy machine). It was added when net/http's server served the
	// API: each proxied request made it start and then stop a goroutine
	// (its background read of the client's connection), and with an idle
	// P each of those woke another thread, which spun and slept again. On
	// 2 cores at 1,000 req/s that was about 4 of the 7.5 context switches
	// per request, 15% of the CPU and 40us of added p50
	// (scripts/proxy-vs-nginx; see the commit that added it). h1Server,
	// which serves the API now, starts no goroutine per request, and at
	// 2,500 req/s two Ps cost what one does; but at 1,000 req/s one P
	// still costs less CPU and adds less latency: 0.12-0.16 of a core
	// against 0.16-0.18, and 66-117us of added p50 against 129-149us, in 4
	// alternated pairs of windows (docs/perf/proxy-tail.md). With one P,
	// work that runs long in the
	// background holds requests up to 10ms (the runtime's preemption
	// slice): a controller with cross-region components builds a summary
	// of its index every summary_interval (24ms for 1M blocks), so it
	// keeps the runtime's default.
	//
	// N > 0 fixes it at N; -1 leaves it to the Go runtime. The GOMAXPROCS
	// environment variable, when set, wins over this.
	MaxProcs int `yaml:"max_procs"`
}

// Validate names the first field that is wrong.
func (c RuntimeConfig) Validate() error {
	if c.MaxProcs < -1 {
		return fmt.Errorf("config: runtime.max_procs = %d: want -1, 0 (adaptive) or a count of threads", c.MaxProcs)
	}
	return nil
}

// The adaptive GOMAXPROCS (RuntimeConfig.MaxProcs 0): the process's CPU
// use and how long its goroutines waited to run are read every
// procsInterval. It runs with the runtime's default at once when it used
// procsUp cores or more, or when for procsSlowFor in a row at least
// procsSlowShare of the goroutines made ready waited procsSlowWait or
// longer to run (the P is busy, or the machine's cores are and a lone
// thread gets too little of them: CPU use then understates what the
// process needs; a busy machine's passing stalls do not count); and with
// one P after procsQuietFor under procsDown.
const (
	procsInterval  = 100 * time.Millisecond
	procsUp        = 0.6
	procsDown      = 0.3
	procsQuietFor  = 2 * time.Second
	procsSlowWait  = time.Millisecond
	procsSlowShare = 0.05
	procsSlowFor   = 500 * time.Millisecond
	// procsMinWaits is how many goroutines must have been made ready in
	// an interval for their waits to count.
	procsMinWaits = 20
)

// procsGovernor decides the adaptive GOMAXPROCS from what it is told of
// the process: a state machine without a clock or a runtime of its own.
type procsGovernor struct {
	max   int // the runtime's default
	cur   int
	quiet time.Duration // how long the process has stayed quiet
	slow  time.Duration // how long goroutines have kept waiting to run
}

// procsSample is one interval of the process: the cores it used, how many
// goroutines were made ready, and how many of them waited procsSlowWait
// or longer to run.
type procsSample struct {
	used        float64
	waits, slow uint64
}

// waiting reports whether goroutines waited to run in the sample.
func (s procsSample) waiting() bool {
	return s.waits >= procsMinWaits && float64(s.slow) >= procsSlowShare*float64(s.waits)
}

// observe takes the last dt of the process and returns the GOMAXPROCS to
// run with now.
func (g *procsGovernor) observe(s procsSample, dt time.Duration) int {
	if s.waiting() {
		g.slow += dt
	} else {
		g.slow = 0
	}
	if s.used < procsDown {
		g.quiet += dt
	} else {
		g.quiet = 0
	}
	switch {
	case g.cur < g.max && (s.used >= procsUp || g.slow >= procsSlowFor):
		g.cur = g.max
	case g.cur > 1 && g.quiet >= procsQuietFor && g.slow == 0:
		g.cur = 1
	}
	return g.cur
}

// runRuntime applies cfg to the Go runtime until ctx is done, then gives
// GOMAXPROCS back to the runtime's default. crossRegion: the controller
// runs cross-region components (no adaptive GOMAXPROCS).
func runRuntime(ctx context.Context, cfg RuntimeConfig, crossRegion bool, log *slog.Logger) {
	if env := os.Getenv("GOMAXPROCS"); env != "" {
		log.Info("GOMAXPROCS is set in the environment: runtime.max_procs is not applied", "GOMAXPROCS", env)
		return
	}
	switch {
	case cfg.MaxProcs > 0:
		runtime.GOMAXPROCS(cfg.MaxProcs)
		<-ctx.Done()
		runtime.SetDefaultGOMAXPROCS()
		return
	case cfg.MaxProcs < 0 || crossRegion:
		return
	}
	g := &procsGovernor{max: runtime.GOMAXPROCS(0)}
	g.cur = g.max
	if g.max <= 1 || !canReadCPUTime {
		return
	}
	defer runtime.SetDefaultGOMAXPROCS()
	t := time.NewTicker(procsInterval)
	defer t.Stop()
	lat := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	waits := func() (all, slow uint64) {
		metrics.Read(lat)
		if lat[0].Value.Kind() != metrics.KindFloat64Histogram {
			return 0, 0
		}
		h := lat[0].Value.Float64Histogram()
		for i, n := range h.Counts {
			all += n
			if h.Buckets[i] >= procsSlowWait.Seconds() {
				slow += n
			}
		}
		return all, slow
	}
	lastAt, lastCPU := time.Now(), processCPUTime()
	lastWaits, lastSlow := waits()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu := processCPUTime()
			all, slow := waits()
			dt := now.Sub(lastAt)
			if dt <= 0 {
				continue
			}
			s := procsSample{used: float64(cpu-lastCPU) / float64(dt), waits: all - lastWaits, slow: slow - lastSlow}
			lastAt, lastCPU, lastWaits, lastSlow = now, cpu, all, slow
			was := g.cur
			if n := g.observe(s, dt); n != was {
				if n == g.max {
					// Back to the runtime's own setting, which follows
					// changes of the cgroup's CPU limit.
					runtime.SetDefaultGOMAXPROCS()
					g.max = runtime.GOMAXPROCS(0)
					g.cur = g.max
				} else {
					runtime.GOMAXPROCS(n)
				}
				log.Debug("GOMAXPROCS adapted to CPU use", "procs", g.cur, "cores_used", s.used,
					"goroutines_ready", s.waits, "waited_1ms", s.slow)
			}
		}
	}
}
