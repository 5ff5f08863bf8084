package route

import (
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// A picker chooses one of the candidates (an index into c.pods) and fills
// the reason and, for ttft, the explanation of the decision.
type picker interface {
	pick(c *cycle, dec *Decision) int
}

func newPickers(cfg Config, scorers []scorer) map[string]picker {
	return map[string]picker{
		PolicyTTFT:        ttftPicker{scorers: scorers, tierWeights: cfg.TierWeights, topK: cfg.TopK},
		PolicyRoundRobin:  roundRobinPicker{},
		PolicyLeastLoaded: leastLoadedPicker{},
		PolicySessionHash: sessionHashPicker{},

		PolicyWeightedRoundRobin:     &weightedRoundRobinPicker{},
		PolicyWeightedLeastLoaded:    weightedLeastLoadedPicker{},
		PolicyLeastOutstandingTokens: leastOutstandingTokensPicker{},
		PolicyBoundedAffinity:        &boundedAffinityPicker{cfg: cfg.BoundedAffinity},
		PolicyPrecisePrefix:          precisePrefixPicker{cfg: cfg.PrecisePrefix},
	}
}

// roundRobinPicker takes the candidates in turn, ignoring cache and load.
type roundRobinPicker struct{}

func (roundRobinPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicyRoundRobin
	return int(c.d.rr.Add(1) % uint64(len(c.pods)))
}

// leastLoadedPicker takes the candidate with the fewest requests in flight;
// ties go to the first from a rotating offset.
type leastLoadedPicker struct{}

func (leastLoadedPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicyLeastLoaded
	n := len(c.pods)
	off := int(c.d.rr.Add(1) % uint64(n))
	best, bestLoad := -1, int64(0)
	for i := range c.pods {
		j := (i + off) % n
		if l := c.pods[j].inflight.Load(); best < 0 || l < bestLoad {
			best, bestLoad = j, l
		}
	}
	return best
}

// sessionHashPicker takes the candidate with the highest hash of (session,
// pod) — rendezvous hashing: the same session lands on the same pod while
// the pod set is stable, and only the sessions of a removed pod move.
// Without a session id, the request id.
type sessionHashPicker struct{}

func (sessionHashPicker) pick(c *cycle, dec *Decision) int {
	dec.Reason = PolicySessionHash
	key := c.req.SessionID
	if key == "" {
		key = c.req.RequestID
	}
	best, bestH := 0, uint64(0)
	for i, p := range c.pods {
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

// ttftPicker is Meridian's: every candidate priced by the scorers and the
// cost model (queue + prefill of the uncached tokens + overhead + the
// scorers' extra terms), the lowest expected time to first token wins. The
// best few are then priced again with the tier each matched block is held
// in (a block on CPU or disk saves less prefill than one in GPU memory).
// Candidates are offered to the model from a rotating offset, so exact
// ties (an idle, cold region) spread instead of always going to the first
// pod.
type ttftPicker struct {
	scorers     []scorer
	tierWeights [index.NumTiers]float64
	topK        int
}

func (t ttftPicker) pick(c *cycle, dec *Decision) int {
	d, n := c.d, len(c.pods)
	off := int(d.rr.Add(1) % uint64(n))
	c.order, c.cands, c.rates = c.order[:0], c.cands[:0], c.rates[:0]
	for i := 0; i < n; i++ {
		p := c.pods[(i+off)%n]
		info := p.Info()
		rate, _ := d.model.RateFor(info.Profile, p.Name)
		c.order = append(c.order, p)
		c.rates = append(c.rates, rate)
		c.cands = append(c.cands, gorgo.Candidate{Pod: p.Name, Profile: info.Profile,
			PromptTokens: c.req.PromptTokens, Running: int(p.inflight.Load())})
	}
	for _, s := range t.scorers {
		s.score(c)
	}
	d.model.Choose(c.cands, nil, c.now, &c.dec)
	best := c.dec.Winner

	order := t.lowest(c, min(max(t.topK, 2), n))
	if best >= 0 {
		for _, ci := range order {
			cand := &c.cands[ci]
			p := c.order[ci]
			matched := c.matched(p)
			if matched == 0 || cand.CachedTokens == 0 {
				continue
			}
			tc := d.idx.TierProfile(p.ID, c.req.Chain[:matched])
			if tc[index.TierGPU] == matched {
				continue
			}
			w := 0.0
			for tier, k := range tc {
				w += float64(k) * t.tierWeights[tier]
			}
			cand.CachedTokens = int(float64(cand.CachedTokens) * w / float64(matched))
			c.dec.Estimates[ci] = d.model.Estimate(cand)
		}
		for _, ci := range order {
			if c.dec.Estimates[ci].TotalMs < c.dec.Estimates[best].TotalMs {
				best = ci
			}
		}
	}
	dec.Reason = "lowest_ttft"
	if c.cands[best].CachedTokens == 0 {
		dec.Reason = "lowest_ttft_no_prefix"
	}
	dec.CachedTokens = c.cands[best].CachedTokens
	dec.EstimateMs = c.dec.Estimates[best].TotalMs
	dec.Candidate = c.cands[best]
	if k := min(t.topK, n); k < len(order) {
		order = t.lowest(c, k)
	}
	for _, ci := range order {
		p := c.order[ci]
		dec.Top = append(dec.Top, CandidateScore{
			Pod: p.Name, Endpoint: p.Info().Endpoint, MatchedBlocks: c.matched(p),
			CachedTokens: c.cands[ci].CachedTokens, Load: p.Load(), Estimate: c.dec.Estimates[ci],
		})
	}
	return (best + off) % n
}

// lowest returns the indexes of the k candidates with the lowest totals
// (ties: earlier first), by selection: k is small.
func (ttftPicker) lowest(c *cycle, k int) []int {
	out := make([]int, 0, k)
	for len(out) < k {
		best := -1
		for i := range c.cands {
			if slices.Contains(out, i) {
				continue
			}
			if best < 0 || c.dec.Estimates[i].TotalMs < c.dec.Estimates[best].TotalMs {
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
