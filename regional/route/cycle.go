package route

import (
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// cycle is the working state of one decision: the request, the pods still
// in the running, and what the data layer found about them. The pipeline's
// stages read and narrow it in turn. A Decider keeps cycles in a pool, and
// every slice here keeps its capacity from one decision to the next, so a
// decision allocates none of this.
type cycle struct {
	d     *Decider
	req   *Request
	now   time.Time
	nowNs int64 // now, in unix nanos
	// matches is the index's answer, ranked by depth: all of it, or, when
	// groups is in use (lazy), the groups answered so far, deepest first
	// (see resolve).
	matches   []index.Match
	groups    index.Groups
	lazy      bool
	drained   bool  // lazy, and the index had no group left to answer
	touched   []int // slots whose bySlot a speculation raised
	confirmed []index.PodID
	bySlot    []int32 // matched blocks per pod slot (index, or speculation)
	pods      []*Pod  // the candidates, narrowed by each filter
	// snap is the registry snapshot pods began as, and whole says no
	// filter has dropped any of it yet: the checks may then use elig, the
	// outcome they had on it at an earlier decision of this cycle.
	snap  *[]*Pod
	whole bool
	elig  eligible
	// asKept says pods is elig.kept, in its order: the ttft picker then
	// takes the candidates' positions from elig (layout).
	asKept bool
	pin    struct {
		pod      string
		inflight int
		ok       bool
	}
	filtered map[string]int // pods each filter dropped (nil: none yet)
	load     loadSums       // the candidates' load, when a filter summed it

	// profs holds, by the registry's profile number, what the pipeline
	// needs of each hardware profile: read from the cost model once per
	// decision, not once per pod.
	profs []profTerms
	// minFactor is the smallest correction of any pod's rate (at most 1):
	// a pod not priced yet runs at least at its profile's rate times it.
	minFactor float64
	factorGen uint64 // the model's PodFactorGen, read before any factor
	cat       *catalog

	// The ttft picker's working set, by position in order (the candidates
	// in the order they are offered to the cost model): for the candidates
	// priced so far (priced[i] == gen), what the scorers priced (terms)
	// and a lower bound of the total estimate (bound); for the few that
	// can win, the estimate itself (est, where evaluated[i] == gen). See
	// pricing.go.
	order     []*Pod
	terms     []terms
	bound     []float64
	est       []gorgo.Estimate
	priced    []uint32
	listed    []uint32 // in prices, with a first bound (list) or priced
	evaluated []uint32
	gen       uint32
	prices    []int // the priced candidates, in the order priced
	evals     []int // the evaluated ones, likewise
	// posOf[slot] is the position of the candidate in that slot, where
	// candGen[slot] == gen; or, when pos is not nil, pos[slot] is (-1:
	// none). See position.
	posOf   []int32
	candGen []uint32
	pos     []int32
	// Candidates are priced a group at a time, by matched depth, deepest
	// first (see more): next indexes matches at the next group, rest says
	// every candidate is priced, and floor is a lower bound of the total
	// of every candidate not priced yet.
	scoring *scoring
	next    int
	rest    bool
	floor   float64
	exact   bool  // floor is that of the next group (see floorAt)
	sel     []int // scratch of lowest
	top     []int // scratch of the ttft picker
}

// profTerms is one hardware profile as a decision sees it.
type profTerms struct {
	name     string
	rate     float64 // calibrated prefill ms per token, now (a pod's is this times its own factor)
	overhead float64 // calibrated overhead ms, now
	attn     float64 // gorgo.Profile.AttnTokens: the attention term's scale (0: none)
	speed    float64 // nominal tokens per ms (see cycle.speedOf)
	limit    int64   // the bounded_load filter's bound on in flight + 1
}

// terms is one candidate as the scorers price it: the fields of its
// gorgo.Candidate that vary from pod to pod, and the pod's load as read
// once for this decision.
type terms struct {
	slot    int
	prof    int
	rate    float64 // the pod's calibrated prefill ms per token (its profile's x its factor)
	running int     // requests in flight
	busy    int64   // unix nanos: when its prefill work should be done
	kv      float64 // scraped KV-cache utilisation
	cached  int     // CachedTokens (the prefix scorer)
	pending int     // PendingPrefillTokens (the queue scorer)
	extra   float64 // ExtraMs (running, kv_util and affinity scorers)
}

func newCycle(capacity int) *cycle {
	return &cycle{matches: make([]index.Match, 0, capacity), bySlot: make([]int32, capacity),
		posOf: make([]int32, capacity), candGen: make([]uint32, capacity)}
}

// begin fills the data layer: the longest cached prefix of every pod (from
// the index, raised by a fresher speculation) and the session's pin. With
// lazy, the index answers a depth group at a time, deepest first, as the
// ttft picker needs them (it prices the deepest groups first and stops
// when the next cannot win): a pod's prefix is known once resolve has
// reached it, which every reader of bySlot on that path does first (the
// candidates it prices, the pods a speculation names). Other pickers read
// every pod's prefix: they get the whole answer at once.
func (c *cycle) begin(d *Decider, req *Request, pods []*Pod, now time.Time, lazy bool) {
	c.d, c.req, c.now, c.nowNs = d, req, now, now.UnixNano()
	c.filtered, c.load = nil, loadSums{pods: -1}
	c.lazy, c.drained = lazy, false
	if lazy {
		d.idx.LookupGroups(req.Chain, &c.groups)
		c.matches = c.matches[:0]
	} else {
		c.matches = d.idx.Lookup(req.Chain, c.matches)
		for _, m := range c.matches {
			c.bySlot[m.Pod.Slot()] = int32(m.Blocks)
		}
	}
	c.touched, c.confirmed = c.touched[:0], c.confirmed[:0]
	d.spec.Match(req.Chain, now, c.speculated)
	for _, id := range c.confirmed {
		d.spec.Confirmed(id, req.Chain[:c.bySlot[id.Slot()]])
	}
	c.pin.pod, c.pin.inflight, c.pin.ok = d.sessions.Pinned(req.SessionID, now)
	c.pods = append(c.pods[:0], pods...)
	c.snap, c.whole, c.asKept = nil, false, false
	c.cat = d.reg.catalog()
	c.profs = grow(c.profs, len(c.cat.profiles))
	for i, name := range c.cat.profiles {
		pt := profTerms{name: name, speed: 1}
		pt.rate, pt.overhead = d.model.Rate(name)
		nominal := d.model.Nominal(name)
		if r := nominal.PrefillMsPerToken; r > 0 {
			pt.speed = 1 / r
		}
		pt.attn = nominal.AttnTokens
		c.profs[i] = pt
	}
	c.minFactor = d.model.MinPodFactor()
	c.factorGen = d.model.PodFactorGen()
}

// resolve answers the index's groups, deepest first, until the pod in
// slot has its prefix in bySlot (a pod in no group has none: 0).
func (c *cycle) resolve(slot int) {
	for c.lazy && c.groups.Pending(slot) {
		c.nextGroup()
	}
}

// nextGroup appends the index's next group to matches and reports whether
// there was one.
func (c *cycle) nextGroup() bool {
	n := len(c.matches)
	c.matches = c.groups.Next(c.matches)
	for _, m := range c.matches[n:] {
		c.bySlot[m.Pod.Slot()] = int32(m.Blocks)
	}
	c.drained = c.drained || len(c.matches) == n
	return len(c.matches) > n
}

// speculated is the speculation's callback: a pod that recently computed
// blocks leading blocks of the chain.
func (c *cycle) speculated(id index.PodID, blocks int) {
	slot := id.Slot()
	c.resolve(slot)
	switch {
	case !c.d.idx.Alive(id):
	case int32(blocks) > c.bySlot[slot]:
		c.bySlot[slot] = int32(blocks)
		c.touched = append(c.touched, slot)
	default:
		c.confirmed = append(c.confirmed, id) // the index caught up
	}
}

// end clears what begin set in the per-slot tables, for the next decision.
func (c *cycle) end() {
	for _, m := range c.matches {
		c.bySlot[m.Pod.Slot()] = 0
	}
	for _, slot := range c.touched {
		c.bySlot[slot] = 0
	}
	if c.lazy {
		c.d.idx.LookupGroups(nil, &c.groups) // drops its hold on the chain
	}
	c.d, c.req, c.filtered, c.cat = nil, nil, nil, nil
	c.order, c.pos = nil, nil
}

// matched is the number of leading blocks of the request's chain pod holds.
func (c *cycle) matched(p *Pod) int { return int(c.bySlot[p.ID.Slot()]) }

// cached is the prompt tokens pod holds, before any tier weighting.
func (c *cycle) cached(p *Pod) int { return c.cachedAt(p.ID.Slot()) }

func (c *cycle) cachedAt(slot int) int {
	return min(int(c.bySlot[slot])*c.req.BlockSize, c.req.PromptTokens)
}

// speedOf is p's relative prefill speed (tokens per ms at its profile's
// nominal rate).
func (c *cycle) speedOf(p *Pod) float64 { return c.profs[p.profile()].speed }

// keep narrows the candidates to those ok accepts, counting the others
// under the filter's name.
func (c *cycle) keep(name string, ok func(*Pod) bool) {
	n := 0
	for _, p := range c.pods {
		if ok(p) {
			c.pods[n] = p
			n++
		}
	}
	c.kept(name, n)
}

// kept ends a filter that moved the n pods it keeps to the front of
// c.pods: the others are counted under its name.
func (c *cycle) kept(name string, n int) {
	if n < len(c.pods) {
		c.whole, c.asKept = false, false
	}
	c.count(name, len(c.pods)-n)
	c.pods = c.pods[:n]
}

// count counts k pods dropped by the named filter.
func (c *cycle) count(name string, k int) {
	if k > 0 {
		if c.filtered == nil {
			c.filtered = map[string]int{}
		}
		c.filtered[name] += k
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// speed is a pod's relative prefill speed: tokens per ms at its profile's
// nominal rate (not the calibrated one, which moves with load and noise and
// would make the bounds built on it move). Within a decision, speedOf reads
// the same from the cycle's profile table.
func (d *Decider) speed(p *Pod) float64 {
	rate := d.model.Nominal(p.Info().Profile).PrefillMsPerToken
	if rate <= 0 {
		return 1
	}
	return 1 / rate
}
