package route

// A scorer prices one term of a candidate's expected time to first token
// (in milliseconds, times its weight) into its terms. Scorers run in a
// fixed order (prefix, queue, running, kv_util, affinity); one with weight
// 0 does not run. The ttft picker runs them all for one candidate before
// the next (see scoring): one pass over the candidates, not one per
// scorer.
type scorer interface {
	// term prices candidate i (c.order[i]), whose terms are t.
	term(c *cycle, i int, t *terms)
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

// scoring is a list of scorers sorted by kind, so that pricing a candidate
// calls each directly (no dynamic dispatch in the per-candidate loop).
type scoring struct {
	prefix   *prefixScorer
	queue    *queueScorer
	running  *runningScorer
	kvUtil   *kvUtilScorer
	affinity *affinityScorer
}

func newScoring(scorers []scorer) scoring {
	var s scoring
	for _, sc := range scorers {
		switch sc := sc.(type) {
		case prefixScorer:
			s.prefix = &sc
		case queueScorer:
			s.queue = &sc
		case runningScorer:
			s.running = &sc
		case kvUtilScorer:
			s.kvUtil = &sc
		case affinityScorer:
			s.affinity = &sc
		}
	}
	return s
}

// price runs the scorers, in their order, on candidate i.
func (s *scoring) price(c *cycle, i int, t *terms) {
	if s.prefix != nil {
		s.prefix.term(c, i, t)
	}
	if s.queue != nil {
		s.queue.term(c, i, t)
	}
	if s.running != nil {
		s.running.term(c, i, t)
	}
	if s.kvUtil != nil {
		s.kvUtil.term(c, i, t)
	}
	if s.affinity != nil {
		s.affinity.term(c, i, t)
	}
}

// prefixScorer counts the pod's exact cached prefix (from the index) toward
// the prefill it saves: weight 1 counts every cached token. The ttft picker
// then weights the best few by the tier each block is held in.
type prefixScorer struct{ weight float64 }

func (s prefixScorer) term(c *cycle, _ int, t *terms) {
	t.cached = min(int(float64(c.cachedAt(t.slot))*s.weight), c.req.PromptTokens)
}

// queueScorer is the prefill work already routed to the pod and not yet
// done (the router's own accounting, fresher than any engine metric), in
// tokens at the pod's current rate.
type queueScorer struct{ weight float64 }

func (s queueScorer) term(c *cycle, i int, t *terms) {
	t.pending = int(float64(backlogTokens(c.order[i], t.busy, c.now, t.rate)) * s.weight)
}

// runningScorer costs each request in flight on the pod a little: each one
// slows the engine's batch steps.
type runningScorer struct{ perRequestMs float64 }

// runningMs is what the running scorer charges per request in flight (0:
// it is off).
func (p *pipeline) runningMs() float64 {
	for _, sc := range p.scorers {
		if rs, ok := sc.(runningScorer); ok {
			return rs.perRequestMs
		}
	}
	return 0
}

func (s runningScorer) term(_ *cycle, _ int, t *terms) {
	t.extra += s.perRequestMs * float64(t.running)
}

// kvUtilScorer costs a pod whose scraped KV cache is past 80% full, linearly
// up to fullMs at 100%: new prefixes there evict others.
type kvUtilScorer struct{ fullMs float64 }

func (s kvUtilScorer) term(_ *cycle, _ int, t *terms) {
	if t.kv > 0.8 {
		t.extra += s.fullMs * (t.kv - 0.8) / 0.2
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

func (s affinityScorer) term(c *cycle, i int, t *terms) {
	if !c.pin.ok || c.pin.inflight >= s.thick || c.order[i].Name != c.pin.pod {
		return
	}
	t.extra -= s.weight * (s.bonusMs + s.cacheWeight*float64(c.cachedAt(t.slot))*t.rate)
}
