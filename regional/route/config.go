package route

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meridian-llm/meridian/index"
)

// Policies a Decider can pick pods by. PolicyTTFT is Meridian's; the others
// are the baselines operators compare it with, through the same controller.
const (
	PolicyTTFT        = "ttft"         // lowest expected time to first token (cache + load)
	PolicyRoundRobin  = "round_robin"  // in turn, ignoring cache and load
	PolicyLeastLoaded = "least_loaded" // fewest requests in flight
	PolicySessionHash = "session_hash" // rendezvous hash of the session id (stateless affinity)

	// The fair baselines (issue 17): what a careful operator of another
	// router would run on a mixed fleet, so Meridian is compared with them
	// and not only with hardware-blind ones.
	PolicyWeightedRoundRobin     = "weighted_round_robin"     // in turn, in proportion to prefill speed
	PolicyWeightedLeastLoaded    = "weighted_least_loaded"    // fewest in flight per unit of prefill speed
	PolicyLeastOutstandingTokens = "least_outstanding_tokens" // fewest prompt tokens in flight per unit of speed
	PolicyBoundedAffinity        = "bounded_affinity"         // consistent hashing with bounded loads, speed-weighted
	PolicyPrecisePrefix          = "precise_prefix"           // llm-d's precise prefix-cache scorer with its load scorers
)

// Filter names, applied in the configured order.
const (
	FilterAlive       = "alive"        // the pod is live in the index
	FilterModel       = "model"        // the pod serves the requested model
	FilterHealthy     = "healthy"      // not ejected by outlier detection
	FilterBoundedLoad = "bounded_load" // in flight <= BoundedLoadFactor x mean
	// FilterNewSession places the first request of a session (a session id
	// not seen yet) by load: only the least loaded pods (in flight per unit
	// of prefill speed, within one request of the least) stay candidates, so
	// sessions spread evenly and then stay where their cache grows (Modal's
	// lesson: session affinity alone is Poisson-uneven).
	FilterNewSession = "new_session"
)

// Config configures the decision pipeline: filters, then scorers
// (each a term in milliseconds, multiplied by its weight), then the picker.
type Config struct {
	// Policy picks among the pods the filters leave; default "ttft".
	Policy string `yaml:"policy"`
	// Filters in order; default alive, model, healthy, bounded_load.
	// new_session is off by default: it places a session's first request
	// by in-flight count, which sends it behind a pod's one long prefill
	// (on the simulated conversation trace at load 0.5 it raised Meridian's
	// TTFT p95 from 3.1 s to 5.1 s).
	Filters []string `yaml:"filters"`
	// Weights of the scorers (0 turns one off):
	//   prefix:   cached tokens count toward the prefill saving (0..1; 1 = fully)
	//   queue:    the prefill backlog ahead on the pod (multiplies gorgo's
	//             queue term, itself weighted by gorgo's queue_weight)
	//   running:  RunningPenaltyMs per request already in flight on the pod
	//   kv_util:  KVUtilPenaltyMs x how far the pod's KV cache is past 80% full
	//   affinity: -(AffinityBonusMs + AffinityCacheWeight x the prefill
	//             time of its cached tokens) on the pod a session is pinned to
	Weights map[string]float64 `yaml:"weights"`
	// BoundedLoadFactor: a pod is a candidate only while its in-flight
	// requests + 1 <= ceil(factor x (total in flight + 1) x its share of the
	// pods' prefill speed), so no pod takes more than factor x its fair share
	// (consistent hashing with bounded loads, weighted by hardware: on a
	// uniform fleet the share is 1/pods). Default 2.5.
	BoundedLoadFactor float64 `yaml:"bounded_load_factor"`
	// RunningPenaltyMs per request in flight on a pod (each slows the
	// engine's batch steps). Default 2.
	RunningPenaltyMs float64 `yaml:"running_penalty_ms"`
	// KVUtilPenaltyMs at a full KV cache (linear from 80% to 100%). Default 100.
	KVUtilPenaltyMs float64 `yaml:"kv_util_penalty_ms"`
	// AffinityBonusMs is subtracted for a session's pinned pod. Default 50.
	AffinityBonusMs float64 `yaml:"affinity_bonus_ms"`
	// AffinityCacheWeight values what a session's pinned pod holds for it
	// beyond this request's saving: its prefill time of the matched tokens
	// x this weight is taken off the pod's estimate. The cost model alone
	// prices one request; moving a conversation off its warm pod also
	// copies its history onto another pod, where it evicts other prefixes,
	// while the old copy goes unused. Default 1 (the history counted
	// twice); 0 turns it off. On the conversation trace (meridian sim) it
	// lifts the hit rate from 85% to 90-92% of a pooled cache's, TTFT
	// unchanged; coding-agent fleets that want the most even spread turn
	// it off (see the README).
	AffinityCacheWeight float64 `yaml:"affinity_cache_weight"`
	// ThickSession is the number of a session's concurrent requests past
	// which its requests no longer get the affinity bonus. Default 4.
	ThickSession int `yaml:"thick_session"`
	// TierWeights weight a matched block by where the pod holds it (gpu,
	// cpu, disk, external); applied to the best candidates only. Default
	// 1, 0.8, 0.5, 0.3.
	TierWeights [index.NumTiers]float64 `yaml:"tier_weights"`
	// SessionTTL and MaxSessions bound the affinity table. Defaults 30m, 1M.
	SessionTTL  time.Duration `yaml:"session_ttl"`
	MaxSessions int           `yaml:"max_sessions"`
	// TopK candidates are explained in a decision. Default 3.
	TopK int `yaml:"top_k"`
	// TieMs: the ttft picker treats the candidates within this many
	// milliseconds of the best estimate as tied and breaks the tie by a
	// rendezvous hash of the request's session id (else its prompt, else
	// its request id) and the pod, so that the replicas of a region, whose
	// views of the pods' load differ by what is in flight between their
	// exchanges, decide a request alike, and a session's turns prefer one
	// pod. 0: exact ties only. Default 5.
	TieMs float64 `yaml:"tie_ms"`
	// BoundedAffinity configures the bounded_affinity picker.
	BoundedAffinity BoundedAffinityConfig `yaml:"bounded_affinity"`
	// PrecisePrefix configures the precise_prefix picker.
	PrecisePrefix PrecisePrefixConfig `yaml:"precise_prefix"`
	// SpeculationTTL is how long a pod that has just answered is assumed to
	// hold its prompt's prefix before the index learns it from the pod's
	// events (see Speculation): until the index confirms it, at most this
	// long. 0 turns it off. Default 10s (KV events normally reach the index
	// within a few hundred milliseconds; the bound matters when ingestion
	// lags or an engine evicts before its events arrive).
	SpeculationTTL time.Duration `yaml:"speculation_ttl"`
}

// BoundedAffinityConfig is consistent hashing with bounded loads (Mirrokni,
// Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA
// 2018), weighted by hardware: each pod has VirtualNodes x its prefill speed
// relative to the slowest pod's points on the ring, and a session's key
// walks the ring from its hash to the first pod whose in-flight requests + 1
// stay within ceil(LoadFactor x (total in flight + 1) x the pod's share of
// the candidates' prefill speed).
type BoundedAffinityConfig struct {
	// LoadFactor is 1 + epsilon of the paper. Default 1.25 (the epsilon of
	// 0.25 the paper's evaluation and HAProxy's hash-balance-factor 125
	// use).
	LoadFactor float64 `yaml:"load_factor"`
	// VirtualNodes per pod of the slowest profile. Default 160 (vLLM
	// router's consistent_hash).
	VirtualNodes int `yaml:"virtual_nodes"`
}

// PrecisePrefixConfig weighs the three scorers of llm-d's precise
// prefix-cache-aware profile, each in [0, 1], their weighted sum maximised:
// the prefix score is a pod's cached prefix blocks min-max normalised over
// the pods that hold any (1 when they all hold the same; 0 for a pod that
// holds none), kv_util is 1 - the scraped KV-cache usage, queue is
// (max - q) / (max - min) of the scraped waiting queues (1 when all equal).
type PrecisePrefixConfig struct {
	// Defaults 2, 1, 1: llm-d's guide
	// guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml
	// (llm-d/llm-d@019a3f3).
	PrefixWeight float64 `yaml:"prefix_weight"`
	KVUtilWeight float64 `yaml:"kv_util_weight"`
	QueueWeight  float64 `yaml:"queue_weight"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Policy:              PolicyTTFT,
		Filters:             []string{FilterAlive, FilterModel, FilterHealthy, FilterBoundedLoad},
		Weights:             map[string]float64{"prefix": 1, "queue": 1, "running": 1, "kv_util": 1, "affinity": 1},
		BoundedLoadFactor:   2.5,
		RunningPenaltyMs:    2,
		KVUtilPenaltyMs:     100,
		AffinityBonusMs:     50,
		AffinityCacheWeight: 1,
		ThickSession:        4,
		TierWeights:         [index.NumTiers]float64{1, 0.8, 0.5, 0.3},
		SessionTTL:          30 * time.Minute,
		MaxSessions:         1 << 20,
		TopK:                3,
		TieMs:               5,
		BoundedAffinity:     BoundedAffinityConfig{LoadFactor: 1.25, VirtualNodes: 160},
		PrecisePrefix:       PrecisePrefixConfig{PrefixWeight: 2, KVUtilWeight: 1, QueueWeight: 1},
		SpeculationTTL:      10 * time.Second,
	}
}

var knownScorers = []string{"prefix", "queue", "running", "kv_util", "affinity"}

// Policies are the picker policies a decision config (or, where allowed,
// the X-Meridian-Policy header) may name.
var Policies = []string{PolicyTTFT, PolicyRoundRobin, PolicyLeastLoaded, PolicySessionHash,
	PolicyWeightedRoundRobin, PolicyWeightedLeastLoaded, PolicyLeastOutstandingTokens, PolicyBoundedAffinity, PolicyPrecisePrefix}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	if !slices.Contains(Policies, c.Policy) {
		return fmt.Errorf("decision config: policy %q: want one of %s", c.Policy, strings.Join(Policies, ", "))
	}
	for _, f := range c.Filters {
		switch f {
		case FilterAlive, FilterModel, FilterHealthy, FilterBoundedLoad, FilterNewSession:
		default:
			return fmt.Errorf("decision config: filters: unknown filter %q (want alive, model, healthy, bounded_load, new_session)", f)
		}
	}
	for name, w := range c.Weights {
		if !slices.Contains(knownScorers, name) {
			return fmt.Errorf("decision config: weights: unknown scorer %q (want %v)", name, knownScorers)
		}
		if !(w >= 0) || w > 100 {
			return fmt.Errorf("decision config: weights.%s = %v: want 0..100", name, w)
		}
		if name == "prefix" && w > 1 {
			return fmt.Errorf("decision config: weights.prefix = %v: want 0..1 (a cached token cannot save more than its prefill)", w)
		}
	}
	switch {
	case !(c.BoundedLoadFactor >= 1):
		return fmt.Errorf("decision config: bounded_load_factor = %v: want >= 1", c.BoundedLoadFactor)
	case c.RunningPenaltyMs < 0 || c.KVUtilPenaltyMs < 0 || c.AffinityBonusMs < 0 || c.AffinityCacheWeight < 0:
		return fmt.Errorf("decision config: running_penalty_ms, kv_util_penalty_ms, affinity_bonus_ms and affinity_cache_weight must be >= 0")
	case c.ThickSession < 1:
		return fmt.Errorf("decision config: thick_session = %d: want >= 1", c.ThickSession)
	case c.SessionTTL <= 0 || c.MaxSessions < 1:
		return fmt.Errorf("decision config: session_ttl = %v, max_sessions = %d: want > 0", c.SessionTTL, c.MaxSessions)
	case c.TopK < 1:
		return fmt.Errorf("decision config: top_k = %d: want >= 1", c.TopK)
	case !(c.TieMs >= 0) || c.TieMs > 1000:
		return fmt.Errorf("decision config: tie_ms = %v: want 0..1000", c.TieMs)
	case c.SpeculationTTL < 0:
		return fmt.Errorf("decision config: speculation_ttl = %v: want >= 0", c.SpeculationTTL)
	case !(c.BoundedAffinity.LoadFactor >= 1) || c.BoundedAffinity.LoadFactor > 100:
		return fmt.Errorf("decision config: bounded_affinity.load_factor = %v: want 1..100", c.BoundedAffinity.LoadFactor)
	case c.BoundedAffinity.VirtualNodes < 1 || c.BoundedAffinity.VirtualNodes > 4096:
		return fmt.Errorf("decision config: bounded_affinity.virtual_nodes = %d: want 1..4096", c.BoundedAffinity.VirtualNodes)
	}
	pp := c.PrecisePrefix
	for _, w := range []float64{pp.PrefixWeight, pp.KVUtilWeight, pp.QueueWeight} {
		if !(w >= 0) || w > 100 {
			return fmt.Errorf("decision config: precise_prefix weights = %v, %v, %v: want 0..100 each", pp.PrefixWeight, pp.KVUtilWeight, pp.QueueWeight)
		}
	}
	for t, w := range c.TierWeights {
		if !(w >= 0) || w > 1 {
			return fmt.Errorf("decision config: tier_weights[%s] = %v: want 0..1", index.Tier(t), w)
		}
	}
	return nil
}
