package route

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// This file keeps the decision as it was first written — one function with
// its filters, scorers and picker inline, scoring every pod — as the naive
// reference the pipeline (Decider.Decide) is compared with by
// TestDecideMatchesNaive. It shares the Decider's index, registry, sessions,
// speculation, model and rotation counter, so that the two, called in
// lockstep on twin deciders, must agree decision for decision.

type naiveScratch struct {
	matches []index.Match
	touched []int
	bySlot  []int32
	speed   []float64
	pods    []*Pod
	pin     struct {
		pod      string
		inflight int
		ok       bool
	}
	cands []gorgo.Candidate
	dec   gorgo.Decision
}

func newNaiveScratch(capacity int) *naiveScratch {
	return &naiveScratch{bySlot: make([]int32, capacity), speed: make([]float64, capacity)}
}

// naiveInFlight: own + the other replicas' reports.
func naiveInFlight(p *Pod) int64 { return p.inflight.Load() + p.peerInflight.Load() }

func naiveSpeed(d *Decider, p *Pod) float64 {
	rate := d.model.Nominal(p.Info().Profile).PrefillMsPerToken
	if rate <= 0 {
		return 1
	}
	return 1 / rate
}

// Decide picks a pod of this region for the request. It changes no
// accounting: a decision that is served is passed to Admit, whose ticket
// counts the request (and its session) on the pod until Done.
func naiveDecide(d *Decider, req *Request) (*Decision, error) {
	pods := d.reg.Pods()
	if len(pods) == 0 {
		return nil, ErrNoPod
	}
	now := d.now()
	s := newNaiveScratch(d.idx.PodCapacity())

	// Data layer: the longest cached prefix of every pod.
	s.matches = d.idx.Lookup(req.Chain, s.matches)
	for _, m := range s.matches {
		s.bySlot[m.Pod.Slot()] = int32(m.Blocks)
	}
	s.touched = s.touched[:0]
	var confirmed []index.PodID
	d.spec.Match(req.Chain, now, func(id index.PodID, blocks int) {
		slot := id.Slot()
		switch {
		case !d.idx.Alive(id):
		case int32(blocks) > s.bySlot[slot]:
			s.bySlot[slot] = int32(blocks)
			s.touched = append(s.touched, slot)
		default:
			confirmed = append(confirmed, id) // the index caught up
		}
	})
	for _, id := range confirmed {
		d.spec.Confirmed(id, req.Chain[:s.bySlot[id.Slot()]])
	}
	defer func() {
		for _, m := range s.matches {
			s.bySlot[m.Pod.Slot()] = 0
		}
		for _, slot := range s.touched {
			s.bySlot[slot] = 0
		}
	}()

	s.pin.pod, s.pin.inflight, s.pin.ok = d.sessions.Pinned(req.SessionID, now)

	// Filters.
	s.pods = append(s.pods[:0], pods...)
	speeds := false // s.speed holds the candidates' speeds
	speed := func(p *Pod) float64 { return s.speed[p.ID.Slot()] }
	needSpeeds := func() {
		if !speeds {
			for _, p := range s.pods {
				s.speed[p.ID.Slot()] = naiveSpeed(d, p)
			}
			speeds = true
		}
	}
	var filtered map[string]int
	drop := func(name string, keep func(*Pod) bool) {
		n := 0
		for _, p := range s.pods {
			if keep(p) {
				s.pods[n] = p
				n++
			}
		}
		if n < len(s.pods) {
			if filtered == nil {
				filtered = map[string]int{}
			}
			filtered[name] += len(s.pods) - n
		}
		s.pods = s.pods[:n]
	}
	if len(req.Exclude) > 0 {
		drop("retried", func(p *Pod) bool { return !slices.Contains(req.Exclude, p) })
	}
	for _, f := range d.Config().Filters {
		switch f {
		case FilterAlive:
			drop(f, func(p *Pod) bool { return d.idx.Alive(p.ID) && p.Info().Endpoint != "" && !p.Lapsed() })
		case FilterModel:
			drop(f, func(p *Pod) bool { m := p.Info().Model; return req.Model == "" || m == "" || m == req.Model })
		case FilterHealthy:
			drop(f, func(p *Pod) bool { return !p.Ejected(now) })
		case FilterBoundedLoad:
			// Each pod's bound is its share of the fleet's prefill speed:
			// a pod twice as fast may carry twice the requests.
			needSpeeds()
			var total int64
			var sum float64
			for _, p := range s.pods {
				total += naiveInFlight(p)
				sum += speed(p)
			}
			if len(s.pods) > 0 && sum > 0 {
				drop(f, func(p *Pod) bool {
					limit := int64(d.Config().BoundedLoadFactor*float64(total+1)*speed(p)/sum + 0.999999)
					return naiveInFlight(p)+1 <= limit
				})
			}
		case FilterNewSession:
			if req.SessionID == "" || len(s.pods) == 0 {
				break
			}
			if s.pin.ok {
				break
			}
			needSpeeds()
			least := math.Inf(1)
			for _, p := range s.pods {
				least = min(least, float64(naiveInFlight(p))/speed(p))
			}
			drop(f, func(p *Pod) bool {
				return float64(naiveInFlight(p))/speed(p) <= least+1/speed(p)
			})
		}
	}
	if len(s.pods) == 0 {
		return nil, fmt.Errorf("%w (filtered: %v)", ErrNoHealthyPod, filtered)
	}

	policy := d.Config().Policy
	if req.Policy != "" {
		policy = req.Policy
	}
	dec := &Decision{Policy: policy, Candidates: len(s.pods), Filtered: filtered}
	var chosen int
	switch policy {
	case PolicyRoundRobin:
		chosen = int(d.rr.Add(1) % uint64(len(s.pods)))
		dec.Reason = "round_robin"
	case PolicyLeastLoaded:
		chosen = naiveLeastLoaded(d, s.pods)
		dec.Reason = "least_loaded"
	case PolicySessionHash:
		chosen = naiveRendezvous(s.pods, req)
		dec.Reason = "session_hash"
	case PolicyWeightedRoundRobin:
		chosen = naiveWeightedRoundRobin(d, s.pods)
		dec.Reason = policy
	case PolicyWeightedLeastLoaded:
		chosen = naiveLeastCost(d, s.pods, func(p *Pod) float64 { return float64(naiveInFlight(p)+1) * naiveRate(d, p) })
		dec.Reason = policy
	case PolicyLeastOutstandingTokens:
		chosen = naiveLeastCost(d, s.pods, func(p *Pod) float64 {
			return (float64(p.outstanding.Load()) + float64(req.PromptTokens)) * naiveRate(d, p)
		})
		dec.Reason = policy
	case PolicyBoundedAffinity:
		chosen = naiveBoundedAffinity(d, s.pods, req)
		dec.Reason = policy
	case PolicyPrecisePrefix:
		chosen = naivePrecisePrefix(d, s, s.pods)
		dec.Reason = policy
	case PolicyTTFT:
		chosen = naiveTTFT(d, s, req, now, dec)
	default:
		return nil, fmt.Errorf("unknown policy %q", policy)
	}
	p := s.pods[chosen]
	info := p.Info()
	dec.Pod, dec.PodName, dec.Endpoint = p, p.Name, info.Endpoint
	dec.MatchedBlocks = int(s.bySlot[p.ID.Slot()])
	if policy != PolicyTTFT {
		dec.CachedTokens = min(dec.MatchedBlocks*req.BlockSize, req.PromptTokens)
		rate, _ := d.model.RateFor(info.Profile, p.Name)
		dec.Candidate = gorgo.Candidate{Pod: p.Name, Profile: info.Profile, PromptTokens: req.PromptTokens,
			CachedTokens: dec.CachedTokens, PendingPrefillTokens: BacklogTokens(p, now, rate), Running: int(naiveInFlight(p))}
		dec.Top = []CandidateScore{{Pod: p.Name, Endpoint: info.Endpoint, MatchedBlocks: dec.MatchedBlocks, CachedTokens: dec.CachedTokens, Load: p.Load()}}
	}
	dec.Uncached = req.PromptTokens - dec.CachedTokens
	dec.session = req.SessionID
	return dec, nil
}

// ttft scores every candidate in milliseconds and picks the lowest expected
// time to first token; the candidates within TieMs of it are tied, and the
// one with the highest hash of (session id, or else the last chain hash,
// or else the request id; pod name) wins.
func naiveTTFT(d *Decider, s *naiveScratch, req *Request, now time.Time, dec *Decision) int {
	n := len(s.pods)
	off := 0
	pinned, sessInflight, hasPin := s.pin.pod, s.pin.inflight, s.pin.ok
	wPrefix, wQueue, wRun, wKV, wAff := d.Config().Weights["prefix"], d.Config().Weights["queue"], d.Config().Weights["running"], d.Config().Weights["kv_util"], d.Config().Weights["affinity"]
	s.cands = s.cands[:0]
	for i := 0; i < n; i++ {
		p := s.pods[(i+off)%n]
		info := p.Info()
		cached := min(int(s.bySlot[p.ID.Slot()])*req.BlockSize, req.PromptTokens)
		extra := wRun * d.Config().RunningPenaltyMs * float64(naiveInFlight(p))
		if u := math.Float64frombits(p.kvUtil.Load()); u > 0.8 {
			extra += wKV * d.Config().KVUtilPenaltyMs * (u - 0.8) / 0.2
		}
		rate, _ := d.model.RateFor(info.Profile, p.Name)
		if hasPin && p.Name == pinned && sessInflight < d.Config().ThickSession {
			extra -= wAff * (d.Config().AffinityBonusMs + d.Config().AffinityCacheWeight*float64(cached)*rate)
		}
		s.cands = append(s.cands, gorgo.Candidate{
			Pod:                  p.Name,
			Profile:              info.Profile,
			PromptTokens:         req.PromptTokens,
			CachedTokens:         min(int(float64(cached)*wPrefix), req.PromptTokens),
			PendingPrefillTokens: int(float64(BacklogTokens(p, now, rate)) * wQueue),
			Running:              int(naiveInFlight(p)),
			ExtraMs:              extra,
		})
	}
	d.model.Choose(s.cands, nil, now, &s.dec)
	best := s.dec.Winner

	// Tier detail for the best few: a block held only on CPU or disk saves
	// less prefill than one in GPU memory.
	order := naiveTopK(d, s, min(max(d.Config().TopK, 2), n))
	if best >= 0 {
		for _, ci := range order {
			c := &s.cands[ci]
			p := s.pods[(ci+off)%n]
			matched := int(s.bySlot[p.ID.Slot()])
			if matched == 0 || c.CachedTokens == 0 {
				continue
			}
			tc := d.idx.TierProfile(p.ID, req.Chain[:matched])
			if tc[index.TierGPU] == matched {
				continue
			}
			w := 0.0
			for t, k := range tc {
				w += float64(k) * d.Config().TierWeights[t]
			}
			c.CachedTokens = int(float64(c.CachedTokens) * w / float64(matched))
			s.dec.Estimates[ci] = d.model.Estimate(c)
		}
		for _, ci := range order {
			if s.dec.Estimates[ci].TotalMs < s.dec.Estimates[best].TotalMs {
				best = ci
			}
		}
		var key [8]byte
		switch {
		case req.SessionID != "":
			binary.LittleEndian.PutUint64(key[:], xxhash.Sum64String(req.SessionID))
		case len(req.Chain) > 0:
			binary.LittleEndian.PutUint64(key[:], req.Chain[len(req.Chain)-1])
		default:
			binary.LittleEndian.PutUint64(key[:], xxhash.Sum64String(req.RequestID))
		}
		weight := func(i int) uint64 {
			return xxhash.Sum64(append(key[:], s.pods[(i+off)%n].Name...))
		}
		tied := best
		for i := range s.cands {
			e := s.dec.Estimates[i]
			if e.Excluded == "" && e.TotalMs <= s.dec.Estimates[best].TotalMs+d.Config().TieMs && weight(i) > weight(tied) {
				tied = i
			}
		}
		best = tied
	}
	dec.Reason = "lowest_ttft"
	if s.cands[best].CachedTokens == 0 {
		dec.Reason = "lowest_ttft_no_prefix"
	}
	dec.CachedTokens = s.cands[best].CachedTokens
	dec.EstimateMs = s.dec.Estimates[best].TotalMs
	dec.Candidate = s.cands[best]
	if k := min(d.Config().TopK, n); k < len(order) {
		order = naiveTopK(d, s, k)
	}
	for _, ci := range order {
		p := s.pods[(ci+off)%n]
		dec.Top = append(dec.Top, CandidateScore{
			Pod: p.Name, Endpoint: p.Info().Endpoint, MatchedBlocks: int(s.bySlot[p.ID.Slot()]),
			CachedTokens: s.cands[ci].CachedTokens, Load: p.Load(), Estimate: s.dec.Estimates[ci],
		})
	}
	return (best + off) % n
}

// topK returns the indexes of the k candidates with the lowest totals
// (ties: earlier first), by selection: k is small.
func naiveTopK(d *Decider, s *naiveScratch, k int) []int {
	out := make([]int, 0, k)
	for len(out) < k {
		best := -1
		for i := range s.cands {
			if slices.Contains(out, i) {
				continue
			}
			if best < 0 || s.dec.Estimates[i].TotalMs < s.dec.Estimates[best].TotalMs {
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

func naiveLeastLoaded(d *Decider, pods []*Pod) int {
	off := int(d.rr.Add(1) % uint64(len(pods)))
	best, bestLoad := -1, int64(0)
	for i := range pods {
		j := (i + off) % len(pods)
		if l := naiveInFlight(pods[j]); best < 0 || l < bestLoad {
			best, bestLoad = j, l
		}
	}
	return best
}

// naiveRate is a pod's nominal prefill time per token (1 / its speed).
func naiveRate(d *Decider, p *Pod) float64 { return 1 / naiveSpeed(d, p) }

// naiveLeastCost scans from the rotating offset for the lowest cost.
func naiveLeastCost(d *Decider, pods []*Pod, cost func(*Pod) float64) int {
	off := int(d.rr.Add(1) % uint64(len(pods)))
	best := -1
	for i := range pods {
		j := (i + off) % len(pods)
		if best < 0 || cost(pods[j]) < cost(pods[best]) {
			best = j
		}
	}
	return best
}

// naiveWeightedRoundRobin: every pod's pass is its start (the pass of the
// pick before it was first seen) plus its turns times its prefill time per
// token; the lowest pass, first in name order, takes the turn. It keeps its
// state in the naive decider's own picker, updated the same way.
func naiveWeightedRoundRobin(d *Decider, pods []*Pod) int {
	w := d.pipe.Load().pickers[PolicyWeightedRoundRobin].(*weightedRoundRobinPicker)
	if w.pods == nil {
		w.pods = map[string]*wrrPod{}
	}
	if len(w.pods) > 2*len(d.reg.Pods())+64 {
		live := map[string]*wrrPod{}
		for _, p := range d.reg.Pods() {
			if s, ok := w.pods[p.Name]; ok {
				live[p.Name] = s
			}
		}
		w.pods = live
	}
	for _, p := range pods {
		if _, ok := w.pods[p.Name]; !ok {
			w.pods[p.Name] = &wrrPod{start: w.vtime}
		}
	}
	best := 0
	pass := func(p *Pod) float64 { s := w.pods[p.Name]; return s.start + float64(s.turns)*naiveRate(d, p) }
	for i, p := range pods {
		if pass(p) < pass(pods[best]) {
			best = i
		}
	}
	w.vtime = pass(pods[best])
	w.pods[pods[best].Name].turns++
	return best
}

// naiveRingPoints lists every point of the ring over the registry's pods,
// sorted by hash then pod name.
func naiveRingPoints(d *Decider) []ringPoint {
	pods := d.reg.Pods()
	slowest := math.Inf(1)
	for _, p := range pods {
		slowest = min(slowest, naiveSpeed(d, p))
	}
	var pts []ringPoint
	for _, p := range pods {
		n := int(math.Round(float64(d.Config().BoundedAffinity.VirtualNodes) * naiveSpeed(d, p) / slowest))
		if n < 1 {
			n = 1
		}
		for i := 0; i < n; i++ {
			pts = append(pts, ringPoint{hash: xxhash.Sum64String(fmt.Sprintf("%s#%d", p.Name, i)), pod: p})
		}
	}
	sort.Slice(pts, func(i, j int) bool {
		if pts[i].hash != pts[j].hash {
			return pts[i].hash < pts[j].hash
		}
		return pts[i].pod.Name < pts[j].pod.Name
	})
	return pts
}

// naiveBoundedAffinity scans the sorted ring from the first point at or
// after the key's hash for a candidate under its bound.
func naiveBoundedAffinity(d *Decider, pods []*Pod, req *Request) int {
	key := req.SessionID
	if key == "" {
		key = req.RequestID
	}
	h := xxhash.Sum64String(key)
	pts := naiveRingPoints(d)
	var total int64
	var sum float64
	for _, p := range pods {
		total += naiveInFlight(p)
		sum += naiveSpeed(d, p)
	}
	start := len(pts)
	for i, pt := range pts {
		if pt.hash >= h {
			start = i
			break
		}
	}
	first := -1
	for k := 0; k < len(pts); k++ {
		pt := pts[(start+k)%len(pts)]
		i := slices.Index(pods, pt.pod)
		if i < 0 {
			continue
		}
		if first < 0 {
			first = i
		}
		bound := math.Ceil(d.Config().BoundedAffinity.LoadFactor * float64(total+1) * naiveSpeed(d, pt.pod) / sum)
		if float64(naiveInFlight(pt.pod)+1) <= bound {
			return i
		}
	}
	return first
}

// naivePrecisePrefix computes llm-d's three scores for every candidate and
// takes the highest sum (ties: the first from the rotating offset).
func naivePrecisePrefix(d *Decider, s *naiveScratch, pods []*Pod) int {
	var matched []int32
	var queues []int64
	for _, p := range pods {
		if m := s.bySlot[p.ID.Slot()]; m > 0 {
			matched = append(matched, m)
		}
		queues = append(queues, max(p.engineWaiting.Load(), 0))
	}
	cfg := d.Config().PrecisePrefix
	cost := func(p *Pod) float64 {
		prefix := 0.0
		if m := s.bySlot[p.ID.Slot()]; m > 0 {
			lo, hi := slices.Min(matched), slices.Max(matched)
			if lo == hi {
				prefix = 1
			} else {
				prefix = float64(m-lo) / float64(hi-lo)
			}
		}
		queue := 1.0
		if lo, hi := slices.Min(queues), slices.Max(queues); hi != lo {
			queue = float64(hi-max(p.engineWaiting.Load(), 0)) / float64(hi-lo)
		}
		kv := 1 - p.Load().KVUtil
		return -(cfg.PrefixWeight*prefix + cfg.KVUtilWeight*kv + cfg.QueueWeight*queue)
	}
	return naiveLeastCost(d, pods, cost)
}

// rendezvous picks the pod with the highest hash of (session, pod): the same
// session lands on the same pod while the pod set is stable, and only the
// sessions of a removed pod move. Without a session id, the request id.
func naiveRendezvous(pods []*Pod, req *Request) int {
	key := req.SessionID
	if key == "" {
		key = req.RequestID
	}
	best, bestH := 0, uint64(0)
	for i, p := range pods {
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

// TestDecideMatchesNaive drives a region through random histories — pods
// joining, leaving, failing and filling their KV caches; prefixes stored,
// evicted and speculated; requests decided under every policy, with
// sessions, retries and admitted load; the clock moving — and checks at
// every decision that the pipeline and the naive reference agree exactly:
// the pod, the reason, the predicted cached tokens, what each filter
// dropped and the explanation of the top candidates.
func TestDecideMatchesNaive(t *testing.T) {
	profiles := []string{"h100", "h200", "b200"}
	rapid.Check(t, func(rt *rapid.T) {
		idx, err := index.New(index.Config{PodCapacity: 64})
		if err != nil {
			rt.Fatal(err)
		}
		reg := NewRegistry(idx)
		clock := time.Unix(1000, 0)
		now := func() time.Time { return clock }
		var infos []PodInfo
		for i := range 8 {
			infos = append(infos, PodInfo{Name: fmt.Sprintf("pod-%d", i), Profile: profiles[i%len(profiles)]})
		}
		// Profiles with attention, pods with their own calibrated speeds:
		// the pipeline prices only the pods that can win, with bounds that
		// must hold for both.
		model := drawModel(rt, gorgo.DefaultConfig(), infos)
		cfg := DefaultConfig()
		cfg.ThickSession = rapid.IntRange(1, 3).Draw(rt, "thick")
		cfg.BoundedLoadFactor = rapid.SampledFrom([]float64{1, 1.5, 2.5}).Draw(rt, "bound")
		cfg.TopK = rapid.IntRange(1, 4).Draw(rt, "topk")
		cfg.TieMs = rapid.SampledFrom([]float64{0, 0.5, 5, 50}).Draw(rt, "tie_ms")
		cfg.BoundedAffinity.LoadFactor = rapid.SampledFrom([]float64{1, 1.25, 2}).Draw(rt, "bounded_affinity_factor")
		cfg.BoundedAffinity.VirtualNodes = rapid.IntRange(1, 8).Draw(rt, "virtual_nodes")
		for _, name := range knownScorers {
			cfg.Weights[name] = rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(rt, "w_"+name)
		}
		if rapid.Bool().Draw(rt, "new_session") {
			cfg.Filters = append(cfg.Filters, FilterNewSession)
		}
		if rapid.Bool().Draw(rt, "shuffle_filters") {
			cfg.Filters = rapid.Permutation(cfg.Filters).Draw(rt, "filters")
		}
		pipeline, err := NewDecider(cfg, idx, reg, model, now)
		if err != nil {
			rt.Fatal(err)
		}
		naive, err := NewDecider(cfg, idx, reg, model, now)
		if err != nil {
			rt.Fatal(err)
		}
		naive.sessions, naive.spec = pipeline.sessions, pipeline.spec // one state, two deciders

		chains := make([][]uint64, 4)
		for i := range chains {
			chains[i] = chain(uint64(i+1), 24)
		}
		var tickets []*Ticket
		var peerSeq uint64
		podName := func(rt *rapid.T) string { return fmt.Sprintf("pod-%d", rapid.IntRange(0, 7).Draw(rt, "pod")) }
		for step := rapid.IntRange(1, 60).Draw(rt, "steps"); step > 0; step-- {
			switch rapid.IntRange(0, 10).Draw(rt, "action") {
			case 0: // a pod joins (or is re-announced)
				name := podName(rt)
				_, _, _ = reg.Upsert(PodInfo{Name: name, Endpoint: rapid.SampledFrom([]string{"http://" + name, "http://" + name, ""}).Draw(rt, "endpoint"),
					Model:   rapid.SampledFrom([]string{"m", "m", "other", ""}).Draw(rt, "model"),
					Profile: rapid.SampledFrom(profiles).Draw(rt, "profile")})
			case 1: // a pod leaves, or leaves the index first, or lapses or comes back
				switch rapid.IntRange(0, 2).Draw(rt, "leave_what") {
				case 0:
					reg.Remove(podName(rt))
				case 1:
					if p, ok := reg.Get(podName(rt)); ok {
						_ = idx.RemovePod(p.ID)
					}
				case 2:
					if p, ok := reg.Get(podName(rt)); ok {
						p.SetLapsed(rapid.Bool().Draw(rt, "lapsed"))
					}
				}
			case 2, 3: // a pod stores a prefix
				if p, ok := reg.Get(podName(rt)); ok {
					c := rapid.SampledFrom(chains).Draw(rt, "chain")
					_ = idx.Register(p.ID, index.Tier(rapid.IntRange(0, int(index.NumTiers)-1).Draw(rt, "tier")), c[:rapid.IntRange(1, len(c)).Draw(rt, "depth")])
				}
			case 4: // a pod evicts
				if p, ok := reg.Get(podName(rt)); ok {
					c := rapid.SampledFrom(chains).Draw(rt, "chain")
					from := rapid.IntRange(0, len(c)-1).Draw(rt, "from")
					_ = idx.Evict(p.ID, index.TierGPU, c[from:])
				}
			case 5: // a pod answers (speculation), fails, or reports its KV cache
				if p, ok := reg.Get(podName(rt)); ok {
					switch rapid.IntRange(0, 3).Draw(rt, "what") {
					case 3:
						p.SetEngineQueue(-1, int64(rapid.IntRange(-1, 5).Draw(rt, "waiting")))
					case 0:
						pipeline.spec.Observe(p.ID, rapid.SampledFrom(chains).Draw(rt, "chain"), clock)
					case 1:
						reg.Report(p, false, clock, DefaultOutlierConfig())
					case 2:
						p.SetKVUtil(rapid.Float64Range(0, 1).Draw(rt, "kv"))
					}
				}
			case 8: // another replica reports its load, or leaves; an engine reports its queue
				switch rapid.IntRange(0, 2).Draw(rt, "peer_what") {
				case 0:
					var loads []PeerLoad
					for i := 0; i < 8; i++ {
						if rapid.Bool().Draw(rt, "peer_has") {
							loads = append(loads, PeerLoad{Pod: fmt.Sprintf("pod-%d", i), InFlight: int64(rapid.IntRange(0, 6).Draw(rt, "peer_n")),
								PendingPrefill: int64(rapid.IntRange(0, 4000).Draw(rt, "peer_pending"))})
						}
					}
					peerSeq++
					reg.SetPeerLoads(rapid.SampledFrom([]string{"r1", "r2"}).Draw(rt, "peer"), uint64(rapid.IntRange(1, 2).Draw(rt, "epoch")), peerSeq, loads, -1, clock)
				case 1:
					reg.ForgetPeer(rapid.SampledFrom([]string{"r1", "r2"}).Draw(rt, "peer"))
				case 2:
					if p, ok := reg.Get(podName(rt)); ok {
						p.SetEngineQueue(int64(rapid.IntRange(-1, 6).Draw(rt, "engine_running")), int64(rapid.IntRange(-1, 4).Draw(rt, "engine_waiting")))
					}
				}
			case 6: // time passes; some requests finish
				clock = clock.Add(time.Duration(rapid.IntRange(0, 40_000).Draw(rt, "ms")) * time.Millisecond)
				for len(tickets) > 0 && rapid.Bool().Draw(rt, "finish") {
					tickets[0].Done(clock)
					tickets = tickets[1:]
				}
			default: // a request
				c := rapid.SampledFrom(chains).Draw(rt, "chain")
				r := &Request{Model: rapid.SampledFrom([]string{"m", "", "other"}).Draw(rt, "req_model"),
					Chain: c[:rapid.IntRange(0, len(c)).Draw(rt, "len")], BlockSize: 64,
					SessionID: rapid.SampledFrom([]string{"", "s1", "s2", "s3"}).Draw(rt, "session"),
					RequestID: fmt.Sprint(step),
					Policy:    rapid.SampledFrom(append([]string{""}, Policies...)).Draw(rt, "policy")}
				r.PromptTokens = len(r.Chain)*64 + rapid.IntRange(0, 63).Draw(rt, "tail")
				if p, ok := reg.Get(podName(rt)); ok && rapid.Bool().Draw(rt, "retry") {
					r.Exclude = []*Pod{p}
				}
				got, gerr := pipeline.Decide(r)
				want, werr := naiveDecide(naive, r)
				if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
					rt.Fatalf("errors differ: pipeline %v, naive %v", gerr, werr)
				}
				if gerr != nil {
					continue
				}
				if !reflect.DeepEqual(got, want) {
					rt.Fatalf("decisions differ:\npipeline %+v\nnaive    %+v", got, want)
				}
				if rapid.Bool().Draw(rt, "admit") {
					tickets = append(tickets, pipeline.Admit(got))
				}
			}
		}
	})
}
