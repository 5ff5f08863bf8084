package route

import "math"

// A scorer prices one term of every candidate's expected time to first
// token (in milliseconds, times its weight) into the cost model's view of
// it: c.cands[i] is c.order[i]. Scorers run in a fixed order (prefix, queue,
// running, kv_util, affinity); one with weight 0 does not run.
type scorer interface {
	score(c *cycle)
}

func newScorers(cfg Config) []scorer {
	w := cfg.Weights
	var out []scorer
	if w["prefix"] > 0 {
		out = append(out, prefixScorer{weight: w["prefix"]})
	}
	if w["queue"] > 0 {
		out = append(out, queueScorer{weight: w["queue"]})
	}
	if w["running"] > 0 {
		out = append(out, runningScorer{perRequestMs: w["running"] * cfg.RunningPenaltyMs})
	}
	if w["kv_util"] > 0 {
		out = append(out, kvUtilScorer{fullMs: w["kv_util"] * cfg.KVUtilPenaltyMs})
	}
	if w["affinity"] > 0 {
		out = append(out, affinityScorer{weight: w["affinity"], bonusMs: cfg.AffinityBonusMs,
			cacheWeight: cfg.AffinityCacheWeight, thick: cfg.ThickSession})
	}
	return out
}

// prefixScorer counts the pod's exact cached prefix (from the index) toward
// the prefill it saves: weight 1 counts every cached token. The ttft picker
// then weights the best few by the tier each block is held in.
type prefixScorer struct{ weight float64 }

func (s prefixScorer) score(c *cycle) {
	for i, p := range c.order {
		c.cands[i].CachedTokens = min(int(float64(c.cached(p))*s.weight), c.req.PromptTokens)
	}
}

// queueScorer is the prefill work already routed to the pod and not yet
// done (the router's own accounting, fresher than any engine metric), in
// tokens at the pod's current rate.
type queueScorer struct{ weight float64 }

func (s queueScorer) score(c *cycle) {
	for i, p := range c.order {
		c.cands[i].PendingPrefillTokens = int(float64(BacklogTokens(p, c.now, c.rates[i])) * s.weight)
	}
}

// runningScorer costs each request in flight on the pod a little: each one
// slows the engine's batch steps.
type runningScorer struct{ perRequestMs float64 }

func (s runningScorer) score(c *cycle) {
	for i, p := range c.order {
		c.cands[i].ExtraMs += s.perRequestMs * float64(p.InFlight())
	}
}

// kvUtilScorer costs a pod whose scraped KV cache is past 80% full, linearly
// up to fullMs at 100%: new prefixes there evict others.
type kvUtilScorer struct{ fullMs float64 }

func (s kvUtilScorer) score(c *cycle) {
	for i, p := range c.order {
		if u := math.Float64frombits(p.kvUtil.Load()); u > 0.8 {
			c.cands[i].ExtraMs += s.fullMs * (u - 0.8) / 0.2
		}
	}
}

// affinityScorer favours the pod a session is pinned to: a fixed bonus plus
// cacheWeight x the prefill time of what the pod holds for it (moving a
// conversation also copies its history elsewhere). A "thick" session, with
// thick or more requests in flight, gets no bonus for the excess, so its
// concurrent requests spread.
type affinityScorer struct {
	weight, bonusMs, cacheWeight float64
	thick                        int
}

func (s affinityScorer) score(c *cycle) {
	if !c.pin.ok || c.pin.inflight >= s.thick {
		return
	}
	for i, p := range c.order {
		if p.Name == c.pin.pod {
			c.cands[i].ExtraMs -= s.weight * (s.bonusMs + s.cacheWeight*float64(c.cached(p))*c.rates[i])
		}
	}
}
