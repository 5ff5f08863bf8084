package route

import (
	"errors"
	"fmt"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
)

// Placement is where a request goes: a pod of this region, or a remote
// region (whose controller then picks the pod), with the full explanation.
type Placement struct {
	// Local is the best pod of this region, when this region may serve the
	// request and has a healthy pod (even if a remote region won).
	Local *Decision `json:"local,omitempty"`
	// Region is the chosen region: this one when Remote is false.
	Region string `json:"region"`
	Remote bool   `json:"remote"`
	// Reason is gorgo's (local_best, remote_saves, remote_only).
	Reason string `json:"reason"`
	// Candidates are what was compared (the local best first, if any), and
	// Cost gorgo's decision over them.
	Candidates []gorgo.Candidate `json:"candidates"`
	Cost       gorgo.Decision    `json:"cost"`
}

// ErrNoRegion means no allowed region can take the request.
var ErrNoRegion = errors.New("no allowed region can serve the request")

// Place decides between this region's best pod and the remote regions
// (candidates already filtered to the regions residency allows, routable,
// with fresh enough summaries — see gossip.RegionsView.Candidates). local
// says whether this region may serve at all (residency and region state).
// shares is the remote-share guardrail's state: Place reads it and changes
// nothing, so a dry run (POST /v1/route) leaves the guardrail as it found
// it; a caller that serves the placement counts it with Record. Place
// changes no session or load accounting either.
func (d *Decider) Place(req *Request, region string, local bool, remotes []gorgo.Candidate, shares *gorgo.ShareTracker) (*Placement, error) {
	now := d.now()
	pl := &Placement{}
	var localErr error
	if local {
		dec, err := d.Decide(req)
		if err == nil {
			pl.Local = dec
			c := dec.Candidate
			c.Region, c.Remote = region, false
			pl.Candidates = append(pl.Candidates, c)
		}
		localErr = err
	}
	pl.Candidates = append(pl.Candidates, remotes...)
	var view gorgo.ShareView
	if shares != nil {
		view = shares
	}
	d.model.Choose(pl.Candidates, view, now, &pl.Cost)
	if pl.Cost.Winner < 0 {
		if localErr != nil {
			return pl, fmt.Errorf("%w: local: %v", ErrNoRegion, localErr)
		}
		return pl, ErrNoRegion
	}
	w := pl.Candidates[pl.Cost.Winner]
	pl.Reason = pl.Cost.Reason
	if w.Remote {
		pl.Region, pl.Remote = w.Region, true
	} else {
		pl.Region = region
	}
	return pl, nil
}

// Record counts a placement that is being served in the remote-share
// guardrail's window (nil shares: no guardrail).
func (pl *Placement) Record(shares *gorgo.ShareTracker, now time.Time) {
	if shares == nil {
		return
	}
	if pl.Remote {
		shares.Record(pl.Region, now)
	} else {
		shares.Record("", now)
	}
}
