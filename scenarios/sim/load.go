package sim

import (
	"math"
	"time"
)

// Load is labelled by prefill utilisation. The offered load of a workload
// is the prefill work its requests bring, as a fraction of what the fleet
// can do:
//
//	offered = sum over requests of work(uncached, cached) / (span x sum over pods of speed)
//
// where a request's uncached and cached tokens are what one shared cache of
// the fleet's total size would leave (the upper bound's pool: a property of
// the workload, not of any policy), work is an H100 engine's prefill time
// of them (linear layers and attention, enginePerf), a pod's speed is its
// engine's prefill speed relative to an H100 (B200 2.27), and span is the
// time from the first arrival to the last. Decode is not counted: a
// decode-heavy workload saturates before 1. The achieved utilisation of a
// run is the prefill time its pods actually spent over the run's length.

// defaultSyntheticLoad is the offered load of a synthetic workload when none
// is configured.
const defaultSyntheticLoad = 0.6

// referencePerf is the engine work is priced on.
func referencePerf() enginePerf { return enginePerfs()["h100"] }

// prefillWorkMs is the reference engine's prefill time of uncached tokens
// after cached ones, without the steps' fixed part (shared with decode).
func prefillWorkMs(e enginePerf, cached, uncached int) float64 {
	u := float64(uncached)
	return e.PrefillMsPerToken*u + e.AttnMsPerTokenPos*u*(float64(cached)+u/2)
}

// speedEq is the fleet's prefill speed in reference engines.
func speedEq(f *fleetSpec) float64 {
	ref := referencePerf().PrefillMsPerToken
	s := 0.0
	for _, p := range f.pods {
		s += ref / p.perf.PrefillMsPerToken
	}
	return s
}

// offeredLoad is the offered load of open-loop requests (sorted by arrival)
// on the fleet.
func offeredLoad(reqs []*request, f *fleetSpec) float64 {
	if len(reqs) < 2 {
		return 0
	}
	capBlocks := 0
	for _, p := range f.pods {
		capBlocks += p.capBlocks
	}
	pool := newKVCache(capBlocks, nil)
	ref := referencePerf()
	var h holding
	work := 0.0
	for _, r := range reqs {
		hit := pool.touch(r.chain, &h)
		cached := min(hit*f.blockSize, r.input)
		work += prefillWorkMs(ref, cached, max(r.input-cached, 1))
	}
	span := float64(reqs[len(reqs)-1].at-reqs[0].at) / float64(time.Millisecond)
	if span <= 0 {
		return math.Inf(1)
	}
	return work / (span * speedEq(f))
}

// scaleArrivals multiplies every arrival instant by k.
func scaleArrivals(reqs []*request, k float64) {
	for _, r := range reqs {
		r.at = time.Duration(float64(r.at) * k)
	}
}

// atLoad generates a Poisson workload whose offered load is target: gen
// makes the requests at a given rate (per second); the rate is corrected
// from the load it gives until within 2% (at most 12 times). The load is
// not linear in the rate: more requests reuse more of the pooled cache, so
// each correction is damped.
func atLoad(target float64, f *fleetSpec, gen func(rate float64) []*request) ([]*request, float64) {
	rate := float64(len(f.pods)) // a first guess: one request per second per pod
	reqs := gen(rate)
	l := offeredLoad(reqs, f)
	for range 12 {
		if !(l > 0) || math.IsInf(l, 0) || math.Abs(l-target) <= 0.02*target {
			break
		}
		rate *= math.Pow(target/l, 1.3)
		reqs = gen(rate)
		l = offeredLoad(reqs, f)
	}
	return reqs, l
}

// codingSessionsFor estimates the concurrent coding-agent users that offer
// the target load (the workload is closed loop: its achieved load falls as
// latency grows). From the generator's parameters (codingSource): a session
// starts with 12,000 shared (cached) and 40,000-80,000 unique tokens, then
// 8-30 turns (19 on average, the history reaching ~113k tokens, ~92k on
// average), each adding a 300-3,000-token message and a 300-700-token
// answer; a turn takes a think time (log-uniform 20 ms-5 s: 0.9 s on
// average), its prefill and 500 decode steps at the fleet's mean step time
// with ten such contexts in the batch.
func codingSessionsFor(target float64, f *fleetSpec) int {
	ref := referencePerf()
	start := prefillWorkMs(ref, 12000, 60000)
	turn := prefillWorkMs(ref, 92000, 2150)
	perSession := start + 19*turn
	step, kv := 0.0, 0.0
	for _, p := range f.pods {
		step += p.perf.StepMs
		kv += p.perf.KVReadMsPerToken
	}
	step /= float64(len(f.pods))
	kv /= float64(len(f.pods))
	itl := step + kv*10*92000
	cycle := 902 + ref.soloTTFTMs(92000, 2150) + 500*itl
	duration := 19*cycle + 5500
	n := target * speedEq(f) * duration / perSession
	return max(1, int(math.Round(n)))
}
