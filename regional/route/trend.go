package route

import (
	"sort"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
)

// Trend remembers this region's mean prefill backlog per pod, in
// milliseconds, over the recent past, so that a remote candidate can be
// charged the load its summary is too old to show.
//
// A remote region's summary shows its backlog as it was when it was built,
// seconds ago. Forwarded adds what this controller sent there since; what
// the region's own users and the other regions sent there is invisible
// until the next summary. The best estimate this controller has of that
// unseen change is its own: demand that rises here over those seconds
// (a start of day, a burst of new sessions) usually rises there too. Before
// Trend, the simulator's coding workload, which starts every user in its
// first 10 s with a 52k-95k-token prompt, had each origin see the others as
// idle and move a new session's first turn there; the session then
// followed its cache for its remaining 8-30 turns, and p95 TTFT was
// 1.04-1.49x that of the in-region policy.
//
// The rule: a remote candidate whose summary shows its region as it was at
// t is charged the growth of this region's backlog since t (never a fall:
// a placement elsewhere moves a session's later turns with its cache, so
// an unseen change may make moving harder, never easier), converted to
// the candidate's tokens at its profile's rate. In a steady state the
// backlog does not grow and nothing is charged; in a region overloaded
// alone (skew) the charge is its growth over one summary's age, less than
// the backlog it accumulated, so it still sheds load, a summary later.
//
// Safe for concurrent use. The zero value is ready.
type Trend struct {
	mu sync.Mutex
	// ring of samples, oldest at head; at most trendSamples, at least
	// trendStep apart (a sample within trendStep of the last replaces it).
	ring [trendSamples]trendSample
	head int
	n    int
}

type trendSample struct {
	at int64 // unix nanos
	ms float64
}

const (
	trendSamples = 1024
	// trendStep x trendSamples is the history kept (~51 s, about the age
	// at which gorgo ignores a summary); older lookups use the oldest
	// sample.
	trendStep = 50 * time.Millisecond
)

// Note records the region's mean backlog per pod (ms) at now. Samples must
// come in time order; an earlier one is ignored.
func (t *Trend) Note(now time.Time, backlogMs float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at := now.UnixNano()
	if t.n > 0 {
		last := &t.ring[(t.head+t.n-1)%trendSamples]
		if at < last.at {
			return
		}
		if t.n > 1 {
			prev := t.ring[(t.head+t.n-2)%trendSamples]
			if at-prev.at < int64(trendStep) {
				*last = trendSample{at: at, ms: backlogMs}
				return
			}
		}
	}
	if t.n == trendSamples {
		t.head = (t.head + 1) % trendSamples
		t.n--
	}
	t.ring[(t.head+t.n)%trendSamples] = trendSample{at: at, ms: backlogMs}
	t.n++
}

// Growth is how much the backlog grew from since to the latest sample (0
// if it fell, or with no sample): the latest sample's value less that of
// the last sample at or before since (the oldest kept, if none is).
func (t *Trend) Growth(since time.Time) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return 0
	}
	at := since.UnixNano()
	// The first sample after since; the one before it is the reference.
	i := sort.Search(t.n, func(i int) bool { return t.ring[(t.head+i)%trendSamples].at > at })
	ref := t.ring[(t.head+max(i-1, 0))%trendSamples].ms
	return max(t.ring[(t.head+t.n-1)%trendSamples].ms-ref, 0)
}

// Adjust adds to each remote candidate's pending prefill the growth of
// this region's backlog since the candidate's summary was built (now less
// its age and half its RTT), in tokens at its profile's current rate.
func (t *Trend) Adjust(cands []gorgo.Candidate, now time.Time, model *gorgo.Model) {
	for i := range cands {
		c := &cands[i]
		if !c.Remote {
			continue
		}
		built := now.Add(-c.SummaryAge - time.Duration(c.RTTMs*float64(time.Millisecond)/2))
		g := t.Growth(built)
		if rate, _ := model.Rate(c.Profile); g > 0 && rate > 0 {
			c.PendingPrefillTokens += int(g / rate)
		}
	}
}

// BacklogMs is the region's mean prefill backlog per pod live in the
// index, in milliseconds at each pod's current rate (what Trend.Note
// takes): the same backlog the ttft picker charges a local pod.
//
// A controller that may forward computes it for every request, over every
// pod, so it reads each profile's rate once and each pod's correction as
// the decision does (Pod.factorAt), not by name per pod: at 256 pods that
// took it from 5.5 us, more than the decision itself, to 1.8 us
// (BenchmarkBacklogMs, medians of 6).
func (d *Decider) BacklogMs(now time.Time) float64 {
	cat := d.reg.catalog()
	gen := d.model.PodFactorGen()
	rates := make([]float64, 0, 8)
	for _, name := range cat.profiles {
		r, _ := d.model.Rate(name)
		rates = append(rates, r)
	}
	sum, n := 0.0, 0
	for _, p := range d.reg.Pods() {
		if !d.idx.Alive(p.ID) {
			continue
		}
		var rate float64
		if prof := p.profile(); prof < len(rates) {
			rate = rates[prof] * p.factorAt(d.model, gen)
		} else {
			// Described under a profile the catalog read above did
			// not have yet.
			rate, _ = d.model.RateFor(p.Info().Profile, p.Name)
		}
		sum += float64(BacklogTokens(p, now, rate)) * rate
		n++
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}
