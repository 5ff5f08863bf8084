package main

// The statistics of drive, apart from its I/O so that they can be tested
// on synthetic samples: percentiles of the two arms of a paired window,
// a bootstrap confidence interval of their difference, the verdict of one
// rate (pass, fail, straddle or invalid) with bounded re-measurement, and
// the search for the highest rate that passes.

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// window is one paired measurement at one rate: the latencies (in
// microseconds, from each request's due time; +Inf for a request that
// failed or did not complete) of the requests sent straight to the
// backend and of those sent through the proxy, taken from one schedule.
type window struct {
	direct, proxied []float64
	// directRound and proxiedRound, when set (by an alternating run), are
	// the round of each sample: the cycle of slices, one per target, it
	// fell in. The samples of one round are not independent (a stall of
	// the machine slows a run of them), so intervals resample rounds.
	directRound, proxiedRound []int32
	// offered is how many requests the schedule held; late how many of
	// them the pacer took up more than a millisecond after they were due
	// (the schedule was not offered: the window is invalid above
	// maxLate); workerLate how many were written more than a millisecond
	// after that (reported, not judged; see pacerLate); queued how many
	// waited for a free connection (that wait is the proxy's queue,
	// counted in neither late nor workerLate).
	offered, late, workerLate, queued int
	// genCPU is the generator's own CPU time in the window and procCPU
	// that of each process group it was told of (-procs; core-seconds),
	// wall its length in seconds.
	genCPU, wall float64
	procCPU      []float64
}

// add pools o into w: paired windows at the same rate measure the same
// difference, so their samples can be taken together.
func (w *window) add(o window) {
	w.direct = append(w.direct, o.direct...)
	w.proxied = append(w.proxied, o.proxied...)
	// o's rounds follow w's: pooled windows were measured one after the
	// other.
	next := int32(0)
	for _, r := range [][]int32{w.directRound, w.proxiedRound} {
		if len(r) > 0 {
			next = max(next, slices.Max(r)+1)
		}
	}
	for _, r := range o.directRound {
		w.directRound = append(w.directRound, next+r)
	}
	for _, r := range o.proxiedRound {
		w.proxiedRound = append(w.proxiedRound, next+r)
	}
	w.offered += o.offered
	w.late += o.late
	w.workerLate += o.workerLate
	w.queued += o.queued
	w.genCPU += o.genCPU
	w.wall += o.wall
	if w.procCPU == nil {
		w.procCPU = make([]float64, len(o.procCPU))
	}
	for i, c := range o.procCPU {
		w.procCPU[i] += c
	}
}

// lateShare is the share of the requests offered that the pacer took up
// late: what judge and decide hold against -max-late.
func (w *window) lateShare() float64 { return share(w.late, w.offered) }

// workerLateShare is the share of the requests offered that were written
// over a millisecond after the pacer took them up: reported, never
// judged.
func (w *window) workerLateShare() float64 { return share(w.workerLate, w.offered) }

// maxLag is how late a request may be taken up, or written after that,
// and still count as on time.
const maxLag = time.Millisecond

// How late a request was sent, measured from due, is split in two: the
// pacer's lag (dispatched - due: the pacer took it up, to write it or to
// queue it, that late) and the start delay (sent - dispatched: from then
// to writing it). Each counts when over maxLag. The pacer now writes
// most requests itself, so the start delay is the time to build one,
// plus a dial for a connection the other end had closed; when a worker
// goroutine was handed each request to write (before), it was mostly
// that worker's wait for a CPU. A queued request has no start delay: it
// waited for a connection to come free, which is the proxy's queue.
//
// Why only the pacer's lag makes a window invalid: the schedule is open
// loop and every latency counts from due, so neither delay is hidden
// from the latencies; what a late pacer breaks is the schedule itself,
// since the requests it did not take up in time were not offered at the
// rate claimed (they come later, in a bunch, and the proxy rested
// meanwhile). A goroutine's wait for a CPU after that (the writer's
// before, a reader's before it reads an answer) is the machine being
// busy at that rate (proxy, backend and generator share the cores): the
// request was offered on time, and since each request's arm is drawn at
// random both arms wait alike, so the delay lands in both distributions
// of the paired difference, like any other load effect. Counting it as
// the generator's lag, as drive did before, judged windows invalid at
// the very rates where the proxies load the machine, which is what is to
// be measured.

// pacerLate reports whether a request due at due and taken up by the
// pacer at dispatched was offered late.
func pacerLate(due, dispatched time.Time) bool { return dispatched.Sub(due) > maxLag }

// workerLate reports whether a request taken up at dispatched and
// written at sent started late; never when it was queued for a free
// connection.
func workerLate(dispatched, sent time.Time, queued bool) bool {
	return !queued && sent.Sub(dispatched) > maxLag
}

// qIndex is the index in n sorted samples of the p-quantile: the sample
// with floor(n*p) samples below it.
func qIndex(n int, p float64) int {
	return min(int(float64(n)*p), n-1)
}

// quantile of sorted samples (NaN when there are none).
func quantile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[qIndex(len(sorted), p)]
}

// estimate is what a window says a proxy adds: added pXX = pXX(proxied) -
// pXX(direct), with percentile-bootstrap 95% confidence intervals.
type estimate struct {
	directP50, directP99, proxiedP50, proxiedP99 float64
	p50, p99                                     float64
	p50CI, p99CI                                 [2]float64
}

// ps are the percentiles that estimate reports, ascending.
var ps = []float64{0.50, 0.99}

// estimateAdded estimates the added p50 and p99 of w with resamples
// bootstrap resamples of each arm (drawn with replacement, the same size
// as the arm, independently: the arms are independent samples of the
// same seconds), or, when both arms carry their rounds, of the rounds (the
// same for both arms; see estimateDifference). seed fixes the resamples,
// so the same samples give the same interval.
func estimateAdded(w window, resamples int, seed uint64) estimate {
	d := sortedArm(w.direct, w.directRound)
	p := sortedArm(w.proxied, w.proxiedRound)
	e := estimate{
		directP50: quantile(d.lat, 0.50), directP99: quantile(d.lat, 0.99),
		proxiedP50: quantile(p.lat, 0.50), proxiedP99: quantile(p.lat, 0.99),
	}
	e.p50, e.p99 = e.proxiedP50-e.directP50, e.proxiedP99-e.directP99
	if len(d.lat) == 0 || len(p.lat) == 0 || resamples <= 0 {
		nan := [2]float64{math.NaN(), math.NaN()}
		e.p50CI, e.p99CI = nan, nan
		return e
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	diff50 := make([]float64, resamples)
	diff99 := make([]float64, resamples)
	qd, qp := make([]float64, len(ps)), make([]float64, len(ps))
	cd, cp := make([]int32, len(d.lat)), make([]int32, len(p.lat))
	var weights []int32
	if d.round != nil && p.round != nil {
		weights = make([]int32, max(slices.Max(d.round), slices.Max(p.round))+1)
	}
	for b := range resamples {
		if weights != nil {
			drawRounds(weights, rng)
			weightedQuantiles(d.lat, d.round, weights, ps, qd)
			weightedQuantiles(p.lat, p.round, weights, ps, qp)
		} else {
			resampleQuantiles(d.lat, ps, cd, qd, rng)
			resampleQuantiles(p.lat, ps, cp, qp, rng)
		}
		diff50[b], diff99[b] = qp[0]-qd[0], qp[1]-qd[1]
	}
	e.p50CI, e.p99CI = ci95(diff50), ci95(diff99)
	return e
}

// drawRounds draws len(weights) rounds with replacement and counts each
// round's draws in weights.
func drawRounds(weights []int32, rng *rand.Rand) {
	clear(weights)
	for range weights {
		weights[rng.IntN(len(weights))]++
	}
}

// difference is what two targets' windows, taken in alternating slices
// of one run, say of their added latencies: added pXX of a less that of
// b, with percentile-bootstrap 95% confidence intervals.
type difference struct {
	p50, p99     float64
	p50CI, p99CI [2]float64
}

// estimateDifference estimates the difference of a's and b's added p50
// and p99 with resamples bootstrap resamples. When the four arms carry
// their rounds, the rounds are resampled, the same for all four (a
// paired block bootstrap: a round's samples stay together and with the
// other target's of the same seconds); otherwise each arm's requests,
// independently, as in estimateAdded. seed fixes the resamples.
func estimateDifference(a, b window, resamples int, seed uint64) difference {
	arms := []roundSamples{sortedArm(a.direct, a.directRound), sortedArm(a.proxied, a.proxiedRound),
		sortedArm(b.direct, b.directRound), sortedArm(b.proxied, b.proxiedRound)}
	added := func(q [][]float64, j int) float64 { return (q[1][j] - q[0][j]) - (q[3][j] - q[2][j]) }
	q := make([][]float64, len(arms))
	blocks, rounds := true, int32(0)
	for i, v := range arms {
		q[i] = []float64{quantile(v.lat, ps[0]), quantile(v.lat, ps[1])}
		if v.round == nil {
			blocks = false
		}
		for _, r := range v.round {
			rounds = max(rounds, r+1)
		}
	}
	var out difference
	out.p50, out.p99 = added(q, 0), added(q, 1)
	nan := [2]float64{math.NaN(), math.NaN()}
	out.p50CI, out.p99CI = nan, nan
	for _, v := range arms {
		if len(v.lat) == 0 {
			return out
		}
	}
	if resamples <= 0 {
		return out
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	diff50 := make([]float64, resamples)
	diff99 := make([]float64, resamples)
	counts := make([][]int32, len(arms))
	for i, v := range arms {
		counts[i] = make([]int32, len(v.lat))
	}
	weights := make([]int32, rounds)
	for r := range resamples {
		if blocks {
			drawRounds(weights, rng)
		}
		for i, v := range arms {
			if blocks {
				weightedQuantiles(v.lat, v.round, weights, ps, q[i])
			} else {
				resampleQuantiles(v.lat, ps, counts[i], q[i], rng)
			}
		}
		diff50[r], diff99[r] = added(q, 0), added(q, 1)
	}
	out.p50CI, out.p99CI = ci95(diff50), ci95(diff99)
	return out
}

// roundSamples is an arm's latencies, sorted, with the round of each
// (nil when the arm has none).
type roundSamples struct {
	lat   []float64
	round []int32
}

// sortedArm sorts lat, and round along with it when it is as long.
func sortedArm(lat []float64, round []int32) roundSamples {
	if len(round) != len(lat) || len(lat) == 0 {
		return roundSamples{lat: slices.Sorted(slices.Values(lat))}
	}
	idx := make([]int, len(lat))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(x, y int) int { return cmp.Compare(lat[x], lat[y]) })
	out := roundSamples{lat: make([]float64, len(lat)), round: make([]int32, len(lat))}
	for i, j := range idx {
		out.lat[i], out.round[i] = lat[j], round[j]
	}
	return out
}

// weightedQuantiles writes to out the ps-quantiles (ascending ps) of the
// samples sorted, each counted weights[round[i]] times: those of a
// resample of rounds. With no weight in all, out is NaN.
// weightedQuantilesNaive is the reference.
func weightedQuantiles(sorted []float64, round, weights []int32, ps, out []float64) {
	total := 0
	for _, r := range round {
		total += int(weights[r])
	}
	if total == 0 {
		for j := range out {
			out[j] = math.NaN()
		}
		return
	}
	j, cum := 0, 0
	for i, r := range round {
		cum += int(weights[r])
		for j < len(ps) && cum > qIndex(total, ps[j]) {
			out[j] = sorted[i]
			j++
		}
		if j == len(ps) {
			return
		}
	}
}

// weightedQuantilesNaive is weightedQuantiles done the obvious way: each
// sample repeated by its round's weight, sorted, and picked.
func weightedQuantilesNaive(lat []float64, round, weights []int32, ps, out []float64) {
	var all []float64
	for i, l := range lat {
		for range weights[round[i]] {
			all = append(all, l)
		}
	}
	slices.Sort(all)
	for j, p := range ps {
		out[j] = quantile(all, p)
	}
}

// ci95 is the 2.5th and 97.5th percentiles of the bootstrap differences
// (NaN if any is NaN: an arm where over 1% of the requests failed has no
// finite p99, and a difference of two infinite ones says nothing).
func ci95(diffs []float64) [2]float64 {
	if slices.ContainsFunc(diffs, math.IsNaN) {
		return [2]float64{math.NaN(), math.NaN()}
	}
	slices.Sort(diffs)
	return [2]float64{quantile(diffs, 0.025), quantile(diffs, 0.975)}
}

// resampleQuantiles draws len(sorted) samples of sorted with replacement
// and writes their ps-quantiles (ascending ps) to out. It counts how often
// each index is drawn instead of sorting the draws: sorted is sorted, so
// the k-th smallest draw is the value at the k-th smallest index drawn.
// counts is scratch of len(sorted). resampleQuantilesNaive is the
// reference: with the same random stream both give the same answer.
func resampleQuantiles(sorted, ps []float64, counts []int32, out []float64, rng *rand.Rand) {
	n := len(sorted)
	clear(counts)
	for range n {
		counts[rng.IntN(n)]++
	}
	j, cum := 0, 0
	for i, c := range counts {
		cum += int(c)
		for j < len(ps) && cum > qIndex(n, ps[j]) {
			out[j] = sorted[i]
			j++
		}
		if j == len(ps) {
			return
		}
	}
}

// resampleQuantilesNaive is resampleQuantiles done the obvious way.
func resampleQuantilesNaive(sorted, ps []float64, out []float64, rng *rand.Rand) {
	n := len(sorted)
	draws := make([]float64, n)
	for i := range draws {
		draws[i] = sorted[rng.IntN(n)]
	}
	slices.Sort(draws)
	for j, p := range ps {
		out[j] = quantile(draws, p)
	}
}

// verdict of one rate.
type verdict string

const (
	pass     verdict = "pass"     // the whole CI of added p99 is within the limit
	fail     verdict = "fail"     // the whole CI is above it
	straddle verdict = "straddle" // the CI holds the limit: not known
	invalid  verdict = "invalid"  // the generator fell behind, or a CI is undefined
)

// criteria of a sustained rate.
type criteria struct {
	limit     float64 // added p99 that still counts as sustained, microseconds
	maxLate   float64 // share of requests sent late above which a window is invalid
	tries     int     // windows measured at most per rate (pooled while straddling)
	resamples int     // bootstrap resamples
	seed      uint64
}

// decide judges one estimate. It passes only when the upper bound of the
// 95% CI of added p99 is within the limit and fails only when its lower
// bound is above it; a pacer that fell behind its schedule (lateShare,
// see pacerLate) makes the window invalid whatever its latencies.
func decide(e estimate, lateShare float64, c criteria) verdict {
	switch {
	case lateShare > c.maxLate || math.IsNaN(e.p99CI[0]) || math.IsNaN(e.p99CI[1]):
		return invalid
	case e.p99CI[1] <= c.limit:
		return pass
	case e.p99CI[0] > c.limit:
		return fail
	}
	return straddle
}

// step is the outcome of one rate.
type step struct {
	rate    float64
	verdict verdict
	est     estimate
	win     window // the windows judged, pooled
	windows int    // how many were measured
}

// judge measures rate with measure until the verdict is pass or fail, at
// most c.tries windows: while the CI straddles the limit it pools another
// window (a narrower CI from more samples); a window where the generator
// fell behind is measured again and not pooled.
func judge(rate float64, measure func(rate float64) window, c criteria) step {
	s := step{rate: rate, verdict: invalid}
	var pooled window
	for t := 0; t < max(c.tries, 1); t++ {
		w := measure(rate)
		s.windows++
		if w.lateShare() > c.maxLate {
			if pooled.offered == 0 {
				s.win, s.est = w, estimateAdded(w, c.resamples, c.seed)
			}
			continue
		}
		pooled.add(w)
		s.win, s.est = pooled, estimateAdded(pooled, c.resamples, c.seed)
		s.verdict = decide(s.est, pooled.lateShare(), c)
		if s.verdict == pass || s.verdict == fail {
			break
		}
	}
	return s
}

// search looks for the highest rate that passes: from start up by half
// while it passes (to at most max), else down by halves (to at least
// minRate) until one passes; then it halves the gap between the highest
// rate passed and the lowest not passed, up to bisections times or until
// they are within 5%. Straddle and invalid count as not passed: the rate
// reported is one that was shown to pass. best.rate is 0 when none did.
func search(start, minRate, maxRate float64, bisections int, try func(rate float64) step) (best step, steps []step) {
	round := func(r float64) float64 { return math.Round(r) }
	var hi float64
	run := func(r float64) bool {
		s := try(r)
		steps = append(steps, s)
		if s.verdict == pass {
			best = s
			return true
		}
		hi = r
		return false
	}
	for r := round(start); r <= maxRate; r = round(r * 1.5) {
		if !run(r) {
			break
		}
	}
	if best.rate == 0 {
		for r := round(start / 2); r >= minRate; r = round(r / 2) {
			if run(r) {
				break
			}
		}
	}
	for i := 0; i < bisections && best.rate > 0 && hi > 0 && hi > best.rate*1.05; i++ {
		run(round((best.rate + hi) / 2))
	}
	return best, steps
}
