package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// Policies compared by the simulator, in report order.
const (
	// Today's routers, blind to hardware: in the origin region, whatever
	// residency says (their violations are counted).
	PolicyRoundRobin      = "round_robin"      // in turn over the origin region's pods
	PolicyLeastLoaded     = "least_loaded"     // fewest in flight in the origin region
	PolicySessionAffinity = "session_affinity" // rendezvous hash of the session id in the origin region

	// The fair baselines: the same routers made hardware-aware, and the
	// peers as their sources describe them; in the origin region like the
	// above. Each is a picker of regional/route (operators compare them
	// through the controller).
	PolicyWeightedRoundRobin     = "weighted_round_robin"     // in turn, in proportion to prefill speed
	PolicyWeightedLeastLoaded    = "weighted_least_loaded"    // fewest in flight per unit of prefill speed
	PolicyLeastOutstandingTokens = "least_outstanding_tokens" // fewest prompt tokens in flight per unit of speed
	PolicyBoundedAffinity        = "bounded_affinity"         // consistent hashing with bounded loads, speed-weighted
	PolicyPrecisePrefix          = "precise_prefix"           // llm-d's precise prefix-cache scorer + KV and queue scorers
	// PolicyGORGO is GORGO's published policy (arXiv 2602.11688 v2): one
	// central proxy over every pod of every region residency allows,
	// score = 0.276 x RTT ms + uncached tokens + 0.5 x queued tokens. A
	// simulator baseline only (see gorgo.go).
	PolicyGORGO = "gorgo"

	PolicyCacheLocal = "cache_local" // Meridian's decision layer, origin region only
	PolicyMeridian   = "meridian"    // Meridian: decision layer plus cross-region placement
	PolicyUpperBound = "upper_bound" // one shared cache pool of the fleet's total size
)

// Ablations of Meridian: its policy with one part of the decision off.
// Cross-region placement off is cache_local.
const (
	AblationNoHardware = "meridian-no-hardware" // the router believes every pod is an H100
	AblationNoLoad     = "meridian-no-load"     // no queue, running or KV terms, no load filters
	AblationNoCache    = "meridian-no-cache"    // no prefix term (local or remote), no speculation
	AblationNoAffinity = "meridian-no-affinity" // no session affinity term
)

// PolicyNames returns every policy in report order.
func PolicyNames() []string {
	return []string{PolicyRoundRobin, PolicyLeastLoaded, PolicySessionAffinity,
		PolicyWeightedRoundRobin, PolicyWeightedLeastLoaded, PolicyLeastOutstandingTokens, PolicyBoundedAffinity,
		PolicyPrecisePrefix, PolicyGORGO, PolicyCacheLocal, PolicyMeridian, PolicyUpperBound}
}

// AblationNames returns Meridian's ablations.
func AblationNames() []string {
	return []string{AblationNoHardware, AblationNoLoad, AblationNoCache, AblationNoAffinity}
}

// FairBaselines are the policies "best fair baseline" is the best of: all
// but meridian, its ablations and upper_bound. PeerBaselines ("best peer
// baseline") leave out cache_local (Meridian's own in-region mode) too.
func FairBaselines() []string {
	var out []string
	for _, p := range PolicyNames() {
		if p != PolicyMeridian && p != PolicyUpperBound {
			out = append(out, p)
		}
	}
	return out
}

// PeerBaselines: see FairBaselines.
func PeerBaselines() []string {
	var out []string
	for _, p := range FairBaselines() {
		if p != PolicyCacheLocal {
			out = append(out, p)
		}
	}
	return out
}

// meridianLike reports whether the policy is Meridian with its
// cross-region placement (meridian or one of its ablations).
func meridianLike(policy string) bool {
	return policy == PolicyMeridian || slices.Contains(AblationNames(), policy)
}

// residencySafe reports whether the policy enforces residency (so its
// violations must be 0).
func residencySafe(policy string) bool {
	return meridianLike(policy) || policy == PolicyCacheLocal || policy == PolicyUpperBound || policy == PolicyGORGO
}

// Workload kinds.
const (
	WorkloadTrace  = "trace"  // a Mooncake-format trace
	WorkloadCoding = "coding" // closed-loop coding-agent sessions
	WorkloadRAG    = "rag"    // shared document prompts with many short questions
	WorkloadShort  = "short"  // short prompts with little reuse
	// WorkloadSharedDocs: large shared documents, each cached in the region
	// that reads it most, asked about from the others too.
	WorkloadSharedDocs = "shared-docs"
)

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("invalid sim config")

// Config is one simulator run: a fleet, a workload and the policies to
// compare, each in a world of its own.
type Config struct {
	Fleet    FleetConfig
	Workload WorkloadConfig
	// Policies to compare, in report order. Default: all (PolicyNames).
	Policies []string
	// Seed of every random draw: the same seed gives the same report.
	Seed uint64
	// EventDelayMin and EventDelayMax bound how long a pod's cache change
	// takes to reach its region's index (engine batching, Kafka, ingestion):
	// uniform per batch, in order per pod. Defaults 100ms and 300ms.
	EventDelayMin, EventDelayMax time.Duration
	// SummaryInterval between rebuilds of each region's summary; a summary
	// reaches the other regions half an RTT after it is built. Default 5s.
	SummaryInterval time.Duration
	// ScrapeInterval between KV-utilisation scrapes of the pods (regional's
	// scraper). Default 1s.
	ScrapeInterval time.Duration
	// SampleInterval between samples of per-pod concurrency (load
	// dispersion). Default 1s.
	SampleInterval time.Duration
	// EgressUSDPerGB prices cross-region bytes in the report. Default 0.02.
	EgressUSDPerGB float64
	// PromptBytesPerToken and OutputBytesPerToken size a forwarded request
	// (prompt text) and its streamed answer (SSE chunks). Defaults 4 and 100.
	PromptBytesPerToken, OutputBytesPerToken float64
	// Residency is the policy file (YAML, residency format) the worlds
	// enforce. Nil: ResidencyPolicy(Fleet.Regions).
	Residency []byte
	// Decision configures Meridian's decision layer (cache_local and
	// meridian). Default route.DefaultConfig().
	Decision route.Config
	// Gorgo configures the cost model. Default gorgo.DefaultConfig().
	Gorgo gorgo.Config
	// NoCalibration turns off feeding observed TTFTs to gorgo's Calibrator
	// (the proxy does it; default on).
	NoCalibration bool
	// ModelError is how far off the router's model of each pod is: every
	// pod's engine is slower or faster than its profile says by a factor
	// 1 + e, e uniform in [-ModelError, ModelError] per pod. Default 0.
	ModelError float64
}

// FleetConfig is the simulated fleet.
type FleetConfig struct {
	// Regions by name. Default us-east-1, us-west-2, eu-west-1.
	Regions []string
	// PodsPerRegion. Default 8.
	PodsPerRegion int
	// Profiles (h100, h200, b200) are cycled over each region's pods.
	// Default h100, h200, b200.
	Profiles []string
	// RTT[i][j] is the round trip between regions i and j. Nil: DefaultRTT.
	RTT [][]time.Duration
	// CacheTokens is each pod's KV capacity in tokens. 0: the profile's
	// (scenarios/enginesim Profiles: 0.45M tokens on H100, 1.12M on H200,
	// 1.68M on B200).
	CacheTokens int
	// MaxConcurrency is each pod's max running requests. 0: the profile's.
	MaxConcurrency int
	// BlockSize is tokens per KV block, the trace's hash-id granularity.
	// Default 512.
	BlockSize int
}

// WorkloadConfig is the traffic.
type WorkloadConfig struct {
	// Kind is trace, coding, rag, short or shared-docs. Default trace.
	Kind string
	// Trace is the loaded trace (Kind trace).
	Trace []TraceRecord
	// Limit replays only the first Limit requests of the trace. 0: all.
	Limit int
	// Window is the fraction of the trace's span a run replays: a window
	// starting at an offset drawn from the seed (so seeds resample the
	// trace). 0 or 1: the whole trace.
	Window float64
	// TimeScale multiplies the trace's arrival rate (2 = twice as fast)
	// when Load is 0. Default 1.
	TimeScale float64
	// Duration of a synthetic workload (no new session, turn or request
	// starts after it). Default 10m.
	Duration time.Duration
	// Load is the offered prefill utilisation the arrivals are scaled to
	// (see load.go): the prefill work the requests bring, their cached
	// prefixes being what a shared cache of the fleet's size would hold,
	// over the fleet's prefill capacity. 0: the trace at its recorded rate
	// (x TimeScale), the synthetic workloads at 0.6.
	Load float64
	// Sessions is the number of concurrent coding-agent users (coding).
	// 0: as many as offer Load (an estimate; the workload is closed loop).
	Sessions int
	// RoamShare is the share of requests that enter another region than
	// their conversation's (roaming users). Default 0.
	RoamShare float64
	// FailRegion fails every pod of that region from FailFrom to FailTo
	// (fractions of the arrivals' span): their caches are lost, requests
	// entering there go elsewhere, and the pods come back cold. "": none.
	FailRegion       string
	FailFrom, FailTo float64
	// OriginShares is the share of conversations entering at each region,
	// in Fleet.Regions order. Default: equal.
	OriginShares []float64
	// ClassShares are the data classes' shares (phi, pii, public,
	// internal). Default phi 0.1, pii 0.1, public 0.6, internal 0.2.
	ClassShares map[string]float64
	// EUHealthShare is the share of conversations of the tenant eu-health,
	// whose PHI must stay in the EU. Default 0.1.
	EUHealthShare float64
}

// load is the offered load to scale to: Load, or the synthetic workloads'
// default.
func (w *WorkloadConfig) load() float64 {
	if w.Load == 0 && w.Kind != WorkloadTrace {
		return defaultSyntheticLoad
	}
	return w.Load
}

// DefaultRegions are the regions of the default fleet.
func DefaultRegions() []string { return []string{"us-east-1", "us-west-2", "eu-west-1"} }

// RegionNames returns n region names: the default three, ap-southeast-1,
// then region-5, region-6, ...
func RegionNames(n int) []string {
	names := append(DefaultRegions(), "ap-southeast-1")
	for i := len(names); i < n; i++ {
		names = append(names, fmt.Sprintf("region-%d", i+1))
	}
	return names[:n]
}

// DefaultRTT returns the round trips between regions: us-east-1 to
// us-west-2 65 ms and to eu-west-1 75 ms (DESIGN.md), us-west-2 to
// eu-west-1 130 ms (an assumption: about the sum of the two), any region to
// ap-southeast-1 220 ms, any other pair 150 ms. The live fleet
// (scenarios/fleet) uses the same table.
func DefaultRTT(regions []string) [][]time.Duration {
	known := map[[2]string]time.Duration{
		{"us-east-1", "us-west-2"}: 65 * time.Millisecond,
		{"us-east-1", "eu-west-1"}: 75 * time.Millisecond,
		{"us-west-2", "eu-west-1"}: 130 * time.Millisecond,
	}
	m := make([][]time.Duration, len(regions))
	for i, a := range regions {
		m[i] = make([]time.Duration, len(regions))
		for j, b := range regions {
			switch {
			case i == j:
			case a == "ap-southeast-1" || b == "ap-southeast-1":
				m[i][j] = 220 * time.Millisecond
			default:
				if d, ok := known[[2]string{a, b}]; ok {
					m[i][j] = d
				} else if d, ok := known[[2]string{b, a}]; ok {
					m[i][j] = d
				} else {
					m[i][j] = 150 * time.Millisecond
				}
			}
		}
	}
	return m
}

// DefaultConfig returns a run of the default fleet (3 regions x 8 pods) on
// the trace workload with every policy; the caller sets Workload.Trace.
func DefaultConfig() Config {
	return Config{
		Fleet: FleetConfig{
			Regions:       DefaultRegions(),
			PodsPerRegion: 8,
			Profiles:      []string{"h100", "h200", "b200"},
			BlockSize:     TraceBlockSize,
		},
		Workload: WorkloadConfig{
			Kind:          WorkloadTrace,
			TimeScale:     1,
			Duration:      10 * time.Minute,
			ClassShares:   map[string]float64{"phi": 0.1, "pii": 0.1, "public": 0.6, "internal": 0.2},
			EUHealthShare: 0.1,
		},
		Policies:            PolicyNames(),
		Seed:                1,
		EventDelayMin:       100 * time.Millisecond,
		EventDelayMax:       300 * time.Millisecond,
		SummaryInterval:     5 * time.Second,
		ScrapeInterval:      time.Second,
		SampleInterval:      time.Second,
		EgressUSDPerGB:      0.02,
		PromptBytesPerToken: 4,
		OutputBytesPerToken: 100,
		Decision:            route.DefaultConfig(),
		Gorgo:               gorgo.DefaultConfig(),
	}
}

// Validate names the first field that is wrong and its value.
func (c *Config) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("%w: %s = %v, want %s", ErrInvalidConfig, field, v, want)
	}
	f, w := &c.Fleet, &c.Workload
	n := len(f.Regions)
	switch {
	case n == 0 || n > 64:
		return bad("Fleet.Regions", f.Regions, "1 to 64 regions")
	case f.PodsPerRegion < 1 || f.PodsPerRegion > 1024:
		return bad("Fleet.PodsPerRegion", f.PodsPerRegion, "1..1024")
	case len(f.Profiles) == 0:
		return bad("Fleet.Profiles", f.Profiles, "at least one of h100, h200, b200")
	case f.CacheTokens < 0:
		return bad("Fleet.CacheTokens", f.CacheTokens, ">= 0")
	case f.MaxConcurrency < 0:
		return bad("Fleet.MaxConcurrency", f.MaxConcurrency, ">= 0")
	case f.BlockSize < 1:
		return bad("Fleet.BlockSize", f.BlockSize, ">= 1")
	}
	seen := map[string]bool{}
	for i, r := range f.Regions {
		if r == "" || seen[r] {
			return bad(fmt.Sprintf("Fleet.Regions[%d]", i), fmt.Sprintf("%q", r), "a unique non-empty name")
		}
		seen[r] = true
	}
	profiles := enginesim.Profiles()
	for i, p := range f.Profiles {
		if _, ok := profiles[p]; !ok {
			return bad(fmt.Sprintf("Fleet.Profiles[%d]", i), fmt.Sprintf("%q", p), "h100, h200 or b200")
		}
	}
	if f.RTT != nil {
		if len(f.RTT) != n {
			return bad("Fleet.RTT", fmt.Sprintf("%d rows", len(f.RTT)), fmt.Sprintf("%d (one per region)", n))
		}
		for i, row := range f.RTT {
			if len(row) != n {
				return bad(fmt.Sprintf("Fleet.RTT[%d]", i), fmt.Sprintf("%d entries", len(row)), fmt.Sprint(n))
			}
			for j, d := range row {
				if d < 0 || (i == j && d != 0) {
					return bad(fmt.Sprintf("Fleet.RTT[%d][%d]", i, j), d, ">= 0, and 0 on the diagonal")
				}
			}
		}
	}
	switch w.Kind {
	case WorkloadTrace:
		if len(w.Trace) == 0 {
			return bad("Workload.Trace", "no records", "a loaded trace")
		}
	case WorkloadCoding, WorkloadRAG, WorkloadShort, WorkloadSharedDocs:
	default:
		return bad("Workload.Kind", fmt.Sprintf("%q", w.Kind), "trace, coding, rag, short or shared-docs")
	}
	switch {
	case w.Limit < 0:
		return bad("Workload.Limit", w.Limit, ">= 0")
	case !(w.TimeScale > 0) || w.TimeScale > 1e6:
		return bad("Workload.TimeScale", w.TimeScale, "> 0")
	case w.Kind != WorkloadTrace && (w.Duration <= 0 || w.Duration > 30*24*time.Hour):
		return bad("Workload.Duration", w.Duration, "> 0 and at most 30 days")
	case !(w.Load >= 0 && w.Load <= 10):
		return bad("Workload.Load", w.Load, "0..10")
	case !(w.Window >= 0 && w.Window <= 1):
		return bad("Workload.Window", w.Window, "0..1")
	case !(w.RoamShare >= 0 && w.RoamShare <= 1):
		return bad("Workload.RoamShare", w.RoamShare, "0..1")
	case w.FailRegion != "" && !slices.Contains(f.Regions, w.FailRegion):
		return bad("Workload.FailRegion", fmt.Sprintf("%q", w.FailRegion), "one of Fleet.Regions")
	case w.FailRegion != "" && !(w.FailFrom >= 0 && w.FailFrom < w.FailTo && w.FailTo <= 1):
		return bad("Workload.FailTo", w.FailTo, fmt.Sprintf("FailFrom (%v) < FailTo <= 1", w.FailFrom))
	case w.Sessions < 0:
		return bad("Workload.Sessions", w.Sessions, ">= 0")
	case !(w.EUHealthShare >= 0 && w.EUHealthShare <= 1):
		return bad("Workload.EUHealthShare", w.EUHealthShare, "0..1")
	}
	if w.OriginShares != nil {
		if len(w.OriginShares) != n {
			return bad("Workload.OriginShares", w.OriginShares, fmt.Sprintf("%d shares (one per region)", n))
		}
		if err := checkShares("Workload.OriginShares", w.OriginShares); err != nil {
			return err
		}
	}
	var classes []float64
	for _, k := range sortedKeys(w.ClassShares) {
		if k == "" {
			return bad("Workload.ClassShares", "an empty class", "class names")
		}
		classes = append(classes, w.ClassShares[k])
	}
	if len(classes) > 0 {
		if err := checkShares("Workload.ClassShares", classes); err != nil {
			return err
		}
	}
	if len(c.Policies) == 0 {
		return bad("Policies", c.Policies, "at least one policy")
	}
	for i, p := range c.Policies {
		if !slices.Contains(PolicyNames(), p) && !slices.Contains(AblationNames(), p) {
			return bad(fmt.Sprintf("Policies[%d]", i), fmt.Sprintf("%q", p), strings.Join(append(PolicyNames(), AblationNames()...), ", "))
		}
		if slices.Index(c.Policies, p) != i {
			return bad(fmt.Sprintf("Policies[%d]", i), fmt.Sprintf("%q", p), "each policy once")
		}
	}
	switch {
	case c.EventDelayMin < 0 || c.EventDelayMax < c.EventDelayMin:
		return bad("EventDelayMax", c.EventDelayMax, fmt.Sprintf(">= EventDelayMin (%v) >= 0", c.EventDelayMin))
	case c.SummaryInterval <= 0:
		return bad("SummaryInterval", c.SummaryInterval, "> 0")
	case c.ScrapeInterval <= 0:
		return bad("ScrapeInterval", c.ScrapeInterval, "> 0")
	case c.SampleInterval <= 0:
		return bad("SampleInterval", c.SampleInterval, "> 0")
	case !(c.EgressUSDPerGB >= 0):
		return bad("EgressUSDPerGB", c.EgressUSDPerGB, ">= 0")
	case !(c.ModelError >= 0) || c.ModelError > 0.9:
		return bad("ModelError", c.ModelError, "0..0.9")
	case !(c.PromptBytesPerToken >= 0) || !(c.OutputBytesPerToken >= 0):
		return bad("PromptBytesPerToken", c.PromptBytesPerToken, ">= 0 (and OutputBytesPerToken too)")
	}
	if err := c.Decision.Validate(); err != nil {
		return fmt.Errorf("%w: Decision: %v", ErrInvalidConfig, err)
	}
	if err := c.Gorgo.Validate(); err != nil {
		return fmt.Errorf("%w: Gorgo: %v", ErrInvalidConfig, err)
	}
	return nil
}

func checkShares(field string, s []float64) error {
	sum := 0.0
	for i, v := range s {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: %s[%d] = %v, want >= 0", ErrInvalidConfig, field, i, v)
		}
		sum += v
	}
	if !(sum > 0) {
		return fmt.Errorf("%w: %s = %v, want a positive sum", ErrInvalidConfig, field, s)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
