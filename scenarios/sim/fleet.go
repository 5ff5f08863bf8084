package sim

import (
	"fmt"
	"time"

	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// podSpec is one simulated pod: its hardware profile's timing (from
// scenarios/enginesim, the same numbers as gorgo.DefaultProfiles), its KV
// capacity in blocks and its max running requests.
type podSpec struct {
	name      string
	region    int
	profile   string
	timing    enginesim.Timing
	capBlocks int
	maxConc   int
}

// fleetSpec is the fleet every world builds: regions, RTTs and pods
// (region-major).
type fleetSpec struct {
	regions   []string
	rtt       [][]time.Duration
	pods      []podSpec
	blockSize int
}

func newFleetSpec(cfg *Config) *fleetSpec {
	f := &fleetSpec{regions: cfg.Fleet.Regions, rtt: cfg.Fleet.RTT, blockSize: cfg.Fleet.BlockSize}
	if f.rtt == nil {
		f.rtt = DefaultRTT(f.regions)
	}
	profiles := enginesim.Profiles()
	for r, region := range f.regions {
		for i := range cfg.Fleet.PodsPerRegion {
			prof := profiles[cfg.Fleet.Profiles[i%len(cfg.Fleet.Profiles)]]
			capTokens := prof.CacheBlocks * 16 // enginesim counts 16-token blocks
			if cfg.Fleet.CacheTokens > 0 {
				capTokens = cfg.Fleet.CacheTokens
			}
			maxConc := prof.MaxConcurrency
			if cfg.Fleet.MaxConcurrency > 0 {
				maxConc = cfg.Fleet.MaxConcurrency
			}
			f.pods = append(f.pods, podSpec{
				name:      fmt.Sprintf("%s-%s-%d", region, prof.Name, i),
				region:    r,
				profile:   prof.Name,
				timing:    prof.Timing,
				capBlocks: max(capTokens/f.blockSize, 1),
				maxConc:   maxConc,
			})
		}
	}
	return f
}

// pod is a pod at run time: vLLM's scheduler in miniature, as
// scenarios/enginesim models it. At most maxConc requests run; the rest wait
// FIFO, as does a request whose blocks do not fit the cache. Prefill is
// compute-bound and shared: a request's prefill starts when the prefill work
// admitted before it is done (enginesim's PrefillSlots = 1), then the fixed
// overhead, then the first token; then one token per decode interval.
type pod struct {
	spec   *podSpec
	region *region
	rp     *route.Pod // the router's view: load accounting
	cache  *kvCache

	running     int
	queue       []*job
	qhead       int
	prefillFree time.Duration
	lastEvent   time.Duration // delivery instant of the last KV event batch (per-pod order)
	inflight    int           // queued or running
}

// job is one request in a world, from the serving region's decision to its
// completion.
type job struct {
	req      *request
	region   *region // the region that decided and serves
	pod      *pod
	dec      *route.Decision
	ticket   *route.Ticket
	ahead    int           // pending prefill tokens ahead of it when routed
	atPod    time.Duration // when the serving controller dispatched it
	netBack  time.Duration // one-way network time back to the client
	h        holding
	admitted time.Duration
	first    time.Duration
}

func (p *pod) submit(w *world, j *job) {
	p.inflight++
	p.queue = append(p.queue, j)
	p.admit(w)
}

// admit starts queued requests in FIFO order while a slot is free and the
// head fits in the cache (a pod running nothing takes any request).
func (p *pod) admit(w *world) {
	for p.qhead < len(p.queue) && p.running < p.spec.maxConc {
		j := p.queue[p.qhead]
		if !p.cache.admit(&j.h, p.running == 0) {
			return
		}
		p.queue[p.qhead] = nil
		p.qhead++
		if p.qhead == len(p.queue) {
			p.queue, p.qhead = p.queue[:0], 0
		}
		p.running++
		p.start(w, j)
	}
}

func (p *pod) start(w *world, j *job) {
	t := p.spec.timing
	cached := min(j.h.Hit*w.fleet.blockSize, j.req.input)
	uncached := max(j.req.input-cached, 1) // an engine always computes the last token
	w.stats.hit(j, cached)
	compute := time.Duration(uncached) * t.PrefillPerToken
	start := max(p.prefillFree, w.now)
	p.prefillFree = start + compute
	j.admitted = w.now
	w.at(p.prefillFree+t.PrefillOverhead, func() { p.firstByte(w, j) })
}

func (p *pod) firstByte(w *world, j *job) {
	j.first = w.now
	p.cache.prefillDone(&j.h)
	w.firstByte(j)
	w.at(w.now+time.Duration(max(j.req.output-1, 0))*p.spec.timing.DecodeInterval, func() { p.done(w, j) })
}

func (p *pod) done(w *world, j *job) {
	p.cache.release(&j.h)
	p.running--
	p.inflight--
	w.done(j)
	p.admit(w)
}
