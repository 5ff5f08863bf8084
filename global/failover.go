package global

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// AutoFailoverConfig configures the automatic failover decision.
//
// A region is failed only on evidence that its pods cannot serve: its own
// report (the serving pods its latest summary counts, no older than
// ReportMaxAge) below MinHealthyPods, or, when the leader holds no current
// report of the region, a majority of the other regions each holding a
// current one below MinHealthyPods. A region that cannot be heard from —
// its controllers declared dead, its report stale everywhere — is not
// failed: a partition between controllers is not a failure of the pods
// behind them, which keep serving the traffic that reaches them, and
// forwards to such a region fail fast and fall back to the next allowed
// one.
type AutoFailoverConfig struct {
	// Interval is how often the leader evaluates the observations. Default 1s.
	Interval time.Duration
	// MinHealthyPods fails a region whose own report counts fewer serving
	// pods. Required (>= 1); default 1.
	MinHealthyPods int
	// ReportMaxAge is how old a region's report may be and still count as
	// evidence either way: an older one neither fails nor recovers the
	// region. Default 30s.
	ReportMaxAge time.Duration
	// Grace is how long a region must stay unhealthy before it is failed, so
	// one bad observation does not fail it. Default 10s.
	Grace time.Duration
	// AutoRecover brings automatically failed regions back: healthy again ->
	// recovering, healthy for HoldDown more -> active. Regions failed or
	// drained by an operator are never recovered automatically. Default true.
	AutoRecover bool
	// HoldDown is how long a recovering region must stay healthy before it
	// takes traffic again. Default 60s.
	HoldDown time.Duration
}

// DefaultAutoFailoverConfig returns the defaults documented on the fields.
func DefaultAutoFailoverConfig() AutoFailoverConfig {
	return AutoFailoverConfig{
		Interval:       time.Second,
		MinHealthyPods: 1,
		ReportMaxAge:   30 * time.Second,
		Grace:          10 * time.Second,
		AutoRecover:    true,
		HoldDown:       60 * time.Second,
	}
}

// Validate checks the configuration; errors name the field.
func (c AutoFailoverConfig) Validate() error {
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("auto failover config: Interval = %v: must be > 0", c.Interval))
	}
	if c.MinHealthyPods < 1 {
		errs = append(errs, fmt.Errorf("auto failover config: MinHealthyPods = %d: must be >= 1 (a region's pods failing to serve is the only evidence of its failure)", c.MinHealthyPods))
	}
	if c.ReportMaxAge <= 0 {
		errs = append(errs, fmt.Errorf("auto failover config: ReportMaxAge = %v: must be > 0", c.ReportMaxAge))
	}
	if c.Grace < 0 {
		errs = append(errs, fmt.Errorf("auto failover config: Grace = %v: must be >= 0", c.Grace))
	}
	if c.HoldDown < 0 {
		errs = append(errs, fmt.Errorf("auto failover config: HoldDown = %v: must be >= 0", c.HoldDown))
	}
	return errors.Join(errs...)
}

// RegionObservation is what the outer layer knows about one region.
type RegionObservation struct {
	// Controllers is the number of controllers known in the region.
	Controllers int
	// DeadControllers is how many of them are declared dead. Liveness alone
	// never fails a region; it explains why a report is stale.
	DeadControllers int
	// HealthyPods is the region's own report of its serving pods; -1 when
	// unknown (no report: no evidence either way).
	HealthyPods int
	// ReportAge is how old that report is (0: current, as for the
	// observer's own region).
	ReportAge time.Duration
	// Views are the other regions' views of this region's pods, by
	// observing region (the leader's own region among them): for each, the
	// freshest report of this region that any of its controllers holds.
	// They decide only when the leader holds no current report of the
	// region itself (see Decider.Step). A region that sends none is absent.
	Views map[string]PeerView
}

// PeerView is what one region holds of another region's report.
type PeerView struct {
	// HealthyPods is the serving pods the report counts; -1: no report.
	HealthyPods int
	// ReportAge is how old that report is.
	ReportAge time.Duration
}

// Observations maps region name to what is known about it. A region without
// an observation is left alone.
type Observations map[string]RegionObservation

// Transition is a region state change decided by the failover decision.
type Transition struct {
	Region string
	From   RegionState
	To     RegionState
	Reason string
}

// Decision is the output of one Decider step: the changes to commit (each as
// a compare-and-set from From) and notes explaining what was held back.
type Decision struct {
	Transitions []Transition
	Notes       []string
}

// Decider is the automatic failover decision: a deterministic state machine
// fed explicit inputs (the committed State, observations, the time). It keeps
// only when each region's current health condition began. It runs on the
// leader only; Reset it when leadership is gained so stale timers are not
// trusted.
type Decider struct {
	cfg            AutoFailoverConfig
	unhealthySince map[string]time.Time
	healthySince   map[string]time.Time
}

// NewDecider returns a Decider with no history.
func NewDecider(cfg AutoFailoverConfig) *Decider {
	d := &Decider{cfg: cfg}
	d.Reset()
	return d
}

// Reset forgets when conditions began.
func (d *Decider) Reset() {
	d.unhealthySince = map[string]time.Time{}
	d.healthySince = map[string]time.Time{}
}

// health is what an observation says of a region's pods.
type health uint8

const (
	healthUnknown health = iota // no current report: no evidence either way
	healthGood
	healthBad
)

// judgeReport says what one report of a region's pods is evidence of, and
// why.
func (d *Decider) judgeReport(pods int, age time.Duration) (health, string) {
	switch {
	case pods < 0:
		return healthUnknown, "no report of its pods"
	case age > d.cfg.ReportMaxAge:
		return healthUnknown, fmt.Sprintf("its last report is %v old", age.Round(time.Second))
	case pods < d.cfg.MinHealthyPods:
		return healthBad, fmt.Sprintf("%d healthy pods, fewer than %d", pods, d.cfg.MinHealthyPods)
	}
	return healthGood, ""
}

// judge says what the observation of a region is evidence of, and why.
// others are the other known regions, whose views vote.
func (d *Decider) judge(o RegionObservation, others []string) (health, string) {
	h, why := d.judgeReport(o.HealthyPods, o.ReportAge)
	if h != healthUnknown {
		return h, why // its own current report decides
	}
	if o.HealthyPods >= 0 && o.Controllers > 0 && o.DeadControllers >= o.Controllers {
		why = fmt.Sprintf("all %d controllers unreachable, %s", o.Controllers, why)
	}
	if len(o.Views) == 0 {
		return healthUnknown, why
	}
	// No current report of its own here: a majority of the other regions
	// must agree, each on a current report of its own holding.
	var bad, good []string
	for _, r := range others {
		v, ok := o.Views[r]
		if !ok {
			continue
		}
		switch vh, _ := d.judgeReport(v.HealthyPods, v.ReportAge); vh {
		case healthBad:
			bad = append(bad, r)
		case healthGood:
			good = append(good, r)
		}
	}
	need := len(others)/2 + 1
	switch {
	case len(others) > 0 && len(bad) >= need:
		return healthBad, fmt.Sprintf("fewer than %d healthy pods as seen by %d of %d other regions (%s)",
			d.cfg.MinHealthyPods, len(bad), len(others), strings.Join(bad, ", "))
	case len(others) > 0 && len(good) >= need:
		return healthGood, ""
	}
	return healthUnknown, fmt.Sprintf("%s; seen serving by %d and not serving by %d of %d other regions, %d needed",
		why, len(good), len(bad), len(others), need)
}

// Step evaluates the observations at time now against the committed state.
// Unhealthy means the region's current report counts too few serving pods
// (the region says so itself) or, when the leader holds no current report
// of it, that a majority of the other known regions hold current reports
// of it counting too few (a quorum sees it so); healthy likewise with
// enough pods. A region without either (unreachable from the leader and
// from most others) is neither unhealthy nor healthy, and is left as it
// is: the leader's view alone, or one other region's, never fails a
// region. Rules, per region in name order:
//   - an active region unhealthy for Grace is failed, unless that would
//     leave no routable region (a failover never blackholes everything);
//   - an automatically failed region that is healthy again becomes
//     recovering (with AutoRecover);
//   - a recovering region (automatic) healthy for HoldDown since it began
//     recovering and since its health returned becomes active;
//   - a recovering region unhealthy again is failed at once;
//   - operator-set states (draining, or failed by hand) are never touched.
func (d *Decider) Step(now time.Time, st *State, obs Observations) Decision {
	var dec Decision
	names := make([]string, 0, len(obs))
	for r := range obs {
		names = append(names, r)
	}
	sort.Strings(names)

	routable := map[string]bool{}
	for _, r := range st.KnownRegions() {
		routable[r] = st.Routable(r)
	}
	for _, r := range names {
		if _, ok := routable[r]; !ok {
			routable[r] = st.Routable(r)
		}
	}
	countRoutable := func() int {
		c := 0
		for _, ok := range routable {
			if ok {
				c++
			}
		}
		return c
	}

	known := make([]string, 0, len(routable))
	for r := range routable {
		known = append(known, r)
	}
	sort.Strings(known)
	others := make([]string, 0, len(known))

	for _, r := range names {
		o := obs[r]
		cur, _ := st.RegionStatus(r)
		others = others[:0]
		for _, k := range known {
			if k != r {
				others = append(others, k)
			}
		}
		h, why := d.judge(o, others)
		bad := h == healthBad
		switch h {
		case healthBad:
			delete(d.healthySince, r)
			if _, ok := d.unhealthySince[r]; !ok {
				d.unhealthySince[r] = now
			}
		case healthGood:
			delete(d.unhealthySince, r)
			if _, ok := d.healthySince[r]; !ok {
				d.healthySince[r] = now
			}
		default:
			// No evidence: neither condition continues through it.
			delete(d.unhealthySince, r)
			delete(d.healthySince, r)
			if cur.State == RegionActive || cur.Automatic {
				dec.Notes = append(dec.Notes, fmt.Sprintf("%s: no evidence of its pods (%s); leaving it %s", r, why, cur.State))
			}
			continue
		}
		switch {
		case bad && cur.State == RegionActive:
			since := d.unhealthySince[r]
			if wait := d.cfg.Grace - now.Sub(since); wait > 0 {
				dec.Notes = append(dec.Notes, fmt.Sprintf("%s unhealthy (%s); failing in %v", r, why, wait))
				continue
			}
			if countRoutable() <= 1 {
				dec.Notes = append(dec.Notes, fmt.Sprintf("%s unhealthy (%s) but it is the last routable region; not failing it", r, why))
				continue
			}
			routable[r] = false
			dec.Transitions = append(dec.Transitions, Transition{Region: r, From: RegionActive, To: RegionFailed,
				Reason: fmt.Sprintf("auto: %s for %v", why, now.Sub(since))})
		case bad && cur.State == RegionRecovering && cur.Automatic:
			dec.Transitions = append(dec.Transitions, Transition{Region: r, From: RegionRecovering, To: RegionFailed,
				Reason: fmt.Sprintf("auto: unhealthy again during hold-down (%s)", why)})
		case !bad && cur.State == RegionFailed && cur.Automatic && d.cfg.AutoRecover:
			dec.Transitions = append(dec.Transitions, Transition{Region: r, From: RegionFailed, To: RegionRecovering,
				Reason: fmt.Sprintf("auto: healthy again; hold-down %v", d.cfg.HoldDown)})
		case !bad && cur.State == RegionRecovering && cur.Automatic && d.cfg.AutoRecover:
			start := d.healthySince[r]
			if cur.Since.After(start) {
				start = cur.Since
			}
			if wait := d.cfg.HoldDown - now.Sub(start); wait > 0 {
				dec.Notes = append(dec.Notes, fmt.Sprintf("%s recovering; active in %v", r, wait))
				continue
			}
			routable[r] = true
			dec.Transitions = append(dec.Transitions, Transition{Region: r, From: RegionRecovering, To: RegionActive,
				Reason: fmt.Sprintf("auto: healthy for the %v hold-down", d.cfg.HoldDown)})
		}
	}
	return dec
}
