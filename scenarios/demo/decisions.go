package demo

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/regional"
)

// Decision is an audit record as the status page shows it.
type Decision struct {
	Time          time.Time `json:"time"`
	Controller    string    `json:"controller"`
	Kind          string    `json:"kind"`
	Origin        string    `json:"origin"`
	Region        string    `json:"region,omitempty"`
	Pod           string    `json:"pod,omitempty"`
	DataClass     string    `json:"data_class,omitempty"`
	Rule          string    `json:"rule,omitempty"`
	PolicyVersion string    `json:"policy_version"`
	DecisionID    string    `json:"decision_id"`
	Reason        string    `json:"reason,omitempty"`    // the placement's reason, for crossings
	MarginMs      float64   `json:"margin_ms,omitempty"` // how much the chosen region beat the next
}

// keepDecisions is how many recent decisions are kept.
const keepDecisions = 40

// decisions follows the controllers' audit logs.
type decisions struct {
	mu     sync.Mutex
	recent []Decision
	counts map[string]int64 // by kind
}

func newDecisions() *decisions { return &decisions{counts: map[string]int64{}} }

// follow tails one audit log until ctx is done or the log is closed.
func (d *decisions) follow(ctx context.Context, l *audit.Log) error {
	cur, err := l.Tail(ctx, audit.Query{})
	if err != nil {
		return err
	}
	defer cur.Close()
	for {
		r, err := cur.Next()
		if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		d.add(r)
	}
}

func (d *decisions) add(r audit.Record) {
	x := Decision{Time: r.Time, Controller: r.Controller, Kind: string(r.Kind), Origin: r.Origin, Region: r.Region, Pod: r.Pod,
		DataClass: r.DataClass, Rule: r.Rule, PolicyVersion: r.PolicyVersion, DecisionID: r.DecisionID}
	var cost regional.CostExplanation
	if len(r.Cost) > 0 && json.Unmarshal(r.Cost, &cost) == nil {
		x.Reason, x.MarginMs = cost.Reason, cost.MarginMs
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts[x.Kind]++
	if r.Kind == audit.KindForwardedIn {
		return // the origin's cross_region record tells the same decision
	}
	d.recent = append(d.recent, x)
	if len(d.recent) > keepDecisions {
		d.recent = slices.Delete(d.recent, 0, len(d.recent)-keepDecisions)
	}
}

// snapshot returns the recent decisions, newest first, and the counts.
func (d *decisions) snapshot() ([]Decision, map[string]int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := slices.Clone(d.recent)
	slices.SortStableFunc(out, func(a, b Decision) int { return b.Time.Compare(a.Time) })
	counts := make(map[string]int64, len(d.counts))
	for k, v := range d.counts {
		counts[k] = v
	}
	return out, counts
}
