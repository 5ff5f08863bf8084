package sim

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// podSpec is one simulated pod: its engine (its hardware profile's,
// slowed or sped up by the model error), its KV capacity in blocks (from
// scenarios/enginesim's profiles) and its max running requests.
type podSpec struct {
	name      string
	region    int
	profile   string
	perf      enginePerf
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
	// routerProfiles are what the router believes of the hardware: the
	// configured gorgo profiles, or else the engines' single-request fits
	// (enginePerf.routerProfile).
	routerProfiles []gorgo.Profile
}

func newFleetSpec(cfg *Config) *fleetSpec {
	f := &fleetSpec{regions: cfg.Fleet.Regions, rtt: cfg.Fleet.RTT, blockSize: cfg.Fleet.BlockSize}
	if f.rtt == nil {
		f.rtt = DefaultRTT(f.regions)
	}
	profiles := enginesim.Profiles()
	perfs := enginePerfs()
	f.routerProfiles = cfg.Gorgo.Profiles
	if len(f.routerProfiles) == 0 {
		for _, name := range sortedKeys(perfs) {
			f.routerProfiles = append(f.routerProfiles, perfs[name].routerProfile())
		}
	}
	errs := rand.New(rand.NewPCG(cfg.Seed, 0xe4404))
	for r, region := range f.regions {
		for i := range cfg.Fleet.PodsPerRegion {
			prof := profiles[cfg.Fleet.Profiles[i%len(cfg.Fleet.Profiles)]]
			perf := perfs[prof.Name]
			capTokens := prof.CacheBlocks * 16 // enginesim counts 16-token blocks
			if cfg.Fleet.CacheTokens > 0 {
				capTokens = cfg.Fleet.CacheTokens
			}
			maxConc := perf.MaxSeqs
			if cfg.Fleet.MaxConcurrency > 0 {
				maxConc = cfg.Fleet.MaxConcurrency
			}
			// The router believes the profile; the pod is off by up to
			// ModelError either way: believed = true x (1 + e).
			e := (2*errs.Float64() - 1) * cfg.ModelError
			f.pods = append(f.pods, podSpec{
				name:      fmt.Sprintf("%s-%s-%d", region, prof.Name, i),
				region:    r,
				profile:   prof.Name,
				perf:      perf.scaled(1 / (1 + e)),
				capBlocks: max(capTokens/f.blockSize, 1),
				maxConc:   maxConc,
			})
		}
	}
	return f
}

// pod is a pod at run time: vLLM's scheduler in miniature. At most maxConc
// requests run; the rest wait FIFO, as does a request whose blocks do not
// fit the cache (a pod running nothing takes any request). A running
// request's uncached prompt is prefilled in chunks that share the engine's
// steps with the running decodes (engine), then it decodes one token per
// step.
type pod struct {
	spec   *podSpec
	region *region
	rp     *route.Pod // the router's view: load accounting
	cache  *kvCache
	eng    engine

	running   int
	queue     []*job
	qhead     int
	lastEvent time.Duration // delivery instant of the last KV event batch (per-pod order)
	inflight  int           // queued or running
	epoch     int           // incremented when the pod fails or comes back
}

// job is one request in a world, from the serving region's decision to its
// completion.
type job struct {
	req      *request
	region   *region // the region that decided and serves
	pod      *pod
	dec      *route.Decision
	ticket   *route.Ticket
	ahead    int           // pending prefill tokens ahead of it when routed (router's estimate)
	atPod    time.Duration // when the serving controller dispatched it
	netBack  time.Duration // one-way network time back to the client
	h        holding
	cache    *kvCache // the cache it was admitted to (a pod that failed has a new one)
	admitted time.Duration
	first    time.Duration

	// Engine state.
	prefillPos, prefillLeft float64 // tokens computed (cached included) and still to compute
	scheduled               bool    // its prefill has had a chunk
	decodeStart, endStep    float64 // engine steps
	context                 float64 // prompt tokens in the KV cache when decoding started
}

// waiting is the engine's count of requests not yet scheduled
// (vllm:num_requests_waiting): queued for a slot or KV blocks, or admitted
// with their prefill not started.
func (p *pod) waiting() int { return len(p.queue) - p.qhead + p.eng.waiting() }

func (p *pod) submit(w *world, j *job) {
	p.inflight++
	p.queue = append(p.queue, j)
	p.step(w)
}

// step brings the engine to now, hands on what it finished, admits what
// now fits and schedules the engine's next wake-up.
func (p *pod) step(w *world) {
	p.eng.advance(w.now)
	for j := p.eng.popPrefilled(); j != nil; j = p.eng.popPrefilled() {
		p.firstByte(w, j)
	}
	for j := p.eng.popDecoded(); j != nil; j = p.eng.popDecoded() {
		p.finish(w, j)
	}
	p.admit(w)
	d := p.eng.plan()
	p.eng.gen++
	if d < 0 {
		return
	}
	gen := p.eng.gen
	w.at(w.now+d, func() {
		if p.eng.gen == gen {
			p.step(w)
		}
	})
}

// admit starts queued requests in FIFO order while a slot is free and the
// head fits in the cache (a pod running nothing takes any request).
func (p *pod) admit(w *world) {
	for p.qhead < len(p.queue) && p.running < p.spec.maxConc {
		j := p.queue[p.qhead]
		if !p.cache.admit(&j.h, p.running == 0) {
			return
		}
		j.cache = p.cache
		p.queue[p.qhead] = nil
		p.qhead++
		if p.qhead == len(p.queue) {
			p.queue, p.qhead = p.queue[:0], 0
		}
		p.running++
		cached := min(j.h.Hit*w.fleet.blockSize, j.req.input)
		w.stats.hit(j, cached)
		j.admitted = w.now
		p.eng.enqueue(j, cached, j.req.input-cached)
	}
}

func (p *pod) firstByte(w *world, j *job) {
	j.first = w.now
	j.cache.prefillDone(&j.h)
	w.firstByte(j)
	if j.req.output > 1 {
		p.eng.startDecode(j, j.req.output)
		return
	}
	p.finish(w, j)
}

func (p *pod) finish(w *world, j *job) {
	j.cache.release(&j.h)
	p.running--
	p.inflight--
	w.done(j)
}
