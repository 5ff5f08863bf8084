package route

import (
	"math"
	"slices"
)

// A filter narrows a decision's candidate pods (cycle.pods) and counts what
// it dropped under its name.
type filter interface {
	apply(c *cycle)
}

// newFilters builds the configured filters in order. Filters that judge
// each pod on its own (alive, model, healthy) and follow one another run
// as one pass (podFilters), which drops a pod under the name of the first
// of them it fails: what running them one after the other would count.
func newFilters(cfg Config) []filter {
	out := make([]filter, 0, len(cfg.Filters))
	var run podFilters
	flush := func() {
		if len(run) > 0 {
			out = append(out, run)
			run = nil
		}
	}
	for _, name := range cfg.Filters {
		switch name {
		case FilterAlive:
			run = append(run, checkAlive)
		case FilterModel:
			run = append(run, checkModel)
		case FilterHealthy:
			run = append(run, checkHealthy)
		case FilterBoundedLoad:
			flush()
			out = append(out, boundedLoadFilter{factor: cfg.BoundedLoadFactor})
		case FilterNewSession:
			flush()
			out = append(out, newSessionFilter{})
		}
	}
	flush()
	return out
}

// excludeFilter drops the pods a request was already tried on (a retry);
// it runs first whenever the request names any.
type excludeFilter struct{}

func (excludeFilter) apply(c *cycle) {
	c.keep("retried", func(p *Pod) bool { return !slices.Contains(c.req.Exclude, p) })
}

// saltFilter keeps a salted request off pods whose KV events cannot carry
// its salt, while any other pod remains. Such a pod indexes the salted
// blocks it stores as unsalted ones (their tokens are all its events say),
// which later unsalted requests would be predicted to hit; kept off salted
// traffic, it holds only blocks its events describe. When only such pods
// remain, availability wins and the request goes to one of them.
type saltFilter struct{}

func (saltFilter) apply(c *cycle) {
	if slices.ContainsFunc(c.pods, func(p *Pod) bool { return !p.Info().SaltBlind() }) {
		c.keep("salt_blind", func(p *Pod) bool { return !p.Info().SaltBlind() })
	}
}

// A check is a filter that judges each pod on its own.
type check uint8

const (
	// checkAlive keeps the pods live in the index (a removed pod leaves
	// the index at once, before the registry snapshot a decision read
	// changes) with a known endpoint (a pod known only from its KV events,
	// or whose announcement was not believed, cannot be sent a request)
	// that has not lapsed (its announcement ran out and it did not answer).
	checkAlive check = iota
	// checkModel keeps the pods that serve the requested model (a pod or a
	// request that names none matches any).
	checkModel
	// checkHealthy keeps the pods outlier detection has not ejected.
	checkHealthy
)

var checkNames = [...]string{checkAlive: FilterAlive, checkModel: FilterModel, checkHealthy: FilterHealthy}

// podFilters runs checks in order in one pass over the candidates. It also
// sums what bounded_load needs of the pods it keeps (c.load).
type podFilters []check

func (f podFilters) apply(c *cycle) {
	now := c.now.UnixNano()
	model, anyModel := -1, c.req.Model == ""
	if m, ok := c.cat.models[c.req.Model]; ok {
		model = m // else only pods that name no model serve it
	}
	var on uint
	for _, k := range f {
		on |= 1 << k
	}
	e := &c.elig
	key := eligibleKey{snap: c.snap, changes: c.d.reg.changes.Load(), live: c.d.idx.LivenessGen(),
		on: on, model: model, anyModel: anyModel}
	if c.whole && e.valid(c, key, now) {
		// The checks' outcome on this snapshot stands: only the load of
		// the pods it kept is read.
		var total, most int64
		if len(e.kept) < len(c.pods) {
			c.pods = append(c.pods[:0], e.kept...)
		}
		for _, p := range c.pods {
			in := p.InFlight()
			total += in
			most = max(most, in)
		}
		for k, d := range e.dropped {
			c.count(checkNames[k], d)
		}
		c.load = loadSums{pods: len(c.pods), inflight: total, most: most, speeds: e.speeds}
		c.asKept = true
		return
	}
	whole := c.whole
	// Every check is worked out for every pod, from one read of its
	// description, and only those configured count: a pod that passes
	// them all (the common case) costs no branch per check, and one that
	// fails is dropped under the first configured check it fails.
	idx := c.d.idx
	var dropped [len(checkNames)]int
	var total, most int64
	var speeds float64
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	n := 0
	for _, p := range c.pods {
		d := p.desc.Load()
		var fail uint
		if !idx.Alive(p.ID) || d&descEndpoint == 0 || p.lapsed.Load() {
			fail |= 1 << checkAlive
		}
		if m := int(d >> descBits & descMask); !anyModel && m != 0 && m != model {
			fail |= 1 << checkModel
		}
		if to := p.ejectedTo.Load(); now < to {
			fail |= 1 << checkHealthy
			hi = min(hi, to)
		} else {
			lo = max(lo, to)
		}
		if fail&on != 0 {
			for _, k := range f {
				if fail&(1<<k) != 0 {
					dropped[k]++
					break
				}
			}
			continue
		}
		c.pods[n] = p
		n++
		in := p.InFlight()
		total += in
		most = max(most, in)
		speeds += c.profs[d&descMask].speed
	}
	for k, d := range dropped {
		c.count(checkNames[k], d)
	}
	c.pods = c.pods[:n]
	c.load = loadSums{pods: n, inflight: total, most: most, speeds: speeds}
	if whole {
		e.keep(c, key, lo, hi, dropped, speeds)
		c.asKept = true
	} else {
		e.key, c.asKept = eligibleKey{}, false
	}
}

// eligible is what the alive, model and healthy checks (podFilters) made
// of a whole registry snapshot, kept by a cycle for the next decisions
// while nothing the checks read has changed: the same snapshot, no change
// counted by the registry (descriptions, lapsing, ejections) or by the
// index (liveness), the same checks and requested model, a clock that has
// not crossed any pod's ejection deadline, and the same speeds of the
// profiles. Each change is counted after it is made and the counts are
// read before the pods, so a kept outcome is never older than its key
// says. A decision on a kept outcome reads of each pod it kept only its
// requests in flight (bounded_load's sums), which change with every
// request and are never kept.
type eligible struct {
	key     eligibleKey
	lo, hi  int64 // unix nanos: the outcome holds at now in [lo, hi)
	kept    []*Pod
	pos     []int32 // by slot, the position in kept of the pod in it (-1: none)
	shared  bool    // two kept pods share a slot (pos is then unused)
	dropped [len(checkNames)]int
	speeds  float64   // the kept pods' profiles' speeds, summed in order
	profs   []float64 // the speed of each profile then
}

// eligibleKey is what an outcome of the checks was worked out from.
type eligibleKey struct {
	snap     *[]*Pod
	changes  uint64
	live     uint64
	on       uint
	model    int
	anyModel bool
}

// valid reports whether e is the checks' outcome for key at now.
func (e *eligible) valid(c *cycle, key eligibleKey, now int64) bool {
	if e.key != key || now < e.lo || now >= e.hi || len(e.profs) != len(c.profs) {
		return false
	}
	for i, s := range e.profs {
		if s != c.profs[i].speed {
			return false
		}
	}
	return true
}

// keep records the checks' outcome on a whole snapshot: c.pods as they
// left them, at now in [lo, hi).
func (e *eligible) keep(c *cycle, key eligibleKey, lo, hi int64, dropped [len(checkNames)]int, speeds float64) {
	e.key, e.lo, e.hi, e.dropped, e.speeds = key, lo, hi, dropped, speeds
	e.kept = append(e.kept[:0], c.pods...)
	e.pos, e.shared = grow(e.pos, len(c.posOf)), false
	for i := range e.pos {
		e.pos[i] = -1
	}
	for i, p := range e.kept {
		slot := p.ID.Slot()
		e.shared = e.shared || e.pos[slot] >= 0
		e.pos[slot] = int32(i)
	}
	e.profs = e.profs[:0]
	for i := range c.profs {
		e.profs = append(e.profs, c.profs[i].speed)
	}
}

// aliveFilter, modelFilter and healthyFilter are the checks on their own.
type (
	aliveFilter   struct{}
	modelFilter   struct{}
	healthyFilter struct{}
)

func (aliveFilter) apply(c *cycle)   { podFilters{checkAlive}.apply(c) }
func (modelFilter) apply(c *cycle)   { podFilters{checkModel}.apply(c) }
func (healthyFilter) apply(c *cycle) { podFilters{checkHealthy}.apply(c) }

// loadSums are the candidates' requests in flight (Pod.InFlight: this
// replica's and the region's other replicas') and prefill speeds,
// summed in candidate order; valid while pods equals the number of
// candidates (filters only ever drop pods, so the count changes whenever
// the set does).
type loadSums struct {
	pods     int
	inflight int64
	most     int64 // the most in flight on any one candidate
	speeds   float64
}

// boundedLoadFilter keeps the pods under their load bound: in flight + 1 <=
// ceil(factor x (total in flight + 1) x the pod's share of the candidates'
// prefill speed). Consistent hashing with bounded loads, weighted by
// hardware: a pod twice as fast may carry twice the requests, and on a
// uniform fleet the share is 1/pods.
type boundedLoadFilter struct{ factor float64 }

func (f boundedLoadFilter) apply(c *cycle) {
	if c.load.pods != len(c.pods) {
		var total, most int64
		var speeds float64
		for _, p := range c.pods {
			in := p.InFlight()
			total += in
			most = max(most, in)
			speeds += c.speedOf(p)
		}
		c.load = loadSums{pods: len(c.pods), inflight: total, most: most, speeds: speeds}
	}
	total, sum := c.load.inflight, c.load.speeds
	if len(c.pods) == 0 || sum <= 0 {
		return
	}
	// The bound depends on the pod only through its profile's speed.
	least := int64(math.MaxInt64)
	for i := range c.profs {
		pt := &c.profs[i]
		pt.limit = int64(f.factor*float64(total+1)*pt.speed/sum + 0.999999)
		least = min(least, pt.limit)
	}
	if c.load.most+1 <= least {
		// Every candidate is within the lowest bound of any profile (the
		// common case: the bound binds only on a hot prefix): none is
		// dropped, and the pods need not be read again.
		return
	}
	n := 0
	for _, p := range c.pods {
		if p.InFlight()+1 <= c.profs[p.profile()].limit {
			c.pods[n] = p
			n++
		}
	}
	c.kept(FilterBoundedLoad, n)
}

// newSessionFilter places the first request of a session (an id not pinned
// yet) by load: only the least loaded pods (in flight per unit of prefill
// speed, within one request of the least) stay candidates, so sessions
// spread evenly and then stay where their cache grows.
type newSessionFilter struct{}

func (newSessionFilter) apply(c *cycle) {
	if c.req.SessionID == "" || len(c.pods) == 0 || c.pin.ok {
		return
	}
	least := math.Inf(1)
	for _, p := range c.pods {
		least = min(least, float64(p.InFlight())/c.speedOf(p))
	}
	n := 0
	for _, p := range c.pods {
		if s := c.speedOf(p); float64(p.InFlight())/s <= least+1/s {
			c.pods[n] = p
			n++
		}
	}
	c.kept(FilterNewSession, n)
}
