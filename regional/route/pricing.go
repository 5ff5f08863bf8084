package route

import (
	"math"
	"slices"
	"strings"

	"github.com/meridian-llm/meridian/gorgo"
)

// The ttft picker prices only what can win. Every candidate's total
// estimate is at least a lower bound worked out from a few numbers
// (lowerBound); a candidate whose bound exceeds the k-th lowest estimate
// found so far cannot be among the k lowest, so it is never estimated
// (lowest). Candidates are priced (their load read, the scorers run, the
// bound computed) a group at a time in order of matched depth, deepest
// first: a group's members are all at least a floor that depends only on
// the depth (floorOf), and floors only grow as the depth falls, so once the
// next group's floor exceeds the k-th lowest estimate no remaining
// candidate is read at all. The k-th lowest estimate falls as groups are
// priced (the first, from loaded pods of the deepest groups, may admit
// every group, until a group brings an idle pod), so lowest prices one
// group at a time and holds each to the limit of the moment. On a region
// whose pods hold prefixes of the prompt at several depths, that prices
// the deepest group or two; on a cold prompt (no pod holds any of it) it
// prices every candidate, as the least loaded may be anywhere. A group is
// first only listed: each member gets a cheaper bound, from the line of it
// the filters just read (list), and is priced only if that bound does
// not rule it out, so of many pods that tie on cache only the least
// loaded are read further. The index
// itself answers those groups only as they are read (index.Groups, see
// cycle.begin): the shallow groups a decision never prices cost it no probe. The tie-break then needs every candidate
// within tieMs of the best estimate, not only the best few: within
// estimates every candidate whose bound (or floor) is at most the best
// estimate + tieMs, so no candidate that could win the tie by its hash is
// pruned. The outcome is exactly that of estimating every candidate
// (TestDecideMatchesNaive, TestLowestMatchesSort, TestTieMatchesFull).

// layout lays the candidates out for the ttft picker, in the filters'
// order (by name: position i is c.pods[i]), and prices those that escape
// the grouping: the pod a session is pinned to (its affinity bonus is not
// in the floors) and pods whose depth a speculation raised (they are not
// where the index's answer puts them).
func (c *cycle) layout(s *scoring) {
	n := len(c.pods)
	c.scoring = s
	c.order = c.pods
	c.terms = grow(c.terms, n)
	c.bound = grow(c.bound, n)
	c.est = grow(c.est, n)
	c.priced = grow(c.priced, n)
	c.listed = grow(c.listed, n)
	c.evaluated = grow(c.evaluated, n)
	if c.gen++; c.gen == 0 {
		clear(c.priced[:cap(c.priced)])
		clear(c.listed[:cap(c.listed)])
		clear(c.evaluated[:cap(c.evaluated)])
		clear(c.candGen)
		c.gen = 1
	}
	c.prices, c.evals = c.prices[:0], c.evals[:0]
	c.next, c.rest = 0, false
	var shared bool
	if c.asKept {
		// The candidates are the checks' kept outcome, whose positions
		// were laid out when it was kept.
		c.pos, shared = c.elig.pos, c.elig.shared
	} else {
		c.pos = nil
		for i, p := range c.order {
			slot := p.ID.Slot()
			shared = shared || c.candGen[slot] == c.gen
			c.posOf[slot], c.candGen[slot] = int32(i), c.gen
		}
	}
	if shared {
		// Two candidates in one slot (a pod dead in the index, the alive
		// filter off, its slot reused): the groups cannot tell them apart.
		c.priceAll()
		return
	}
	for _, slot := range c.touched {
		if i, ok := c.position(slot); ok {
			c.priceAt(i)
		}
	}
	if a := s.affinity; a != nil && c.pin.ok && c.pin.inflight < a.thick {
		if j, ok := slices.BinarySearchFunc(c.pods, c.pin.pod, func(p *Pod, name string) int {
			return strings.Compare(p.Name, name)
		}); ok {
			c.priceAt(j)
		}
	}
	c.floor = c.floorAt()
}

// position is the position of the candidate in slot, if there is one
// (layout).
func (c *cycle) position(slot int) (int, bool) {
	if c.pos != nil {
		i := c.pos[slot]
		return int(i), i >= 0
	}
	return int(c.posOf[slot]), c.candGen[slot] == c.gen
}

// priceAt prices the candidate at position i, unless it is priced.
func (c *cycle) priceAt(i int) {
	if c.priced[i] == c.gen {
		return
	}
	p := c.order[i]
	c.resolve(p.ID.Slot())
	t := &c.terms[i]
	prof := p.profile()
	*t = terms{
		slot:    p.ID.Slot(),
		prof:    prof,
		rate:    c.profs[prof].rate * p.factorAt(c.d.model, c.factorGen),
		running: int(p.InFlight()),
		busy:    p.prefillBusy.Load(),
		kv:      math.Float64frombits(p.kvUtil.Load()),
	}
	c.scoring.price(c, i, t)
	c.bound[i] = c.lowerBound(t)
	c.priced[i] = c.gen
	if c.listed[i] != c.gen {
		c.listed[i] = c.gen
		c.prices = append(c.prices, i)
	}
}

// list gives the candidate at position i, unless it is listed or priced,
// a first bound from the fields of its first cache line, which the
// filters just read: its terms with the smallest rate it may be priced at
// (its profile's times the smallest factor of any pod), its backlog
// without the prefill model's part (backlogTokens is at least the pending
// tokens, ours and the peers'), and no kv_util term. Each is at most what
// priceAt will put in its place and the bound is monotone in each, so it
// never exceeds the bound priceAt gives; a candidate it rules out is never
// read further. Within a group that ties on cache (many pods hold the
// whole prompt) only the least loaded are priced.
func (c *cycle) list(i int) {
	if c.listed[i] == c.gen {
		return
	}
	p := c.order[i]
	prof := p.profile()
	t := terms{slot: p.ID.Slot(), prof: prof, rate: c.profs[prof].rate * c.minFactor}
	s := c.scoring
	if s.prefix != nil {
		s.prefix.term(c, i, &t)
	}
	if s.queue != nil {
		pending := int(max(p.pendingPrefill.Load(), 0)) + int(max(p.peerPending.Load(), 0))
		t.pending = int(float64(pending) * s.queue.weight)
	}
	if s.running != nil {
		t.running = int(p.InFlight())
		s.running.term(c, i, &t)
	}
	c.bound[i] = c.lowerBound(&t)
	c.listed[i] = c.gen
	c.prices = append(c.prices, i)
}

// refine prices candidate i if it is only listed, and reports whether its
// bound is still at most limit.
func (c *cycle) refine(i int, limit float64) bool {
	if c.priced[i] != c.gen {
		c.priceAt(i)
	}
	return !(c.bound[i] > limit)
}

// more lists the next group (see list): the candidates of the next
// matched depth (index answers are ranked by depth), or, after the last,
// prices every candidate left. limit is the caller's: when the floor was
// not exact (floorAt) and the exact one exceeds limit, more only makes it
// exact.
func (c *cycle) more(limit float64) {
	if !c.exact {
		// The floor was that of the deepest group there could be: read
		// the next group, or learn there is none, for the exact floor,
		// and list it only if that does not exceed limit.
		c.nextGroup()
		if c.floor = c.floorAt(); c.floor > limit {
			return
		}
	}
	if c.next < len(c.matches) || (c.lazy && c.nextGroup()) {
		depth := c.matches[c.next].Blocks
		for ; c.next < len(c.matches) && c.matches[c.next].Blocks == depth; c.next++ {
			if i, ok := c.position(c.matches[c.next].Pod.Slot()); ok && c.priced[i] != c.gen {
				c.list(i)
			}
		}
		c.floor = c.floorAt()
		return
	}
	c.priceAll()
}

// priceUntil prices the groups until the floor of the rest exceeds limit,
// a limit that does not fall meanwhile (within's; lowest's does, and it
// prices one group at a time). When even the highest floor, a group's at
// depth 0, does not exceed it,
// every group would be priced one after the other, each with its floor
// worked out (a region whose pods hold the prompt at many depths, with
// an idle pod possible at any of them): they are priced at once.
func (c *cycle) priceUntil(limit float64) {
	if c.rest || c.floor > limit {
		return
	}
	if !(c.floorOf(0) > limit) {
		c.priceAll()
		return
	}
	for !c.rest && !(c.floor > limit) {
		c.more(limit)
	}
}

// priceAll prices every candidate not priced yet.
func (c *cycle) priceAll() {
	for i := range c.order {
		c.priceAt(i)
	}
	c.rest, c.floor = true, math.Inf(1)
}

// floorAt is a lower bound of the total estimate of every candidate not
// priced yet: the bound of a pod at the next group's depth (0 after the
// last group) with no load, no extra cost, the cheapest profile and the
// smallest calibrated factor of any pod. The
// queue, running and kv_util terms are never negative, and the only
// negative one, the affinity bonus, goes to a pod priced up front.
//
// While the index has groups left to answer, the next is not read for
// its depth: the floor is that of a group one block shallower than the
// last (the deepest the next can be; floors only grow as the depth
// falls), and exact is false. A floor that rules that out spares the
// decision reading the group at all (of 64 pods that hold the whole
// prompt, an idle one usually beats any pod one block short); more reads
// it when the floor does not.
func (c *cycle) floorAt() float64 {
	c.exact = true
	depth := 0
	switch {
	case c.next < len(c.matches):
		depth = c.matches[c.next].Blocks
	case c.lazy && len(c.matches) > 0 && !c.drained && !c.groups.Done():
		c.exact = false
		depth = c.matches[len(c.matches)-1].Blocks - 1
	case c.lazy && c.nextGroup():
		depth = c.matches[c.next].Blocks
	}
	return c.floorOf(depth)
}

// floorOf is floorAt for a group at the given depth. It never grows with
// the depth (more cached tokens, less prefill): floorOf(0) is the highest
// floor of all.
func (c *cycle) floorOf(depth int) float64 {
	cached := 0
	if s := c.scoring.prefix; s != nil {
		cached = min(int(float64(min(depth*c.req.BlockSize, c.req.PromptTokens))*s.weight), c.req.PromptTokens)
	}
	floor := math.Inf(1)
	for prof := range c.profs {
		rate := c.profs[prof].rate * c.minFactor
		floor = min(floor, c.lowerBound(&terms{prof: prof, rate: rate, cached: cached}))
	}
	return floor
}

// estimate is the cost model's estimate of candidate i.
func (c *cycle) estimate(i int) gorgo.Estimate {
	cand := c.candidate(i)
	return c.d.model.EstimateAt(&cand, c.terms[i].rate)
}

// candidate is candidate i as the cost model sees it.
func (c *cycle) candidate(i int) gorgo.Candidate {
	t := &c.terms[i]
	return gorgo.Candidate{Pod: c.order[i].Name, Profile: c.profs[t.prof].name, PromptTokens: c.req.PromptTokens,
		CachedTokens: t.cached, PendingPrefillTokens: t.pending, Running: t.running, ExtraMs: t.extra}
}

// lowerBound is a lower bound of the total estimate of the candidate
// whose terms are t, from its terms, its rate and its profile alone:
// gorgo's estimate of a local candidate without the term for a pod past
// its concurrency limit, which only adds. Every operation is the
// estimate's own, in the same order, and floating-point addition and
// multiplication by a non-negative number are monotone, so the bound never
// exceeds the estimate (TestLowerBoundUnderEstimate), and with a lower
// rate (floorAt's) it is lower still. Where no pod is saturated it equals
// it.
func (c *cycle) lowerBound(t *terms) float64 {
	pt := &c.profs[t.prof]
	prompt := c.req.PromptTokens
	// gorgo floors the cached tokens times a staleness weight, 1 here.
	cached := min(max(t.cached, 0), prompt)
	uncached := max(prompt-cached, 0)
	queue := c.d.queueWeight * (float64(max(t.pending, 0)) * t.rate)
	return queue + prefillMs(pt.attn, t.rate, cached, uncached) + pt.overhead + 0 + 0 + t.extra
}

// prefillMs is gorgo's prefill time, operation for operation: rate x u x
// (1 + (c + u/2) / attn), linear when attn is 0.
func prefillMs(attn, rate float64, cached, uncached int) float64 {
	u := float64(max(uncached, 0))
	if attn <= 0 {
		return u * rate
	}
	return u * rate * (1 + (float64(max(cached, 0))+u/2)/attn)
}

// evaluate estimates candidate i with the cost model, at the rate its
// terms were priced at (the model's own for the pod: its profile's rate,
// read once per decision, times the pod's factor, kept per PodFactorGen),
// so that the model need not look the pod's factor up by name.
func (c *cycle) evaluate(i int) {
	c.est[i] = c.estimate(i)
	if c.evaluated[i] != c.gen {
		c.evaluated[i] = c.gen
		c.evals = append(c.evals, i)
	}
}

func (c *cycle) isEvaluated(i int) bool { return c.evaluated[i] == c.gen }

// lowest returns the positions of the k candidates with the lowest total
// estimates, lowest first (ties: the earlier position first), exactly as
// ranking every candidate would. Estimates already made stand (the picker
// may have re-priced some upwards); every other candidate is at least its
// bound, or the floor if it is not priced. With T the k-th lowest
// estimate made, a candidate whose bound exceeds T has k candidates
// strictly below it and cannot be among the k; so once every candidate
// whose bound (or floor) is at most T is estimated, the k lowest estimated
// are the k lowest of all.
func (c *cycle) lowest(k int) []int {
	k = min(k, len(c.order))
	sel := c.sel[:0]
	for _, i := range c.evals {
		sel = insertLowest(sel, k, i, c.estLess)
	}
	for len(sel) < k {
		// Too few estimates: estimate the priced candidate with the
		// lowest bound (any would do; this one is likely to stay), or
		// price the next group when every priced one is estimated.
		best := -1
		for _, i := range c.prices {
			if !c.isEvaluated(i) && (best < 0 || c.boundLess(i, best)) {
				best = i
			}
		}
		if best < 0 {
			c.more(math.Inf(1))
			continue
		}
		if c.priced[best] != c.gen {
			c.priceAt(best) // its bound rises: look again
			continue
		}
		c.evaluate(best)
		sel = insertLowest(sel, k, best, c.estLess)
	}
	// From here the limit only falls: each estimate that enters the k
	// lowest lowers it at once, so the candidates after it are held to
	// the tighter one (with bounds that equal the estimates, no pod
	// saturated, this estimates about k ln(n/k) candidates, not every one
	// under the first limit). A priced candidate checked once against it
	// is never checked again, and the next group is priced only while its
	// floor does not exceed it: a first limit set by loaded pods of the
	// deepest groups, high enough to admit every group, falls as soon as
	// a group brings an idle pod, and the shallower groups are never
	// read. The limit stays a k-th lowest estimate, so the argument
	// above holds whenever it is taken.
	limit := c.est[sel[k-1]].TotalMs
	for next := 0; ; {
		for ; next < len(c.prices); next++ {
			if i := c.prices[next]; !c.isEvaluated(i) && !(c.bound[i] > limit) && c.refine(i, limit) {
				c.evaluate(i)
				if c.estLess(i, sel[k-1]) {
					sel = insertLowest(sel, k, i, c.estLess)
					limit = c.est[sel[k-1]].TotalMs
				}
			}
		}
		if c.rest || c.floor > limit {
			c.sel = sel
			return sel
		}
		c.more(limit)
	}
}

// within estimates every candidate whose total estimate may be at most
// limit: the groups are priced until the floor of the rest exceeds it,
// then every priced candidate whose bound does not exceed it is estimated.
// A candidate left unestimated has an estimate above limit. Estimates
// already made stand, as in lowest.
func (c *cycle) within(limit float64) {
	c.priceUntil(limit)
	for _, i := range c.prices {
		if !c.isEvaluated(i) && !(c.bound[i] > limit) && c.refine(i, limit) {
			c.evaluate(i)
		}
	}
}

// boundLess orders candidates by bound, then position.
func (c *cycle) boundLess(a, b int) bool {
	ba, bb := c.bound[a], c.bound[b]
	return ba < bb || (!(bb < ba) && a < b)
}

// estLess orders candidates by total estimate, then position.
func (c *cycle) estLess(a, b int) bool {
	ea, eb := c.est[a].TotalMs, c.est[b].TotalMs
	return ea < eb || (!(eb < ea) && a < b)
}

// insertLowest keeps sel the (at most) k lowest items by less, sorted.
func insertLowest(sel []int, k, i int, less func(a, b int) bool) []int {
	if len(sel) == k {
		if !less(i, sel[k-1]) {
			return sel
		}
		sel = sel[:k-1]
	}
	j := len(sel)
	sel = append(sel, i)
	for j > 0 && less(i, sel[j-1]) {
		sel[j] = sel[j-1]
		j--
	}
	sel[j] = i
	return sel
}
