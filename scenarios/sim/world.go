package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/summary"
	"github.com/meridian-llm/meridian/residency"
)

// epoch is virtual time zero on the wall clock the decision code sees.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// region is one region's controller in a world: the real index, pod
// registry, cost model, calibrator and decision layer, fed by the world's
// events on a virtual clock.
type region struct {
	idx    int
	name   string
	index  *index.Index
	reg    *route.Registry
	model  *gorgo.Model
	calib  *gorgo.Calibrator
	dec    *route.Decider
	shares *gorgo.ShareTracker
	pods   []*pod
	view   *gossip.RegionsView // remote regions' summaries as received here
	fwd    route.Forwarded     // prefill sent to remote regions, not yet landed
	trend  route.Trend         // the region's own backlog over time
	gen    uint64
	failed bool // every pod down (Workload.FailRegion)
}

// world is one policy's simulation: its own fleet, controllers, clock and
// event queue. Single-threaded; worlds run side by side.
type world struct {
	cfg     *Config
	policy  string
	fleet   *fleetSpec
	res     *residency.Policy
	src     source
	now     time.Duration
	q       eventQueue
	work    int // scheduled events that are not periodic
	rng     *rand.Rand
	regions []*region
	pods    []*pod
	stats   *collector
	clock   atomic.Int64 // now, published for the progress bar
	pool    *kvCache     // upper_bound's one cache, shared by every pod
	reqs    int64
	// landing releases a forwarded request from its origin's Forwarded
	// when its prefill is over (first byte) or it is refused.
	landing map[int64]func()
	// pick, when set, routes every arrival instead of the policy (the
	// tail analysis's oracles and probes, roam_analysis_test.go).
	pick func(w *world, r *request, origin *region, allowed residency.Decision)
	// narrow, when set, amends r's decision input before reg decides on
	// it, at the origin and at a region it is forwarded to (the tail
	// analysis's pod reservations, roam_analysis_test.go).
	narrow func(reg *region, r *request, rr *route.Request)
}

// landed releases r from its origin's count of forwarded prefill work.
func (w *world) landed(r *request) {
	if f, ok := w.landing[r.id]; ok {
		delete(w.landing, r.id)
		f()
	}
}

func (w *world) wall() time.Time { return epoch.Add(w.now) }

// at schedules work at the given instant (never before now).
func (w *world) at(t time.Duration, fn func()) {
	w.work++
	w.q.push(max(t, w.now), func() {
		w.work--
		fn()
	})
}

// every runs fn each interval while there is other work scheduled.
func (w *world) every(interval time.Duration, fn func()) {
	var tick func()
	tick = func() {
		fn()
		if w.work > 0 {
			w.q.push(w.now+interval, tick)
		}
	}
	w.q.push(w.now+interval, tick)
}

func newWorld(cfg *Config, policy string, fleet *fleetSpec, res *residency.Policy, src source) (*world, error) {
	w := &world{cfg: cfg, policy: policy, fleet: fleet, res: res, src: src,
		rng: rand.New(rand.NewPCG(cfg.Seed, 0xe7e47)), stats: newCollector(policy)}
	now := func() time.Time { return w.wall() }
	var pool *kvCache
	if policy == PolicyUpperBound {
		capBlocks := 0
		for _, p := range fleet.pods {
			capBlocks += p.capBlocks
		}
		pool = newKVCache(capBlocks, nil)
		w.pool = pool
	}
	dcfg, profiles := decisionFor(cfg, policy, fleet)
	for ri, name := range fleet.regions {
		var specs []*podSpec
		capBlocks := 0
		for i := range fleet.pods {
			if fleet.pods[i].region == ri {
				specs = append(specs, &fleet.pods[i])
				capBlocks += fleet.pods[i].capBlocks
			}
		}
		idx, err := index.New(index.Config{PodCapacity: (len(specs) + 63) / 64 * 64, ExpectedBlocks: capBlocks})
		if err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		r := &region{idx: ri, name: name, index: idx, reg: route.NewRegistry(idx),
			shares: gorgo.NewShareTracker(cfg.Gorgo.ShareWindow)}
		if r.model, err = gorgo.New(cfg.Gorgo, profiles...); err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		r.calib = gorgo.NewCalibrator(r.model, gorgo.DefaultCalibratorConfig())
		if r.dec, err = route.NewDecider(dcfg, idx, r.reg, r.model, now); err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		for _, s := range specs {
			rp, _, err := r.reg.Upsert(route.PodInfo{Name: s.name, Profile: s.profile, Endpoint: "sim://" + s.name, Static: true})
			if err != nil {
				return nil, fmt.Errorf("pod %s: %w", s.name, err)
			}
			p := &pod{spec: s, region: r, rp: rp, eng: engine{perf: s.perf}}
			if pool != nil {
				p.cache = pool
			} else {
				p.cache = newKVCache(s.capBlocks, w.kvEvents(p))
			}
			r.pods = append(r.pods, p)
			w.pods = append(w.pods, p)
		}
		w.regions = append(w.regions, r)
	}
	if meridianLike(policy) {
		for _, r := range w.regions {
			r.view = &gossip.RegionsView{Local: r.name}
			for _, o := range w.regions {
				if o != r {
					r.view.Regions = append(r.view.Regions, gossip.RegionView{Region: o.name, Live: true,
						RTT: fleet.rtt[r.idx][o.idx], RTTSource: gossip.RTTStatic})
				}
			}
			slices.SortStableFunc(r.view.Regions, func(a, b gossip.RegionView) int { return int(a.RTT - b.RTT) })
		}
	}
	return w, nil
}

// kvEvents returns the pod cache's event sink: each change reaches the
// region's index after the configured delay, in order per pod, as the
// ingester would apply the engine's KV events.
func (w *world) kvEvents(p *pod) func(stored bool, hashes []uint64) {
	epoch := p.epoch // the cache's own: a pod that failed has a new cache
	return func(stored bool, hashes []uint64) {
		if p.epoch != epoch {
			return
		}
		d := w.cfg.EventDelayMin
		if span := w.cfg.EventDelayMax - w.cfg.EventDelayMin; span > 0 {
			d += time.Duration(w.rng.Int64N(int64(span) + 1))
		}
		at := max(w.now+d, p.lastEvent)
		p.lastEvent = at
		hs := slices.Clone(hashes)
		rp := p.rp
		// Index events are not work: they must not keep a finished run alive,
		// but they are applied in time order with everything else.
		w.q.push(at, func() {
			if p.epoch != epoch {
				return // the pod failed since: its slot is gone
			}
			var err error
			if stored {
				err = p.region.index.Register(rp.ID, index.TierGPU, hs)
			} else {
				err = p.region.index.Evict(rp.ID, index.TierGPU, hs)
			}
			if err != nil {
				w.stats.indexErrors++
			}
		})
	}
}

// run drives the world until no work is left.
func (w *world) run(stop *atomic.Bool) {
	w.src.start(w)
	scrape := w.cfg.ScrapeInterval
	if w.policy == PolicyPrecisePrefix {
		scrape = preciseScrapeInterval
	}
	w.every(scrape, w.scrape)
	w.every(w.cfg.SampleInterval, w.sample)
	w.scheduleFailure()
	if meridianLike(w.policy) {
		// The fleet starts with gossip converged: the first summaries are
		// already everywhere.
		w.publishSummaries(true)
		w.every(w.cfg.SummaryInterval, func() { w.publishSummaries(false) })
	}
	for n := 0; w.q.len() > 0; n++ {
		e := w.q.pop()
		w.now = e.at
		e.fn()
		if n&1023 == 0 {
			w.clock.Store(int64(w.now))
			if stop != nil && stop.Load() {
				return
			}
		}
	}
	w.clock.Store(int64(w.now))
}

// utilization is the achieved prefill utilisation of the world's pods
// over the run.
func (w *world) utilization() float64 {
	if w.now <= 0 || len(w.pods) == 0 {
		return 0
	}
	t := 0.0
	for _, p := range w.pods {
		t += p.eng.prefillTime
	}
	return t / (float64(len(w.pods)) * float64(w.now) / float64(time.Millisecond))
}

// scrape records each pod's KV utilisation and waiting queue, as
// regional's scraper (and llm-d's, for precise_prefix) does.
func (w *world) scrape() {
	for _, p := range w.pods {
		p.rp.SetKVUtil(p.cache.Usage())
		p.rp.SetEngineQueue(-1, int64(p.waiting()))
	}
}

// sample records the dispersion of per-pod concurrency.
func (w *world) sample() {
	sum, sq := 0.0, 0.0
	for _, p := range w.pods {
		x := float64(p.inflight)
		sum += x
		sq += x * x
	}
	n := float64(len(w.pods))
	mean := sum / n
	if mean > 0 {
		w.stats.dispersion(max(sq/n-mean*mean, 0) / mean)
	}
}

// publishSummaries builds each region's summary from its index and its
// own load accounting; the other regions receive it half an RTT later (at
// once with now).
func (w *world) publishSummaries(now bool) {
	for _, r := range w.regions {
		if r.failed {
			continue // its pods are down; the others see it not live
		}
		loads := map[string]*summary.ProfileLoad{}
		for _, p := range r.pods {
			l := loads[p.spec.profile]
			if l == nil {
				l = &summary.ProfileLoad{Profile: p.spec.profile}
				loads[p.spec.profile] = l
			}
			ld := p.rp.Load()
			l.Pods++
			// As the controller's summary (regional/multiregion.go): the
			// backlog in tokens at the profile's rate, attention included,
			// the same measure a local candidate's queue is priced with.
			rate, _ := r.dec.Model().Rate(p.spec.profile)
			l.PendingPrefillTokens += int64(route.BacklogTokens(p.rp, w.wall(), rate))
			l.Running += int(ld.InFlight)
			l.Slots += p.spec.maxConc
			l.FreeKVBlocks += int64(p.cache.Free())
		}
		in := summary.Input{Region: r.name, Generation: summary.NextGeneration(r.gen, w.wall()), BuiltAt: w.wall(),
			BlockSize: w.fleet.blockSize}
		r.gen = in.Generation
		for _, k := range sortedKeys(loads) {
			in.Load = append(in.Load, *loads[k])
		}
		s, err := summary.FromIndex(r.index, in, summary.DefaultBuildConfig())
		if err != nil {
			w.stats.summaryErrors++
			continue
		}
		for _, o := range w.regions {
			if o == r {
				continue
			}
			receive := func() {
				for i := range o.view.Regions {
					if v := &o.view.Regions[i]; v.Region == r.name {
						v.Summary, v.ReceivedAt = s, w.wall()
					}
				}
			}
			if now {
				receive()
			} else {
				w.q.push(w.now+w.fleet.rtt[r.idx][o.idx]/2, receive)
			}
		}
	}
}

// routeRequest is the decision input for r.
func (w *world) routeRequest(r *request) *route.Request {
	return &route.Request{Chain: r.chain, BlockSize: w.fleet.blockSize, PromptTokens: r.input,
		SessionID: r.session, RequestID: strconv.FormatInt(r.id, 10)}
}

// arrive routes a request arriving at its origin region's controller.
func (w *world) arrive(r *request) {
	w.reqs++
	w.stats.arrived++
	allowed := w.res.Evaluate(r.attrs)
	origin := w.regions[r.origin]
	switch {
	case w.pick != nil:
		w.pick(w, r, origin, allowed)
	case w.policy == PolicyGORGO:
		w.gorgo(r, origin, allowed)
	case meridianLike(w.policy):
		w.place(r, origin, allowed)
	case w.policy == PolicyCacheLocal || w.policy == PolicyUpperBound:
		// In-region only, but residency-safe: a request its origin may not
		// serve (or whose origin's pods are down) goes to the nearest region
		// that may.
		if allowed.Allows(origin.name) && !origin.failed {
			w.decideAt(r, origin, allowed, 0)
			return
		}
		dst := w.nearestAllowed(origin, allowed)
		if dst == nil {
			w.stats.rejected++
			return
		}
		w.forward(r, origin, dst, allowed)
	case origin.failed:
		// Today's routers behind a global load balancer: the nearest region
		// with pods, whatever residency says.
		dst := w.nearestLive(origin)
		if dst == nil {
			w.stats.rejected++
			return
		}
		oneWay := w.fleet.rtt[origin.idx][dst.idx] / 2
		w.at(w.now+oneWay, func() { w.decideAt(r, dst, allowed, oneWay) })
	default:
		// Today's routers and the fair baselines: the origin region,
		// whatever residency says.
		w.decideAt(r, origin, allowed, 0)
	}
}

// nearestLive is the nearest region whose pods are up.
func (w *world) nearestLive(from *region) *region {
	var best *region
	for _, o := range w.regions {
		if !o.failed && (best == nil || w.fleet.rtt[from.idx][o.idx] < w.fleet.rtt[from.idx][best.idx]) {
			best = o
		}
	}
	return best
}

func (w *world) nearestAllowed(from *region, allowed residency.Decision) *region {
	var best *region
	for _, o := range w.regions {
		if !o.failed && allowed.Allows(o.name) && (best == nil || w.fleet.rtt[from.idx][o.idx] < w.fleet.rtt[from.idx][best.idx]) {
			best = o
		}
	}
	return best
}

// place is Meridian's cross-region choice at the origin: the remote
// candidates come from the gossiped summaries of the regions residency
// allows, and the decision layer's Place compares them with the best local
// pod under gorgo's guardrails.
func (w *world) place(r *request, origin *region, allowed residency.Decision) {
	t0 := time.Now() // the decision's wall time, remote candidates included
	rr := w.routeRequest(r)
	if w.narrow != nil {
		w.narrow(origin, r, rr)
	}
	remotes := origin.view.Candidates(w.wall(), "", r.chain, r.input, func(name string) bool {
		return name != origin.name && allowed.Allows(name)
	}, origin.dec.Model(), nil)
	origin.fwd.Adjust(remotes, origin.unseen)
	if !origin.failed {
		origin.trend.Note(w.wall(), origin.dec.BacklogMs(w.wall()))
	}
	origin.trend.Adjust(remotes, w.wall(), origin.dec.Model())
	for i := range remotes {
		remotes[i].EgressBytes = int64(float64(r.input) * w.cfg.PromptBytesPerToken)
		if w.policy == AblationNoCache {
			remotes[i].CachedTokens = 0
		}
	}
	pl, err := origin.dec.Place(rr, origin.name, allowed.Allows(origin.name) && !origin.failed, remotes, origin.shares)
	w.stats.decided(time.Since(t0))
	if err != nil {
		w.stats.rejected++
		why := "no_candidate"
		for _, e := range pl.Cost.Estimates {
			if e.Excluded != "" {
				why = e.Excluded
			}
		}
		w.stats.reason("rejected_" + why)
		return
	}
	w.stats.reason(pl.Reason)
	pl.Record(origin.shares, w.wall())
	if !pl.Remote {
		w.dispatch(r, origin, pl.Local, 0)
		return
	}
	for _, o := range w.regions {
		if o.name == pl.Region {
			id := origin.fwd.Add(o.name, w.wall(), pl.Cost.Estimates[pl.Cost.Winner].Uncached)
			if w.landing == nil {
				w.landing = map[int64]func(){}
			}
			w.landing[r.id] = func() { origin.fwd.Landed(o.name, id) }
			w.forward(r, origin, o, allowed)
			return
		}
	}
	w.stats.rejected++
}

// unseen tells Forwarded.Adjust when region's summary arrived here, the
// RTT to it and its pod count.
func (r *region) unseen(name string) (route.Unseen, bool) {
	for i := range r.view.Regions {
		if v := &r.view.Regions[i]; v.Region == name && v.Summary != nil {
			return route.Unseen{ReceivedAt: v.ReceivedAt, RTT: v.RTT, Pods: v.Summary.Totals().Pods}, true
		}
	}
	return route.Unseen{}, false
}

// forward sends r from its origin to dst's controller: it arrives half an
// RTT later, and dst re-checks residency and picks its own pod.
func (w *world) forward(r *request, from, dst *region, allowed residency.Decision) {
	oneWay := w.fleet.rtt[from.idx][dst.idx] / 2
	w.at(w.now+oneWay, func() {
		if !allowed.Allows(dst.name) {
			w.stats.denied++ // the receiving region refuses it
			w.landed(r)
			return
		}
		w.decideAt(r, dst, allowed, oneWay)
	})
}

// decideAt runs the region's in-region decision and dispatches.
func (w *world) decideAt(r *request, reg *region, allowed residency.Decision, netBack time.Duration) {
	t0 := time.Now()
	rr := w.routeRequest(r)
	if w.narrow != nil {
		w.narrow(reg, r, rr)
	}
	dec, err := reg.dec.Decide(rr)
	w.stats.decided(time.Since(t0))
	if err != nil {
		w.stats.rejected++
		w.landed(r)
		return
	}
	w.dispatch(r, reg, dec, netBack)
}

// dispatch accounts the request on the chosen pod (the router's in-flight
// and prefill backlog accounting) and hands it to the pod.
func (w *world) dispatch(r *request, reg *region, dec *route.Decision, netBack time.Duration) {
	var p *pod
	for _, c := range reg.pods {
		if c.rp == dec.Pod {
			p = c
			break
		}
	}
	rate, _ := reg.model.RateFor(p.spec.profile, p.spec.name)
	ahead := 0
	if rate > 0 {
		ahead = int(float64(p.rp.PrefillBacklog(w.wall())) / float64(time.Millisecond) / rate)
	}
	w.dispatchAdmitted(r, reg, dec, reg.dec.Admit(dec), netBack, ahead)
}

// dispatchAdmitted hands a request whose ticket is taken to its pod.
func (w *world) dispatchAdmitted(r *request, reg *region, dec *route.Decision, t *route.Ticket, netBack time.Duration, ahead int) {
	var p *pod
	for _, c := range reg.pods {
		if c.rp == dec.Pod {
			p = c
			break
		}
	}
	j := &job{req: r, region: reg, pod: p, dec: dec, atPod: w.now, netBack: netBack, ahead: ahead, ticket: t}
	j.h.chain = r.chain
	j.h.blocks = (r.input + r.output + w.fleet.blockSize - 1) / w.fleet.blockSize
	if j.h.blocks < len(r.chain) {
		j.h.blocks = len(r.chain)
	}
	if !w.res.Evaluate(r.attrs).Allows(reg.name) {
		w.stats.violations++
	}
	if reg.idx != r.origin {
		w.stats.cross++
		w.stats.egressBytes += float64(r.input)*w.cfg.PromptBytesPerToken + float64(r.output)*w.cfg.OutputBytesPerToken
	}
	p.submit(w, j)
}

// firstByte is the serving controller seeing the answer's first byte.
func (w *world) firstByte(j *job) {
	now := w.wall()
	w.landed(j.req)
	j.ticket.FirstByte(now)
	j.region.dec.Speculation().Observe(j.pod.rp.ID, j.req.chain, now)
	if !w.cfg.NoCalibration {
		j.region.calib.Observe(gorgo.Observation{Profile: j.pod.spec.profile, Pod: j.pod.spec.name, UncachedTokens: j.dec.Uncached,
			CachedTokens: j.dec.CachedTokens, PendingPrefillTokens: j.ahead, TTFTMs: float64(w.now-j.atPod) / float64(time.Millisecond)})
	}
	w.stats.ttft(j, w.now+j.netBack-j.req.at)
}

// done is the serving controller seeing the answer complete.
func (w *world) done(j *job) {
	now := w.wall()
	j.ticket.Done(now)
	w.stats.e2e(j, w.now+j.netBack-j.req.at)
	if j.req.next != nil {
		at := w.now + j.netBack
		w.at(at, func() { j.req.next(w, at) })
	}
}
