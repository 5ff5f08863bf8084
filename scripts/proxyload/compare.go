package main

// compare measures several targets at one rate in one run, for A/B
// comparisons: drive's search measures its targets one after another,
// and on a shared machine the order decided more than the builds
// compared (in docs/perf/proxy-tail.md's stop 42 section the target
// measured first had the lower added p99 in 6 of 7 pairs). Here the
// proxied arm goes to each target in turn for a slice (-alternate), all
// targets' connections open throughout, so that each target's samples
// come from the same stretch of the machine's load, spread over it, and
// what drifts in the machine lands on each alike. The direct arm runs
// throughout; each target's added latency is taken against the direct
// requests of its own slices. The start of each slice is not measured
// (-slice-warmup): a target that sat idle for the other's slices warms
// up first, as a target measured alone would have.

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// compareJSON is one target's line of a comparison.
type compareJSON struct {
	Proxy         string             `json:"proxy"`
	RPS           float64            `json:"rps"`
	AddedP50us    float64            `json:"added_p50_us"`
	AddedP99us    float64            `json:"added_p99_us"`
	AddedP50CI    [2]float64         `json:"added_p50_ci95_us"`
	AddedP99CI    [2]float64         `json:"added_p99_ci95_us"`
	Verdict       verdict            `json:"verdict"` // of added p99 <= max_added_us
	MaxAddedUS    float64            `json:"max_added_us"`
	Samples       int                `json:"samples"`
	DirectSamples int                `json:"direct_samples"`
	LateShare     float64            `json:"late_share"`
	WorkerLate    float64            `json:"worker_late_share"`
	QueuedShare   float64            `json:"queued_share"`
	Failed        int                `json:"failed"`
	CPU           map[string]float64 `json:"cpu_cores"` // over its slices
	P50us         float64            `json:"p50_us"`
	P99us         float64            `json:"p99_us"`
	DirectP50us   float64            `json:"direct_p50_us"`
	DirectP99us   float64            `json:"direct_p99_us"`
	Alternate     string             `json:"alternate"`
	Load          string             `json:"load"`
}

// differenceJSON is the line of a pair of targets: what the first adds
// less what the second adds.
type differenceJSON struct {
	Compare    string     `json:"compare"` // "A-B"
	RPS        float64    `json:"rps"`
	P50DiffUS  float64    `json:"added_p50_diff_us"`
	P50DiffCI  [2]float64 `json:"added_p50_diff_ci95_us"`
	P99DiffUS  float64    `json:"added_p99_diff_us"`
	P99DiffCI  [2]float64 `json:"added_p99_diff_ci95_us"`
	Difference string     `json:"difference"` // of added p99: "A lower", "B lower" or "none shown" (the CI holds 0)
}

// compare runs the targets open (named names, in arm order) at rate with
// slicing sl: an unmeasured run of warmup per target, then one measured
// until each target has samples requests in both arms (or length per
// target). It prints a line per target and one per pair.
func (d *driver) compare(names []string, rate, ratio float64, samples int, length, warmup time.Duration, sl slicing, c criteria) error {
	if warmup > 0 {
		d.run(rate, ratio, 0, warmup, sl)
	}
	ws := d.run(rate, ratio, samples, length, sl)
	ests := make([]estimate, len(ws))
	for k, w := range ws {
		e := estimateAdded(w, c.resamples, c.seed)
		ests[k] = e
		v := decide(e, w.lateShare(), c)
		fmt.Fprintf(os.Stderr, "proxyload: %s at %.0f req/s (+%.0f direct), alternating every %v: %s, added p50 %.0f us, p99 %.0f us [%.0f, %.0f] "+
			"(direct p50 %.0f p99 %.0f us; %d+%d samples, late %.2f%% (workers %.2f%%), cores %v; load %s)\n",
			names[k], rate, rate*ratio, sl.every, v, e.p50, e.p99, e.p99CI[0], e.p99CI[1], e.directP50, e.directP99,
			len(w.proxied), len(w.direct), 100*w.lateShare(), 100*w.workerLateShare(), d.cpu(w), loadavg())
		if err := printJSON(compareJSON{Proxy: names[k], RPS: rate, AddedP50us: r1(e.p50), AddedP99us: r1(e.p99),
			AddedP50CI: r2(e.p50CI), AddedP99CI: r2(e.p99CI), Verdict: v, MaxAddedUS: c.limit,
			Samples: len(w.proxied), DirectSamples: len(w.direct), LateShare: w.lateShare(), WorkerLate: w.workerLateShare(),
			QueuedShare: share(w.queued, w.offered), Failed: failed(w), CPU: d.cpu(w),
			P50us: r1(e.proxiedP50), P99us: r1(e.proxiedP99), DirectP50us: r1(e.directP50), DirectP99us: r1(e.directP99),
			Alternate: sl.every.String(), Load: loadavg()}); err != nil {
			return err
		}
	}
	for a := range ws {
		for b := a + 1; b < len(ws); b++ {
			df := estimateDifference(ws[a], ws[b], c.resamples, c.seed)
			fmt.Fprintf(os.Stderr, "proxyload: %s less %s: added p50 %+.0f us [%.0f, %.0f], p99 %+.0f us [%.0f, %.0f]: %s\n",
				names[a], names[b], df.p50, df.p50CI[0], df.p50CI[1], df.p99, df.p99CI[0], df.p99CI[1], lower(df.p99CI, names[a], names[b]))
			if err := printJSON(differenceJSON{Compare: names[a] + "-" + names[b], RPS: rate,
				P50DiffUS: r1(df.p50), P50DiffCI: r2(df.p50CI), P99DiffUS: r1(df.p99), P99DiffCI: r2(df.p99CI),
				Difference: lower(df.p99CI, names[a], names[b])}); err != nil {
				return err
			}
		}
	}
	return nil
}

// lower reads the CI of a difference a - b: which is lower, or none shown
// when it holds 0 (or is undefined).
func lower(ci [2]float64, a, b string) string {
	switch {
	case ci[1] < 0:
		return a + " lower"
	case ci[0] > 0:
		return b + " lower"
	}
	return "none shown"
}

func printJSON(v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}
