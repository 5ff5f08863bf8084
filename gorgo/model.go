package gorgo

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Profile is the latency model of one kind of pod (hardware and model).
type Profile struct {
	Name              string  `json:"name" yaml:"name"`
	PrefillMsPerToken float64 `json:"prefill_ms_per_token" yaml:"prefill_ms_per_token"` // prefill time per uncached prompt token
	OverheadMs        float64 `json:"overhead_ms" yaml:"overhead_ms"`                   // fixed part of TTFT (scheduling, one forward pass)
	DecodeMsPerToken  float64 `json:"decode_ms_per_token" yaml:"decode_ms_per_token"`   // time between output tokens
	MaxConcurrency    int     `json:"max_concurrency" yaml:"max_concurrency"`           // requests a pod runs at once (vLLM max_num_seqs)
	MeanOutputTokens  int     `json:"mean_output_tokens" yaml:"mean_output_tokens"`     // for the slot-wait estimate
	// AttnTokens is the context at which a prefill token's attention costs
	// as much as its linear layers: a token at position p costs rate x (1 +
	// p / AttnTokens), so prefilling u tokens after c cached ones costs
	// rate x u x (1 + (c + u/2) / AttnTokens). Attention FLOPs per token
	// grow with its position (4 x layers x hidden x p against 2 x params
	// for the linear layers: p / 53,800 for a Llama-3-70B), so long
	// contexts cost more per token than a linear model says. 0: linear.
	AttnTokens float64 `json:"attn_tokens,omitempty" yaml:"attn_tokens"`
}

// DefaultProfiles are 70B-class FP8 models at tensor parallelism 2, from the
// public numbers in DESIGN.md: the seed's 2K-token prompt on H100 takes ~80 ms
// to first token on a hit and ~800 ms on a miss, so prefill costs ~0.36 ms per
// uncached token; H200 has the same FP8 compute and 1.43x the memory
// bandwidth; B200 has 2.27x the dense FP8 compute and 2.39x the bandwidth.
// They match the engine simulator's profiles (scenarios/enginesim).
func DefaultProfiles() []Profile {
	return []Profile{
		{Name: "h100", PrefillMsPerToken: 0.36, OverheadMs: 75, DecodeMsPerToken: 25, MaxConcurrency: 256, MeanOutputTokens: 350},
		{Name: "h200", PrefillMsPerToken: 0.36, OverheadMs: 52, DecodeMsPerToken: 17.4, MaxConcurrency: 256, MeanOutputTokens: 350},
		{Name: "b200", PrefillMsPerToken: 0.158, OverheadMs: 31, DecodeMsPerToken: 10.5, MaxConcurrency: 256, MeanOutputTokens: 350},
	}
}

// Config weighs the terms and sets the guardrails. Zero values are not
// defaults; start from DefaultConfig.
type Config struct {
	// QueueWeight multiplies the queue term; default 0.75. Below 1, queueing
	// weighs less than prefill, which keeps requests on warm pods (where they
	// add little work) instead of spreading cold prefills that add much: at 1
	// a saturated fleet in regional's end-to-end test slid into misses that
	// made the load worse (TTFT p50 2.9-3.5x round-robin's instead of 7x).
	// Much below 1 the model under-weighs queues on mixed fleets: at GORGO's
	// 0.5 the simulator's short-prompt workload had a p95 1.04-1.12x the best
	// baseline's, against 0.6-0.7x at 0.75 and 0.55x at 1.
	QueueWeight float64 `yaml:"queue_weight"`
	RTTWeight   float64 `yaml:"rtt_weight"` // multiplies the RTT term; default 1

	EgressUSDPerGB float64 `yaml:"egress_usd_per_gb"` // price of cross-region egress; default 0 (term off)
	MsPerUSD       float64 `yaml:"ms_per_usd"`        // TTFT milliseconds one dollar of egress is worth; default 0

	// A remote candidate must beat the best local one by both margins.
	ForwardMarginMs   float64 `yaml:"forward_margin_ms"`   // default 25
	ForwardMarginFrac float64 `yaml:"forward_margin_frac"` // of the best local estimate; default 0.10

	// MaxRemoteShare caps the share of this region's decisions that go to any
	// one remote region over ShareWindow; default 0.8, 1 turns it off. (At
	// 0.5 a region running at 1.2x its capacity while its neighbour idled
	// could not shed enough: TTFT p95 15 s against 5.8 s at 0.8 in the
	// simulator's skew scenario at load 0.5.)
	MaxRemoteShare float64       `yaml:"max_remote_share"`
	ShareWindow    time.Duration `yaml:"share_window"` // default 60s

	// ColdWorkWeight: when remote regions are among the candidates, each
	// candidate is charged for the prefill, at its own rate, of the tokens
	// it would compute beyond the warmest candidate's, times this weight;
	// default 1, 0 turns it off. A request
	// sent where its prefix is not cached redoes work that delays every
	// request queued behind it there, which its own TTFT does not show:
	// priced at its TTFT alone, requests left warm pods for cold regions
	// whenever the local queue was a little longer, and the fleet did more
	// work for the same traffic (the simulator's coding workload at load
	// 0.8: hit rate 80.5% against 89.0% in-region, TTFT p95 64.6 s against
	// 39.4 s). Within a region the decision layer's own weights make the
	// same trade (QueueWeight below 1). Tokens, not milliseconds: a
	// faster pod computing the same tokens redoes nothing (charged the
	// difference in prefill time, a local H100 paid 56% of its prefill
	// again against a remote B200 pool, and every region's short prompts
	// herded onto the others' B200s).
	ColdWorkWeight float64 `yaml:"cold_work_weight"`

	// A remote region's cached-token estimate has full weight while its
	// summary is younger than FreshFor, then loses weight linearly, and is
	// ignored (the candidate is excluded) from IgnoreAfter.
	FreshFor    time.Duration `yaml:"fresh_for"`    // default 10s
	IgnoreAfter time.Duration `yaml:"ignore_after"` // default 60s

	// DefaultProfile is used for candidates naming an unknown profile.
	DefaultProfile string `yaml:"default_profile"` // default "h100"

	// Profiles are the hardware profiles, as measured on the operator's
	// own engines (a single-request benchmark gives the prefill rate, the
	// overhead and the decode time). Empty: DefaultProfiles.
	Profiles []Profile `yaml:"profiles"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		QueueWeight:       0.75,
		RTTWeight:         1,
		ForwardMarginMs:   25,
		ForwardMarginFrac: 0.10,
		MaxRemoteShare:    0.8,
		ShareWindow:       60 * time.Second,
		ColdWorkWeight:    1,
		FreshFor:          10 * time.Second,
		IgnoreAfter:       60 * time.Second,
		DefaultProfile:    "h100",
	}
}

// ErrInvalidConfig is wrapped by Validate's errors.
var ErrInvalidConfig = errors.New("invalid gorgo config")

// Validate names the first field out of range and its value.
func (c Config) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("%w: %s = %v, want %s", ErrInvalidConfig, field, v, want)
	}
	switch {
	case !(c.QueueWeight >= 0) || c.QueueWeight > 100:
		return bad("QueueWeight", c.QueueWeight, "0..100")
	case !(c.RTTWeight >= 0) || c.RTTWeight > 100:
		return bad("RTTWeight", c.RTTWeight, "0..100")
	case !(c.EgressUSDPerGB >= 0):
		return bad("EgressUSDPerGB", c.EgressUSDPerGB, ">= 0")
	case !(c.MsPerUSD >= 0):
		return bad("MsPerUSD", c.MsPerUSD, ">= 0")
	case !(c.ForwardMarginMs >= 0):
		return bad("ForwardMarginMs", c.ForwardMarginMs, ">= 0")
	case !(c.ForwardMarginFrac >= 0) || c.ForwardMarginFrac >= 1:
		return bad("ForwardMarginFrac", c.ForwardMarginFrac, "0 <= x < 1")
	case !(c.MaxRemoteShare > 0) || c.MaxRemoteShare > 1:
		return bad("MaxRemoteShare", c.MaxRemoteShare, "0 < x <= 1")
	case c.ShareWindow <= 0:
		return bad("ShareWindow", c.ShareWindow, "> 0")
	case !(c.ColdWorkWeight >= 0) || c.ColdWorkWeight > 100:
		return bad("ColdWorkWeight", c.ColdWorkWeight, "0..100")
	case c.FreshFor < 0 || c.IgnoreAfter <= c.FreshFor:
		return bad("IgnoreAfter", c.IgnoreAfter, fmt.Sprintf("> FreshFor (%v)", c.FreshFor))
	}
	return nil
}

// Candidate is one place the request could be served. Callers fill it from
// the index (local pods), region summaries (remote regions) and their own
// in-flight accounting.
type Candidate struct {
	Region  string `json:"region"`
	Pod     string `json:"pod,omitempty"` // empty for a remote region (its controller picks)
	Remote  bool   `json:"remote"`
	Profile string `json:"profile"`

	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"` // exact locally, estimated for remote regions

	PendingPrefillTokens int `json:"pending_prefill_tokens"` // prefill work ahead of us
	Running              int `json:"running"`                // requests in flight

	RTTMs       float64       `json:"rtt_ms"`
	EgressBytes int64         `json:"egress_bytes,omitempty"`
	SummaryAge  time.Duration `json:"summary_age_ns,omitempty"` // remote only
	// Suspect (remote only): the region's controllers are not answering
	// pings right now (not known dead). A latency-driven choice skips it;
	// traffic that no other place may take still goes there.
	Suspect bool `json:"suspect,omitempty"`

	// ExtraMs is added by the caller's other scorers (affinity, KV
	// utilisation), already weighted, in milliseconds.
	ExtraMs float64 `json:"extra_ms,omitempty"`
}

// Estimate is the cost of one candidate, term by term.
type Estimate struct {
	QueueMs     float64 `json:"queue_ms"`
	PrefillMs   float64 `json:"prefill_ms"`
	OverheadMs  float64 `json:"overhead_ms"`
	RTTMs       float64 `json:"rtt_ms"`
	EgressMs    float64 `json:"egress_ms"`
	ExtraMs     float64 `json:"extra_ms"`
	ColdWorkMs  float64 `json:"cold_work_ms,omitempty"` // weighted prefill of the tokens beyond the warmest candidate's (with remote candidates)
	TotalMs     float64 `json:"total_ms"`
	Uncached    int     `json:"uncached_tokens"`
	CacheWeight float64 `json:"cache_weight"`       // staleness weight on CachedTokens
	RateMs      float64 `json:"rate_ms_per_token"`  // prefill rate used
	Excluded    string  `json:"excluded,omitempty"` // why it could not win
}

// Model holds the profiles with their calibrated rates. Safe for concurrent
// use: rates are swapped atomically by a Calibrator.
type Model struct {
	cfg      Config
	profiles map[string]*profileState
	fallback *profileState
	pods     podFactors
}

type profileState struct {
	Profile
	rate     atomic.Uint64 // float64 bits: calibrated prefill ms per token
	overhead atomic.Uint64 // float64 bits: calibrated overhead ms
}

// podFactors are per-pod prefill-speed corrections published by a
// Calibrator: a pod's rate is its profile's times its factor. Reading one
// takes no lock (a decision reads one per pod it prices); publishing is
// serialized.
type podFactors struct {
	m  sync.Map   // pod name -> float64
	mu sync.Mutex // held by set
	// low is the float64 bits of the smallest factor, at most 1 (0 bits:
	// none published, 1): a lower bound of every pod's rate is its
	// profile's times it.
	low atomic.Uint64
	// gen counts publications; it moves after the factor it publishes is
	// readable (see PodFactorGen).
	gen atomic.Uint64
}

// min is the smallest factor of any pod, at most 1.
func (p *podFactors) min() float64 {
	if b := p.low.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

func (p *podFactors) get(pod string) float64 {
	if pod == "" {
		return 1
	}
	if f, ok := p.m.Load(pod); ok {
		return f.(float64)
	}
	return 1
}

func (p *podFactors) set(pod string, f float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.gen.Add(1)
	v, had := p.m.Swap(pod, f)
	switch low := p.min(); {
	case f < low:
		p.low.Store(math.Float64bits(f))
	case had && v.(float64) <= low && f > v.(float64):
		// The pod that held the smallest factor moved up: find the next.
		low = 1
		p.m.Range(func(_, v any) bool {
			low = min(low, v.(float64))
			return true
		})
		p.low.Store(math.Float64bits(low))
	}
}

func (p *profileState) rateMs() float64     { return math.Float64frombits(p.rate.Load()) }
func (p *profileState) overheadMs() float64 { return math.Float64frombits(p.overhead.Load()) }

// New builds a model over the given profiles (if none, the config's; if
// none either, DefaultProfiles).
func New(cfg Config, profiles ...Profile) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(profiles) == 0 {
		profiles = cfg.Profiles
	}
	if len(profiles) == 0 {
		profiles = DefaultProfiles()
	}
	m := &Model{cfg: cfg, profiles: map[string]*profileState{}}
	for _, p := range profiles {
		if p.Name == "" || !(p.PrefillMsPerToken > 0) || p.OverheadMs < 0 || p.MaxConcurrency <= 0 || !(p.AttnTokens >= 0) {
			return nil, fmt.Errorf("%w: profile %+v: want a name, PrefillMsPerToken > 0, OverheadMs >= 0, MaxConcurrency > 0, AttnTokens >= 0", ErrInvalidConfig, p)
		}
		if _, dup := m.profiles[p.Name]; dup {
			return nil, fmt.Errorf("%w: profile %q defined twice", ErrInvalidConfig, p.Name)
		}
		ps := &profileState{Profile: p}
		ps.rate.Store(math.Float64bits(p.PrefillMsPerToken))
		ps.overhead.Store(math.Float64bits(p.OverheadMs))
		m.profiles[p.Name] = ps
	}
	m.fallback = m.profiles[cfg.DefaultProfile]
	if m.fallback == nil {
		return nil, fmt.Errorf("%w: DefaultProfile %q is not among the profiles", ErrInvalidConfig, cfg.DefaultProfile)
	}
	return m, nil
}

// Config returns the model's configuration.
func (m *Model) Config() Config { return m.cfg }

func (m *Model) profile(name string) *profileState {
	if p, ok := m.profiles[name]; ok {
		return p
	}
	return m.fallback
}

// Nominal returns a profile as configured (before any calibration); the
// default profile for an unknown name.
func (m *Model) Nominal(profile string) Profile { return m.profile(profile).Profile }

// Rate returns the prefill ms per token and overhead ms currently used for a
// profile (calibrated if a Calibrator has published).
func (m *Model) Rate(profile string) (prefillMsPerToken, overheadMs float64) {
	p := m.profile(profile)
	return p.rateMs(), p.overheadMs()
}

// RateFor is Rate for one pod: its profile's rate times the pod's own
// correction, if a Calibrator has published one ("": none).
func (m *Model) RateFor(profile, pod string) (prefillMsPerToken, overheadMs float64) {
	p := m.profile(profile)
	return p.rateMs() * m.pods.get(pod), p.overheadMs()
}

// PodFactor is the pod's published correction of its profile's rate (1:
// none).
func (m *Model) PodFactor(pod string) float64 { return m.pods.get(pod) }

// PodFactorGen counts the PodFactor publications so far. A factor read
// after PodFactorGen returned g is at least as new as the g-th
// publication, so a caller may keep it, labelled g, for as long as
// PodFactorGen still returns g (a decision reads one per pod it prices,
// and a lookup by name costs a hash).
func (m *Model) PodFactorGen() uint64 { return m.pods.gen.Load() }

// MinPodFactor is the smallest PodFactor of any pod, at most 1: every pod's
// rate is at least its profile's times it (a decision bounds the estimates
// of pods it has not priced with it).
func (m *Model) MinPodFactor() float64 { return m.pods.min() }

// PrefillMs is the model's prefill time of uncached tokens after cached ones
// on a pod (attention included when the profile has AttnTokens).
func (m *Model) PrefillMs(profile, pod string, cached, uncached int) float64 {
	rate, _ := m.RateFor(profile, pod)
	return prefillMs(m.profile(profile).AttnTokens, rate, cached, uncached)
}

// prefillMs is rate x u x (1 + (c + u/2) / attn) (linear when attn is 0).
func prefillMs(attn, rate float64, cached, uncached int) float64 {
	u := float64(max(uncached, 0))
	if attn <= 0 {
		return u * rate
	}
	return u * rate * (1 + (float64(max(cached, 0))+u/2)/attn)
}

// cacheWeight is the weight of a remote summary of the given age, or 0 and
// false when it is too old to use.
func (m *Model) cacheWeight(c *Candidate) (float64, bool) {
	if !c.Remote || c.SummaryAge <= m.cfg.FreshFor {
		return 1, true
	}
	if c.SummaryAge >= m.cfg.IgnoreAfter {
		return 0, false
	}
	return 1 - float64(c.SummaryAge-m.cfg.FreshFor)/float64(m.cfg.IgnoreAfter-m.cfg.FreshFor), true
}

// Estimate computes a candidate's expected TTFT term by term.
func (m *Model) Estimate(c *Candidate) Estimate {
	p := m.profile(c.Profile)
	rate := p.rateMs()
	if !c.Remote {
		rate *= m.pods.get(c.Pod)
	}
	return m.estimate(c, p, rate)
}

// EstimateAt is Estimate for a candidate whose prefill rate the caller
// has read already: its profile's current rate (Rate) times, for a local
// candidate, its pod's correction (PodFactor), multiplied in that order.
// It does not look the pod's correction up by name; with the rate
// Estimate would use, it returns what Estimate returns.
func (m *Model) EstimateAt(c *Candidate, rate float64) Estimate {
	return m.estimate(c, m.profile(c.Profile), rate)
}

func (m *Model) estimate(c *Candidate, p *profileState, rate float64) Estimate {
	w, fresh := m.cacheWeight(c)
	cached := int(math.Floor(float64(min(max(c.CachedTokens, 0), c.PromptTokens)) * w))
	uncached := max(c.PromptTokens-cached, 0)
	queue := float64(max(c.PendingPrefillTokens, 0)) * rate
	if over := c.Running - p.MaxConcurrency; over >= 0 {
		// Every running request must finish before one more starts: on
		// average a slot frees every service time / concurrency.
		service := p.overheadMs() + float64(p.MeanOutputTokens)*p.DecodeMsPerToken
		queue += float64(over+1) * service / float64(p.MaxConcurrency)
	}
	e := Estimate{
		QueueMs:     m.cfg.QueueWeight * queue,
		PrefillMs:   prefillMs(p.AttnTokens, rate, cached, uncached),
		OverheadMs:  p.overheadMs(),
		RTTMs:       m.cfg.RTTWeight * max(c.RTTMs, 0),
		ExtraMs:     c.ExtraMs,
		Uncached:    uncached,
		CacheWeight: w,
		RateMs:      rate,
	}
	if c.Remote && c.EgressBytes > 0 {
		e.EgressMs = float64(c.EgressBytes) / 1e9 * m.cfg.EgressUSDPerGB * m.cfg.MsPerUSD
	}
	e.TotalMs = e.QueueMs + e.PrefillMs + e.OverheadMs + e.RTTMs + e.EgressMs + e.ExtraMs
	if !fresh {
		e.Excluded = ExcludedStale
	}
	return e
}

// Reasons a candidate was excluded, and reasons for a decision.
const (
	ExcludedStale     = "summary_stale"
	ExcludedSuspect   = "region_suspect"
	ExcludedShareCap  = "remote_share_cap"
	ExcludedNoSaving  = "saving_below_margin"
	ReasonLocalBest   = "local_best"
	ReasonRemoteSaves = "remote_saves"
	ReasonRemoteOnly  = "remote_only" // no local candidate (region failed, drained or empty)
	// ReasonRemoteUnconfirmed: no local candidate and no remote one with a
	// fresh summary and answering controllers; the best of the others.
	ReasonRemoteUnconfirmed = "remote_only_unconfirmed"
	ReasonNone              = "no_candidate"
)

// Decision is a choice with its full explanation.
type Decision struct {
	Winner     int        `json:"winner"` // index into Candidates, -1 if none
	Reason     string     `json:"reason"`
	BestLocal  int        `json:"best_local"`  // -1 if no local candidate
	BestRemote int        `json:"best_remote"` // best eligible-by-freshness remote, -1 if none
	MarginMs   float64    `json:"margin_ms"`   // best local total - winner total (0 when local wins)
	RequiredMs float64    `json:"required_ms"` // saving a remote had to exceed
	Estimates  []Estimate `json:"estimates"`   // parallel to the candidates
}

// ShareView tells Choose how much of this region's recent traffic already
// went to a remote region (a ShareTracker implements it).
type ShareView interface {
	Share(region string, now time.Time) float64
}

// Choose estimates every candidate and picks the winner: the cheapest local
// candidate, unless a fresh remote candidate is cheaper by the forwarding
// margin and its region is under its share cap; with no local candidate, the
// cheapest fresh remote one (the share cap does not apply then); with no
// fresh remote one either, the cheapest remote whose summary is stale (its
// cache counted as empty) or whose controllers are suspect: traffic that
// only remote regions may take is not refused for a missed ping or a late
// summary. Ties go to the earlier candidate, so the choice is deterministic
// for a given input. dst's Estimates slice is reused.
func (m *Model) Choose(cands []Candidate, shares ShareView, now time.Time, dst *Decision) {
	*dst = Decision{Winner: -1, BestLocal: -1, BestRemote: -1, Reason: ReasonNone, Estimates: dst.Estimates[:0]}
	for i := range cands {
		e := m.Estimate(&cands[i])
		if e.Excluded == "" && cands[i].Remote && cands[i].Suspect {
			e.Excluded = ExcludedSuspect
		}
		dst.Estimates = append(dst.Estimates, e)
	}
	// Prefill beyond the warmest usable place is work the fleet need not
	// do: with remote candidates, charge it (ColdWorkWeight). What is
	// charged is the tokens a candidate would compute beyond the warmest
	// one's, at its own rate: a faster pod computing as many tokens redoes
	// nothing, it only finishes sooner, and its prefill term says so.
	if m.cfg.ColdWorkWeight > 0 && slices.ContainsFunc(cands, func(c Candidate) bool { return c.Remote }) {
		fewest := math.MaxInt
		for i := range dst.Estimates {
			if e := &dst.Estimates[i]; e.Excluded == "" {
				fewest = min(fewest, e.Uncached)
			}
		}
		for i := range dst.Estimates {
			if e := &dst.Estimates[i]; e.Excluded == "" && e.Uncached > fewest {
				c := &cands[i]
				warm := prefillMs(m.profile(c.Profile).AttnTokens, e.RateMs, c.PromptTokens-fewest, fewest)
				e.ColdWorkMs = m.cfg.ColdWorkWeight * max(e.PrefillMs-warm, 0)
				e.TotalMs += e.ColdWorkMs
			}
		}
	}
	for i := range cands {
		e := &dst.Estimates[i]
		if e.Excluded == "" && !cands[i].Remote && (dst.BestLocal < 0 || e.TotalMs < dst.Estimates[dst.BestLocal].TotalMs) {
			dst.BestLocal = i
		}
	}
	// The share cap keeps latency-only decisions from pulling a region's
	// traffic to one remote region; it does not apply when this region has
	// no candidate at all (failed, drained, not allowed by residency): that
	// traffic must go somewhere.
	capShares := shares != nil && m.cfg.MaxRemoteShare < 1 && dst.BestLocal >= 0
	for i := range cands {
		e := &dst.Estimates[i]
		if e.Excluded != "" || !cands[i].Remote {
			continue
		}
		if capShares && shares.Share(cands[i].Region, now) >= m.cfg.MaxRemoteShare {
			e.Excluded = ExcludedShareCap
			continue
		}
		if dst.BestRemote < 0 || e.TotalMs < dst.Estimates[dst.BestRemote].TotalMs {
			dst.BestRemote = i
		}
	}
	switch {
	case dst.BestLocal < 0 && dst.BestRemote < 0:
		for i := range cands {
			e := &dst.Estimates[i]
			if cands[i].Remote && (e.Excluded == ExcludedStale || e.Excluded == ExcludedSuspect) &&
				(dst.Winner < 0 || e.TotalMs < dst.Estimates[dst.Winner].TotalMs) {
				dst.Winner = i
			}
		}
		if dst.Winner >= 0 {
			dst.BestRemote, dst.Reason = dst.Winner, ReasonRemoteUnconfirmed
		}
		return
	case dst.BestLocal < 0:
		dst.Winner, dst.Reason = dst.BestRemote, ReasonRemoteOnly
		return
	}
	local := dst.Estimates[dst.BestLocal].TotalMs
	dst.Winner, dst.Reason = dst.BestLocal, ReasonLocalBest
	dst.RequiredMs = max(m.cfg.ForwardMarginMs, m.cfg.ForwardMarginFrac*local)
	if dst.BestRemote >= 0 {
		saving := local - dst.Estimates[dst.BestRemote].TotalMs
		if saving > dst.RequiredMs {
			dst.Winner, dst.Reason, dst.MarginMs = dst.BestRemote, ReasonRemoteSaves, saving
		} else if saving > 0 {
			dst.Estimates[dst.BestRemote].Excluded = ExcludedNoSaving
		}
	}
}
