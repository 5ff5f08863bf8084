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

func newFilters(cfg Config) []filter {
	out := make([]filter, 0, len(cfg.Filters))
	for _, name := range cfg.Filters {
		switch name {
		case FilterAlive:
			out = append(out, aliveFilter{})
		case FilterModel:
			out = append(out, modelFilter{})
		case FilterHealthy:
			out = append(out, healthyFilter{})
		case FilterBoundedLoad:
			out = append(out, boundedLoadFilter{factor: cfg.BoundedLoadFactor})
		case FilterNewSession:
			out = append(out, newSessionFilter{})
		}
	}
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

// aliveFilter keeps the pods live in the index (a removed pod leaves the
// index at once, before the registry snapshot a decision read changes) with
// a known endpoint (a pod known only from its KV events, or whose
// announcement was not believed, cannot be sent a request) that has not
// lapsed (its announcement ran out and it did not answer).
type aliveFilter struct{}

func (aliveFilter) apply(c *cycle) {
	c.keep(FilterAlive, func(p *Pod) bool { return c.d.idx.Alive(p.ID) && p.Info().Endpoint != "" && !p.Lapsed() })
}

// modelFilter keeps the pods that serve the requested model (a pod or a
// request that names none matches any).
type modelFilter struct{}

func (modelFilter) apply(c *cycle) {
	c.keep(FilterModel, func(p *Pod) bool {
		m := p.Info().Model
		return c.req.Model == "" || m == "" || m == c.req.Model
	})
}

// healthyFilter keeps the pods outlier detection has not ejected.
type healthyFilter struct{}

func (healthyFilter) apply(c *cycle) {
	c.keep(FilterHealthy, func(p *Pod) bool { return !p.Ejected(c.now) })
}

// boundedLoadFilter keeps the pods under their load bound: in flight + 1 <=
// ceil(factor x (total in flight + 1) x the pod's share of the candidates'
// prefill speed). Consistent hashing with bounded loads, weighted by
// hardware: a pod twice as fast may carry twice the requests, and on a
// uniform fleet the share is 1/pods.
type boundedLoadFilter struct{ factor float64 }

func (f boundedLoadFilter) apply(c *cycle) {
	var total int64
	var sum float64
	for _, p := range c.pods {
		total += p.inflight.Load()
		sum += c.speedOf(p)
	}
	if len(c.pods) == 0 || sum <= 0 {
		return
	}
	c.keep(FilterBoundedLoad, func(p *Pod) bool {
		limit := int64(f.factor*float64(total+1)*c.speedOf(p)/sum + 0.999999)
		return p.inflight.Load()+1 <= limit
	})
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
		least = min(least, float64(p.inflight.Load())/c.speedOf(p))
	}
	c.keep(FilterNewSession, func(p *Pod) bool {
		return float64(p.inflight.Load())/c.speedOf(p) <= least+1/c.speedOf(p)
	})
}
