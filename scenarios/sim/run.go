package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-llm/meridian/residency"
)

// Options are how a run reports while it goes.
type Options struct {
	// Progress receives a progress bar (carriage-return updates) once the
	// run has taken longer than ProgressAfter; nil: none.
	Progress io.Writer
	// ProgressAfter defaults to 2s.
	ProgressAfter time.Duration
	// Parallel is how many worlds run at once; 0: GOMAXPROCS.
	Parallel int
}

// instance is one configuration of a run (one load and seed of a sweep):
// the inputs its policies' worlds share and never modify.
type instance struct {
	cfg     Config
	fleet   *fleetSpec
	res     *residency.Policy
	open    []*request // open-loop requests; nil for coding
	offered float64    // offered load of the open-loop requests
}

// prepare validates cfg and builds an instance's inputs.
func prepare(cfg Config) (*instance, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	resYAML := cfg.Residency
	if resYAML == nil {
		resYAML = ResidencyPolicy(cfg.Fleet.Regions)
	}
	res, err := residency.Parse("sim-residency.yaml", resYAML)
	if err != nil {
		return nil, fmt.Errorf("sim: residency policy: %w", err)
	}
	for _, r := range cfg.Fleet.Regions {
		if _, ok := res.RegionIndex(r); !ok {
			return nil, fmt.Errorf("sim: residency policy does not declare region %q", r)
		}
	}
	in := &instance{cfg: cfg, fleet: newFleetSpec(&cfg), res: res}
	in.open, in.offered = openRequests(&in.cfg, in.fleet)
	return in, nil
}

// openRequests builds the open-loop requests of the workload at its load.
func openRequests(cfg *Config, f *fleetSpec) ([]*request, float64) {
	w := &cfg.Workload
	var gen func(rate float64) []*request
	switch w.Kind {
	case WorkloadTrace:
		reqs := traceRequests(cfg, traceWindow(cfg))
		if w.Load > 0 {
			if l := offeredLoad(reqs, f); l > 0 {
				scaleArrivals(reqs, l/w.Load)
			}
		} else {
			scaleArrivals(reqs, 1/w.TimeScale)
		}
		return reqs, offeredLoad(reqs, f)
	case WorkloadRAG:
		gen = func(rate float64) []*request { return ragRequests(cfg, rate) }
	case WorkloadShort:
		gen = func(rate float64) []*request { return shortRequests(cfg, rate) }
	case WorkloadSharedDocs:
		gen = func(rate float64) []*request { return sharedDocRequests(cfg, rate) }
	default:
		return nil, 0
	}
	return atLoad(w.load(), f, gen)
}

func (in *instance) source() source {
	if in.cfg.Workload.Kind == WorkloadCoding {
		return newCodingSource(&in.cfg, in.fleet)
	}
	return &openSource{reqs: in.open}
}

// task is one world to run: an instance and a policy, and where its result
// goes.
type task struct {
	in     *instance
	policy string
	res    *Result
	err    error
}

// Run simulates every configured policy on the same fleet and workload,
// each in a world of its own (run side by side on Parallel goroutines), and
// reports their figures in the configured order. It is deterministic for a
// configuration: the same Config gives the same Report (but WallS).
func Run(ctx context.Context, cfg Config, opts Options) (*Report, error) {
	in, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	tasks := make([]*task, len(cfg.Policies))
	for i, p := range cfg.Policies {
		tasks[i] = &task{in: in, policy: p}
	}
	if err := runTasks(ctx, tasks, opts); err != nil {
		return nil, err
	}
	rep := &Report{Workload: cfg.Workload.Kind, Regions: cfg.Fleet.Regions, Pods: len(in.fleet.pods), Seed: cfg.Seed,
		OfferedLoad: in.offered}
	for _, t := range tasks {
		rep.Results = append(rep.Results, *t.res)
	}
	if ub, ok := rep.Result(PolicyUpperBound); ok && ub.HitRate > 0 {
		for i := range rep.Results {
			rep.Results[i].OfUpperBound = rep.Results[i].HitRate / ub.HitRate
		}
	}
	return rep, nil
}

// runTasks runs the worlds, at most Parallel at once, each built when a
// worker takes it (so a sweep never holds all its worlds in memory), with
// one progress bar over all of them. Results are independent of the order
// and parallelism.
func runTasks(ctx context.Context, tasks []*task, opts Options) error {
	var stop atomic.Bool
	ctxDone := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer ctxDone()

	pr := &progressState{total: len(tasks)}
	done := make(chan struct{})
	var bar sync.WaitGroup
	if opts.Progress != nil {
		bar.Add(1)
		go func() {
			defer bar.Done()
			progress(opts, pr, done)
		}()
	}
	par := opts.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(par, len(tasks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(tasks) || stop.Load() {
					return
				}
				t := tasks[i]
				t0 := time.Now()
				w, err := newWorld(&t.in.cfg, t.policy, t.in.fleet, t.in.res, t.in.source())
				if err != nil {
					t.err = fmt.Errorf("sim: policy %s: %w", t.policy, err)
					stop.Store(true)
					return
				}
				pr.start(w)
				w.run(&stop)
				pr.finish(w)
				if n := w.stats.indexErrors + w.stats.summaryErrors; n > 0 {
					t.err = fmt.Errorf("sim: policy %s: %d index and %d summary errors", w.policy, w.stats.indexErrors, w.stats.summaryErrors)
					stop.Store(true)
					return
				}
				r := w.stats.result(&t.in.cfg, w.now)
				r.Utilization = w.utilization()
				r.WallS = time.Since(t0).Seconds()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				r.HeapMB = float64(ms.HeapInuse) / (1 << 20)
				runtime.KeepAlive(w)
				t.res = &r
			}
		}()
	}
	wg.Wait()
	close(done)
	bar.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	for _, t := range tasks {
		if t.err != nil {
			return t.err
		}
	}
	return nil
}

// progressState is what the progress bar reads: worlds finished and the
// ones running.
type progressState struct {
	mu      sync.Mutex
	total   int
	done    int
	running []*world
}

func (p *progressState) start(w *world) {
	p.mu.Lock()
	p.running = append(p.running, w)
	p.mu.Unlock()
}

func (p *progressState) finish(w *world) {
	p.mu.Lock()
	p.done++
	if i := slices.Index(p.running, w); i >= 0 {
		p.running = slices.Delete(p.running, i, i+1)
	}
	p.mu.Unlock()
}

// fraction of the run done: finished worlds, and the virtual-time progress
// of the running ones.
func (p *progressState) fraction() (float64, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	frac := float64(p.done)
	for _, w := range p.running {
		h := w.src.horizon()
		if h <= 0 {
			continue
		}
		frac += min(float64(w.clock.Load())/float64(h), 1)
	}
	return frac / float64(max(p.total, 1)), p.total
}

// progress draws a bar of the run's progress until done.
func progress(opts Options, pr *progressState, done <-chan struct{}) {
	after := opts.ProgressAfter
	if after <= 0 {
		after = 2 * time.Second
	}
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	drawn := false
	draw := func(final bool) {
		frac, total := pr.fraction()
		if final {
			frac = 1
		}
		const width = 40
		n := int(math.Round(frac * width))
		fmt.Fprintf(opts.Progress, "\rsimulating %d worlds [%s%s] %3.0f%% %5.1fs", total,
			strings.Repeat("#", n), strings.Repeat(".", width-n), 100*frac, time.Since(start).Seconds())
		drawn = true
	}
	for {
		select {
		case <-done:
			if drawn || time.Since(start) >= after {
				draw(true)
				fmt.Fprintln(opts.Progress)
			}
			return
		case <-tick.C:
			if time.Since(start) >= after {
				draw(false)
			}
		}
	}
}

// CacheCheckResult is the hit ratio of one cache pool on a trace.
type CacheCheckResult struct {
	Requests     int     `json:"requests"`
	BlockHitRate float64 `json:"block_hit_rate"`
	TokenHitRate float64 `json:"token_hit_rate"`
}

// CacheCheck replays a trace through one cache pool (the pods' cache model)
// of capacityTokens (0: unbounded), with no routing and no timing: each
// request's longest cached prefix counts as hit, then its blocks are cached
// (the cache model check against SOURCES.md's figures).
func CacheCheck(recs []TraceRecord, capacityTokens, blockSize int) CacheCheckResult {
	capBlocks := math.MaxInt / 2
	if capacityTokens > 0 {
		capBlocks = max(capacityTokens/blockSize, 1)
	}
	c := newKVCache(capBlocks, nil)
	var h holding
	var hit, blocks, tokHit, tok int64
	for _, r := range recs {
		n := c.touch(r.HashIDs, &h)
		hit += int64(n)
		blocks += int64(len(r.HashIDs))
		tokHit += int64(min(n*blockSize, r.InputLength))
		tok += int64(r.InputLength)
	}
	res := CacheCheckResult{Requests: len(recs)}
	if blocks > 0 {
		res.BlockHitRate = float64(hit) / float64(blocks)
	}
	if tok > 0 {
		res.TokenHitRate = float64(tokHit) / float64(tok)
	}
	return res
}
