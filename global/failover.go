package global

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// AutoFailoverConfig configures the automatic failover decision.
type AutoFailoverConfig struct {
	// Interval is how often the leader evaluates the observations. Default 1s.
	Interval time.Duration
	// FailOnControllersDead fails a region when every one of its known
	// controllers is declared dead (by gossip). Default true.
	FailOnControllersDead bool
	// MinHealthyPods fails a region whose healthy pod count is below this
	// (0 disables the check). Default 1.
	MinHealthyPods int
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
		Interval:              time.Second,
		FailOnControllersDead: true,
		MinHealthyPods:        1,
		Grace:                 10 * time.Second,
		AutoRecover:           true,
		HoldDown:              60 * time.Second,
	}
}

// Validate checks the configuration; errors name the field.
func (c AutoFailoverConfig) Validate() error {
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("auto failover config: Interval = %v: must be > 0", c.Interval))
	}
	if c.MinHealthyPods < 0 {
		errs = append(errs, fmt.Errorf("auto failover config: MinHealthyPods = %d: must be >= 0", c.MinHealthyPods))
	}
	if c.Grace < 0 {
		errs = append(errs, fmt.Errorf("auto failover config: Grace = %v: must be >= 0", c.Grace))
	}
	if c.HoldDown < 0 {
		errs = append(errs, fmt.Errorf("auto failover config: HoldDown = %v: must be >= 0", c.HoldDown))
	}
	if !c.FailOnControllersDead && c.MinHealthyPods == 0 {
		errs = append(errs, errors.New("auto failover config: FailOnControllersDead is false and MinHealthyPods is 0: nothing can trigger a failover"))
	}
	return errors.Join(errs...)
}

// RegionObservation is what the outer layer knows about one region.
type RegionObservation struct {
	// Controllers is the number of controllers known in the region.
	Controllers int
	// DeadControllers is how many of them are declared dead.
	DeadControllers int
	// HealthyPods is the region's healthy pod count; -1 when unknown (then
	// the pod check does not apply).
	HealthyPods int
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

// unhealthy says whether an observation calls for a failover, and why.
func (d *Decider) unhealthy(o RegionObservation) (bool, string) {
	if d.cfg.FailOnControllersDead && o.Controllers > 0 && o.DeadControllers >= o.Controllers {
		return true, fmt.Sprintf("all %d controllers declared dead", o.Controllers)
	}
	if d.cfg.MinHealthyPods > 0 && o.HealthyPods >= 0 && o.HealthyPods < d.cfg.MinHealthyPods {
		return true, fmt.Sprintf("%d healthy pods, fewer than %d", o.HealthyPods, d.cfg.MinHealthyPods)
	}
	return false, ""
}

// Step evaluates the observations at time now against the committed state.
// Rules, per region in name order:
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

	for _, r := range names {
		o := obs[r]
		cur, _ := st.RegionStatus(r)
		bad, why := d.unhealthy(o)
		if bad {
			delete(d.healthySince, r)
			if _, ok := d.unhealthySince[r]; !ok {
				d.unhealthySince[r] = now
			}
		} else {
			delete(d.unhealthySince, r)
			if _, ok := d.healthySince[r]; !ok {
				d.healthySince[r] = now
			}
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
