package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
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

// Run simulates every configured policy on the same fleet and workload,
// each in a world of its own (run side by side on Parallel goroutines), and
// reports their figures in the configured order. It is deterministic for a
// configuration: the same Config gives the same Report (but WallS).
func Run(ctx context.Context, cfg Config, opts Options) (*Report, error) {
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
	fleet := newFleetSpec(&cfg)
	var open []*request
	switch cfg.Workload.Kind {
	case WorkloadTrace:
		open = traceRequests(&cfg)
	case WorkloadRAG:
		open = ragRequests(&cfg, fleet)
	case WorkloadShort:
		open = shortRequests(&cfg, fleet)
	}
	worlds := make([]*world, len(cfg.Policies))
	for i, p := range cfg.Policies {
		var src source
		if cfg.Workload.Kind == WorkloadCoding {
			src = newCodingSource(&cfg, len(fleet.pods))
		} else {
			src = &openSource{reqs: open}
		}
		if worlds[i], err = newWorld(&cfg, p, fleet, res, src); err != nil {
			return nil, fmt.Errorf("sim: policy %s: %w", p, err)
		}
	}

	var stop atomic.Bool
	done := make(chan struct{})
	var bar sync.WaitGroup
	if opts.Progress != nil {
		bar.Add(1)
		go func() {
			defer bar.Done()
			progress(opts, worlds, done)
		}()
	}
	ctxDone := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer ctxDone()

	par := opts.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	walls := make([]time.Duration, len(worlds))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, w := range worlds {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			w.run(&stop)
			walls[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	close(done)
	bar.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}

	rep := &Report{Workload: cfg.Workload.Kind, Regions: cfg.Fleet.Regions, Pods: len(fleet.pods), Seed: cfg.Seed}
	for i, w := range worlds {
		r := w.stats.result(&cfg, w.now)
		r.WallS = walls[i].Seconds()
		if n := w.stats.indexErrors + w.stats.summaryErrors; n > 0 {
			return nil, fmt.Errorf("sim: policy %s: %d index and %d summary errors", w.policy, w.stats.indexErrors, w.stats.summaryErrors)
		}
		rep.Results = append(rep.Results, r)
	}
	if ub, ok := rep.Result(PolicyUpperBound); ok && ub.HitRate > 0 {
		for i := range rep.Results {
			rep.Results[i].OfUpperBound = rep.Results[i].HitRate / ub.HitRate
		}
	}
	return rep, nil
}

// progress draws a bar of the worlds' mean virtual-time progress until done.
func progress(opts Options, worlds []*world, done <-chan struct{}) {
	after := opts.ProgressAfter
	if after <= 0 {
		after = 2 * time.Second
	}
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	drawn := false
	draw := func() {
		frac := 0.0
		for _, w := range worlds {
			h := w.src.horizon()
			if h <= 0 {
				frac++
				continue
			}
			frac += min(float64(w.clock.Load())/float64(h), 1)
		}
		frac /= float64(len(worlds))
		const width = 40
		n := int(math.Round(frac * width))
		fmt.Fprintf(opts.Progress, "\rsimulating %d policies [%s%s] %3.0f%% %5.1fs", len(worlds),
			strings.Repeat("#", n), strings.Repeat(".", width-n), 100*frac, time.Since(start).Seconds())
		drawn = true
	}
	for {
		select {
		case <-done:
			if drawn || time.Since(start) >= after {
				draw()
				fmt.Fprintln(opts.Progress)
			}
			return
		case <-tick.C:
			if time.Since(start) >= after {
				draw()
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
