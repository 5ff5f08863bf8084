package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// collector gathers one world's figures.
type collector struct {
	policy                     string
	arrived                    int
	rejected                   int // no region or pod could take it
	denied                     int // refused by a receiving region (residency re-check)
	violations                 int // served in a region its residency rule forbids
	cross                      int // served outside the origin region
	egressBytes                float64
	blocksHit, blocks          int64
	tokensHit, tokens          int64
	ttfts, e2es                []float64 // ms
	dispSum                    float64
	dispN                      int
	reasons                    map[string]int
	indexErrors, summaryErrors int
	decisions                  int
	decideWall                 time.Duration
	keep                       bool   // keep every job that got its first byte (analysis)
	jobs                       []*job // with keep
}

// decided counts one decision (Decide, or Place with its remote
// candidates) and its wall time.
func (c *collector) decided(d time.Duration) { c.decisions++; c.decideWall += d }

func newCollector(policy string) *collector {
	return &collector{policy: policy, reasons: map[string]int{}}
}

func (c *collector) hit(j *job, cachedTokens int) {
	c.blocksHit += int64(j.h.Hit)
	c.blocks += int64(len(j.req.chain))
	c.tokensHit += int64(cachedTokens)
	c.tokens += int64(j.req.input)
}

func (c *collector) ttft(j *job, d time.Duration) {
	if c.keep {
		c.jobs = append(c.jobs, j)
	}
	c.ttfts = append(c.ttfts, float64(d)/float64(time.Millisecond))
}

func (c *collector) e2e(_ *job, d time.Duration) {
	c.e2es = append(c.e2es, float64(d)/float64(time.Millisecond))
}

func (c *collector) dispersion(v float64) { c.dispSum += v; c.dispN++ }

func (c *collector) reason(r string) { c.reasons[r]++ }

// Result is one policy's figures.
type Result struct {
	Policy string `json:"policy"`
	// HitRate is the block hit ratio: prompt blocks served from a pod's
	// cache at admission over all prompt blocks.
	HitRate float64 `json:"hit_rate"`
	// TokenHitRate is the same over prompt tokens.
	TokenHitRate float64 `json:"token_hit_rate"`
	// OfUpperBound is HitRate over the upper bound's (0 without one).
	OfUpperBound float64 `json:"of_upper_bound"`
	TTFTP50Ms    float64 `json:"ttft_p50_ms"`
	TTFTP95Ms    float64 `json:"ttft_p95_ms"`
	TTFTP99Ms    float64 `json:"ttft_p99_ms"`
	TTFTMeanMs   float64 `json:"ttft_mean_ms"`
	E2EP50Ms     float64 `json:"e2e_p50_ms"`
	E2EP95Ms     float64 `json:"e2e_p95_ms"`
	// CrossRegionRequests were served outside their origin region.
	CrossRegionRequests int     `json:"cross_region_requests"`
	EgressGB            float64 `json:"egress_gb"`
	EgressUSD           float64 `json:"egress_usd"`
	ResidencyViolations int     `json:"residency_violations"`
	// ResidencyRefused were refused by the region they were sent to: its
	// re-check of the residency rule said no (counted in Rejected too).
	ResidencyRefused int `json:"residency_refused"`
	// LoadDispersion is the mean over samples of variance / mean of the
	// per-pod concurrency (requests queued or running).
	LoadDispersion float64 `json:"load_dispersion"`
	// Utilization is the achieved prefill utilisation: the time the pods
	// spent on prefill over their time (see load.go).
	Utilization float64 `json:"utilization"`
	Requests    int     `json:"requests"`
	Completed   int     `json:"completed"`
	Rejected    int     `json:"rejected"`
	// Reasons counts Place's reasons (meridian only).
	Reasons map[string]int `json:"reasons,omitempty"`
	// SimulatedS is the virtual time the run covered; WallS what it took.
	SimulatedS float64 `json:"simulated_s"`
	WallS      float64 `json:"wall_s"`
	// Decisions made by the router's code (Decide, or Place with its
	// remote candidates), and their mean wall time in microseconds;
	// HeapMB is the Go heap in use once the world has run (the world's
	// memory when worlds run one at a time). Wall-clock figures, not
	// deterministic.
	Decisions int     `json:"decisions"`
	DecideUs  float64 `json:"decide_us"`
	HeapMB    float64 `json:"heap_mb"`
	// TTFTQuantiles are the TTFT at quantiles 0, 0.005, ..., 1 (ms), for
	// the CDF chart.
	TTFTQuantiles []float64 `json:"ttft_quantiles_ms,omitempty"`
}

func (c *collector) result(cfg *Config, simulated time.Duration) Result {
	r := Result{Policy: c.policy, Requests: c.arrived, Completed: len(c.e2es), Rejected: c.rejected + c.denied,
		CrossRegionRequests: c.cross, ResidencyViolations: c.violations, ResidencyRefused: c.denied, SimulatedS: simulated.Seconds()}
	if c.blocks > 0 {
		r.HitRate = float64(c.blocksHit) / float64(c.blocks)
	}
	if c.tokens > 0 {
		r.TokenHitRate = float64(c.tokensHit) / float64(c.tokens)
	}
	t := slices.Clone(c.ttfts)
	slices.Sort(t)
	e := slices.Clone(c.e2es)
	slices.Sort(e)
	r.TTFTP50Ms, r.TTFTP95Ms, r.TTFTP99Ms = quantile(t, 0.5), quantile(t, 0.95), quantile(t, 0.99)
	r.E2EP50Ms, r.E2EP95Ms = quantile(e, 0.5), quantile(e, 0.95)
	if len(t) > 0 {
		s := 0.0
		for _, v := range t {
			s += v
		}
		r.TTFTMeanMs = s / float64(len(t))
		for i := 0; i <= 200; i++ {
			r.TTFTQuantiles = append(r.TTFTQuantiles, quantile(t, float64(i)/200))
		}
	}
	r.EgressGB = c.egressBytes / 1e9
	r.EgressUSD = r.EgressGB * cfg.EgressUSDPerGB
	if c.dispN > 0 {
		r.LoadDispersion = c.dispSum / float64(c.dispN)
	}
	if len(c.reasons) > 0 {
		r.Reasons = c.reasons
	}
	r.Decisions = c.decisions
	if c.decisions > 0 {
		r.DecideUs = float64(c.decideWall) / float64(c.decisions) / float64(time.Microsecond)
	}
	return r
}

// quantile is the nearest-rank quantile of sorted values (0 when empty).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Report is a whole run: every policy's result, in the configured order.
type Report struct {
	Workload string   `json:"workload"`
	Regions  []string `json:"regions"`
	Pods     int      `json:"pods"`
	Seed     uint64   `json:"seed"`
	// OfferedLoad is the offered prefill utilisation of the open-loop
	// requests (0 for the closed-loop coding workload).
	OfferedLoad float64  `json:"offered_load"`
	Results     []Result `json:"results"`
}

// Result returns the named policy's result.
func (r *Report) Result(policy string) (Result, bool) {
	for _, x := range r.Results {
		if x.Policy == policy {
			return x, true
		}
	}
	return Result{}, false
}

// Row is the --json record of one policy: exactly these fields.
type Row struct {
	Policy              string  `json:"policy"`
	HitRate             float64 `json:"hit_rate"`
	TTFTP50Ms           float64 `json:"ttft_p50_ms"`
	TTFTP95Ms           float64 `json:"ttft_p95_ms"`
	TTFTP99Ms           float64 `json:"ttft_p99_ms"`
	E2EP95Ms            float64 `json:"e2e_p95_ms"`
	CrossRegionRequests int     `json:"cross_region_requests"`
	EgressGB            float64 `json:"egress_gb"`
	ResidencyViolations int     `json:"residency_violations"`
	LoadDispersion      float64 `json:"load_dispersion"`
}

// Rows returns the --json records.
func (r *Report) Rows() []Row {
	out := make([]Row, 0, len(r.Results))
	for _, x := range r.Results {
		out = append(out, Row{Policy: x.Policy, HitRate: x.HitRate, TTFTP50Ms: x.TTFTP50Ms, TTFTP95Ms: x.TTFTP95Ms,
			TTFTP99Ms: x.TTFTP99Ms, E2EP95Ms: x.E2EP95Ms, CrossRegionRequests: x.CrossRegionRequests,
			EgressGB: x.EgressGB, ResidencyViolations: x.ResidencyViolations, LoadDispersion: x.LoadDispersion})
	}
	return out
}

// WriteJSON writes the rows as one JSON array.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.Rows())
}

// WriteTable writes the report as an aligned table.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "workload %s, %d regions (%s), %d pods, seed %d\n\n", r.Workload, len(r.Regions),
		strings.Join(r.Regions, ", "), r.Pods, r.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\thit blocks\thit tokens\tof bound\tTTFT p50\tp95\tp99\te2e p95\tcross-region\tegress GB\tegress $\tresidency viol.\tload disp.\trequests\t")
	for _, x := range r.Results {
		of := "-"
		if x.OfUpperBound > 0 {
			of = fmt.Sprintf("%.1f%%", 100*x.OfUpperBound)
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%.1f%%\t%s\t%s\t%s\t%s\t%s\t%d\t%.4f\t%.4f\t%d\t%.2f\t%d\t\n", x.Policy,
			100*x.HitRate, 100*x.TokenHitRate, of, ms(x.TTFTP50Ms), ms(x.TTFTP95Ms), ms(x.TTFTP99Ms), ms(x.E2EP95Ms),
			x.CrossRegionRequests, x.EgressGB, x.EgressUSD, x.ResidencyViolations, x.LoadDispersion, x.Requests)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, x := range r.Results {
		fmt.Fprintf(w, "%s: %d decisions, %.1f us each (wall), heap %.0f MB after the run\n", x.Policy, x.Decisions, x.DecideUs, x.HeapMB)
	}
	return nil
}

// ms formats milliseconds for the table.
func ms(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1fs", v/1000)
	}
	return fmt.Sprintf("%.0fms", v)
}

func writeIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
