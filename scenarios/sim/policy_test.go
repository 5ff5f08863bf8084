package sim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/route"
)

// Each baseline runs its own picker behind liveness only; Meridian's
// ablations turn off exactly their part.
func TestDecisionFor(t *testing.T) {
	cfg := DefaultConfig()
	f := newFleetSpec(&cfg)
	for p, picker := range baselinePickers {
		d, _ := decisionFor(&cfg, p, f)
		if d.Policy != picker || !slices.Equal(d.Filters, []string{route.FilterAlive}) {
			t.Errorf("%s: policy %s filters %v", p, d.Policy, d.Filters)
		}
	}
	d, prof := decisionFor(&cfg, AblationNoHardware, f)
	for _, p := range prof {
		if p.PrefillMsPerToken != prof[0].PrefillMsPerToken {
			t.Errorf("no-hardware: %s priced %v, h100 %v", p.Name, p.PrefillMsPerToken, prof[0].PrefillMsPerToken)
		}
	}
	if d.Policy != route.PolicyTTFT {
		t.Errorf("no-hardware: policy %s", d.Policy)
	}
	if d, _ := decisionFor(&cfg, AblationNoLoad, f); d.Weights["queue"] != 0 || slices.Contains(d.Filters, route.FilterBoundedLoad) {
		t.Errorf("no-load: %+v", d)
	}
	if d, _ := decisionFor(&cfg, AblationNoCache, f); d.Weights["prefix"] != 0 || d.AffinityCacheWeight != 0 || d.SpeculationTTL != 0 {
		t.Errorf("no-cache: %+v", d)
	}
	if d, _ := decisionFor(&cfg, AblationNoAffinity, f); d.Weights["affinity"] != 0 || d.Weights["prefix"] != 1 {
		t.Errorf("no-affinity: %+v", d)
	}
	if cfg.Decision.Weights["queue"] == 0 {
		t.Fatal("an ablation changed the shared configuration")
	}
}

// The scenarios where going global should pay: under failover no request
// reaches the failed region's pods while they are down, residency holds
// for the policies that enforce it, and the others count violations.
func TestScenarios(t *testing.T) {
	for _, name := range ScenarioNames() {
		cfg := DefaultConfig()
		cfg.Workload.Kind = WorkloadShort
		cfg.Workload.Duration = 40 * time.Second
		cfg.Fleet.PodsPerRegion = 2
		cfg.Policies = []string{PolicyLeastLoaded, PolicyGORGO, PolicyCacheLocal, PolicyMeridian}
		if err := ApplyScenario(&cfg, name); err != nil {
			t.Fatal(err)
		}
		rep, err := Run(context.Background(), cfg, Options{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, r := range rep.Results {
			if residencySafe(r.Policy) && r.ResidencyViolations != 0 {
				t.Errorf("%s/%s: %d violations", name, r.Policy, r.ResidencyViolations)
			}
			if r.Completed == 0 {
				t.Errorf("%s/%s: nothing completed", name, r.Policy)
			}
		}
		if name == "roaming" || name == "skew" {
			if m, _ := rep.Result(PolicyMeridian); m.CrossRegionRequests == 0 {
				t.Errorf("%s: meridian sent nothing across regions", name)
			}
		}
	}
	if err := ApplyScenario(&Config{}, "nope"); err == nil {
		t.Error("unknown scenario accepted")
	}
}

// While us-west-2's pods are down, no request is served there; after,
// they serve again, cold.
func TestFailover(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Kind = WorkloadShort
	cfg.Workload.Duration = 60 * time.Second
	cfg.Fleet.PodsPerRegion = 2
	if err := ApplyScenario(&cfg, "failover"); err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{PolicyMeridian, PolicyCacheLocal, PolicyGORGO, PolicyLeastLoaded} {
		in, err := prepare(cfg)
		if err != nil {
			t.Fatal(err)
		}
		w, err := newWorld(&in.cfg, policy, in.fleet, in.res, in.source())
		if err != nil {
			t.Fatal(err)
		}
		var failed *region
		for _, r := range w.regions {
			if r.name == "us-west-2" {
				failed = r
			}
		}
		h := in.open[len(in.open)-1].at
		servedDuring, servedAfter := 0, 0
		w.at(time.Duration(float64(h)*0.4), func() {
			for _, p := range failed.pods {
				servedDuring -= int(p.rp.Load().Routed)
			}
		})
		w.at(time.Duration(float64(h)*0.6), func() {
			for _, p := range failed.pods {
				servedDuring += int(p.rp.Load().Routed)
			}
		})
		w.run(nil)
		for _, p := range failed.pods {
			servedAfter += int(p.rp.Load().Routed)
		}
		if servedDuring != 0 {
			t.Errorf("%s: %d requests routed to failed pods", policy, servedDuring)
		}
		if servedAfter == 0 {
			t.Errorf("%s: the recovered pods served nothing", policy)
		}
		if policy != PolicyLeastLoaded && w.stats.violations != 0 {
			t.Errorf("%s: %d violations", policy, w.stats.violations)
		}
	}
}

// GORGO's baseline takes the lowest 0.276 x RTT + uncached + 0.5 x queued
// tokens over the pods of every region residency allows.
func TestGORGOBaseline(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Kind = WorkloadShort
	cfg.Fleet.PodsPerRegion = 2
	in, err := prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorld(&in.cfg, PolicyGORGO, in.fleet, in.res, in.source())
	if err != nil {
		t.Fatal(err)
	}
	r := in.open[0]
	origin := w.regions[r.origin]
	allowed := w.res.Evaluate(r.attrs)
	// Load every pod of the origin with queued tokens except one remote
	// pod the request may use: the proxy must weigh RTT against queue.
	for _, p := range w.pods {
		if p.region == origin {
			p.rp.Admit(0, 0, w.wall())
			d := &route.Decision{Pod: p.rp, Uncached: 100000}
			p.region.dec.Admit(d)
		}
	}
	w.gorgo(r, origin, allowed)
	var got *pod
	for _, p := range w.pods {
		if p.rp.Load().InFlight > 0 && p.region != origin {
			got = p
		}
	}
	if allowed.Allows(w.regions[0].name) && allowed.Allows(w.regions[1].name) && got == nil {
		t.Fatal("a remote idle pod was not chosen over origin pods with 100k queued tokens each")
	}
	if got != nil && !allowed.Allows(got.region.name) {
		t.Fatalf("chose %s, which residency forbids", got.region.name)
	}
}
