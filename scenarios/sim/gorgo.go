package sim

import (
	"time"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/residency"
)

// GORGO's published policy (arXiv 2602.11688 v2, the "2D model" of its
// final implementation; /work/shared/reference/gorgo.md 1.3): one central
// proxy routes every request to the replica with the lowest
//
//	score = rtt_weight x RTT ms + uncached tokens + queue_weight x queued tokens
//
// with the weights its online tuning settled on, frozen for its held-out
// windows. Queued tokens are the raw prompt tokens of the requests the proxy
// has sent to the replica and not seen complete (the paper found counting
// only uncached ones hid load). Units are mixed on purpose; no hardware term.
const (
	gorgoRTTWeight   = 0.276
	gorgoQueueWeight = 0.5
)

// gorgo routes r as GORGO's proxy would, co-located with the request's
// origin region (RTT 0 there), over every pod of every region residency
// allows (GORGO itself has no residency; given it, it never violates).
// Its view of each pod's cache is exact and fresh (the region's index):
// GORGO's real-time radix trie of its own routing is at best that good.
// The chosen pod is charged at once (the proxy's count), and a remote pod
// receives the request half an RTT later.
func (w *world) gorgo(r *request, origin *region, allowed residency.Decision) {
	var best *pod
	bestScore, bestCached := 0.0, 0
	for _, reg := range w.regions {
		if !allowed.Allows(reg.name) {
			continue
		}
		matches := reg.index.Lookup(r.chain, nil)
		byID := make(map[index.PodID]int, len(matches))
		for _, m := range matches {
			byID[m.Pod] = m.Blocks
		}
		rtt := float64(w.fleet.rtt[origin.idx][reg.idx]) / float64(time.Millisecond)
		for _, p := range reg.pods {
			if !reg.index.Alive(p.rp.ID) {
				continue
			}
			cached := min(byID[p.rp.ID]*w.fleet.blockSize, r.input)
			score := gorgoRTTWeight*rtt + float64(r.input-cached) + gorgoQueueWeight*float64(p.rp.Load().OutstandingTokens)
			if best == nil || score < bestScore {
				best, bestScore, bestCached = p, score, cached
			}
		}
	}
	if best == nil {
		w.stats.rejected++
		return
	}
	reg := best.region
	dec := &route.Decision{Pod: best.rp, PodName: best.spec.name, Policy: PolicyGORGO, Reason: PolicyGORGO,
		CachedTokens: bestCached, Uncached: r.input - bestCached}
	if reg == origin {
		w.dispatch(r, reg, dec, 0)
		return
	}
	// The proxy counts the request on the pod now; the pod sees it half an
	// RTT later.
	oneWay := w.fleet.rtt[origin.idx][reg.idx] / 2
	rate, _ := reg.model.RateFor(best.spec.profile, best.spec.name)
	ahead := 0
	if rate > 0 {
		ahead = int(float64(best.rp.PrefillBacklog(w.wall())) / float64(time.Millisecond) / rate)
	}
	t := reg.dec.Admit(dec)
	w.at(w.now+oneWay, func() { w.dispatchAdmitted(r, reg, dec, t, oneWay, ahead) })
}
