package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// SweepConfig is a load sweep: every policy of a Config at each load, each
// repeated over Seeds seeds (seed, seed+1, ...: the workload's random
// draws, the residency attributes and, with Workload.Window, the window of
// the trace all change with the seed).
type SweepConfig struct {
	Loads []float64
	Seeds int
}

// SweepRun is one (load, policy) of a sweep, over its seeds: means, and a
// 95% confidence interval of the mean TTFT p95 (Student's t over the
// seeds' p95s). Residency violations are summed over the seeds (the target
// is 0); cross-region requests and egress are means per seed.
type SweepRun struct {
	Load                float64    `json:"load"`
	Utilization         float64    `json:"utilization"`
	Policy              string     `json:"policy"`
	Seeds               int        `json:"seeds"`
	HitRate             float64    `json:"hit_rate"`
	TTFTP50Ms           float64    `json:"ttft_p50_ms"`
	TTFTP95Ms           float64    `json:"ttft_p95_ms"`
	TTFTP95CI95Ms       [2]float64 `json:"ttft_p95_ci95_ms"`
	E2EP95Ms            float64    `json:"e2e_p95_ms"`
	LoadDispersion      float64    `json:"load_dispersion"`
	CrossRegionRequests float64    `json:"cross_region_requests"`
	EgressGB            float64    `json:"egress_gb"`
	ResidencyViolations int        `json:"residency_violations"`
}

// SweepReport is a whole sweep: the rows, and every world's result.
type SweepReport struct {
	Workload string    `json:"workload"`
	Regions  []string  `json:"regions"`
	Pods     int       `json:"pods"`
	Seed     uint64    `json:"seed"`
	Seeds    int       `json:"seeds"`
	Loads    []float64 `json:"loads"`
	Policies []string  `json:"policies"`
	// Offered[l][k] is the offered load of seed k at load l (0 for the
	// closed-loop coding workload).
	Offered [][]float64 `json:"offered"`
	Runs    []SweepRun  `json:"runs"`
	// Results[l][k] is seed k's report at load l.
	Results [][][]Result `json:"results"`
	// Params are the run's parameters, for the report.
	Params map[string]string `json:"params"`
}

// Sweep runs cfg's policies at every load and seed, all worlds side by
// side (Parallel at a time, one progress bar), and aggregates them. It is
// deterministic like Run.
func Sweep(ctx context.Context, cfg Config, sc SweepConfig, opts Options) (*SweepReport, error) {
	if len(sc.Loads) == 0 {
		return nil, fmt.Errorf("%w: sweep: no loads", ErrInvalidConfig)
	}
	if sc.Seeds < 1 || sc.Seeds > 100 {
		return nil, fmt.Errorf("%w: sweep: seeds = %d, want 1..100", ErrInvalidConfig, sc.Seeds)
	}
	for i, l := range sc.Loads {
		if !(l > 0 && l <= 10) {
			return nil, fmt.Errorf("%w: sweep: loads[%d] = %v, want 0 < load <= 10", ErrInvalidConfig, i, l)
		}
	}
	rep := &SweepReport{Workload: cfg.Workload.Kind, Regions: cfg.Fleet.Regions, Seed: cfg.Seed, Seeds: sc.Seeds,
		Loads: sc.Loads, Policies: cfg.Policies}
	var tasks []*task
	grid := make([][][]*task, len(sc.Loads))
	for li, load := range sc.Loads {
		grid[li] = make([][]*task, sc.Seeds)
		rep.Offered = append(rep.Offered, make([]float64, sc.Seeds))
		for k := range sc.Seeds {
			c := cfg
			c.Workload.Load = load
			c.Seed = cfg.Seed + uint64(k)
			in, err := prepare(c)
			if err != nil {
				return nil, err
			}
			rep.Pods = len(in.fleet.pods)
			rep.Offered[li][k] = in.offered
			for _, p := range cfg.Policies {
				t := &task{in: in, policy: p}
				grid[li][k] = append(grid[li][k], t)
				tasks = append(tasks, t)
			}
		}
	}
	if err := runTasks(ctx, tasks, opts); err != nil {
		return nil, err
	}
	for li, load := range sc.Loads {
		rep.Results = append(rep.Results, make([][]Result, sc.Seeds))
		for k := range sc.Seeds {
			for _, t := range grid[li][k] {
				rep.Results[li][k] = append(rep.Results[li][k], *t.res)
			}
		}
		for pi, p := range cfg.Policies {
			var rs []Result
			for k := range sc.Seeds {
				rs = append(rs, rep.Results[li][k][pi])
			}
			rep.Runs = append(rep.Runs, aggregate(load, p, rs))
		}
	}
	rep.Params = cfg.params(sc)
	return rep, nil
}

// aggregate is one sweep row from its seeds' results.
func aggregate(load float64, policy string, rs []Result) SweepRun {
	r := SweepRun{Load: load, Policy: policy, Seeds: len(rs)}
	var p95s []float64
	for _, x := range rs {
		r.Utilization += x.Utilization
		r.HitRate += x.HitRate
		r.TTFTP50Ms += x.TTFTP50Ms
		r.TTFTP95Ms += x.TTFTP95Ms
		r.E2EP95Ms += x.E2EP95Ms
		r.LoadDispersion += x.LoadDispersion
		r.CrossRegionRequests += float64(x.CrossRegionRequests)
		r.EgressGB += x.EgressGB
		r.ResidencyViolations += x.ResidencyViolations
		p95s = append(p95s, x.TTFTP95Ms)
	}
	n := float64(len(rs))
	r.Utilization /= n
	r.HitRate /= n
	r.TTFTP50Ms /= n
	r.TTFTP95Ms /= n
	r.E2EP95Ms /= n
	r.LoadDispersion /= n
	r.CrossRegionRequests /= n
	r.EgressGB /= n
	lo, hi := ci95(p95s)
	r.TTFTP95CI95Ms = [2]float64{lo, hi}
	return r
}

// ci95 is the 95% confidence interval of the mean of xs (Student's t with
// n-1 degrees of freedom; the mean itself for one value).
func ci95(xs []float64) (float64, float64) {
	n := len(xs)
	mean := 0.0
	for _, x := range xs {
		mean += x
	}
	mean /= float64(n)
	if n < 2 {
		return mean, mean
	}
	ss := 0.0
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	half := tQuantile975(n-1) * math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	return mean - half, mean + half
}

// tQuantile975 is Student's t 0.975 quantile for df degrees of freedom.
func tQuantile975(df int) float64 {
	table := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df >= 1 && df <= len(table) {
		return table[df-1]
	}
	return 1.96
}

// Run returns the sweep row of a policy at a load.
func (r *SweepReport) Run(load float64, policy string) (SweepRun, bool) {
	for _, x := range r.Runs {
		if x.Load == load && x.Policy == policy {
			return x, true
		}
	}
	return SweepRun{}, false
}

// WriteJSON writes {"runs": [...]}: one object per (load, policy).
func (r *SweepReport) WriteJSON(w io.Writer) error {
	return writeIndentedJSON(w, struct {
		Runs []SweepRun `json:"runs"`
	}{r.Runs})
}

// WriteTable writes the rows as an aligned table, one block per load.
func (r *SweepReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "workload %s, %d regions (%s), %d pods, seeds %d..%d\n", r.Workload, len(r.Regions),
		strings.Join(r.Regions, ", "), r.Pods, r.Seed, r.Seed+uint64(r.Seeds)-1)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tachieved\tpolicy\thit\tTTFT p50\tp95\tp95 95% CI\te2e p95\tcross-region\tegress GB\tviol.\tdisp.\t")
	for _, x := range r.Runs {
		fmt.Fprintf(tw, "%.2f\t%.2f\t%s\t%.1f%%\t%s\t%s\t%s..%s\t%s\t%.0f\t%.4f\t%d\t%.2f\t\n", x.Load, x.Utilization, x.Policy,
			100*x.HitRate, ms(x.TTFTP50Ms), ms(x.TTFTP95Ms), ms(x.TTFTP95CI95Ms[0]), ms(x.TTFTP95CI95Ms[1]), ms(x.E2EP95Ms),
			x.CrossRegionRequests, x.EgressGB, x.ResidencyViolations, x.LoadDispersion)
	}
	return tw.Flush()
}

// params lists a run's parameters for the report.
func (c *Config) params(sc SweepConfig) map[string]string {
	w := &c.Workload
	p := map[string]string{
		"workload":        w.Kind,
		"regions":         strings.Join(c.Fleet.Regions, ", "),
		"pods per region": fmt.Sprint(c.Fleet.PodsPerRegion),
		"profiles":        strings.Join(c.Fleet.Profiles, ", "),
		"block size":      fmt.Sprint(c.Fleet.BlockSize),
		"policies":        strings.Join(c.Policies, ", "),
		"seeds":           fmt.Sprintf("%d (from %d)", sc.Seeds, c.Seed),
		"model error":     fmt.Sprint(c.ModelError),
		"calibration":     fmt.Sprint(!c.NoCalibration),
		"event delay":     fmt.Sprintf("%v..%v", c.EventDelayMin, c.EventDelayMax),
		"summary":         c.SummaryInterval.String(),
		"origin shares":   fmt.Sprint(w.OriginShares),
		"class shares":    fmt.Sprint(w.ClassShares),
		"eu-health share": fmt.Sprint(w.EUHealthShare),
		"roam share":      fmt.Sprint(w.RoamShare),
	}
	var loads []string
	for _, l := range sc.Loads {
		loads = append(loads, fmt.Sprint(l))
	}
	p["loads"] = strings.Join(loads, ", ")
	switch w.Kind {
	case WorkloadTrace:
		p["trace requests"] = fmt.Sprint(len(w.Trace))
		p["window"] = fmt.Sprint(w.Window)
	case WorkloadCoding:
		p["duration"] = w.Duration.String()
		p["sessions"] = fmt.Sprint(w.Sessions)
	default:
		p["duration"] = w.Duration.String()
	}
	if w.FailRegion != "" {
		p["failure"] = fmt.Sprintf("%s from %.2f to %.2f of the run", w.FailRegion, w.FailFrom, w.FailTo)
	}
	if b, err := json.Marshal(c.Decision); err == nil {
		p["decision"] = string(b)
	}
	if b, err := json.Marshal(c.Gorgo); err == nil {
		p["gorgo"] = string(b)
	}
	return p
}
