package sim

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/residency"
)

// TestRoamAnalysis is an analysis, not a check: who makes up the top 5% of
// TTFT on the conversation trace's roaming scenario (the evidence sweep's
// worlds, seeds 1..ROAM_SEEDS, window 0.5), and what a clairvoyant choice
// of remote pod could have done for them. Skipped unless ROAM is set:
//
//	ROAM=1 ROAM_LOADS=0.2,0.5 ROAM_POLICIES=meridian,cache_local,probe,probe_local,oracle,oracle_local,upper_bound \
//	  go test ./scenarios/sim -run TestRoamAnalysis -v -timeout 30m
//
// ROAM_SCENARIO picks another scenario (none: no scenario); SUMINT sets
// the summary interval. probe and probe_local run meridian and cache_local
// and record, at each decision, the exact soonest first token any local
// and any allowed remote pod could give the request (oracle's estimate);
// their "counterfactual p95" lets each request take the better of what it
// got and that remote option, with no knock-on on other requests. probe
// also prices each request as meridian's Place would (dryPlace) and breaks
// the router's best remote estimate down for the tail requests it kept
// local although a remote pod was truly >20% sooner. meridian_plus and
// cache_local_plus serve that clairvoyant remote choice for real whenever
// it beats every local pod by PLUS_MARGIN (a fraction, default 0).
//
// meridian_reserve and cache_local_reserve plan ahead instead: each
// region keeps RESERVE_PODS (default 1) of its B200 pods for prompts of at
// least RESERVE_TOKENS (default 32768) tokens; shorter ones are kept off
// them (RESERVE_SLACK, a fraction: unless the best other pod's estimate is
// more than that much above the reserved pod's; unset: always). Long
// prompts choose among every pod as before. pooled_local and
// pooled_meridian are cache_local and meridian over one cache of the
// fleet's size shared by every pod and known to every index (upper_bound's
// cache under the hardware-aware picker): a TTFT reference for the cache.
func TestRoamAnalysis(t *testing.T) {
	if os.Getenv("ROAM") == "" {
		t.Skip("analysis")
	}
	recs, err := LoadTraceFile("/work/shared/traces/conversation_trace.jsonl", TraceBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	loads := []float64{0.2, 0.5}
	if s := os.Getenv("ROAM_LOADS"); s != "" {
		loads = nil
		for _, f := range strings.Split(s, ",") {
			v, _ := strconv.ParseFloat(f, 64)
			loads = append(loads, v)
		}
	}
	seeds := 5
	if s := os.Getenv("ROAM_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	policies := []string{PolicyMeridian, PolicyCacheLocal}
	if s := os.Getenv("ROAM_POLICIES"); s != "" {
		policies = strings.Split(s, ",")
	}
	scen := "roaming"
	if s := os.Getenv("ROAM_SCENARIO"); s != "" {
		scen = s
	}
	perfs := enginePerfs()
	for _, load := range loads {
		for _, pol := range policies {
			var agg aggStats
			for k := range seeds {
				cfg := DefaultConfig()
				cfg.Workload.Trace = recs
				cfg.Workload.Window = 0.5
				cfg.Workload.Load = load
				cfg.Seed = 1 + uint64(k)
				if scen != "none" {
					if err := ApplyScenario(&cfg, scen); err != nil {
						t.Fatal(err)
					}
				}
				cfg.Policies = []string{PolicyCacheLocal}
				if v := os.Getenv("SUMINT"); v != "" {
					d, _ := time.ParseDuration(v)
					cfg.SummaryInterval = d
				}
				in, err := prepare(cfg)
				if err != nil {
					t.Fatal(err)
				}
				wp := pol
				if strings.HasPrefix(pol, "oracle") {
					wp = PolicyCacheLocal
				}
				w, err := newWorld(&in.cfg, wp, in.fleet, in.res, in.source())
				if err != nil {
					t.Fatal(err)
				}
				switch pol {
				case "oracle":
					w.pick = oracle(false)
				case "oracle_local":
					w.pick = oracle(true)
				case "meridian_plus", "cache_local_plus":
					// meridian (cache_local) as it is, except that a request
					// goes to the truly soonest remote pod whenever that is
					// sooner than every local pod by the margin PLUS_MARGIN
					// (a fraction; default 0): clairvoyant remote placement,
					// served for real, knock-on included.
					w = baseWorld(t, in, pol == "cache_local_plus")
					margin, _ := strconv.ParseFloat(os.Getenv("PLUS_MARGIN"), 64)
					o := oracle(false)
					w.pick = func(w *world, r *request, origin *region, allowed residency.Decision) {
						lo, re := math.Inf(1), math.Inf(1)
						oracleEst = func(reg *region, p *pod, t float64) {
							if reg == origin {
								lo = min(lo, t)
							} else {
								re = min(re, t)
							}
						}
						oracleDry = true
						o(w, r, origin, allowed)
						oracleDry, oracleEst = false, nil
						if re < lo*(1-margin) {
							oracleRemoteOnly = true
							o(w, r, origin, allowed)
							oracleRemoteOnly = false
							return
						}
						if w.policy == PolicyMeridian {
							w.place(r, origin, allowed)
						} else if allowed.Allows(origin.name) && !origin.failed {
							w.decideAt(r, origin, allowed, 0)
						} else if dst := w.nearestAllowed(origin, allowed); dst != nil {
							w.forward(r, origin, dst, allowed)
						} else {
							w.stats.rejected++
						}
					}
				case "meridian_reserve", "cache_local_reserve":
					w = baseWorld(t, in, pol == "cache_local_reserve")
					w.narrow = reserve(w, reserveConfigFromEnv(t))
				case "pooled_local", "pooled_meridian":
					w = baseWorld(t, in, pol == "pooled_local")
					pool(w)
				case "probe", "probe_local":
					w = baseWorld(t, in, pol == "probe_local")
					probes = map[int64][2]float64{}
					ests = map[int64][3]float64{}
					remEst = map[int64]remoteParts{}
					o := oracle(false)
					w.pick = func(w *world, r *request, origin *region, allowed residency.Decision) {
						lo, re := math.Inf(1), math.Inf(1)
						oracleEst = func(reg *region, p *pod, t float64) {
							if reg == origin {
								lo = min(lo, t)
							} else {
								re = min(re, t)
							}
						}
						oracleDry = true
						o(w, r, origin, allowed)
						oracleDry, oracleEst = false, nil
						probes[r.id] = [2]float64{lo, re}
						if w.policy == PolicyMeridian {
							le, rem, ex := dryPlace(w, r, origin, allowed)
							ests[r.id] = [3]float64{le, rem, ex}
							w.place(r, origin, allowed)
						} else if allowed.Allows(origin.name) && !origin.failed {
							w.decideAt(r, origin, allowed, 0)
						} else if dst := w.nearestAllowed(origin, allowed); dst != nil {
							w.forward(r, origin, dst, allowed)
						} else {
							w.stats.rejected++
						}
					}
				}
				w.stats.keep = true
				w.run(nil)
				agg.add(w, perfs)
			}
			agg.print(t, load, pol)
		}
	}
}

var (
	oracleEst func(reg *region, p *pod, t float64)
	oracleDry bool
	// oracleRemoteOnly restricts the oracle to remote regions.
	oracleRemoteOnly bool
	probes           map[int64][2]float64
	ests             map[int64][3]float64
	remEst           map[int64]remoteParts
)

type remoteParts struct {
	queue, prefill, overhead, rtt, egress, extra, cold float64
	cached, pending, running                           int
	profile                                            string
}

// dryPlace is meridian's placement of r as w.place would make it, without
// serving it: the local estimate, the best remote one and the winner's
// (all TotalMs; +Inf when absent).
func dryPlace(w *world, r *request, origin *region, allowed residency.Decision) (local, remote, win float64) {
	rr := w.routeRequest(r)
	remotes := origin.view.Candidates(w.wall(), "", r.chain, r.input, func(name string) bool {
		return name != origin.name && allowed.Allows(name)
	}, origin.dec.Model(), nil)
	origin.fwd.Adjust(remotes, origin.unseen)
	origin.trend.Adjust(remotes, w.wall(), origin.dec.Model())
	for i := range remotes {
		remotes[i].EgressBytes = int64(float64(r.input) * w.cfg.PromptBytesPerToken)
	}
	local, remote, win = math.Inf(1), math.Inf(1), math.Inf(1)
	pl, err := origin.dec.Place(rr, origin.name, allowed.Allows(origin.name) && !origin.failed, remotes, origin.shares)
	if err != nil {
		return
	}
	for i, c := range pl.Candidates {
		e := pl.Cost.Estimates[i]
		if c.Remote {
			if e.Excluded == "" && e.TotalMs < remote {
				remote = e.TotalMs
				if remEst != nil {
					remEst[r.id] = remoteParts{e.QueueMs, e.PrefillMs, e.OverheadMs, e.RTTMs, e.EgressMs, e.ExtraMs, e.ColdWorkMs, c.CachedTokens, c.PendingPrefillTokens, c.Running, c.Profile}
				}
			}
		} else {
			local = e.TotalMs
		}
	}
	win = pl.Cost.Estimates[pl.Cost.Winner].TotalMs
	return
}

type jobRow struct {
	bestLocal, bestRemote float64
	estLocal, estRemote   float64
	parts                 remoteParts

	ttft, net, slot, prefill, solo, soloB200, soloB200Cold float64
	roamed, servedHome, remote                             bool
	input, cached                                          int
	profile                                                string
	homeOK                                                 bool // residency allows the conversation's home region
	p95                                                    float64
}

type aggStats struct {
	top, all []jobRow
	p95s     []float64
	p50s     []float64
	lbs      [][3]float64
	cf       [][2]float64 // per seed: p95 of solo on own pod, of solo on B200 same cache, of B200 cold
}

func (a *aggStats) add(w *world, perfs map[string]enginePerf) {
	var rows []jobRow
	for _, j := range w.stats.jobs {
		r := j.req
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		cached := min(j.h.Hit*w.fleet.blockSize, r.input)
		row := jobRow{
			ttft:    ms(j.first + j.netBack - r.at),
			net:     ms(j.atPod-r.at) + ms(j.netBack),
			slot:    ms(j.admitted - j.atPod),
			prefill: ms(j.first - j.admitted),
			solo:    j.pod.spec.perf.soloTTFTMs(cached, r.input-cached),
			roamed:  r.home != r.origin, servedHome: j.region.idx == r.home, remote: j.region.idx != r.origin,
			input: r.input, cached: cached, profile: j.pod.spec.profile,
			homeOK: w.res.Evaluate(r.attrs).Allows(w.regions[r.home].name),
		}
		row.parts = remEst[r.id]
		if e, ok := ests[r.id]; ok {
			row.estLocal, row.estRemote = e[0], e[1]
		}
		if pr, ok := probes[r.id]; ok {
			row.bestLocal, row.bestRemote = pr[0], pr[1]
		}
		row.soloB200 = perfs["b200"].soloTTFTMs(cached, r.input-cached)
		row.soloB200Cold = perfs["b200"].soloTTFTMs(0, r.input)
		rows = append(rows, row)
	}
	tt := make([]float64, len(rows))
	for i := range rows {
		tt[i] = rows[i].ttft
	}
	slices.Sort(tt)
	p95 := tt[int(0.95*float64(len(tt)-1))]
	a.p95s = append(a.p95s, p95)
	a.p50s = append(a.p50s, tt[int(0.5*float64(len(tt)-1))])
	pct := func(f func(jobRow) float64) float64 {
		v := make([]float64, len(rows))
		for i := range rows {
			v[i] = f(rows[i])
		}
		slices.Sort(v)
		return v[int(0.95*float64(len(v)-1))]
	}
	if probes != nil {
		a.cf = append(a.cf, [2]float64{pct(func(r jobRow) float64 { return min(r.ttft, r.bestRemote) }), pct(func(r jobRow) float64 { return min(r.ttft, r.bestRemote, r.bestLocal) })})
	}
	a.lbs = append(a.lbs, [3]float64{pct(func(r jobRow) float64 { return r.solo + r.net }), pct(func(r jobRow) float64 { return r.soloB200 }), pct(func(r jobRow) float64 { return r.soloB200Cold })})
	for _, r := range rows {
		r.p95 = p95
		if r.ttft >= p95 {
			a.top = append(a.top, r)
		}
		a.all = append(a.all, r)
	}
}

func (a *aggStats) print(t *testing.T, load float64, pol string) {
	var b strings.Builder
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	var lb0, lb1, lb2 []float64
	for _, l := range a.lbs {
		lb0, lb1, lb2 = append(lb0, l[0]), append(lb1, l[1]), append(lb2, l[2])
	}
	fmt.Fprintf(&b, "== load %.1f %s: p95 mean %.0f ms (seeds %.0f); p50 mean %.0f ms; p95 of (own-pod solo+net) %.0f, (B200 solo, same cache) %.0f, (B200 solo cold) %.0f\n",
		load, pol, mean(a.p95s), a.p95s, mean(a.p50s), mean(lb0), mean(lb1), mean(lb2))
	desc := func(name string, rows []jobRow) {
		n := float64(len(rows))
		var roamed, home, remote, homeOK, roamedOK float64
		var in, cached, ttft, net, slot, pre, solo, sB, sBc float64
		prof := map[string]int{}
		for _, r := range rows {
			if r.roamed {
				roamed++
				if r.homeOK {
					roamedOK++
				}
			}
			if r.servedHome {
				home++
			}
			if r.remote {
				remote++
			}
			if r.homeOK {
				homeOK++
			}
			in += float64(r.input)
			cached += float64(r.cached)
			ttft += r.ttft
			net += r.net
			slot += r.slot
			pre += r.prefill
			solo += r.solo
			sB += r.soloB200
			sBc += r.soloB200Cold
			prof[r.profile]++
		}
		fmt.Fprintf(&b, "  %s n=%d roamed %.1f%% (home allowed %.1f%% of roamed) served-remote %.1f%% served-home %.1f%% | input %.0f cached %.0f (%.1f%%) | ttft %.0f = net %.0f + slot %.0f + prefill %.0f (solo own pod %.0f, queue-in-engine %.0f) | B200 solo same cache %.0f, cold %.0f | profiles %v\n",
			name, len(rows), 100*roamed/n, 100*roamedOK/max(roamed, 1), 100*remote/n, 100*home/n, in/n, cached/n, 100*cached/max(in, 1), ttft/n, net/n, slot/n, pre/n, solo/n, (pre-solo)/n, sB/n, sBc/n, prof)
	}
	desc("top5%", a.top)
	if len(a.cf) > 0 {
		var c0, c1 []float64
		for _, c := range a.cf {
			c0, c1 = append(c0, c[0]), append(c1, c[1])
		}
		fmt.Fprintf(&b, "  counterfactual p95 (no knock-on): min(actual, true best remote) %.0f; min(actual, true best anywhere) %.0f\n", mean(c0), mean(c1))
	}
	if probes != nil {
		var n, remoteBetter, remoteBetter20, actualWorse20 float64
		var sumLoc, sumRem, sumAct float64
		for _, r := range a.top {
			n++
			if r.bestRemote < r.bestLocal {
				remoteBetter++
			}
			if r.bestRemote < 0.8*r.bestLocal {
				remoteBetter20++
			}
			if r.bestRemote < 0.8*r.ttft {
				actualWorse20++
			}
			sumLoc += r.bestLocal
			if !math.IsInf(r.bestRemote, 1) {
				sumRem += r.bestRemote
			}
			sumAct += r.ttft
		}
		if ests != nil {
			var n, el, er, tl, tr, act float64
			var nl, nr float64
			for _, r := range a.top {
				if !(r.bestRemote < 0.8*r.ttft) || r.remote || math.IsInf(r.estLocal, 1) {
					continue
				}
				n++
				el += r.estLocal
				tl += r.bestLocal
				act += r.ttft
				tr += r.bestRemote
				if !math.IsInf(r.estRemote, 1) {
					er += r.estRemote
					nr++
				}
				nl++
			}
			var q, pf, ov, rt, eg, ex, cw, ca, pe, ru float64
			profs := map[string]int{}
			for _, r := range a.top {
				if !(r.bestRemote < 0.8*r.ttft) || r.remote || math.IsInf(r.estLocal, 1) || math.IsInf(r.estRemote, 1) {
					continue
				}
				e := r.parts
				q, pf, ov, rt, eg, ex, cw = q+e.queue, pf+e.prefill, ov+e.overhead, rt+e.rtt, eg+e.egress, ex+e.extra, cw+e.cold
				ca, pe, ru = ca+float64(e.cached), pe+float64(e.pending), ru+float64(e.running)
				profs[e.profile]++
			}
			k := max(nr, 1)
			fmt.Fprintf(&b, "  their best remote est: queue %.0f prefill %.0f overhead %.0f rtt %.0f egress %.0f extra %.0f cold %.0f | cached %.0f pending tokens %.0f running %.1f | pools %v\n",
				q/k, pf/k, ov/k, rt/k, eg/k, ex/k, cw/k, ca/k, pe/k, ru/k, profs)
			fmt.Fprintf(&b, "  missed (served locally, true best remote < 0.8 x actual): %d; router's local est %.0f vs true best local %.0f vs actual %.0f; router's best remote est %.0f (n=%.0f) vs true best remote %.0f\n",
				int(n), el/nl, tl/nl, act/nl, er/max(nr, 1), nr, tr/nl)
		}
		fmt.Fprintf(&b, "  probe top5%%: true best remote < true best local in %.1f%% (by >20%%: %.1f%%); best remote < 0.8 x actual TTFT in %.1f%%; mean true best local %.0f, remote %.0f (finite), actual %.0f\n",
			100*remoteBetter/n, 100*remoteBetter20/n, 100*actualWorse20/n, sumLoc/n, sumRem/n, sumAct/n)
	}
	desc("all  ", a.all)
	// Top 5% split by roamed.
	var tr, tn []jobRow
	for _, r := range a.top {
		if r.roamed {
			tr = append(tr, r)
		} else {
			tn = append(tn, r)
		}
	}
	desc("top5% roamed", tr)
	desc("top5% not-roamed", tn)
	// Input-length distribution: what share of all requests have B200-cold solo >= p95?
	var over float64
	for _, r := range a.all {
		if r.soloB200Cold >= r.p95 {
			over++
		}
	}
	fmt.Fprintf(&b, "  share of all requests whose cold B200 solo TTFT >= the run's p95: %.2f%%\n", 100*over/float64(len(a.all)))
	t.Log(b.String())
}

// oracle returns a clairvoyant greedy picker: each request goes to the pod,
// among the regions residency allows (only the origin with local), whose
// true engine state gives it the soonest first token: the prefill work
// queued ahead of it (with the engine's own constants), its own prefill
// with the pod's true cached prefix, and the RTT.
func oracle(local bool) func(w *world, r *request, origin *region, allowed residency.Decision) {
	type pend struct {
		at   time.Duration
		work float64 // ms of prefill
	}
	pending := map[*pod][]pend{}
	workOf := func(e enginePerf, pos, left float64) float64 {
		return e.PrefillMsPerToken*left + e.AttnMsPerTokenPos*left*(pos+left/2)
	}
	return func(w *world, r *request, origin *region, allowed residency.Decision) {
		var best *pod
		bestT, bestCached := math.Inf(1), 0
		for _, reg := range w.regions {
			if !allowed.Allows(reg.name) || reg.failed || (local && reg != origin) || (oracleRemoteOnly && reg == origin) {
				continue
			}
			oneWay := w.fleet.rtt[origin.idx][reg.idx] / 2
			arrive := w.now + oneWay
			for _, p := range reg.pods {
				e := p.spec.perf
				ahead, toks := 0.0, 0.0
				for i := p.eng.phead; i < len(p.eng.prefill); i++ {
					j := p.eng.prefill[i]
					ahead += workOf(e, j.prefillPos, j.prefillLeft)
					toks += j.prefillLeft
				}
				for i := p.qhead; i < len(p.queue); i++ {
					j := p.queue[i]
					c := float64(min(p.cache.Lookup(j.req.chain)*w.fleet.blockSize, j.req.input))
					ahead += workOf(e, c, float64(j.req.input)-c)
					toks += float64(j.req.input) - c
				}
				ps := pending[p][:0]
				for _, q := range pending[p] {
					if q.at > w.now {
						ps = append(ps, q)
						if q.at <= arrive {
							ahead += q.work
						}
					}
				}
				pending[p] = ps
				step := e.StepMs + e.KVReadMsPerToken*p.eng.kv
				ahead += step * math.Ceil(toks/float64(e.ChunkTokens))
				ahead = max(ahead-float64(oneWay)/float64(time.Millisecond), 0)
				cached := min(p.cache.Lookup(r.chain)*w.fleet.blockSize, r.input)
				own := e.soloTTFTMs(cached, r.input-cached)
				t := 2*float64(oneWay)/float64(time.Millisecond) + ahead + own
				if oracleEst != nil {
					oracleEst(reg, p, t)
				}
				if t < bestT {
					best, bestT, bestCached = p, t, cached
				}
			}
		}
		if oracleDry {
			return
		}
		if best == nil {
			w.stats.rejected++
			return
		}
		reg := best.region
		dec := &route.Decision{Pod: best.rp, PodName: best.spec.name, Policy: "oracle", Reason: "oracle",
			CachedTokens: bestCached, Uncached: r.input - bestCached}
		if reg == origin {
			w.dispatch(r, reg, dec, 0)
			return
		}
		oneWay := w.fleet.rtt[origin.idx][reg.idx] / 2
		pending[best] = append(pending[best], pend{at: w.now + oneWay, work: workOf(best.spec.perf, float64(bestCached), float64(r.input-bestCached))})
		t := reg.dec.Admit(dec)
		w.at(w.now+oneWay, func() { w.dispatchAdmitted(r, reg, dec, t, oneWay, 0) })
	}
}

// baseWorld is a new world of in under meridian, or cache_local when local.
func baseWorld(t *testing.T, in *instance, local bool) *world {
	t.Helper()
	base := PolicyMeridian
	if local {
		base = PolicyCacheLocal
	}
	w, err := newWorld(&in.cfg, base, in.fleet, in.res, in.source())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// reserveConfig is a reservation of B200 pods for long prompts (see
// TestRoamAnalysis).
type reserveConfig struct {
	tokens int     // a prompt of at least this many tokens is long
	pods   int     // B200 pods reserved per region
	slack  float64 // < 0: short prompts never use a reserved pod
	// idlest reserves, instead of fixed pods, the rc.pods B200 pods with
	// the least prefill backlog the router accounts at the moment.
	idlest bool
}

func reserveConfigFromEnv(t *testing.T) reserveConfig {
	t.Helper()
	rc := reserveConfig{tokens: 32768, pods: 1, slack: -1}
	var err error
	if v := os.Getenv("RESERVE_TOKENS"); v != "" {
		if rc.tokens, err = strconv.Atoi(v); err != nil {
			t.Fatalf("RESERVE_TOKENS %q: %v", v, err)
		}
	}
	if v := os.Getenv("RESERVE_PODS"); v != "" {
		if rc.pods, err = strconv.Atoi(v); err != nil {
			t.Fatalf("RESERVE_PODS %q: %v", v, err)
		}
	}
	rc.idlest = os.Getenv("RESERVE_IDLEST") != ""
	if v := os.Getenv("RESERVE_SLACK"); v != "" {
		if rc.slack, err = strconv.ParseFloat(v, 64); err != nil {
			t.Fatalf("RESERVE_SLACK %q: %v", v, err)
		}
	}
	return rc
}

// reserve returns a world.narrow that keeps prompts shorter than
// rc.tokens off the last rc.pods B200 pods of the deciding region: always
// (rc.slack < 0), or unless the region's best pod is a reserved one and
// the best of the others is estimated more than rc.slack (a fraction)
// slower. With rc.idlest the reserved pods are, at each decision, the
// B200 pods with the least backlog the router accounts. The in-region
// decision stays the region's own (Decide, its filters and picker); only
// its candidates change.
func reserve(w *world, rc reserveConfig) func(reg *region, r *request, rr *route.Request) {
	reserved := map[*region][]*route.Pod{}
	return func(reg *region, r *request, rr *route.Request) {
		if r.input >= rc.tokens {
			return
		}
		rs, ok := reserved[reg]
		if !ok || rc.idlest {
			rs = rs[:0]
			var b200 []*route.Pod
			for i := len(reg.pods) - 1; i >= 0; i-- {
				if p := reg.pods[i]; p.spec.profile == "b200" {
					b200 = append(b200, p.rp)
				}
			}
			if rc.idlest {
				now := w.wall()
				slices.SortStableFunc(b200, func(a, b *route.Pod) int {
					return cmp.Compare(a.PrefillBacklog(now), b.PrefillBacklog(now))
				})
			}
			rs = append(rs, b200[:min(rc.pods, len(b200))]...)
			reserved[reg] = rs
		}
		if len(rs) == 0 {
			return
		}
		if rc.slack >= 0 {
			full, err := reg.dec.Decide(rr)
			if err != nil || !slices.Contains(rs, full.Pod) {
				return
			}
			ex := *rr
			ex.Exclude = append(slices.Clone(rr.Exclude), rs...)
			kept, err := reg.dec.Decide(&ex)
			if err != nil || kept.EstimateMs > (1+rc.slack)*full.EstimateMs {
				return
			}
		}
		rr.Exclude = append(rr.Exclude, rs...)
	}
}

// pool gives every pod of w one cache of the fleet's size (upper_bound's)
// whose KV events reach every region's index, for every pod, after the
// configured delay: each pod is known to hold whatever any pod computed.
func pool(w *world) {
	capBlocks := 0
	for _, p := range w.pods {
		capBlocks += p.spec.capBlocks
	}
	var last time.Duration
	c := newKVCache(capBlocks, func(stored bool, hashes []uint64) {
		d := w.cfg.EventDelayMin
		if span := w.cfg.EventDelayMax - w.cfg.EventDelayMin; span > 0 {
			d += time.Duration(w.rng.Int64N(int64(span) + 1))
		}
		at := max(w.now+d, last)
		last = at
		hs := slices.Clone(hashes)
		w.q.push(at, func() {
			for _, p := range w.pods {
				var err error
				if stored {
					err = p.region.index.Register(p.rp.ID, index.TierGPU, hs)
				} else {
					err = p.region.index.Evict(p.rp.ID, index.TierGPU, hs)
				}
				if err != nil {
					w.stats.indexErrors++
				}
			}
		})
	})
	w.pool = c
	for _, p := range w.pods {
		p.cache = c
	}
}
