package drill

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Millis is a duration that JSON encodes as a number of milliseconds
// (microsecond precision).
type Millis time.Duration

// D returns the duration.
func (m Millis) D() time.Duration { return time.Duration(m) }

// MarshalJSON writes the milliseconds.
func (m Millis) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(time.Duration(m).Round(time.Microsecond))/1e6, 'f', -1, 64), nil
}

// UnmarshalJSON reads milliseconds.
func (m *Millis) UnmarshalJSON(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("milliseconds: %w", err)
	}
	*m = Millis(time.Duration(f * 1e6))
	return nil
}

func millisPtr(d time.Duration) *Millis { m := Millis(d); return &m }

// The kinds of timeline events.
const (
	EventStart           = "start"            // probes started
	EventBaseline        = "baseline"         // every probe has its baseline rounds
	EventTriggerSent     = "trigger_sent"     // failover (or drain) requested
	EventTriggerReturned = "trigger_returned" // the admin API answered: the change is committed
	EventFirstMoved      = "first_moved"      // the first affected probe served as the policy allows without the region
	EventMoved           = "moved"            // every affected probe so, for good
	EventMovedTimeout    = "moved_timeout"    // the drill stopped waiting for traffic to move
	EventFirstError      = "first_error"      // the first probe error
	EventLastError       = "last_error"       // the last probe error
	EventFirstRefused    = "first_refused"    // the first 503 residency_no_healthy_region (expected refusals included)
	EventLastRefused     = "last_refused"     // the last one
	EventViolation       = "violation"        // a probe served where the policy forbids
	EventRecoverSent     = "recover_sent"     // recovery requested
	EventRecoverReturned = "recover_returned" // the admin API answered
	EventFirstBack       = "first_back"       // the first affected probe served as in the baseline again
	EventBack            = "back"             // every affected probe so, for good
	EventBackTimeout     = "back_timeout"     // the drill stopped waiting for traffic to come back
	EventEnd             = "end"              // probes stopped
)

// Event is one line of the timeline.
type Event struct {
	At time.Time `json:"at"`
	// Offset is from the trigger returning (from the start when the drill
	// triggered nothing).
	Offset Millis `json:"offset_ms"`
	Kind   string `json:"kind"`
	Probe  string `json:"probe,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Check is one criterion of the verdict.
type Check struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Passed   bool   `json:"passed"`
}

// OutcomeCount counts one outcome of one probe in one phase.
type OutcomeCount struct {
	Phase   string `json:"phase"` // before, failed, after
	Outcome string `json:"outcome"`
	Class   string `json:"class"` // ok, stale, other, error, violation
	Count   int    `json:"count"`
}

// ProbeReport is one probe's expectations, outcomes and figures.
type ProbeReport struct {
	Probe     string `json:"probe"`
	Origin    string `json:"origin"`
	Tenant    string `json:"tenant"`
	DataClass string `json:"data_class"`
	// Allowed are the regions the policy allows; Rule decided it.
	Allowed []string `json:"allowed"`
	Rule    string   `json:"rule"`
	// Baseline are the outcomes seen before the trigger; WhileFailed the
	// outcomes the policy allows while the region is out.
	Baseline    []string `json:"baseline"`
	WhileFailed []string `json:"while_failed"`
	// Affected probes must move (a baseline outcome is not allowed while
	// the region is out); only they time the move and the return.
	Affected bool `json:"affected"`
	// Moved and Back are from the trigger (recovery) returning to the
	// result from which the probe stayed moved (back); nil when not reached
	// or not affected.
	Moved      *Millis        `json:"moved_ms"`
	Back       *Millis        `json:"back_ms"`
	Verdict    string         `json:"verdict"`
	Requests   int            `json:"requests"`
	Errors     int            `json:"errors"`
	Violations int            `json:"violations"`
	Outcomes   []OutcomeCount `json:"outcomes"`
}

// ProbeSample is one probe result quoted in the report.
type ProbeSample struct {
	At         time.Time `json:"at"`
	Offset     Millis    `json:"offset_ms"`
	Probe      string    `json:"probe"`
	Phase      string    `json:"phase"`
	Outcome    string    `json:"outcome"`
	Detail     string    `json:"detail,omitempty"`
	DecisionID string    `json:"decision_id,omitempty"`
}

// Report is the result of a drill.
type Report struct {
	Region      string            `json:"region"`
	Mode        string            `json:"mode"` // fail or drain
	Admin       string            `json:"admin"`
	Controllers map[string]string `json:"controllers"`
	// Policy names the residency policy in force (revision and Raft version).
	Policy string `json:"policy"`
	// Routable are the regions that could serve at the start.
	Routable []string  `json:"routable"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Interval Millis    `json:"interval_ms"`

	Passed bool `json:"passed"`
	// Aborted says why the drill stopped early, if it did.
	Aborted   string `json:"aborted,omitempty"`
	Recovered bool   `json:"recovered"`

	TargetMoved Millis `json:"target_moved_ms"`
	TargetBack  Millis `json:"target_back_ms"`
	// Moved: from the trigger returning until every affected probe was
	// served as the policy allows without the region, for good. Back: from
	// the recovery returning until every affected probe was served as in
	// the baseline, for good. Nil when not reached.
	Moved *Millis `json:"moved_ms"`
	Back  *Millis `json:"back_ms"`
	// TriggerLatency and RecoverLatency are the admin API calls' durations.
	TriggerLatency *Millis `json:"trigger_latency_ms"`
	RecoverLatency *Millis `json:"recover_latency_ms"`

	Requests   int `json:"requests"`
	Errors     int `json:"errors"`
	Violations int `json:"violations"`
	// Refused counts 503 residency_no_healthy_region answers (expected
	// ones included).
	Refused int `json:"refused"`
	// Affected counts the probes that had to move.
	Affected int `json:"affected"`

	Checks       []Check       `json:"checks"`
	Timeline     []Event       `json:"timeline"`
	Probes       []ProbeReport `json:"probes"`
	ErrorSamples []ProbeSample `json:"error_samples"`
	// ViolationSamples lists every violation (up to maxViolationSamples).
	ViolationSamples []ProbeSample `json:"violation_samples"`
	Notes            []string      `json:"notes,omitempty"`
}

const (
	maxErrorSamples     = 20
	maxViolationSamples = 100
)

// drillMeta is what the outer layer knows besides the results.
type drillMeta struct {
	cfg                     Config
	policy                  string
	routable                []string
	started, finished       time.Time
	triggerDetail           string
	recoverDetail           string
	movedGaveUp, backGaveUp time.Time
	triggerErr, recoverErr  string
	aborted                 string
	recovered               bool
	notes                   []string
}

// report builds the report from the judged results.
func (j *judge) report(m drillMeta) *Report {
	mode := "fail"
	if m.cfg.Drain {
		mode = "drain"
	}
	rep := &Report{Region: j.region, Mode: mode, Admin: m.cfg.Admin, Controllers: m.cfg.Controllers, Policy: m.policy,
		Routable: m.routable, Started: m.started, Finished: m.finished, Interval: Millis(m.cfg.Interval),
		Aborted: m.aborted, Recovered: m.recovered, TargetMoved: Millis(m.cfg.TargetMoved), TargetBack: Millis(m.cfg.TargetBack),
		Checks: []Check{}, Timeline: []Event{}, Probes: []ProbeReport{}, ErrorSamples: []ProbeSample{},
		ViolationSamples: []ProbeSample{}, Notes: m.notes}
	if rep.Controllers == nil {
		rep.Controllers = map[string]string{}
	}
	origin := m.started
	if !j.trigger.done.IsZero() {
		origin = j.trigger.done
	}
	ev := func(at time.Time, kind, probe, detail string) {
		rep.Timeline = append(rep.Timeline, Event{At: at, Offset: Millis(at.Sub(origin)), Kind: kind, Probe: probe, Detail: detail})
	}
	sample := func(t *probeTrack, r *judged) ProbeSample {
		return ProbeSample{At: r.done, Offset: Millis(r.done.Sub(origin)), Probe: t.probe.String(), Phase: r.phase.String(),
			Outcome: r.outcome, Detail: r.detail, DecisionID: r.decision}
	}

	ev(m.started, EventStart, "", fmt.Sprintf("%s from %s, every %v", plural(len(j.probes), "probe"), plural(len(originsOf(j.probes)), "origin"), m.cfg.Interval))
	var baselineAt time.Time
	var movedAt, backAt, firstMovedAt, firstBackAt struct {
		t *probeTrack
		r *judged
	}
	movedAll, backAll := true, true
	for _, t := range j.probes {
		pr := ProbeReport{Probe: t.probe.String(), Origin: t.probe.Origin, Tenant: t.probe.Tenant, DataClass: t.probe.DataClass,
			Allowed: t.decision.Regions(), Rule: ruleOf(t), Baseline: t.baseline, WhileFailed: t.failed, Affected: t.affected,
			Outcomes: []OutcomeCount{}}
		if pr.Allowed == nil {
			pr.Allowed = []string{}
		}
		if pr.Baseline == nil {
			pr.Baseline = []string{}
		}
		for i := range t.results {
			r := &t.results[i]
			if i < j.rounds && r.phase == phaseBefore && r.done.After(baselineAt) {
				baselineAt = r.done
			}
			pr.Requests++
			switch r.class {
			case classError:
				pr.Errors++
				rep.Errors++
			case classViolation:
				pr.Violations++
				rep.Violations++
			}
			if r.outcome == outcomeNoHealthy {
				rep.Refused++
			}
			addOutcome(&pr.Outcomes, r)
		}
		rep.Requests += pr.Requests
		if t.affected {
			rep.Affected++
			first, settled := t.settle(phaseFailed)
			if first != nil && (firstMovedAt.r == nil || first.done.Before(firstMovedAt.r.done)) {
				firstMovedAt.t, firstMovedAt.r = t, first
			}
			if settled == nil {
				movedAll = false
			} else {
				pr.Moved = millisPtr(max(0, settled.done.Sub(j.trigger.done)))
				if movedAt.r == nil || settled.done.After(movedAt.r.done) {
					movedAt.t, movedAt.r = t, settled
				}
			}
			first, settled = t.settle(phaseAfter)
			if first != nil && (firstBackAt.r == nil || first.done.Before(firstBackAt.r.done)) {
				firstBackAt.t, firstBackAt.r = t, first
			}
			if settled == nil {
				backAll = false
			} else {
				pr.Back = millisPtr(max(0, settled.done.Sub(j.recover.done)))
				if backAt.r == nil || settled.done.After(backAt.r.done) {
					backAt.t, backAt.r = t, settled
				}
			}
			switch {
			case pr.Moved == nil:
				pr.Verdict = "never moved"
			case pr.Back == nil:
				pr.Verdict = "moved, never back"
			default:
				pr.Verdict = "moved and back"
			}
		} else {
			pr.Verdict = "not affected"
		}
		rep.Probes = append(rep.Probes, pr)
	}
	// Samples, in time order.
	var errs, viols, refused []ProbeSample
	for _, t := range j.probes {
		for i := range t.results {
			r := &t.results[i]
			switch r.class {
			case classError:
				errs = append(errs, sample(t, r))
			case classViolation:
				viols = append(viols, sample(t, r))
			}
			if r.outcome == outcomeNoHealthy {
				refused = append(refused, sample(t, r))
			}
		}
	}
	bySampleTime := func(a, b ProbeSample) int { return a.At.Compare(b.At) }
	slices.SortStableFunc(errs, bySampleTime)
	slices.SortStableFunc(viols, bySampleTime)
	slices.SortStableFunc(refused, bySampleTime)
	if !baselineAt.IsZero() {
		ev(baselineAt, EventBaseline, "", fmt.Sprintf("%d rounds; %d of %s must move", j.rounds, rep.Affected, plural(len(j.probes), "probe")))
	}
	action := "fail " + j.region
	if m.cfg.Drain {
		action = "drain " + j.region
	}
	if !j.trigger.sent.IsZero() {
		ev(j.trigger.sent, EventTriggerSent, "", action)
		if !j.trigger.done.IsZero() {
			ev(j.trigger.done, EventTriggerReturned, "", m.triggerDetail)
			rep.TriggerLatency = millisPtr(j.trigger.done.Sub(j.trigger.sent))
		}
	}
	if firstMovedAt.r != nil {
		ev(firstMovedAt.r.done, EventFirstMoved, firstMovedAt.t.probe.String(), firstMovedAt.r.outcome)
	}
	if movedAll && movedAt.r != nil && !j.trigger.done.IsZero() {
		rep.Moved = millisPtr(max(0, movedAt.r.done.Sub(j.trigger.done)))
		ev(movedAt.r.done, EventMoved, movedAt.t.probe.String(), fmt.Sprintf("every affected probe served as the policy allows without %s", j.region))
	}
	if !m.movedGaveUp.IsZero() {
		ev(m.movedGaveUp, EventMovedTimeout, "", fmt.Sprintf("traffic had not moved %v after the trigger returned", m.cfg.MovedTimeout))
	}
	for _, fl := range []struct {
		samples     []ProbeSample
		first, last string
	}{{errs, EventFirstError, EventLastError}, {refused, EventFirstRefused, EventLastRefused}} {
		if len(fl.samples) > 0 {
			first, last := firstLast(fl.samples)
			ev(first.At, fl.first, first.Probe, first.Outcome)
			ev(last.At, fl.last, last.Probe, last.Outcome)
		}
	}
	if !j.recover.sent.IsZero() {
		ev(j.recover.sent, EventRecoverSent, "", "recover "+j.region)
		if !j.recover.done.IsZero() {
			ev(j.recover.done, EventRecoverReturned, "", m.recoverDetail)
			rep.RecoverLatency = millisPtr(j.recover.done.Sub(j.recover.sent))
		}
	}
	if firstBackAt.r != nil {
		ev(firstBackAt.r.done, EventFirstBack, firstBackAt.t.probe.String(), firstBackAt.r.outcome)
	}
	if backAll && backAt.r != nil && !j.recover.done.IsZero() {
		rep.Back = millisPtr(max(0, backAt.r.done.Sub(j.recover.done)))
		ev(backAt.r.done, EventBack, backAt.t.probe.String(), "every affected probe served as in the baseline")
	}
	if !m.backGaveUp.IsZero() {
		ev(m.backGaveUp, EventBackTimeout, "", fmt.Sprintf("traffic was not back %v after the recovery returned", m.cfg.BackTimeout))
	}
	rep.ErrorSamples = append(rep.ErrorSamples, errs[:min(len(errs), maxErrorSamples)]...)
	rep.ViolationSamples = append(rep.ViolationSamples, viols[:min(len(viols), maxViolationSamples)]...)
	for _, v := range viols[:min(len(viols), maxErrorSamples)] {
		ev(v.At, EventViolation, v.Probe, v.Outcome+" (allowed: "+strings.Join(rep.probe(v.Probe).Allowed, ", ")+")")
	}
	ev(m.finished, EventEnd, "", fmt.Sprintf("%s, %s, %s", plural(rep.Requests, "request"), plural(rep.Errors, "error"), plural(rep.Violations, "violation")))
	slices.SortStableFunc(rep.Timeline, func(a, b Event) int { return a.At.Compare(b.At) })

	rep.Checks = j.checks(rep, m)
	rep.Passed = rep.Aborted == ""
	for _, c := range rep.Checks {
		rep.Passed = rep.Passed && c.Passed
	}
	return rep
}

func (j *judge) checks(rep *Report, m drillMeta) []Check {
	figure := func(name string, target time.Duration, got *Millis, started bool, gaveUp time.Duration, notStarted string) Check {
		c := Check{Name: name, Target: "≤ " + fmtDur(target)}
		switch {
		case got != nil:
			c.Measured, c.Passed = fmtDur(got.D()), got.D() <= target
		case !started:
			c.Measured = notStarted
		default:
			c.Measured = "not within " + fmtDur(gaveUp)
		}
		return c
	}
	triggered := !j.trigger.done.IsZero()
	notTriggered := "not triggered"
	if m.triggerErr != "" {
		notTriggered = "trigger failed: " + m.triggerErr
	}
	backNot := "not recovered"
	if !triggered {
		backNot = notTriggered
	}
	out := []Check{
		figure("traffic moved", m.cfg.TargetMoved, rep.Moved, triggered, m.cfg.MovedTimeout, notTriggered),
		figure("traffic back", m.cfg.TargetBack, rep.Back, !j.recover.done.IsZero(), m.cfg.BackTimeout, backNot),
		{Name: "residency violations", Target: "0", Measured: strconv.Itoa(rep.Violations), Passed: rep.Violations == 0},
		{Name: "probes affected", Target: "≥ 1", Measured: fmt.Sprintf("%d of %d", rep.Affected, len(j.probes)), Passed: rep.Affected > 0},
	}
	rc := Check{Name: "region recovered", Target: "active", Passed: m.recovered}
	switch {
	case j.trigger.sent.IsZero():
		rc.Measured, rc.Passed = "never failed over", true
	case m.recovered:
		rc.Measured = "active"
	case m.recoverErr != "":
		rc.Measured = "recover failed: " + m.recoverErr
	default:
		rc.Measured = "not recovered"
	}
	out = append(out, rc)
	if m.cfg.MaxErrors >= 0 {
		out = append(out, Check{Name: "probe errors", Target: "≤ " + strconv.Itoa(m.cfg.MaxErrors), Measured: strconv.Itoa(rep.Errors), Passed: rep.Errors <= m.cfg.MaxErrors})
	}
	return out
}

// firstLast returns the earliest and the latest of samples sorted by time;
// of several at the latest time, the first listed.
func firstLast(samples []ProbeSample) (first, last ProbeSample) {
	i := len(samples) - 1
	for i > 0 && samples[i-1].At.Equal(samples[i].At) {
		i--
	}
	return samples[0], samples[i]
}

func (r *Report) probe(name string) ProbeReport {
	for _, p := range r.Probes {
		if p.Probe == name {
			return p
		}
	}
	return ProbeReport{}
}

func ruleOf(t *probeTrack) string {
	d := t.decision
	if d.DeniedBy.Valid() && d.Allowed.Empty() {
		return d.DeniedBy.Name
	}
	if d.Rule.Valid() {
		return d.Rule.Name
	}
	return d.Outcome.String()
}

func originsOf(ts []*probeTrack) []string {
	var out []string
	for _, t := range ts {
		if !slices.Contains(out, t.probe.Origin) {
			out = append(out, t.probe.Origin)
		}
	}
	return out
}

func addOutcome(list *[]OutcomeCount, r *judged) {
	ph, cl := r.phase.String(), r.class.String()
	for i := range *list {
		o := &(*list)[i]
		if o.Phase == ph && o.Outcome == r.outcome && o.Class == cl {
			o.Count++
			return
		}
	}
	*list = append(*list, OutcomeCount{Phase: ph, Outcome: r.outcome, Class: cl, Count: 1})
}

// fmtDur renders a duration to the millisecond.
func fmtDur(d time.Duration) string {
	d = d.Round(time.Millisecond)
	if d == 0 {
		return "0s"
	}
	return d.String()
}

// plural renders n and the noun, with an s unless n is 1. (dr/check has
// the same four lines: a copy, not a dependency between the two.)
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func fmtOffset(m Millis) string {
	if m.D() >= 0 {
		return "+" + fmtDur(m.D())
	}
	return "-" + fmtDur(-m.D())
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write drill report: %w", err)
	}
	return nil
}

// WriteMarkdown writes the report as a Markdown document: verdict, figures
// against the targets, timeline, per-probe outcomes, errors and violations.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	verdict := "PASS"
	if !r.Passed {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "# Failover drill of %s: %s\n\n", r.Region, verdict)
	verb := "Failed"
	if r.Mode == "drain" {
		verb = "Drained"
	}
	probed := fmt.Sprintf("probed from %s every %s (%s, %s)", plural(len(r.Controllers), "region"), fmtDur(r.Interval.D()),
		plural(len(r.Probes), "probe"), plural(r.Requests, "request"))
	switch {
	case r.TriggerLatency == nil && !r.Recovered:
		fmt.Fprintf(&b, "Did not get to %s %s: %s.\n\n", strings.ToLower(strings.TrimSuffix(verb, "ed")), r.Region, probed)
	case r.Recovered:
		fmt.Fprintf(&b, "%s %s through the admin API at %s, %s, and recovered it.\n\n", verb, r.Region, r.Admin, probed)
	default:
		fmt.Fprintf(&b, "%s %s through the admin API at %s, %s; it was not recovered.\n\n", verb, r.Region, r.Admin, probed)
	}
	if r.Aborted != "" {
		fmt.Fprintf(&b, "**Aborted:** %s\n\n", mdCell(r.Aborted))
	}
	if !r.Recovered && r.Aborted != "" && strings.Contains(r.Aborted, "recover") {
		fmt.Fprintf(&b, "**%s may still be out of service:** run `meridian failover recover --region %s`.\n\n", r.Region, r.Region)
	}
	b.WriteString("| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| policy | %s |\n", mdCell(r.Policy))
	fmt.Fprintf(&b, "| started | %s |\n", r.Started.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(&b, "| finished | %s |\n", r.Finished.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(&b, "| routable at start | %s |\n", mdCell(strings.Join(r.Routable, ", ")))
	for _, reg := range slices.Sorted(maps.Keys(r.Controllers)) {
		fmt.Fprintf(&b, "| controller %s | %s |\n", reg, mdCell(r.Controllers[reg]))
	}
	if r.TriggerLatency != nil {
		fmt.Fprintf(&b, "| trigger call | %s |\n", fmtDur(r.TriggerLatency.D()))
	}
	if r.RecoverLatency != nil {
		fmt.Fprintf(&b, "| recover call | %s |\n", fmtDur(r.RecoverLatency.D()))
	}
	fmt.Fprintf(&b, "| requests | %d (%d errors, %d violations, %d refused as no healthy region) |\n\n", r.Requests, r.Errors, r.Violations, r.Refused)

	b.WriteString("## Verdict\n\n| check | target | measured | result |\n|---|---|---|---|\n")
	for _, c := range r.Checks {
		res := "pass"
		if !c.Passed {
			res = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Name, mdCell(c.Target), mdCell(c.Measured), res)
	}

	b.WriteString("\n## Timeline\n\n")
	if r.TriggerLatency != nil {
		b.WriteString("Times are from the trigger returning.\n\n")
	} else {
		b.WriteString("Times are from the start.\n\n")
	}
	b.WriteString("| time | event | probe | detail |\n|---|---|---|---|\n")
	for _, e := range r.Timeline {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", fmtOffset(e.Offset), e.Kind, mdCell(e.Probe), mdCell(e.Detail))
	}

	b.WriteString("\n## Probes\n\n")
	b.WriteString("Affected probes had a baseline outcome the policy does not allow while the region is out; they time the move and the return.\n\n")
	b.WriteString("| probe | allowed (rule) | expected while failed | before | while failed | after | moved | back | verdict |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range r.Probes {
		fmt.Fprintf(&b, "| %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |\n", mdCell(p.Probe),
			mdCell(orNone(p.Allowed)), mdCell(p.Rule), mdCell(strings.Join(p.WhileFailed, ", ")),
			mdCell(outcomesIn(p.Outcomes, "before")), mdCell(outcomesIn(p.Outcomes, "failed")), mdCell(outcomesIn(p.Outcomes, "after")),
			optDur(p.Moved, p.Affected), optDur(p.Back, p.Affected), p.Verdict)
	}

	if len(r.ViolationSamples) > 0 {
		fmt.Fprintf(&b, "\n## Residency violations (%d)\n\n| time | probe | phase | outcome | decision |\n|---|---|---|---|---|\n", r.Violations)
		for _, s := range r.ViolationSamples {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", fmtOffset(s.Offset), mdCell(s.Probe), s.Phase, mdCell(s.Outcome), mdCell(s.DecisionID))
		}
	}
	if len(r.ErrorSamples) > 0 {
		fmt.Fprintf(&b, "\n## Errors (%d; the first %d)\n\n| time | probe | phase | outcome | detail |\n|---|---|---|---|---|\n", r.Errors, len(r.ErrorSamples))
		for _, s := range r.ErrorSamples {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", fmtOffset(s.Offset), mdCell(s.Probe), s.Phase, mdCell(s.Outcome), mdCell(s.Detail))
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write drill report: %w", err)
	}
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func optDur(m *Millis, affected bool) string {
	switch {
	case !affected:
		return "-"
	case m == nil:
		return "never"
	}
	return fmtDur(m.D())
}

// outcomesIn renders a phase's outcomes: "200 us-east-1 ×38, 200 us-west-2 ×2 (stale)".
func outcomesIn(os []OutcomeCount, phase string) string {
	var parts []string
	for _, o := range os {
		if o.Phase != phase {
			continue
		}
		s := fmt.Sprintf("%s ×%d", o.Outcome, o.Count)
		if o.Class != "ok" {
			s += " (" + o.Class + ")"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// mdCell makes s safe inside a Markdown table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.ReplaceAll(s, "\n", " ")
	return s
}
