package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
)

// quorumPolicy spreads four regions over three zones; public data may go
// anywhere.
const quorumPolicy = `version: 1
revision: quorum-test
regions:
  - name: us-east-1
  - name: us-west-2
  - name: eu-west-1
  - name: ap-southeast-1
zones:
  us: [us-east-1, us-west-2]
  eu: [eu-west-1]
  ap: [ap-southeast-1]
data_classes: [public]
rules:
  - name: public-anywhere
    match: {data_class: public}
    allow: [us, eu, ap]
default:
  allow: [origin]
`

// Issue acceptance (faults, failover on a quorum of regions' view): four
// regions, automatic failover on. One region is cut off (gossip) from the
// Raft leader's controller only, for longer than a report may be old:
// the leader holds no current report of it, the two other regions do and
// see it serving, so it is not failed. Then its pods all go: those two
// regions see its report of no pod, a majority of the three others, and
// the leader fails it over though it cannot hear it itself.
func TestFailoverOnQuorumOfRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	clk := &fastClock{}
	part := gossiptest.NewPartition()
	const maxAge = 10 * time.Second
	f := startFleet(t, Config{
		Regions: []RegionSpec{{Name: "us-east-1"}, {Name: "us-west-2"}, {Name: "eu-west-1"}, {Name: "ap-southeast-1"}},
		Policy:  []byte(quorumPolicy),
		Controller: func(_ string, c *regional.Config) {
			c.AutoFailover = regional.AutoFailoverConfig{Enabled: true, Interval: 200 * time.Millisecond, MinHealthyPods: 1,
				Grace: 2 * time.Second, HoldDown: 5 * time.Second, ReportMaxAge: maxAge}
		},
		Deps: func(region string, d *regional.Deps) {
			d.Clock, d.WrapGossipTransport = clk.Now, part.Wrap("ctl-"+region)
		},
	})
	var leader *regional.Controller
	var leaderRegion string
	eventually(t, "a raft leader", func() bool {
		for _, r := range f.Regions {
			if r.Controller.Global().IsLeader() {
				leader, leaderRegion = r.Controller, r.Name
				return true
			}
		}
		return false
	})
	cut := "eu-west-1"
	if leaderRegion == cut {
		cut = "ap-southeast-1"
	}
	var others []string // the regions other than the cut one and the leader's
	for _, r := range f.Regions {
		if r.Name != cut && r.Name != leaderRegion {
			others = append(others, r.Name)
		}
	}
	t.Logf("leader %s in %s; cutting %s off from it; %v still hear it", leader.ID(), leaderRegion, cut, others)

	// What the leader's view says of the cut region: its own copy of the
	// region's report, and the other regions' copies from their sightings.
	seen := func(wantPods int) error {
		view := leader.Gossip().View()
		now := clk.Now()
		var errs []string
		for _, s := range view.Sightings {
			if s.Region != cut {
				continue
			}
			age := s.SummaryAge(now)
			switch {
			case s.Observer == leader.ID() && age <= maxAge:
				errs = append(errs, fmt.Sprintf("the leader's own report of %s is current (%v old)", cut, age))
			case s.ObserverRegion != leaderRegion && (s.Pods != wantPods || age > maxAge):
				errs = append(errs, fmt.Sprintf("%s sees %d pods in a report %v old, want %d in a current one", s.Observer, s.Pods, age, wantPods))
			}
		}
		if n := countObservers(view.Sightings, cut, leaderRegion); n != len(others) {
			errs = append(errs, fmt.Sprintf("sightings of %s from %d other regions, want %d", cut, n, len(others)))
		}
		if len(errs) > 0 {
			return fmt.Errorf("%s", strings.Join(errs, "; "))
		}
		return nil
	}
	evaluations := func() float64 { return counter(t, leader, "meridian_global_auto_failover_evaluations_total", nil) }
	evaluated := func(what string) {
		t.Helper()
		from := evaluations()
		eventually(t, what, func() bool { return evaluations() >= from+2 })
	}

	part.Cut([]string{"ctl-" + leaderRegion}, []string{"ctl-" + cut})
	clk.Advance(maxAge + 5*time.Second) // the leader's copy of the cut region's report is no longer current
	eventually(t, "the leader holds no current report of "+cut+"; the other regions do, and see its pods", func() bool {
		return seen(2) == nil
	})
	evaluated("the automatic failover to evaluate the cut-off region")
	if err := seen(2); err != nil {
		t.Fatalf("the premise changed during the evaluation: %v", err)
	}
	for _, r := range f.Regions {
		if s := r.Controller.Global().State().RegionState(cut).String(); s != "active" {
			t.Fatalf("%s sees %s %s while the other regions see it serving", r.Name, cut, s)
		}
	}

	// Its pods all go: the regions that hear it see its report of none.
	for _, e := range f.Region(cut).Engines {
		if err := e.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, cut+" failed over on the other regions' view", func() bool { return f.nowhereRoutable(cut) })
	rs, _ := leader.Global().State().RegionStatus(cut)
	if rs.State.String() != "failed" || !rs.Automatic {
		t.Fatalf("%s: %+v", cut, rs)
	}
	if !leader.Global().IsLeader() {
		t.Logf("leadership moved during the test; not checking who decided (reason %q)", rs.Reason)
	} else if want := fmt.Sprintf("as seen by %d of 3 other regions", len(others)); !strings.Contains(rs.Reason, want) {
		t.Fatalf("%s failed for %q, want the other regions' view (%q)", cut, rs.Reason, want)
	}
	t.Logf("%s failed: %s", cut, rs.Reason)
}

// countObservers counts the regions other than region and except whose
// controllers sent a sighting of region.
func countObservers(sightings []gossip.Sighting, region, except string) int {
	set := map[string]bool{}
	for _, s := range sightings {
		if s.Region == region && s.ObserverRegion != except && s.ObserverRegion != region {
			set[s.ObserverRegion] = true
		}
	}
	return len(set)
}
