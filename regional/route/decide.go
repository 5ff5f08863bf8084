package route

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

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
	// Salted says the request carries a cache salt: it avoids pods whose
	// KV events cannot carry one (PodInfo.SaltBlind) while others remain.
	Salted bool
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
	idx      *index.Index
	reg      *Registry
	model    *gorgo.Model
	sessions *Sessions
	spec     *Speculation
	now      func() time.Time
	rr       atomic.Uint64 // rotation of round_robin and of the baselines' ties
	scratch  sync.Pool
	retried  excludeFilter
	// queueWeight is the cost model's, read once (its config is fixed).
	queueWeight float64

	// pipe is the pipeline in force; Reconfigure replaces it whole, and a
	// decision reads it once.
	pipe atomic.Pointer[pipeline]
}

// pipeline is the decision pipeline built from one Config: the filters in
// their configured order, the scorers with a non-zero weight, and every
// picker (a request may name another policy than the configured one).
type pipeline struct {
	cfg     Config
	filters []filter
	scorers []scorer
	pickers map[string]picker
}

func newPipeline(cfg Config) *pipeline {
	p := &pipeline{cfg: cfg, filters: newFilters(cfg), scorers: newScorers(cfg)}
	p.pickers = newPickers(cfg, p.scorers)
	return p
}

// NewDecider builds the pipeline. now is the clock (time.Now in production).
func NewDecider(cfg Config, idx *index.Index, reg *Registry, model *gorgo.Model, now func() time.Time) (*Decider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Decider{idx: idx, reg: reg, model: model, now: now,
		sessions: NewSessions(cfg.SessionTTL, cfg.MaxSessions), queueWeight: model.Config().QueueWeight}
	if cfg.SpeculationTTL > 0 {
		d.spec = NewSpeculation(cfg.SpeculationTTL, 1<<20)
	}
	d.pipe.Store(newPipeline(cfg))
	d.scratch.New = func() any { return newCycle(idx.PodCapacity()) }
	return d, nil
}

// RestartKeys are the decision settings a running Decider keeps from
// NewDecider: they size its session table and its speculation memory.
// Reconfigure leaves them as they are.
var RestartKeys = []string{"session_ttl", "max_sessions", "speculation_ttl"}

// Reconfigure replaces the pipeline with one built from cfg (validated
// first: an invalid cfg changes nothing): the policy, the filters, the
// scorers' weights and penalties, the pickers' settings. Decisions under
// way finish with the pipeline they started with; the next ones use the
// new one. SessionTTL, MaxSessions and SpeculationTTL (RestartKeys) keep
// the values the Decider was built with: the returned config is the one in
// force.
func (d *Decider) Reconfigure(cfg Config) (Config, error) {
	if err := cfg.Validate(); err != nil {
		return d.Config(), err
	}
	cur := d.Config()
	cfg.SessionTTL, cfg.MaxSessions, cfg.SpeculationTTL = cur.SessionTTL, cur.MaxSessions, cur.SpeculationTTL
	d.pipe.Store(newPipeline(cfg))
	return cfg, nil
}

// Sessions exposes the affinity table (the proxy records request ends).
func (d *Decider) Sessions() *Sessions { return d.sessions }

// Speculation exposes the recently-computed-prefix memory (the proxy feeds
// it at each answer's first byte); nil when turned off.
func (d *Decider) Speculation() *Speculation { return d.spec }

// Config returns the configuration of the pipeline in force.
func (d *Decider) Config() Config { return d.pipe.Load().cfg }

// Alive reports whether p is live in the index (announced and not removed).
func (d *Decider) Alive(p *Pod) bool { return d.idx.Alive(p.ID) }

// Registry returns the pods the decisions choose among.
func (d *Decider) Registry() *Registry { return d.reg }

// Model returns the cost model the decisions are priced with.
func (d *Decider) Model() *gorgo.Model { return d.model }

// Decide picks a pod of this region for the request: the data layer (the
// longest cached prefix of every pod, from the index and the speculation),
// then the filters, then the picker of the request's policy (whose
// scorers, for ttft, price each remaining pod). It changes no accounting: a
// decision that is served is passed to Admit, whose ticket counts the
// request (and its session) on the pod until Done.
func (d *Decider) Decide(req *Request) (*Decision, error) {
	dec := &Decision{}
	if err := d.DecideInto(req, dec); err != nil {
		return nil, err
	}
	return dec, nil
}

// DecideInto is Decide writing the decision into dst, reusing its Top
// slice and Filtered map: with a dst kept from an earlier decision it
// allocates nothing (TestDecideAllocs). dst is overwritten whole; on an
// error its contents are unspecified. Filtered is nil, or empty, when no
// filter dropped a pod.
func (d *Decider) DecideInto(req *Request, dst *Decision) error {
	snap := d.reg.snapshot()
	pods := *snap
	if len(pods) == 0 {
		return ErrNoPod
	}
	pipe := d.pipe.Load()
	policy := pipe.cfg.Policy
	if req.Policy != "" {
		policy = req.Policy
	}
	pick, ok := pipe.pickers[policy]
	if !ok {
		return fmt.Errorf("unknown policy %q", policy)
	}
	c := d.scratch.Get().(*cycle)
	defer d.scratch.Put(c)
	c.begin(d, req, pods, d.now(), policy == PolicyTTFT)
	defer c.end()
	c.snap, c.whole = snap, true
	if dst.Filtered != nil {
		clear(dst.Filtered)
		c.filtered = dst.Filtered
	}

	if len(req.Exclude) > 0 {
		d.retried.apply(c)
	}
	if req.Salted {
		saltFilter{}.apply(c)
	}
	for _, f := range pipe.filters {
		f.apply(c)
	}
	if len(c.pods) == 0 {
		return fmt.Errorf("%w (filtered: %v)", ErrNoHealthyPod, c.filtered)
	}

	*dst = Decision{Policy: policy, Candidates: len(c.pods), Filtered: c.filtered, Top: dst.Top[:0]}
	p := c.pods[pick.pick(c, dst)]
	info := p.info.Load()
	dst.Pod, dst.PodName, dst.Endpoint = p, p.Name, info.Endpoint
	dst.MatchedBlocks = c.matched(p)
	if policy != PolicyTTFT {
		// A baseline does not price its choice; explain it with the same
		// terms the cost model would use.
		dst.CachedTokens = c.cached(p)
		rate, _ := d.model.RateFor(info.Profile, p.Name)
		dst.Candidate = gorgo.Candidate{Pod: p.Name, Profile: info.Profile, PromptTokens: req.PromptTokens,
			CachedTokens: dst.CachedTokens, PendingPrefillTokens: BacklogTokens(p, c.now, rate), Running: int(p.InFlight())}
		dst.Top = append(dst.Top[:0], CandidateScore{Pod: p.Name, Endpoint: info.Endpoint, MatchedBlocks: dst.MatchedBlocks, CachedTokens: dst.CachedTokens, Load: p.Load()})
	}
	dst.Uncached = req.PromptTokens - dst.CachedTokens
	dst.session = req.SessionID
	return nil
}

// BacklogTokens expresses the pod's remaining prefill backlog in tokens at
// the profile's current rate (gorgo multiplies it back): the backlog model's
// remaining work, but never less than the uncached tokens of the requests
// that have not had their first byte (the model drains with time; work a
// stalled pod has not done, waiting for KV blocks behind long decodes say,
// must not look done), and nothing when every request has had it; plus
// the uncached tokens the region's other replicas last reported waiting
// for their first byte there.
func BacklogTokens(p *Pod, now time.Time, rateMs float64) int {
	return backlogTokens(p, p.prefillBusy.Load(), now, rateMs)
}

// backlogTokens is BacklogTokens with the pod's prefill deadline (busy,
// unix nanos) already read.
func backlogTokens(p *Pod, busy int64, now time.Time, rateMs float64) int {
	peers := int(max(p.peerPending.Load(), 0))
	pending := int(p.pendingPrefill.Load())
	if rateMs <= 0 || pending <= 0 {
		return max(pending, 0) + peers // nothing of ours before its first byte: nothing of ours ahead
	}
	return max(int(float64(time.Duration(max(busy-now.UnixNano(), 0)))/float64(time.Millisecond)/rateMs), pending) + peers
}

// Admit accounts the decision's request on its pod: its uncached tokens and
// their expected prefill time on the pod (gorgo's prefill model: the pod's
// current rate, attention included), its prompt tokens as outstanding, and
// its session as begun there (pinning the session to the pod). The
// ticket's Done undoes all three.
func (d *Decider) Admit(dec *Decision) *Ticket {
	work := time.Duration(d.model.PrefillMs(dec.Pod.Info().Profile, dec.Pod.Name, dec.CachedTokens, dec.Uncached) * float64(time.Millisecond))
	now := d.now()
	t := dec.Pod.Admit(dec.Uncached, work, now)
	t.tokens = int64(dec.Uncached + dec.CachedTokens)
	dec.Pod.outstanding.Add(t.tokens)
	if dec.session != "" {
		d.sessions.Begin(dec.session, dec.PodName, now)
		t.sessions, t.session = d.sessions, dec.session
	}
	return t
}
