package route

import (
	"math"
	"sync"
)

// The fair baselines: pickers that know each pod's hardware (its nominal
// prefill speed) and the router's own load accounting, but not Meridian's
// cost model. Operators compare Meridian with them through the same
// controller (the policy setting or the X-Meridian-Policy header), and the
// simulator runs them as the strongest versions of today's routers.

// weightedRoundRobinPicker is stride scheduling: each pod has a pass; the
// candidate with the lowest pass is taken (ties: the first in name order)
// and its pass advances by its nominal prefill time per token, so over a
// stable set of candidates each takes turns in proportion to its prefill
// speed. A pod seen for the first time starts at the pass of the last
// pick, so a new pod does not take a burst. The pass of a pod is kept as
// start + turns x stride (never summed), so it is exactly the naive
// reference's merge of every pod's multiples of its stride.
type weightedRoundRobinPicker struct {
	mu    sync.Mutex
	pods  map[string]*wrrPod
	vtime float64 // pass of the last pick
}

type wrrPod struct {
	start float64
	turns int64
}

func (p *wrrPod) pass(stride float64) float64 { return p.start + float64(p.turns)*stride }

func (w *weightedRoundRobinPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicyWeightedRoundRobin
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pods == nil {
		w.pods = map[string]*wrrPod{}
	}
	if len(w.pods) > 2*len(c.d.reg.Pods())+64 {
		live := map[string]*wrrPod{}
		for _, p := range c.d.reg.Pods() {
			if s, ok := w.pods[p.Name]; ok {
				live[p.Name] = s
			}
		}
		w.pods = live
	}
	best, bestPass := -1, 0.0
	for i, p := range c.pods {
		s := w.pods[p.Name]
		if s == nil {
			s = &wrrPod{start: w.vtime}
			w.pods[p.Name] = s
		}
		if v := s.pass(1 / c.speedOf(p)); best < 0 || v < bestPass {
			best, bestPass = i, v
		}
	}
	w.vtime = bestPass
	w.pods[c.pods[best].Name].turns++
	return best
}

// weightedLeastLoadedPicker takes the candidate with the fewest requests in
// flight per unit of prefill speed, counting this one ((in flight + 1) /
// speed, as Envoy's weighted least-request does), so idle pods are taken
// fastest first; ties go to the first from a rotating offset. In flight is
// the region's (Pod.InFlight: this replica's and the other replicas' last
// reports), as least_loaded and Meridian's own policy count it.
type weightedLeastLoadedPicker struct{}

func (weightedLeastLoadedPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicyWeightedLeastLoaded
	return c.leastBy(func(p *Pod) float64 { return float64(p.InFlight()+1) / c.speedOf(p) })
}

// leastOutstandingTokensPicker takes the candidate whose prompt tokens in
// flight, this request's included, would take the least time at its
// nominal prefill speed: the token-weighted least-load of GORGO's
// baselines, made hardware-aware.
type leastOutstandingTokensPicker struct{}

func (leastOutstandingTokensPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicyLeastOutstandingTokens
	prompt := float64(max(c.req.PromptTokens, 0))
	return c.leastBy(func(p *Pod) float64 { return (float64(p.outstanding.Load()) + prompt) / c.speedOf(p) })
}

// leastBy returns the candidate with the lowest cost; ties go to the first
// from a rotating offset.
func (c *cycle) leastBy(cost func(*Pod) float64) int {
	n := len(c.pods)
	off := int(c.d.rr.Add(1) % uint64(n))
	best, bestCost := -1, 0.0
	for i := range c.pods {
		j := (i + off) % n
		if v := cost(c.pods[j]); best < 0 || v < bestCost {
			best, bestCost = j, v
		}
	}
	return best
}

// boundedAffinityPicker is consistent hashing with bounded loads (see
// BoundedAffinityConfig): the ring is built once per registry snapshot.
type boundedAffinityPicker struct {
	cfg  BoundedAffinityConfig
	mu   sync.Mutex
	ring *hashRing
}

func (b *boundedAffinityPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicyBoundedAffinity
	pods := c.d.reg.Pods()
	b.mu.Lock()
	r := b.ring
	if !r.builtFor(pods, c.d) {
		r = newHashRing(pods, c.d, b.cfg.VirtualNodes)
		b.ring = r
	}
	b.mu.Unlock()
	return r.pick(c, requestKey(c.req), b.cfg.LoadFactor)
}

// requestKey is what affinity hashes: the session id, else the request id.
func requestKey(r *Request) string {
	if r.SessionID != "" {
		return r.SessionID
	}
	return r.RequestID
}

// loadBound is a pod's bound on in-flight requests (its own + 1 must not
// exceed it): ceil(factor x (total + 1) x speed / sum), the candidates'
// total in flight and sum of speeds.
func loadBound(factor float64, total int64, speed, sum float64) int64 {
	return int64(math.Ceil(factor * float64(total+1) * speed / sum))
}

// precisePrefixPicker is llm-d's precise prefix-cache-aware scheduling
// profile (see PrecisePrefixConfig): the weighted sum of the normalised
// prefix, KV-utilisation and queue scores, maximised; ties (llm-d picks one
// at random) go to the first from a rotating offset.
type precisePrefixPicker struct{ cfg PrecisePrefixConfig }

func (pp precisePrefixPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicyPrecisePrefix
	minM, maxM := int32(math.MaxInt32), int32(-1)
	minQ, maxQ := int64(math.MaxInt64), int64(-1)
	for _, p := range c.pods {
		if m := c.bySlot[p.ID.Slot()]; m > 0 {
			minM, maxM = min(minM, m), max(maxM, m)
		}
		q := p.engineQueue()
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	score := func(p *Pod) float64 {
		prefix := 0.0
		if m := c.bySlot[p.ID.Slot()]; m > 0 {
			prefix = 1
			if maxM > minM {
				prefix = float64(m-minM) / float64(maxM-minM)
			}
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-p.engineQueue()) / float64(maxQ-minQ)
		}
		kv := 1 - math.Float64frombits(p.kvUtil.Load())
		return pp.cfg.PrefixWeight*prefix + pp.cfg.KVUtilWeight*kv + pp.cfg.QueueWeight*queue
	}
	return c.leastBy(func(p *Pod) float64 { return -score(p) })
}
