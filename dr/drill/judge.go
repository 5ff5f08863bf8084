package drill

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/meridian-llm/meridian/residency"
)

// The drill's judge: a single-threaded state machine fed with probe results
// and the times of the trigger and the recovery. It owns no goroutine and
// reads no clock (every time comes with its input), so a scripted run gives
// the same verdict as a live one with the same outcomes.

// drillPhase is where a result falls, by the time it completed.
type drillPhase uint8

const (
	phaseBefore drillPhase = iota // completed before the trigger was sent
	phaseFailed                   // from the trigger sent to the recovery sent
	phaseAfter                    // from the recovery sent on
)

var phaseNames = [...]string{"before", "failed", "after"}

func (p drillPhase) String() string { return phaseNames[p] }

// resultClass is the judgement of one probe result.
type resultClass uint8

const (
	// classOK: the outcome the phase expects (the baseline before and
	// after; what the policy allows without the region while it is failed).
	classOK resultClass = iota
	// classStale: the previous phase's outcome (traffic not moved yet, or
	// not back yet). Not an error.
	classStale
	// classOther: served in a region the policy allows, but neither
	// expected nor stale. Not an error.
	classOther
	// classError: refused or failed when the policy and the region states
	// say it should be served (or refused otherwise), or a transport error.
	classError
	// classViolation: served in a region the residency policy forbids.
	classViolation
)

var classNames = [...]string{"ok", "stale", "other", "error", "violation"}

func (c resultClass) String() string { return classNames[c] }

// Outcomes the controllers give for refusals the policy explains.
const (
	outcomeDenied    = "451 residency_denied"
	outcomeNoHealthy = "503 residency_no_healthy_region"
)

// probeResult is one probe request as the outer layer saw it.
type probeResult struct {
	probe      int // index into the judge's probes
	seq        int
	sent, done time.Time
	status     int    // 0 when the request failed before an answer
	code       string // error.code of a JSON error answer
	region     string // X-Meridian-Region of a 200
	forwarded  string // X-Meridian-Forwarded-To
	decision   string // X-Meridian-Decision-Id
	errKind    string // transport failure: timeout, connection_refused, ...
	detail     string // the error message or answer excerpt, for the report
}

// outcome is the result as compared with expectations: "200 REGION",
// "STATUS CODE", or "error: KIND".
func (r *probeResult) outcome() string {
	switch {
	case r.errKind != "":
		return "error: " + r.errKind
	case r.status == http.StatusOK && r.region == "":
		return "200 (no X-Meridian-Region)"
	case r.status == http.StatusOK:
		return "200 " + r.region
	case r.code != "":
		return fmt.Sprintf("%d %s", r.status, r.code)
	}
	return fmt.Sprintf("%d", r.status)
}

// judged is a stored, classified result.
type judged struct {
	seq        int
	sent, done time.Time
	phase      drillPhase
	class      resultClass
	outcome    string
	detail     string
	decision   string
	forwarded  string
}

// probeTrack is one probe's expectations and results.
type probeTrack struct {
	probe    Probe
	decision residency.Decision
	// normal: what the policy allows with the regions routable at the
	// start; failed: the same without the drilled region. Sorted outcomes.
	normal, failed []string
	// baseline: the outcomes of the baseline rounds that were not errors.
	baseline []string
	affected bool
	results  []judged
}

type judge struct {
	region  string
	rounds  int
	probes  []*probeTrack
	trigger struct{ sent, done time.Time }
	recover struct{ sent, done time.Time }
}

// expectation is what a request with decision d gets when the regions for
// which routable is true can serve: 200 in one of them, 503 when none can,
// 451 when the policy allows nothing.
func expectation(d residency.Decision, routable func(string) bool) []string {
	if d.Allowed.Empty() {
		return []string{outcomeDenied}
	}
	var out []string
	for _, r := range d.Regions() {
		if routable(r) {
			out = append(out, "200 "+r)
		}
	}
	if len(out) == 0 {
		return []string{outcomeNoHealthy}
	}
	slices.Sort(out)
	return out
}

// newJudge evaluates every probe against the policy: routable are the
// regions that can serve at the start, region the one the drill fails.
func newJudge(pol *residency.Policy, model, region string, routable []string, probes []Probe, rounds int) *judge {
	j := &judge{region: region, rounds: rounds}
	up := func(r string) bool { return slices.Contains(routable, r) }
	upWithout := func(r string) bool { return r != region && up(r) }
	for _, p := range probes {
		d := pol.Evaluate(residency.Attributes{Tenant: p.Tenant, DataClass: p.DataClass, OriginRegion: p.Origin, Model: model})
		j.probes = append(j.probes, &probeTrack{probe: p, decision: d,
			normal: expectation(d, up), failed: expectation(d, upWithout)})
	}
	return j
}

func (j *judge) markTriggerSent(t time.Time)     { j.trigger.sent = t }
func (j *judge) markTriggerReturned(t time.Time) { j.trigger.done = t }
func (j *judge) markRecoverSent(t time.Time)     { j.recover.sent = t }
func (j *judge) markRecoverReturned(t time.Time) { j.recover.done = t }

func (j *judge) phaseOf(done time.Time) drillPhase {
	switch {
	case j.trigger.sent.IsZero() || done.Before(j.trigger.sent):
		return phaseBefore
	case j.recover.sent.IsZero() || done.Before(j.recover.sent):
		return phaseFailed
	}
	return phaseAfter
}

// observe classifies and records one result. Results of one probe must come
// in the order they were sent; the trigger and recovery marks must be set
// before any result that completed after them is observed.
func (j *judge) observe(r probeResult) resultClass {
	t := j.probes[r.probe]
	ph := j.phaseOf(r.done)
	out := r.outcome()
	inBaseline := ph == phaseBefore && len(t.results) < j.rounds
	var target, prev []string
	switch {
	case inBaseline:
		target = t.normal
	case ph == phaseBefore:
		target = t.baseline
	case ph == phaseFailed:
		target, prev = t.failed, t.baseline
	default:
		target, prev = t.baseline, t.failed
	}
	c := classifyResult(&r, out, target, prev, t.decision)
	t.results = append(t.results, judged{seq: r.seq, sent: r.sent, done: r.done, phase: ph, class: c, outcome: out,
		detail: r.detail, decision: r.decision, forwarded: r.forwarded})
	if inBaseline {
		if (c == classOK || c == classOther) && !slices.Contains(t.baseline, out) {
			t.baseline = append(t.baseline, out)
			slices.Sort(t.baseline)
		}
		if len(t.results) == j.rounds {
			for _, o := range t.baseline {
				if !slices.Contains(t.failed, o) {
					t.affected = true
				}
			}
		}
	}
	return c
}

func classifyResult(r *probeResult, out string, target, prev []string, d residency.Decision) resultClass {
	served := r.errKind == "" && r.status == http.StatusOK && r.region != ""
	switch {
	case served && !d.Allows(r.region):
		return classViolation
	case slices.Contains(target, out):
		return classOK
	case slices.Contains(prev, out):
		return classStale
	case served:
		return classOther
	}
	return classError
}

// baselineDone reports whether every probe has its baseline rounds.
func (j *judge) baselineDone() bool {
	for _, t := range j.probes {
		if len(t.results) < j.rounds {
			return false
		}
	}
	return true
}

// baselineProblems lists the baseline results that were errors or
// violations: the drill does not fail a region of an unhealthy cluster.
func (j *judge) baselineProblems() []string {
	var out []string
	for _, t := range j.probes {
		for _, r := range t.results[:min(j.rounds, len(t.results))] {
			if r.class == classError || r.class == classViolation {
				msg := fmt.Sprintf("probe %s: %s (%s; the policy expects %s)", t.probe, r.outcome, r.class, orList(t.normal))
				if r.detail != "" {
					msg += ": " + r.detail
				}
				out = append(out, msg)
			}
		}
	}
	return out
}

// baselineAbort returns the report's reason and the error when the
// baseline has problems.
func (j *judge) baselineAbort() (string, error) {
	probs := j.baselineProblems()
	if len(probs) == 0 {
		return "", nil
	}
	why := "baseline unhealthy: " + probs[0]
	if len(probs) > 1 {
		why += fmt.Sprintf(" (and %d more)", len(probs)-1)
	}
	return why, fmt.Errorf("%w: nothing was triggered: %s", ErrBaseline, strings.Join(probs, "; "))
}

// allMoved reports whether every affected probe's latest result is the
// failed phase's expected outcome.
func (j *judge) allMoved() bool { return j.allLatest(phaseFailed) }

// allBack reports whether every affected probe's latest result is the
// baseline again.
func (j *judge) allBack() bool { return j.allLatest(phaseAfter) }

func (j *judge) allLatest(ph drillPhase) bool {
	for _, t := range j.probes {
		if !t.affected {
			continue
		}
		if len(t.results) == 0 {
			return false
		}
		last := t.results[len(t.results)-1]
		if last.phase != ph || last.class != classOK {
			return false
		}
	}
	return true
}

// settle returns the first result of phase ph that was ok, and the one from
// which every later result of the phase was ok (nil when the phase's last
// result was not ok, or the phase has none).
func (t *probeTrack) settle(ph drillPhase) (first, settled *judged) {
	for i := range t.results {
		r := &t.results[i]
		if r.phase != ph {
			continue
		}
		if r.class != classOK {
			settled = nil
			continue
		}
		if first == nil {
			first = r
		}
		if settled == nil {
			settled = r
		}
	}
	return first, settled
}

func orList(s []string) string {
	switch len(s) {
	case 0:
		return "nothing"
	case 1:
		return s[0]
	}
	out := ""
	for i, x := range s {
		switch {
		case i == 0:
		case i == len(s)-1:
			out += " or "
		default:
			out += ", "
		}
		out += x
	}
	return out
}
