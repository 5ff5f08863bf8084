package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/scenarios/sim"
)

// simCommand is `meridian sim`: the multi-region simulator.
func simCommand() *cli.Command {
	d := sim.DefaultConfig()
	return &cli.Command{
		Name:  "sim",
		Usage: "simulate routing policies side by side on a trace or a synthetic workload (discrete-event, virtual time)",
		Description: "Replays a Mooncake-format trace (--trace) or a synthetic workload (--workload coding|rag|short|\n" +
			"shared-docs), optionally under a scenario (--scenario skew|roaming|failover|long-rtt), through a\n" +
			"simulated multi-region fleet once per policy, driving Meridian's real index, decision layer, cost\n" +
			"model, region summaries and residency policy on a virtual clock against a chunked-prefill engine\n" +
			"model, and reports per policy: hit rate, TTFT p50/p95/p99, end-to-end p95, cross-region requests\n" +
			"and egress, residency violations and load dispersion. --json prints one JSON array with one object\n" +
			"per policy (fields policy, hit_rate, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms, e2e_p95_ms,\n" +
			"cross_region_requests, egress_gb, residency_violations, load_dispersion).\n" +
			"With --load L1,L2,... it sweeps: arrivals scaled to each offered prefill utilisation, --seeds N\n" +
			"seeds each (with --window F, each seed replays its own window of the trace); --json then prints\n" +
			"{\"runs\": [...]}, one object per (load, policy) with load, utilization (achieved), policy, seeds,\n" +
			"hit_rate, ttft_p50_ms, ttft_p95_ms, ttft_p95_ci95_ms, e2e_p95_ms, load_dispersion,\n" +
			"cross_region_requests, egress_gb and residency_violations (means over seeds; violations summed).\n" +
			"--charts DIR writes SVG charts and report.json; --report FILE one self-contained HTML report.\n" +
			"Policies: " + strings.Join(sim.PolicyNames(), ", ") + "; --ablations adds " + strings.Join(sim.AblationNames(), ", ") + ".",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "trace", Usage: "Mooncake-format trace (JSON lines: timestamp, input_length, output_length, hash_ids)"},
			&cli.IntFlag{Name: "trace-block-size", Value: sim.TraceBlockSize, Usage: "tokens per hash id of the trace"},
			&cli.StringFlag{Name: "workload", Usage: "trace, coding, rag, short or shared-docs (default: trace with --trace)"},
			&cli.StringFlag{Name: "scenario", Usage: "where going global should pay: " + strings.Join(sim.ScenarioNames(), ", ")},
			&cli.IntFlag{Name: "region-count", Value: len(d.Fleet.Regions), Usage: "`N` regions, taken in this order: us-east-1, us-west-2, eu-west-1, ap-southeast-1, region-5, ..."},
			&cli.IntFlag{Name: "pods-per-region", Value: d.Fleet.PodsPerRegion, Usage: "pods in each region"},
			&cli.StringFlag{Name: "profiles", Value: strings.Join(d.Fleet.Profiles, ","), Usage: "hardware profiles cycled over each region's pods (h100, h200, b200)"},
			&cli.StringFlag{Name: "policy", Value: "all", Usage: "comma-separated policies, or all"},
			&cli.BoolFlag{Name: "ablations", Usage: "also run Meridian with its hardware, load, cache and affinity terms each off"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON array of per-policy objects instead of the table"},
			&cli.StringFlag{Name: "charts", Usage: "directory for the SVG charts and report.json"},
			&cli.StringFlag{Name: "report", Usage: "file for one self-contained HTML report with the run's parameters"},
			&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seed of every random draw"},
			&cli.Float64Flag{Name: "time-scale", Value: d.Workload.TimeScale, Usage: "multiply the trace's arrival rate (without --load)"},
			&cli.IntFlag{Name: "cache-tokens", Usage: "KV capacity per pod in tokens (default: the profile's)"},
			&cli.IntFlag{Name: "max-concurrency", Usage: "running requests per pod (default: the profile's)"},
			&cli.DurationFlag{Name: "duration", Value: d.Workload.Duration, Usage: "length of a synthetic workload"},
			&cli.IntFlag{Name: "limit", Usage: "replay only the first N requests of the trace"},
			&cli.StringFlag{Name: "load", Usage: "offered prefill utilisation, or a comma-separated list to sweep (default: the trace's own rate, 0.6 for synthetic workloads)"},
			&cli.IntFlag{Name: "seeds", Value: 1, Usage: "seeds per load of a sweep (needs --load)"},
			&cli.Float64Flag{Name: "window", Usage: "fraction of the trace each seed replays, at an offset drawn from the seed (0: all of it)"},
			&cli.Float64Flag{Name: "model-error", Usage: "each pod's engine is off what the router believes by up to this fraction"},
			&cli.Float64Flag{Name: "roam-share", Usage: "share of requests entering another region than their conversation's"},
			&cli.BoolFlag{Name: "no-calibration", Usage: "do not feed observed TTFTs to the cost model's calibrator"},
			&cli.IntFlag{Name: "sessions", Usage: "coding: concurrent agent users (default 2 per pod)"},
			&cli.StringFlag{Name: "origin-shares", Usage: "share of conversations per region, comma-separated (default equal)"},
			&cli.Float64Flag{Name: "eu-health-share", Value: d.Workload.EUHealthShare, Usage: "share of conversations of the EU PHI tenant eu-health"},
			&cli.StringFlag{Name: "residency", Usage: "residency policy file (default: the simulator's policy for the regions)"},
			&cli.Float64Flag{Name: "egress-usd-per-gb", Value: d.EgressUSDPerGB, Usage: "price of cross-region egress in the report"},
			&cli.DurationFlag{Name: "event-delay-min", Value: d.EventDelayMin, Usage: "least delay of a pod's KV events to the index"},
			&cli.DurationFlag{Name: "event-delay-max", Value: d.EventDelayMax, Usage: "largest delay of a pod's KV events to the index"},
			&cli.DurationFlag{Name: "summary-interval", Value: d.SummaryInterval, Usage: "rebuild period of each region's summary"},
			&cli.StringFlag{Name: "controller-config", Usage: "controller config file (as for meridian controller --config) whose decision and gorgo sections Meridian's policies use"},
			&cli.BoolFlag{Name: "quiet", Usage: "no progress bar"},
		},
		Action: func(c *cli.Context) error {
			cfg, sweep, err := simConfig(c)
			if err != nil {
				return usageError("sim: %w", err)
			}
			if err := cfg.Validate(); err != nil {
				return usageError("sim: %w", err)
			}
			// A batch run of short-lived worlds: trade memory for less GC.
			defer debug.SetGCPercent(debug.SetGCPercent(200))
			out := sim.Output{Stdout: c.App.Writer, JSON: c.Bool("json"), Charts: c.String("charts"), Report: c.String("report")}
			if !c.Bool("quiet") {
				out.Stderr = c.App.ErrWriter
			}
			return sim.Execute(c.Context, cfg, sweep, out)
		},
	}
}

func simConfig(c *cli.Context) (sim.Config, *sim.SweepConfig, error) {
	cfg, err := simBaseConfig(c)
	if err != nil {
		return cfg, nil, err
	}
	var loads []float64
	if s := c.String("load"); s != "" {
		for i, f := range strings.Split(s, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				return cfg, nil, fmt.Errorf("--load: entry %d %q: %w", i+1, f, err)
			}
			loads = append(loads, v)
		}
	}
	seeds := c.Int("seeds")
	switch {
	case seeds < 1 || seeds > 100:
		return cfg, nil, fmt.Errorf("--seeds %d: want 1 to 100", seeds)
	case len(loads) == 0 && seeds > 1:
		return cfg, nil, fmt.Errorf("--seeds needs --load")
	case len(loads) == 0:
		return cfg, nil, nil
	}
	return cfg, &sim.SweepConfig{Loads: loads, Seeds: seeds}, nil
}

func simBaseConfig(c *cli.Context) (sim.Config, error) {
	cfg := sim.DefaultConfig()
	n := c.Int("region-count")
	if n < 1 || n > 64 {
		return cfg, fmt.Errorf("--region-count %d: want 1 to 64", n)
	}
	cfg.Fleet.Regions = sim.RegionNames(n)
	cfg.Fleet.PodsPerRegion = c.Int("pods-per-region")
	cfg.Fleet.Profiles = strings.Split(c.String("profiles"), ",")
	cfg.Fleet.CacheTokens = c.Int("cache-tokens")
	cfg.Fleet.MaxConcurrency = c.Int("max-concurrency")
	cfg.Seed = c.Uint64("seed")
	w := &cfg.Workload
	w.TimeScale = c.Float64("time-scale")
	w.Duration = c.Duration("duration")
	w.Limit = c.Int("limit")
	w.Window = c.Float64("window")
	w.RoamShare = c.Float64("roam-share")
	w.Sessions = c.Int("sessions")
	w.EUHealthShare = c.Float64("eu-health-share")
	w.Kind = c.String("workload")
	trace := c.String("trace")
	switch {
	case w.Kind == "" && trace == "":
		return cfg, fmt.Errorf("give --trace FILE or --workload coding|rag|short")
	case w.Kind == "":
		w.Kind = sim.WorkloadTrace
	case w.Kind == sim.WorkloadTrace && trace == "":
		return cfg, fmt.Errorf("--workload trace needs --trace FILE")
	case w.Kind != sim.WorkloadTrace && trace != "":
		return cfg, fmt.Errorf("--trace is for --workload trace, not %q", w.Kind)
	}
	if trace != "" {
		bs := c.Int("trace-block-size")
		recs, err := sim.LoadTraceFile(trace, bs)
		if err != nil {
			return cfg, err
		}
		w.Trace = recs
		cfg.Fleet.BlockSize = bs
	}
	if s := c.String("origin-shares"); s != "" {
		for i, f := range strings.Split(s, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				return cfg, fmt.Errorf("--origin-shares: entry %d %q: %w", i+1, f, err)
			}
			w.OriginShares = append(w.OriginShares, v)
		}
	}
	if p := c.String("policy"); p != "all" {
		cfg.Policies = nil
		for _, name := range strings.Split(p, ",") {
			cfg.Policies = append(cfg.Policies, strings.TrimSpace(name))
		}
	}
	if c.Bool("ablations") {
		for _, a := range sim.AblationNames() {
			if !slices.Contains(cfg.Policies, a) {
				cfg.Policies = append(cfg.Policies, a)
			}
		}
	}
	if name := c.String("scenario"); name != "" {
		if err := sim.ApplyScenario(&cfg, name); err != nil {
			return cfg, err
		}
	}
	if path := c.String("residency"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("--residency: %w", err)
		}
		cfg.Residency = b
	}
	if path := c.String("controller-config"); path != "" {
		cc, err := regional.LoadConfig(path)
		if err != nil {
			return cfg, fmt.Errorf("--controller-config: %w", err)
		}
		cfg.Decision, cfg.Gorgo = cc.Decision, cc.Gorgo
	}
	cfg.ModelError = c.Float64("model-error")
	cfg.NoCalibration = c.Bool("no-calibration")
	cfg.EgressUSDPerGB = c.Float64("egress-usd-per-gb")
	cfg.EventDelayMin = c.Duration("event-delay-min")
	cfg.EventDelayMax = c.Duration("event-delay-max")
	cfg.SummaryInterval = c.Duration("summary-interval")
	return cfg, nil
}
