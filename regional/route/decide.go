package route

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// Policies a Decider can pick pods by. PolicyTTFT is Meridian's; the others
// are the baselines operators compare it with, through the same controller.
const (
	PolicyTTFT        = "ttft"         // lowest expected time to first token (cache + load)
	PolicyRoundRobin  = "round_robin"  // in turn, ignoring cache and load
	PolicyLeastLoaded = "least_loaded" // fewest requests in flight
	PolicySessionHash = "session_hash" // rendezvous hash of the session id (stateless affinity)
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
	// Filters in order; default alive, model, healthy, bounded_load,
	// new_session.
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
	// SpeculationTTL is how long a pod that has just answered is assumed to
	// hold its prompt's prefix before the index learns it from the pod's
	// events (see Speculation): until the index confirms it, at most this
	// long. 0 turns it off. Default 10s (KV events normally reach the index
	// within a few hundred milliseconds; the bound matters when ingestion
	// lags or an engine evicts before its events arrive).
	SpeculationTTL time.Duration `yaml:"speculation_ttl"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Policy:              PolicyTTFT,
		Filters:             []string{FilterAlive, FilterModel, FilterHealthy, FilterBoundedLoad, FilterNewSession},
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
		SpeculationTTL:      10 * time.Second,
	}
}

var knownScorers = []string{"prefix", "queue", "running", "kv_util", "affinity"}

// Policies are the picker policies a decision config (or, where allowed,
// the X-Meridian-Policy header) may name.
var Policies = []string{PolicyTTFT, PolicyRoundRobin, PolicyLeastLoaded, PolicySessionHash}

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
	case c.SpeculationTTL < 0:
		return fmt.Errorf("decision config: speculation_ttl = %v: want >= 0", c.SpeculationTTL)
	}
	for t, w := range c.TierWeights {
		if !(w >= 0) || w > 1 {
			return fmt.Errorf("decision config: tier_weights[%s] = %v: want 0..1", index.Tier(t), w)
		}
	}
	return nil
}

// Errors of a decision.
var (
	ErrNoPod        = errors.New("no pod serves this region")
	ErrNoHealthyPod = errors.New("no healthy pod can take the request")
)

// Request is what the decision needs to know about a request.
type Request struct {
	Model        string
	Chain        []uint64 // chain hashes of the prompt's full blocks
	BlockSize    int      // tokens per block of Chain
	PromptTokens int
	SessionID    string
	RequestID    string
	Policy       string // override of the configured policy (if allowed), or ""
	Exclude      []*Pod // pods already tried for this request (retries)
}

// CandidateScore explains one candidate of a decision.
type CandidateScore struct {
	Pod           string         `json:"pod"`
	Endpoint      string         `json:"endpoint"`
	MatchedBlocks int            `json:"matched_blocks"`
	CachedTokens  int            `json:"cached_tokens"`
	Load          Load           `json:"load"`
	Estimate      gorgo.Estimate `json:"estimate"`
}

// Decision is the outcome of routing one request inside the region.
type Decision struct {
	Pod           *Pod             `json:"-"`
	PodName       string           `json:"pod"`
	Endpoint      string           `json:"endpoint"`
	Policy        string           `json:"policy"`
	Reason        string           `json:"reason"`
	MatchedBlocks int              `json:"matched_blocks"`
	CachedTokens  int              `json:"cached_tokens"`   // predicted, tier-weighted
	Uncached      int              `json:"uncached_tokens"` // prompt - predicted cached
	Candidates    int              `json:"candidates"`      // pods left after filters
	Filtered      map[string]int   `json:"filtered,omitempty"`
	Top           []CandidateScore `json:"top"`
	EstimateMs    float64          `json:"estimate_ms"`
	// Candidate is the chosen pod as a cost-model candidate, for the
	// comparison with remote regions (Place).
	Candidate gorgo.Candidate `json:"-"`
	// session is the request's session id, begun on the pod by Admit.
	session string
}

// Decider runs the pipeline. Safe for concurrent use; it reads only
// snapshots (index, registry) and its own small synchronized state.
type Decider struct {
	cfg      Config
	w        struct{ prefix, queue, running, kvUtil, affinity float64 } // cfg.Weights, resolved once
	idx      *index.Index
	reg      *Registry
	model    *gorgo.Model
	sessions *Sessions
	spec     *Speculation
	now      func() time.Time
	rr       atomic.Uint64
	scratch  sync.Pool
}

type scratch struct {
	matches []index.Match
	touched []int // slots whose bySlot a speculation raised
	bySlot  []int32
	speed   []float64 // by slot, for the candidates: prefill tokens per ms (see speed)
	pods    []*Pod
	pin     struct {
		pod      string
		inflight int
		ok       bool
	}
	cands []gorgo.Candidate
	dec   gorgo.Decision
}

// NewDecider builds the pipeline. now is the clock (time.Now in production).
func NewDecider(cfg Config, idx *index.Index, reg *Registry, model *gorgo.Model, now func() time.Time) (*Decider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Decider{cfg: cfg, idx: idx, reg: reg, model: model, now: now,
		sessions: NewSessions(cfg.SessionTTL, cfg.MaxSessions)}
	d.w.prefix, d.w.queue, d.w.running, d.w.kvUtil, d.w.affinity = cfg.Weights["prefix"], cfg.Weights["queue"],
		cfg.Weights["running"], cfg.Weights["kv_util"], cfg.Weights["affinity"]
	if cfg.SpeculationTTL > 0 {
		d.spec = NewSpeculation(cfg.SpeculationTTL, 1<<20)
	}
	d.scratch.New = func() any {
		return &scratch{matches: make([]index.Match, 0, idx.PodCapacity()), bySlot: make([]int32, idx.PodCapacity()),
			speed: make([]float64, idx.PodCapacity())}
	}
	return d, nil
}

// Sessions exposes the affinity table (the proxy records request ends).
func (d *Decider) Sessions() *Sessions { return d.sessions }

// Speculation exposes the recently-computed-prefix memory (the proxy feeds
// it at each answer's first byte); nil when turned off.
func (d *Decider) Speculation() *Speculation { return d.spec }

// Config returns the pipeline's configuration.
func (d *Decider) Config() Config { return d.cfg }

// Model returns the cost model the decisions are priced with.
func (d *Decider) Model() *gorgo.Model { return d.model }

// Decide picks a pod of this region for the request. It changes no
// accounting: a decision that is served is passed to Admit, whose ticket
// counts the request (and its session) on the pod until Done.
func (d *Decider) Decide(req *Request) (*Decision, error) {
	pods := d.reg.Pods()
	if len(pods) == 0 {
		return nil, ErrNoPod
	}
	now := d.now()
	s := d.scratch.Get().(*scratch)
	defer d.scratch.Put(s)

	// Data layer: the longest cached prefix of every pod.
	s.matches = d.idx.Lookup(req.Chain, s.matches)
	for _, m := range s.matches {
		s.bySlot[m.Pod.Slot()] = int32(m.Blocks)
	}
	s.touched = s.touched[:0]
	var confirmed []index.PodID
	d.spec.Match(req.Chain, now, func(id index.PodID, blocks int) {
		slot := id.Slot()
		switch {
		case !d.idx.Alive(id):
		case int32(blocks) > s.bySlot[slot]:
			s.bySlot[slot] = int32(blocks)
			s.touched = append(s.touched, slot)
		default:
			confirmed = append(confirmed, id) // the index caught up
		}
	})
	for _, id := range confirmed {
		d.spec.Confirmed(id, req.Chain[:s.bySlot[id.Slot()]])
	}
	defer func() {
		for _, m := range s.matches {
			s.bySlot[m.Pod.Slot()] = 0
		}
		for _, slot := range s.touched {
			s.bySlot[slot] = 0
		}
	}()

	s.pin.pod, s.pin.inflight, s.pin.ok = d.sessions.Pinned(req.SessionID, now)

	// Filters.
	s.pods = append(s.pods[:0], pods...)
	speeds := false // s.speed holds the candidates' speeds
	speed := func(p *Pod) float64 { return s.speed[p.ID.Slot()] }
	needSpeeds := func() {
		if !speeds {
			for _, p := range s.pods {
				s.speed[p.ID.Slot()] = d.speed(p)
			}
			speeds = true
		}
	}
	var filtered map[string]int
	drop := func(name string, keep func(*Pod) bool) {
		n := 0
		for _, p := range s.pods {
			if keep(p) {
				s.pods[n] = p
				n++
			}
		}
		if n < len(s.pods) {
			if filtered == nil {
				filtered = map[string]int{}
			}
			filtered[name] += len(s.pods) - n
		}
		s.pods = s.pods[:n]
	}
	if len(req.Exclude) > 0 {
		drop("retried", func(p *Pod) bool { return !slices.Contains(req.Exclude, p) })
	}
	for _, f := range d.cfg.Filters {
		switch f {
		case FilterAlive:
			drop(f, func(p *Pod) bool { return d.idx.Alive(p.ID) })
		case FilterModel:
			drop(f, func(p *Pod) bool { m := p.Info().Model; return req.Model == "" || m == "" || m == req.Model })
		case FilterHealthy:
			drop(f, func(p *Pod) bool { return !p.Ejected(now) })
		case FilterBoundedLoad:
			// Each pod's bound is its share of the fleet's prefill speed:
			// a pod twice as fast may carry twice the requests.
			needSpeeds()
			var total int64
			var sum float64
			for _, p := range s.pods {
				total += p.inflight.Load()
				sum += speed(p)
			}
			if len(s.pods) > 0 && sum > 0 {
				drop(f, func(p *Pod) bool {
					limit := int64(d.cfg.BoundedLoadFactor*float64(total+1)*speed(p)/sum + 0.999999)
					return p.inflight.Load()+1 <= limit
				})
			}
		case FilterNewSession:
			if req.SessionID == "" || len(s.pods) == 0 {
				break
			}
			if s.pin.ok {
				break
			}
			needSpeeds()
			least := math.Inf(1)
			for _, p := range s.pods {
				least = min(least, float64(p.inflight.Load())/speed(p))
			}
			drop(f, func(p *Pod) bool {
				return float64(p.inflight.Load())/speed(p) <= least+1/speed(p)
			})
		}
	}
	if len(s.pods) == 0 {
		return nil, fmt.Errorf("%w (filtered: %v)", ErrNoHealthyPod, filtered)
	}

	policy := d.cfg.Policy
	if req.Policy != "" {
		policy = req.Policy
	}
	dec := &Decision{Policy: policy, Candidates: len(s.pods), Filtered: filtered}
	var chosen int
	switch policy {
	case PolicyRoundRobin:
		chosen = int(d.rr.Add(1) % uint64(len(s.pods)))
		dec.Reason = "round_robin"
	case PolicyLeastLoaded:
		chosen = d.leastLoaded(s.pods)
		dec.Reason = "least_loaded"
	case PolicySessionHash:
		chosen = d.rendezvous(s.pods, req)
		dec.Reason = "session_hash"
	case PolicyTTFT:
		chosen = d.ttft(s, req, now, dec)
	default:
		return nil, fmt.Errorf("unknown policy %q", policy)
	}
	p := s.pods[chosen]
	info := p.Info()
	dec.Pod, dec.PodName, dec.Endpoint = p, p.Name, info.Endpoint
	dec.MatchedBlocks = int(s.bySlot[p.ID.Slot()])
	if policy != PolicyTTFT {
		dec.CachedTokens = min(dec.MatchedBlocks*req.BlockSize, req.PromptTokens)
		rate, _ := d.model.Rate(info.Profile)
		dec.Candidate = gorgo.Candidate{Pod: p.Name, Profile: info.Profile, PromptTokens: req.PromptTokens,
			CachedTokens: dec.CachedTokens, PendingPrefillTokens: BacklogTokens(p, now, rate), Running: int(p.inflight.Load())}
		dec.Top = []CandidateScore{{Pod: p.Name, Endpoint: info.Endpoint, MatchedBlocks: dec.MatchedBlocks, CachedTokens: dec.CachedTokens, Load: p.Load()}}
	}
	dec.Uncached = req.PromptTokens - dec.CachedTokens
	dec.session = req.SessionID
	return dec, nil
}

// ttft scores every candidate in milliseconds and picks the lowest expected
// time to first token. Candidates are offered to gorgo starting at a rotating
// offset, so exact ties (an idle, cold region) spread instead of always
// going to the first pod.
func (d *Decider) ttft(s *scratch, req *Request, now time.Time, dec *Decision) int {
	n := len(s.pods)
	off := int(d.rr.Add(1) % uint64(n))
	pinned, sessInflight, hasPin := s.pin.pod, s.pin.inflight, s.pin.ok
	wPrefix, wQueue, wRun, wKV, wAff := d.w.prefix, d.w.queue, d.w.running, d.w.kvUtil, d.w.affinity
	s.cands = s.cands[:0]
	for i := 0; i < n; i++ {
		p := s.pods[(i+off)%n]
		info := p.Info()
		cached := min(int(s.bySlot[p.ID.Slot()])*req.BlockSize, req.PromptTokens)
		extra := wRun * d.cfg.RunningPenaltyMs * float64(p.inflight.Load())
		if u := math.Float64frombits(p.kvUtil.Load()); u > 0.8 {
			extra += wKV * d.cfg.KVUtilPenaltyMs * (u - 0.8) / 0.2
		}
		rate, _ := d.model.Rate(info.Profile)
		if hasPin && p.Name == pinned && sessInflight < d.cfg.ThickSession {
			extra -= wAff * (d.cfg.AffinityBonusMs + d.cfg.AffinityCacheWeight*float64(cached)*rate)
		}
		s.cands = append(s.cands, gorgo.Candidate{
			Pod:                  p.Name,
			Profile:              info.Profile,
			PromptTokens:         req.PromptTokens,
			CachedTokens:         min(int(float64(cached)*wPrefix), req.PromptTokens),
			PendingPrefillTokens: int(float64(BacklogTokens(p, now, rate)) * wQueue),
			Running:              int(p.inflight.Load()),
			ExtraMs:              extra,
		})
	}
	d.model.Choose(s.cands, nil, now, &s.dec)
	best := s.dec.Winner

	// Tier detail for the best few: a block held only on CPU or disk saves
	// less prefill than one in GPU memory.
	order := d.topK(s, min(max(d.cfg.TopK, 2), n))
	if best >= 0 {
		for _, ci := range order {
			c := &s.cands[ci]
			p := s.pods[(ci+off)%n]
			matched := int(s.bySlot[p.ID.Slot()])
			if matched == 0 || c.CachedTokens == 0 {
				continue
			}
			tc := d.idx.TierProfile(p.ID, req.Chain[:matched])
			if tc[index.TierGPU] == matched {
				continue
			}
			w := 0.0
			for t, k := range tc {
				w += float64(k) * d.cfg.TierWeights[t]
			}
			c.CachedTokens = int(float64(c.CachedTokens) * w / float64(matched))
			s.dec.Estimates[ci] = d.model.Estimate(c)
		}
		for _, ci := range order {
			if s.dec.Estimates[ci].TotalMs < s.dec.Estimates[best].TotalMs {
				best = ci
			}
		}
	}
	dec.Reason = "lowest_ttft"
	if s.cands[best].CachedTokens == 0 {
		dec.Reason = "lowest_ttft_no_prefix"
	}
	dec.CachedTokens = s.cands[best].CachedTokens
	dec.EstimateMs = s.dec.Estimates[best].TotalMs
	dec.Candidate = s.cands[best]
	if k := min(d.cfg.TopK, n); k < len(order) {
		order = d.topK(s, k)
	}
	for _, ci := range order {
		p := s.pods[(ci+off)%n]
		dec.Top = append(dec.Top, CandidateScore{
			Pod: p.Name, Endpoint: p.Info().Endpoint, MatchedBlocks: int(s.bySlot[p.ID.Slot()]),
			CachedTokens: s.cands[ci].CachedTokens, Load: p.Load(), Estimate: s.dec.Estimates[ci],
		})
	}
	return (best + off) % n
}

// speed is a pod's relative prefill speed: tokens per ms at its profile's
// nominal rate (not the calibrated one, which moves with load and noise and
// would make the bound itself move).
func (d *Decider) speed(p *Pod) float64 {
	rate := d.model.Nominal(p.Info().Profile).PrefillMsPerToken
	if rate <= 0 {
		return 1
	}
	return 1 / rate
}

// BacklogTokens expresses the pod's remaining prefill backlog in tokens at
// the profile's current rate (gorgo multiplies it back).
func BacklogTokens(p *Pod, now time.Time, rateMs float64) int {
	if rateMs <= 0 {
		return int(p.pendingPrefill.Load())
	}
	return int(float64(p.PrefillBacklog(now)) / float64(time.Millisecond) / rateMs)
}

// Admit accounts the decision's request on its pod: its uncached tokens and
// their expected prefill time at the pod profile's current rate, and its
// session as begun there (pinning the session to the pod). The ticket's
// Done undoes both.
func (d *Decider) Admit(dec *Decision) *Ticket {
	rate, _ := d.model.Rate(dec.Pod.Info().Profile)
	work := time.Duration(float64(dec.Uncached) * rate * float64(time.Millisecond))
	now := d.now()
	t := dec.Pod.Admit(dec.Uncached, work, now)
	if dec.session != "" {
		d.sessions.Begin(dec.session, dec.PodName, now)
		t.sessions, t.session = d.sessions, dec.session
	}
	return t
}

// topK returns the indexes of the k candidates with the lowest totals
// (ties: earlier first), by selection: k is small.
func (d *Decider) topK(s *scratch, k int) []int {
	out := make([]int, 0, k)
	for len(out) < k {
		best := -1
		for i := range s.cands {
			if slices.Contains(out, i) {
				continue
			}
			if best < 0 || s.dec.Estimates[i].TotalMs < s.dec.Estimates[best].TotalMs {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out = append(out, best)
	}
	return out
}

func (d *Decider) leastLoaded(pods []*Pod) int {
	off := int(d.rr.Add(1) % uint64(len(pods)))
	best, bestLoad := -1, int64(0)
	for i := range pods {
		j := (i + off) % len(pods)
		if l := pods[j].inflight.Load(); best < 0 || l < bestLoad {
			best, bestLoad = j, l
		}
	}
	return best
}

// rendezvous picks the pod with the highest hash of (session, pod): the same
// session lands on the same pod while the pod set is stable, and only the
// sessions of a removed pod move. Without a session id, the request id.
func (d *Decider) rendezvous(pods []*Pod, req *Request) int {
	key := req.SessionID
	if key == "" {
		key = req.RequestID
	}
	best, bestH := 0, uint64(0)
	for i, p := range pods {
		h := xxhash.New()
		_, _ = h.WriteString(key)
		_, _ = h.Write([]byte{0})
		_, _ = h.WriteString(p.Name)
		if v := h.Sum64(); i == 0 || v > bestH {
			best, bestH = i, v
		}
	}
	return best
}
