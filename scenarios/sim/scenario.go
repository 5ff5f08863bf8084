package sim

import (
	"fmt"
	"slices"
	"strings"
)

// Scenarios where going global should pay, as presets over a workload
// (usually the conversation trace), all under the simulator's residency
// policy with its share of pinned traffic:
//
//   - skew: one region's offered load is 8x each other's (diurnal peak):
//     us-east-1 takes 80% of the conversations, at global load 0.5 it runs
//     at 1.2x its capacity while the others idle;
//   - roaming: 30% of requests enter another region than their
//     conversation's (users travel, anycast flips);
//   - failover: us-west-2's pods fail from a third to two thirds of the
//     run, and come back cold;
//   - long-rtt: four regions, ap-southeast-1 (220 ms from every other)
//     takes 70% of the conversations.
//
// The large shared documents cached in one region are a workload of their
// own (shared-docs).
var scenarios = map[string]func(*Config){
	"skew": func(c *Config) {
		c.Workload.OriginShares = skewShares(len(c.Fleet.Regions), 0, 0.8)
	},
	"roaming": func(c *Config) { c.Workload.RoamShare = 0.3 },
	"failover": func(c *Config) {
		c.Workload.FailRegion, c.Workload.FailFrom, c.Workload.FailTo = "us-west-2", 1.0/3, 2.0/3
	},
	"long-rtt": func(c *Config) {
		c.Fleet.Regions = RegionNames(4)
		c.Fleet.RTT = nil
		c.Workload.OriginShares = skewShares(4, 3, 0.7)
	},
}

// ScenarioNames lists the scenarios, sorted.
func ScenarioNames() []string { return sortedKeys(scenarios) }

// ApplyScenario sets a scenario's parameters on cfg.
func ApplyScenario(cfg *Config, name string) error {
	f, ok := scenarios[name]
	if !ok {
		return fmt.Errorf("%w: scenario %q: want one of %s", ErrInvalidConfig, name, strings.Join(ScenarioNames(), ", "))
	}
	f(cfg)
	if !slices.Contains(cfg.Fleet.Regions, "us-west-2") && cfg.Workload.FailRegion == "us-west-2" {
		return fmt.Errorf("%w: scenario %q needs region us-west-2", ErrInvalidConfig, name)
	}
	return nil
}

// skewShares gives region hot the share hot and splits the rest evenly.
func skewShares(n, hot int, share float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = (1 - share) / float64(max(n-1, 1))
	}
	out[hot] = share
	if n == 1 {
		out[0] = 1
	}
	return out
}
