package sim

import (
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/route"
)

// preciseScrapeInterval is llm-d's metrics refresh (--refresh-metrics-interval
// 50ms), at which the precise_prefix world scrapes its pods' KV usage and
// waiting queues.
const preciseScrapeInterval = 50 * time.Millisecond

// baselinePickers maps the simulator's in-region baselines to the decision
// pipeline's pickers.
var baselinePickers = map[string]string{
	PolicyRoundRobin:             route.PolicyRoundRobin,
	PolicyLeastLoaded:            route.PolicyLeastLoaded,
	PolicySessionAffinity:        route.PolicySessionHash,
	PolicyWeightedRoundRobin:     route.PolicyWeightedRoundRobin,
	PolicyWeightedLeastLoaded:    route.PolicyWeightedLeastLoaded,
	PolicyLeastOutstandingTokens: route.PolicyLeastOutstandingTokens,
	PolicyBoundedAffinity:        route.PolicyBoundedAffinity,
	PolicyPrecisePrefix:          route.PolicyPrecisePrefix,
	PolicyUpperBound:             route.PolicyLeastLoaded,
	PolicyGORGO:                  route.PolicyLeastLoaded, // unused: gorgo picks across regions itself
}

// decisionFor returns the decision configuration and the router's hardware
// profiles of a policy's world.
//
// The baselines run their picker behind no filter but liveness (as their
// routers do), with the pipeline's defaults for the picker's own settings
// (bounded_affinity's load factor, precise_prefix's weights) and no
// speculation, except precise_prefix, which gets llm-d's speculative index
// entries (2 s). Meridian and its ablations run the configured decision
// layer; an ablation turns one part of it off.
func decisionFor(cfg *Config, policy string, fleet *fleetSpec) (route.Config, []gorgo.Profile) {
	profiles := fleet.routerProfiles
	if picker, ok := baselinePickers[policy]; ok {
		d := route.DefaultConfig()
		d.Filters = []string{route.FilterAlive}
		d.SpeculationTTL = 0
		if policy == PolicyPrecisePrefix {
			d.SpeculationTTL = 2 * time.Second
		}
		d.Policy = picker
		return d, profiles
	}
	d := cfg.Decision
	d.Weights = make(map[string]float64, len(cfg.Decision.Weights))
	for k, v := range cfg.Decision.Weights {
		d.Weights[k] = v
	}
	switch policy {
	case AblationNoHardware:
		// Every profile priced as the first one (h100 in the defaults).
		same := make([]gorgo.Profile, len(profiles))
		for i, p := range profiles {
			same[i] = profiles[0]
			same[i].Name = p.Name
		}
		profiles = same
	case AblationNoLoad:
		d.Weights["queue"], d.Weights["running"], d.Weights["kv_util"] = 0, 0, 0
		var keep []string
		for _, f := range d.Filters {
			if f != route.FilterBoundedLoad && f != route.FilterNewSession {
				keep = append(keep, f)
			}
		}
		d.Filters = keep
	case AblationNoCache:
		d.Weights["prefix"] = 0
		d.AffinityCacheWeight = 0
		d.SpeculationTTL = 0
	case AblationNoAffinity:
		d.Weights["affinity"] = 0
	}
	return d, profiles
}
