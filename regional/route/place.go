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
// with fresh enough summaries — see gossip.RegionsView.Candidates; each
// pays here the running scorer's charge on its requests in flight). local
// says whether this region may serve at all (residency and region state).
// shares is the remote-share guardrail's state: Place reads it and changes
// nothing, so a dry run (POST /v1/route) leaves the guardrail as it found
// it; a caller that serves the placement counts it with Record. Place
// changes no session or load accounting either.
func (d *Decider) Place(req *Request, region string, local bool, remotes []gorgo.Candidate, shares *gorgo.ShareTracker) (*Placement, error) {
	pl := &Placement{}
	err := d.PlaceInto(req, region, local, remotes, shares, pl)
	return pl, err
}

// PlaceInto is Place writing into dst, reusing its Local decision, its
// Candidates and its estimates: with a dst kept from an earlier placement
// it allocates nothing (TestDecideAllocs). dst is overwritten whole.
func (d *Decider) PlaceInto(req *Request, region string, local bool, remotes []gorgo.Candidate, shares *gorgo.ShareTracker, dst *Placement) error {
	now := d.now()
	spare := dst.Local
	*dst = Placement{Candidates: dst.Candidates[:0], Cost: gorgo.Decision{Estimates: dst.Cost.Estimates}}
	var localErr error
	if local {
		dec := spare
		if dec == nil {
			dec = &Decision{}
		}
		localErr = d.DecideInto(req, dec)
		if localErr == nil {
			dst.Local = dec
			c := dec.Candidate
			c.Region, c.Remote = region, false
			dst.Candidates = append(dst.Candidates, c)
		}
	}
	n := len(dst.Candidates)
	dst.Candidates = append(dst.Candidates, remotes...)
	// A remote candidate pays what the running scorer charges a local one
	// for the requests in flight on its pod (the remote controller's own
	// picker charges its pods so): without it a remote pool with as many
	// requests in flight looked that much sooner than a local pod (2 ms
	// each; 150-200 ms on the simulator's short prompts at load 0.8).
	if perRequestMs := d.pipe.Load().runningMs(); perRequestMs > 0 {
		for i := n; i < len(dst.Candidates); i++ {
			dst.Candidates[i].ExtraMs += perRequestMs * float64(max(dst.Candidates[i].Running, 0))
		}
	}
	var view gorgo.ShareView
	if shares != nil {
		view = shares
	}
	d.model.Choose(dst.Candidates, view, now, &dst.Cost)
	if dst.Cost.Winner < 0 {
		if localErr != nil {
			return fmt.Errorf("%w: local: %w", ErrNoRegion, localErr)
		}
		return ErrNoRegion
	}
	w := dst.Candidates[dst.Cost.Winner]
	dst.Reason = dst.Cost.Reason
	if w.Remote {
		dst.Region, dst.Remote = w.Region, true
	} else {
		dst.Region = region
	}
	return nil
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
