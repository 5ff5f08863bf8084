package sim

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/meridian-llm/meridian/residency"
)

// request is one request as the workload makes it. Open-loop requests are
// shared by every world and must not be modified; a world keeps its own
// state of a request in a job.
type request struct {
	id      int64
	at      time.Duration // arrival at the origin region's controller
	session string
	input   int // prompt tokens
	output  int // output tokens
	chain   []uint64
	origin  int // region index
	home    int // the conversation's region (origin before roaming)
	attrs   residency.Attributes
	// next is called by closed-loop workloads when the answer is complete at
	// the client (at the given instant); nil for open-loop requests.
	next func(w *world, at time.Duration)
}

// source feeds a world its requests.
type source interface {
	// start schedules the first arrivals in w.
	start(w *world)
	// horizon is when the last request arrives (or, closed loop, when no
	// new work starts any more): the progress bar's 100%.
	horizon() time.Duration
}

// mix64 is splitmix64's finalizer: a bijection of uint64 that spreads bits.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// nonZero maps 0 (never an index key) to 1.
func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// unit maps a hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// attributes assigns the origin region and residency attributes of a
// conversation deterministically from its key: origin by OriginShares, the
// tenant eu-health with EUHealthShare, the data class by ClassShares.
type attributes struct {
	regions []string
	origin  []float64 // cumulative
	classes []string
	cum     []float64 // cumulative class shares
	euShare float64
	roam    float64
	seed    uint64
}

func newAttributes(cfg *Config) *attributes {
	a := &attributes{regions: cfg.Fleet.Regions, euShare: cfg.Workload.EUHealthShare, roam: cfg.Workload.RoamShare, seed: cfg.Seed}
	shares := cfg.Workload.OriginShares
	if shares == nil {
		shares = make([]float64, len(a.regions))
		for i := range shares {
			shares[i] = 1
		}
	}
	a.origin = cumulative(shares)
	a.classes = sortedKeys(cfg.Workload.ClassShares)
	var cs []float64
	for _, k := range a.classes {
		cs = append(cs, cfg.Workload.ClassShares[k])
	}
	a.cum = cumulative(cs)
	return a
}

func cumulative(s []float64) []float64 {
	out := make([]float64, len(s))
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	acc := 0.0
	for i, v := range s {
		acc += v / sum
		out[i] = acc
	}
	if len(out) > 0 {
		out[len(out)-1] = 1
	}
	return out
}

func pick(cum []float64, u float64) int {
	for i, c := range cum {
		if u < c {
			return i
		}
	}
	return len(cum) - 1
}

// assign fills r's origin and attributes for the conversation key.
func (a *attributes) assign(r *request, key uint64) {
	h := mix64(key ^ mix64(a.seed))
	r.origin = pick(a.origin, unit(h))
	r.home = r.origin
	tenant := "acme"
	if unit(mix64(h^1)) < a.euShare {
		tenant = "eu-health"
	}
	class := ""
	if len(a.classes) > 0 {
		class = a.classes[pick(a.cum, unit(mix64(h^2)))]
	}
	r.attrs = residency.Attributes{Tenant: tenant, DataClass: class, OriginRegion: a.regions[r.origin], Session: r.session}
}

// roamed moves r, with probability RoamShare (drawn from the request's own
// key), to another region than its conversation's: a roaming user's turn,
// entering where the user now is, while the conversation's cache stays home.
func (a *attributes) roamed(r *request, key uint64) {
	if a.roam <= 0 || len(a.regions) < 2 {
		return
	}
	h := mix64(key ^ mix64(a.seed^0x70a3))
	if unit(h) >= a.roam {
		return
	}
	other := int(mix64(h) % uint64(len(a.regions)-1))
	if other >= r.origin {
		other++
	}
	r.home = r.origin
	r.origin = other
	r.attrs.OriginRegion = a.regions[other]
}

// openSource replays a fixed list of requests, sorted by arrival.
type openSource struct{ reqs []*request }

func (s *openSource) horizon() time.Duration {
	if len(s.reqs) == 0 {
		return 0
	}
	return s.reqs[len(s.reqs)-1].at
}

func (s *openSource) start(w *world) {
	if len(s.reqs) > 0 {
		s.schedule(w, 0)
	}
}

func (s *openSource) schedule(w *world, i int) {
	r := s.reqs[i]
	w.at(r.at, func() {
		if i+1 < len(s.reqs) {
			s.schedule(w, i+1)
		}
		w.arrive(r)
	})
}

// traceWindow returns the records a run replays: the first Limit, or a
// window of Window x the trace's span starting at an offset drawn from the
// seed (the whole trace when Window is 0 or 1), its timestamps shifted to
// start at 0.
func traceWindow(cfg *Config) []TraceRecord {
	recs := cfg.Workload.Trace
	if l := cfg.Workload.Limit; l > 0 && l < len(recs) {
		recs = recs[:l]
	}
	win := cfg.Workload.Window
	if win <= 0 || win >= 1 || len(recs) < 2 {
		return recs
	}
	first, last := recs[0].Timestamp, recs[len(recs)-1].Timestamp
	length := int64(win * float64(last-first))
	u := unit(mix64(cfg.Seed ^ 0x717d0))
	from := first + int64(u*float64(last-first-length))
	i, _ := slices.BinarySearchFunc(recs, from, func(r TraceRecord, t int64) int { return cmp.Compare(r.Timestamp, t) })
	j, _ := slices.BinarySearchFunc(recs, from+length, func(r TraceRecord, t int64) int { return cmp.Compare(r.Timestamp, t) })
	out := slices.Clone(recs[i:j])
	for k := range out {
		out[k].Timestamp -= from
	}
	return out
}

// traceRequests turns trace records into requests: arrival at the
// timestamp, chain hashes from the hash ids, the conversation keyed by its
// first two hash ids.
func traceRequests(cfg *Config, recs []TraceRecord) []*request {
	attrs := newAttributes(cfg)
	salt := mix64(0x7ace)
	out := make([]*request, len(recs))
	for i, rec := range recs {
		key := rec.HashIDs[0]
		if len(rec.HashIDs) > 1 {
			key = mix64(key) ^ rec.HashIDs[1]
		}
		r := &request{
			id:      int64(i),
			at:      time.Duration(rec.Timestamp) * time.Millisecond,
			session: fmt.Sprintf("c%016x", mix64(key)),
			input:   rec.InputLength,
			output:  max(rec.OutputLength, 1),
			chain:   make([]uint64, len(rec.HashIDs)),
		}
		for j, id := range rec.HashIDs {
			r.chain[j] = nonZero(mix64(id ^ salt))
		}
		attrs.assign(r, key)
		attrs.roamed(r, uint64(i)<<1|1)
		out[i] = r
	}
	return out
}

// segment is a run of tokens with one content id; a synthetic prompt is a
// sequence of segments.
type segment struct {
	id uint64
	n  int
}

// chainOf appends the block hashes of the token sequence segs, one per
// started block of blockSize tokens: a block's hash chains its parent's with
// the (segment, offset range) pieces it covers, so two sequences share the
// hashes of exactly their common full leading blocks.
func chainOf(segs []segment, blockSize int, dst []uint64) []uint64 {
	h := uint64(0x5eed)
	filled := 0
	for _, s := range segs {
		off := 0
		for off < s.n {
			take := min(s.n-off, blockSize-filled)
			h = mix64(h ^ mix64(s.id^mix64(uint64(off)<<20|uint64(off+take))))
			off += take
			filled += take
			if filled == blockSize {
				dst = append(dst, nonZero(h))
				filled = 0
			}
		}
	}
	if filled > 0 {
		dst = append(dst, nonZero(mix64(h^0xfa57)))
	}
	return dst
}

func total(segs []segment) int {
	n := 0
	for _, s := range segs {
		n += s.n
	}
	return n
}

// poisson returns arrival instants of a Poisson process of the given rate
// (per second) over d.
func poisson(rng *rand.Rand, rate float64, d time.Duration) []time.Duration {
	var out []time.Duration
	t := 0.0
	for {
		t += rng.ExpFloat64() / rate
		at := time.Duration(t * float64(time.Second))
		if at >= d {
			return out
		}
		out = append(out, at)
	}
}

// ragRequests: 400 documents (a shared 1,000-token system prompt, then
// 2,000 to 12,000 tokens of document) picked by a Zipf(1.1) popularity; each
// request is a document plus a question of 30 to 300 tokens, answered in 50
// to 400 tokens; 1,000 users; Poisson arrivals at rate per second.
func ragRequests(cfg *Config, rate float64) []*request {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x4a6))
	const docs, users = 400, 1000
	docLen := make([]int, docs)
	for i := range docLen {
		docLen[i] = 2000 + rng.IntN(10001)
	}
	zipf := rand.NewZipf(rng, 1.1, 1, docs-1)
	attrs := newAttributes(cfg)
	var out []*request
	for i, at := range poisson(rng, rate, cfg.Workload.Duration) {
		d := zipf.Uint64()
		u := rng.IntN(users)
		segs := []segment{{id: 1, n: 1000}, {id: 1<<40 | d, n: docLen[d]}, {id: 2<<40 | uint64(i), n: 30 + rng.IntN(271)}}
		r := &request{id: int64(i), at: at, session: fmt.Sprintf("u%d", u), input: total(segs),
			output: 50 + rng.IntN(351), chain: chainOf(segs, cfg.Fleet.BlockSize, nil)}
		attrs.assign(r, uint64(u))
		attrs.roamed(r, uint64(i)<<1|1)
		out = append(out, r)
	}
	return out
}

// shortRequests: prompts of 200 to 4,000 tokens, nearly all unique (10%
// start with one of 20 system prompts of 512 to 2,048 tokens), answers of 20
// to 400 tokens; 2,000 users; Poisson arrivals at rate per second (GORGO's
// WildChat regime).
func shortRequests(cfg *Config, rate float64) []*request {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5407))
	const users = 2000
	sysLen := make([]int, 20)
	for i := range sysLen {
		sysLen[i] = 512 + rng.IntN(1537)
	}
	attrs := newAttributes(cfg)
	var out []*request
	for i, at := range poisson(rng, rate, cfg.Workload.Duration) {
		var segs []segment
		if rng.Float64() < 0.1 {
			s := rng.IntN(len(sysLen))
			segs = append(segs, segment{id: 3<<40 | uint64(s), n: sysLen[s]})
		}
		segs = append(segs, segment{id: 4<<40 | uint64(i), n: 200 + rng.IntN(3801)})
		u := rng.IntN(users)
		r := &request{id: int64(i), at: at, session: fmt.Sprintf("u%d", u), input: total(segs),
			output: 20 + rng.IntN(381), chain: chainOf(segs, cfg.Fleet.BlockSize, nil)}
		attrs.assign(r, uint64(u))
		attrs.roamed(r, uint64(i)<<1|1)
		out = append(out, r)
	}
	return out
}

// sharedDocRequests: 60 large shared documents (a 1,000-token system
// prompt, then 20,000 to 80,000 tokens: contracts, manuals, codebases),
// each homed in one region (by OriginShares) and picked by a Zipf(1.1)
// popularity; 70% of a document's questions come from its home region, the
// rest from the others; a request is the document plus a question of 50 to
// 300 tokens, answered in 50 to 400; 2,000 users carry the residency
// attributes; Poisson arrivals at rate per second. A document is cached
// where it is read most: another region pays its whole prefill, or the
// round trip to the home region.
func sharedDocRequests(cfg *Config, rate float64) []*request {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xd0c5))
	const docs, users = 60, 2000
	attrs := newAttributes(cfg)
	docLen := make([]int, docs)
	home := make([]int, docs)
	for i := range docs {
		docLen[i] = 20000 + rng.IntN(60001)
		home[i] = pick(attrs.origin, rng.Float64())
	}
	zipf := rand.NewZipf(rng, 1.1, 1, docs-1)
	n := len(cfg.Fleet.Regions)
	var out []*request
	for i, at := range poisson(rng, rate, cfg.Workload.Duration) {
		d := zipf.Uint64()
		u := rng.IntN(users)
		segs := []segment{{id: 8 << 40, n: 1000}, {id: 9<<40 | d, n: docLen[d]}, {id: 10<<40 | uint64(i), n: 50 + rng.IntN(251)}}
		r := &request{id: int64(i), at: at, session: fmt.Sprintf("d%d.u%d", d, u), input: total(segs),
			output: 50 + rng.IntN(351), chain: chainOf(segs, cfg.Fleet.BlockSize, nil)}
		attrs.assign(r, uint64(u))
		r.origin = home[d]
		if n > 1 && rng.Float64() >= 0.7 {
			r.origin = (home[d] + 1 + rng.IntN(n-1)) % n
		}
		r.attrs.OriginRegion = cfg.Fleet.Regions[r.origin]
		attrs.roamed(r, uint64(i)<<1|1)
		out = append(out, r)
	}
	return out
}

// logUniform draws from [lo, hi] with a uniform logarithm.
func logUniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return time.Duration(math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
}
