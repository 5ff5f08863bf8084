package route

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-llm/meridian/index"
)

// A picker chooses one of the candidates (an index into c.pods) and fills
// the reason and, for ttft, the explanation of the decision.
type picker interface {
	pick(c *cycle, dec *Decision) int
}

func newPickers(cfg Config, scorers []scorer) map[string]picker {
	return map[string]picker{
		PolicyTTFT:        &ttftPicker{scoring: newScoring(scorers), tierWeights: cfg.TierWeights, topK: cfg.TopK, tieMs: cfg.TieMs},
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
		if l := c.pods[j].InFlight(); best < 0 || l < bestLoad {
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
//
// Ties are broken deterministically, so that every replica of the region
// decides a request alike: among the candidates within tieMs of the best,
// the one with the highest rendezvous hash of (the request's tie key, pod)
// wins (see tieKey: the session id first, so a session's turns prefer one
// pod). Exact ties (an idle, cold region) still spread, by the key.
//
// Only what can win is priced (see pricing.go): candidates are read and
// scored a depth group at a time, deepest first, and estimated by the cost
// model only while a lower bound does not rule them out of the best few or
// of the tie (within tieMs of the best). The outcome is exactly that of
// estimating every candidate (TestDecideMatchesNaive).
type ttftPicker struct {
	scoring     scoring
	tierWeights [index.NumTiers]float64
	topK        int
	tieMs       float64
}

// tieKey is what a request's ties are broken by: its session id, else the
// chain hash of its whole prompt (the same prompt, the same pod), else its
// request id.
func tieKey(req *Request) uint64 {
	switch {
	case req.SessionID != "":
		return SessionKey(req.SessionID)
	case len(req.Chain) > 0:
		return req.Chain[len(req.Chain)-1]
	}
	return xxhash.Sum64String(req.RequestID)
}

// rendezvous is the rendezvous (highest random weight) hash of key and a
// pod name.
func rendezvous(key uint64, pod string) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], key)
	var h xxhash.Digest
	h.Reset()
	_, _ = h.Write(b[:])
	_, _ = h.WriteString(pod)
	return h.Sum64()
}

func (t *ttftPicker) pick(c *cycle, dec *Decision) int {
	d, n := c.d, len(c.pods)
	c.layout(&t.scoring)
	// The lowest estimate first, the earliest among equals: the cost
	// model's own choice among local candidates.
	order := append(c.top[:0], c.lowest(min(max(t.topK, 2), n))...)
	best := order[0]
	for _, ci := range order {
		p := c.order[ci]
		matched := c.matched(p)
		tm := &c.terms[ci]
		if matched == 0 || tm.cached == 0 {
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
		tm.cached = int(float64(tm.cached) * w / float64(matched))
		c.est[ci] = c.estimate(ci)
	}
	for _, ci := range order {
		if c.est[ci].TotalMs < c.est[best].TotalMs {
			best = ci
		}
	}
	best = c.breakTie(best, t.tieMs)
	dec.Reason = "lowest_ttft"
	if c.terms[best].cached == 0 {
		dec.Reason = "lowest_ttft_no_prefix"
	}
	dec.CachedTokens = c.terms[best].cached
	dec.EstimateMs = c.est[best].TotalMs
	dec.Candidate = c.candidate(best)
	if k := min(t.topK, n); k < len(order) {
		order = append(order[:0], c.lowest(k)...)
	}
	c.top = order
	for _, ci := range order {
		p := c.order[ci]
		dec.Top = append(dec.Top, CandidateScore{
			Pod: p.Name, Endpoint: p.info.Load().Endpoint, MatchedBlocks: c.matched(p),
			CachedTokens: c.terms[ci].cached, Load: p.Load(), Estimate: c.est[ci],
		})
	}
	return best
}

// breakTie returns the winner of the tie around best, the lowest estimate:
// of every candidate whose estimate is within tieMs of best's (best's own
// included), the one with the highest rendezvous hash of the request's tie
// key and its pod. A candidate the pricing has not estimated may be in the
// tie (a bound is not an estimate, and tieMs widens the tie past the best
// few), so every candidate whose bound or floor does not rule it out is
// estimated first (within).
func (c *cycle) breakTie(best int, tieMs float64) int {
	limit := c.est[best].TotalMs + tieMs
	c.within(limit)
	key := tieKey(c.req)
	var bestH uint64
	hashed := false
	for _, i := range c.evals {
		if e := &c.est[i]; i == best || e.Excluded != "" || !(e.TotalMs <= limit) {
			continue
		}
		if !hashed {
			bestH, hashed = rendezvous(key, c.order[best].Name), true
		}
		if h := rendezvous(key, c.order[i].Name); h > bestH {
			best, bestH = i, h
		}
	}
	return best
}
