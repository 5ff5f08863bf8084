package global

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RunAutoFailover runs the automatic failover until ctx ends: every
// cfg.Interval, when this node leads, it asks observe for the current
// observations, runs the Decider and commits each transition as a
// compare-and-set (so a concurrent operator change wins). On a follower it
// does nothing but forget the Decider's timers. It returns nil when ctx ends.
func (n *Node) RunAutoFailover(ctx context.Context, cfg AutoFailoverConfig, observe func(context.Context) Observations) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	d := NewDecider(cfg)
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	wasLeader := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if n.closed.Load() {
			return ErrClosed
		}
		leader := n.IsLeader()
		if !leader || !wasLeader {
			d.Reset()
		}
		wasLeader = leader
		if !leader {
			continue
		}
		st := n.State()
		dec := d.Step(n.now(), st, observe(ctx))
		n.m.autoSteps.Inc()
		for _, note := range dec.Notes {
			n.log.Debug("auto failover", "note", note)
		}
		for _, tr := range dec.Transitions {
			if err := n.commitTransition(ctx, st, tr); err != nil && ctx.Err() == nil {
				n.log.Warn("auto failover: commit failed", "target_region", tr.Region, "to", tr.To, "err", err)
			}
		}
	}
}

// commitTransition commits one decided transition. The request id is derived
// from the state index the decision was based on, so a retry, or the same
// decision made again on the same state, is applied once.
func (n *Node) commitTransition(ctx context.Context, st *State, tr Transition) error {
	from := tr.From
	rid := fmt.Sprintf("auto:%s:%s:%d", tr.Region, tr.To, st.index)
	_, err := n.SetRegionState(ctx, RegionChange{Region: tr.Region, State: tr.To, Reason: tr.Reason, Expect: &from, Automatic: true, Force: true},
		WriteOptions{RequestID: rid, Actor: "auto:" + n.cfg.NodeID})
	if errors.Is(err, ErrConflict) {
		return nil // the state moved on (an operator acted); the next step re-decides
	}
	if err == nil {
		n.m.autoFailovers.WithLabelValues(tr.To.String()).Inc()
		n.log.Warn("auto failover", "target_region", tr.Region, "from", tr.From, "to", tr.To, "reason", tr.Reason)
	}
	return err
}
