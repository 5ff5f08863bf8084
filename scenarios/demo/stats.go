package demo

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/residency"
)

// Outcomes of a request, as the client sees them.
const (
	codeDenied   = "residency_denied"            // 451
	codeNoRegion = "residency_no_healthy_region" // 503
)

// sample is one request as the client saw it.
type sample struct {
	sent, done time.Time
	answered   time.Time // the response headers arrived (the first byte)
	entry      string    // region whose controller received it
	replica    string    // the controller (replica) the load balancer sent it to
	controller string    // X-Meridian-Controller: whose pod answered
	served     string    // X-Meridian-Region (answered requests)
	pod        string    // X-Meridian-Pod
	forwarded  bool      // X-Meridian-Forwarded-To was set
	status     int
	code       string // the error body's code, for refusals
	message    string // the error body's message
	ttft       time.Duration
	prompt     int
	cached     int
	tenant     string
	class      string
	session    string
	err        string // transport or protocol failure; "" when none
	probe      bool   // a failover probe, not generator traffic
}

// ringSize bounds the TTFTs kept per region and pod for the live
// percentiles (the last ringSize answers).
const ringSize = 2048

// ring keeps the last ringSize values.
type ring struct {
	vals []float64
	next int
}

func (r *ring) add(v float64) {
	if len(r.vals) < ringSize {
		r.vals = append(r.vals, v)
		return
	}
	r.vals[r.next] = v
	r.next = (r.next + 1) % ringSize
}

// rateWindow counts events per wall-clock second over the last 8 seconds.
type rateWindow struct {
	sec [8]int64
	n   [8]int64
}

func (w *rateWindow) add(t time.Time) {
	s := t.Unix()
	i := s & 7
	if w.sec[i] != s {
		w.sec[i], w.n[i] = s, 0
	}
	w.n[i]++
}

// rate is the mean per second over the 5 whole seconds before now.
func (w *rateWindow) rate(now time.Time) float64 {
	s := now.Unix()
	var n int64
	for k := int64(1); k <= 5; k++ {
		i := (s - k) & 7
		if w.sec[i] == s-k {
			n += w.n[i]
		}
	}
	return float64(n) / 5
}

// tally is what the table shows for a region or a pod.
type tally struct {
	served, prompt, cached int64
	fwdIn                  int64 // served here, entered elsewhere
	fwdOut                 int64 // entered here, served elsewhere
	denied, refused, errs  int64 // entered here
	ttft                   ring
	rate                   rateWindow
}

// Event is one line of the demo's story (failover, recovery, anomalies).
type Event struct {
	At   float64 `json:"at_s"` // seconds since the system was ready
	Text string  `json:"text"`
}

// phiTally follows the EU health tenant's PHI: where it entered and where it
// was served.
type phiTally struct {
	entered   map[string]int64
	served    map[string]int64
	refused   int64
	inFailure struct{ entered, servedEU, elsewhere, refused int64 }
}

// stats aggregates samples. Safe for concurrent use.
type stats struct {
	policy *residency.Policy
	start  time.Time
	now    func() time.Time

	mu         sync.Mutex
	regions    map[string]*tally
	pods       map[string]*tally
	requests   int64 // generator requests (not probes)
	probes     int64
	errs       int64
	denials    int64
	refused    int64
	forwards   int64
	prompt     int64
	cached     int64
	ttfts      []float64 // every generator answer's TTFT, ms
	recent     ring      // the last answers' TTFTs, ms (live percentiles)
	rate       rateWindow
	violations int64
	phi        phiTally
	downs      map[string][]interval // when each region was failed over
	events     []Event
	errorKinds map[string]int64
	loss       replicaLoss
	answers    []answerAt // every generator answer, for the hit rate around the replica kill
}

// replicaLoss follows the replica killed during the run.
type replicaLoss struct {
	id           string
	killed       time.Time // zero: not killed (yet)
	restarted    time.Time // ready again; zero: not (yet)
	kills        int64
	restarts     int64
	inflightLost int64 // failed requests that were in flight on it when it was killed
	failedDuring int64 // other failed requests while it was down
}

// inFlightOn reports whether x was in flight on the killed replica when it
// was killed: sent to it, or answered by one of its pods, before the kill,
// and not finished before it.
func (l *replicaLoss) inFlightOn(x sample) bool {
	return !l.killed.IsZero() && (x.replica == l.id || x.controller == l.id) && x.sent.Before(l.killed) && !x.done.Before(l.killed)
}

// during reports whether x overlapped the time the replica was down.
func (l *replicaLoss) during(x sample) bool {
	return !l.killed.IsZero() && !x.done.Before(l.killed) && (l.restarted.IsZero() || !x.sent.After(l.restarted))
}

// answerAt is one answer's time and tokens.
type answerAt struct {
	done           time.Time
	prompt, cached int
}

// replicaKilled records the kill of a replica.
func (s *stats) replicaKilled(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loss.id, s.loss.killed, s.loss.restarted = id, at, time.Time{}
	s.loss.kills++
	s.eventLocked("replica %s killed (a crash: its connections cut, no gossip leave, no Raft handover)", id)
}

// replicaRestarted records that the killed replica, started again at
// began, is ready again at at.
func (s *stats) replicaRestarted(id string, began, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loss.restarted = at
	s.loss.restarts++
	s.eventLocked("replica %s started again: ready %.1f s later (index rebuilt from the topic), %.1f s after the kill; %d requests in flight on it were lost, %d others failed",
		id, at.Sub(began).Seconds(), at.Sub(s.loss.killed).Seconds(), s.loss.inflightLost, s.loss.failedDuring)
}

// hitRateBetween is the hit rate of the answers that finished in [from, to).
func (s *stats) hitRateBetween(from, to time.Time) (rate float64, answers int) {
	var prompt, cached int64
	for _, a := range s.answers {
		if !a.done.Before(from) && a.done.Before(to) {
			prompt += int64(a.prompt)
			cached += int64(a.cached)
			answers++
		}
	}
	return ratio(cached, prompt), answers
}

func newStats(p *residency.Policy, now func() time.Time) *stats {
	s := &stats{policy: p, now: now, start: now(), regions: map[string]*tally{}, pods: map[string]*tally{},
		downs: map[string][]interval{}, errorKinds: map[string]int64{}}
	s.phi.entered, s.phi.served = map[string]int64{}, map[string]int64{}
	return s
}

func (s *stats) region(name string) *tally {
	t := s.regions[name]
	if t == nil {
		t = &tally{}
		s.regions[name] = t
	}
	return t
}

func (s *stats) pod(name string) *tally {
	t := s.pods[name]
	if t == nil {
		t = &tally{}
		s.pods[name] = t
	}
	return t
}

// elapsed is the time since the run started, in seconds.
func (s *stats) elapsed(t time.Time) float64 { return t.Sub(s.start).Seconds() }

// event records a line of the story.
func (s *stats) event(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.eventLocked(format, args...)
}

func (s *stats) eventLocked(format string, args ...any) {
	s.events = append(s.events, Event{At: s.elapsed(s.now()), Text: fmt.Sprintf(format, args...)})
	if len(s.events) > 200 {
		s.events = slices.Delete(s.events, 0, len(s.events)-200)
	}
}

// interval is a time a region was failed over; to is zero while it still is.
type interval struct{ from, to time.Time }

// setDown marks a region failed over (or recovered) from t.
func (s *stats) setDown(region string, down bool, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	iv := s.downs[region]
	switch {
	case down && (len(iv) == 0 || !iv[len(iv)-1].to.IsZero()):
		s.downs[region] = append(iv, interval{from: t})
	case !down && len(iv) > 0 && iv[len(iv)-1].to.IsZero():
		iv[len(iv)-1].to = t
	}
}

// downDuring reports whether region was failed over at some time in [a, b].
func (s *stats) downDuring(region string, a, b time.Time) bool {
	for _, iv := range s.downs[region] {
		if !iv.from.After(b) && (iv.to.IsZero() || !iv.to.Before(a)) {
			return true
		}
	}
	return false
}

// anyDownDuring reports whether any region was failed over in [a, b].
func (s *stats) anyDownDuring(a, b time.Time) bool {
	for r := range s.downs {
		if s.downDuring(r, a, b) {
			return true
		}
	}
	return false
}

// record classifies one request and adds it to the figures.
func (s *stats) record(x sample) {
	d := s.policy.Evaluate(residency.Attributes{Tenant: x.tenant, DataClass: x.class, OriginRegion: x.entry, Session: x.session})
	s.mu.Lock()
	defer s.mu.Unlock()
	if x.probe {
		s.probes++
	} else {
		s.requests++
	}
	rt := s.region(x.entry)
	isPHI := x.tenant == "eu-health" && x.class == "phi"
	if isPHI && !x.probe {
		s.phi.entered[x.entry]++
	}
	fail := func(kind, detail string) {
		if s.loss.inFlightOn(x) {
			// Lost with the replica: what a crash of the process serving it
			// costs, not a failure of the system.
			s.loss.inflightLost++
			if s.loss.inflightLost <= 3 {
				s.eventLocked("request in flight on the killed replica %s lost (%s): %s/%s entering %s", s.loss.id, kind, x.tenant, x.class, x.entry)
			}
			return
		}
		if s.loss.during(x) {
			s.loss.failedDuring++
		}
		s.errs++
		rt.errs++
		s.errorKinds[kind]++
		if s.errorKinds[kind] <= 3 {
			s.eventLocked("error (%s): %s/%s entering %s: %s", kind, x.tenant, x.class, x.entry, detail)
		}
	}
	switch {
	case x.err != "":
		fail("transport", x.err)
	case x.status == 200:
		if x.served == "" || x.pod == "" {
			fail("protocol", "answer without X-Meridian-Region or X-Meridian-Pod")
			return
		}
		if !d.Allows(x.served) {
			s.violations++
			s.eventLocked("RESIDENCY VIOLATION: %s/%s entering %s served in %s; the policy allows %v", x.tenant, x.class, x.entry, x.served, d.Regions())
		}
		if x.served != x.entry && !x.forwarded {
			fail("protocol", "served in "+x.served+" without X-Meridian-Forwarded-To")
		}
		if isPHI && !x.probe {
			s.phi.served[x.served]++
			if s.anyDownDuring(x.sent, x.done) {
				s.phi.inFailure.entered++
				if x.served == "eu-west-1" {
					s.phi.inFailure.servedEU++
				} else {
					s.phi.inFailure.elsewhere++
				}
			}
		}
		if x.probe {
			return
		}
		ms := float64(x.ttft) / float64(time.Millisecond)
		s.ttfts = append(s.ttfts, ms)
		s.recent.add(ms)
		s.rate.add(x.done)
		s.prompt += int64(x.prompt)
		s.cached += int64(x.cached)
		s.answers = append(s.answers, answerAt{done: x.done, prompt: x.prompt, cached: x.cached})
		for _, t := range []*tally{s.region(x.served), s.pod(x.pod)} {
			t.served++
			t.prompt += int64(x.prompt)
			t.cached += int64(x.cached)
			t.ttft.add(ms)
			t.rate.add(x.done)
		}
		if x.forwarded {
			s.forwards++
			rt.fwdOut++
			s.region(x.served).fwdIn++
		}
	case x.status == 451 && x.code == codeDenied:
		s.denials++
		rt.denied++
		if !d.Allowed.Empty() {
			fail("unexpected_denial", fmt.Sprintf("451 though the policy allows %v", d.Regions()))
		}
	case x.status == 503 && x.code == codeNoRegion:
		s.refused++
		rt.refused++
		if isPHI && !x.probe {
			s.phi.refused++
			s.phi.inFailure.refused++
		}
		for _, r := range d.Regions() {
			if !s.downDuring(r, x.sent, x.done) {
				fail("unexpected_refusal", fmt.Sprintf("503 %s though %s, which the policy allows, was not failed over: %s", x.code, r, x.message))
				return
			}
		}
	default:
		fail(fmt.Sprintf("status_%d", x.status), x.code+": "+x.message)
	}
}

// percentile returns the p-quantile (0..1) of sorted values by the
// nearest-rank method; 0 without values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(p*float64(len(sorted))+0.999999999) - 1
	k = max(0, min(k, len(sorted)-1))
	return sorted[k]
}

func sortedCopy(v []float64) []float64 {
	c := slices.Clone(v)
	slices.Sort(c)
	return c
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
