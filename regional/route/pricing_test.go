package route

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// TestLowerBoundUnderEstimate: the bound the ttft picker prunes with never
// exceeds gorgo's estimate of the same candidate, and equals it when the
// pod is not past its concurrency limit; the floor of a depth never
// exceeds the bound of a pod at that depth, whatever its load and its own
// speed. Profiles may have an attention term, pods a calibrated factor.
func TestLowerBoundUnderEstimate(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := gorgo.DefaultConfig()
		cfg.QueueWeight = rapid.SampledFrom([]float64{0, 0.5, 0.75, 1, 3}).Draw(rt, "qw")
		var infos []PodInfo
		for _, prof := range []string{"h100", "b200", "unknown"} {
			infos = append(infos, PodInfo{Name: prof, Endpoint: "http://" + prof, Profile: prof})
		}
		model := drawModel(rt, cfg, infos)
		f := newFixtureT(rt, 0)
		f.dec.model, f.dec.queueWeight = model, cfg.QueueWeight
		for _, info := range infos {
			_, _, _ = f.reg.Upsert(info)
		}
		prompt := rapid.IntRange(0, 200_000).Draw(rt, "prompt")
		c := newCycle(64)
		c.begin(f.dec, &Request{BlockSize: 64, PromptTokens: prompt}, f.reg.Pods(), f.clock, false)
		defer c.end()
		c.scoring = &scoring{prefix: &prefixScorer{weight: rapid.SampledFrom([]float64{0.5, 1}).Draw(rt, "w")}}
		prof := rapid.IntRange(0, len(c.profs)-1).Draw(rt, "prof")
		pod := infos[rapid.IntRange(0, len(infos)-1).Draw(rt, "pod")].Name
		tm := terms{
			prof:    prof,
			rate:    c.profs[prof].rate * model.PodFactor(pod),
			cached:  rapid.IntRange(-10, 250_000).Draw(rt, "cached"),
			pending: rapid.IntRange(-10, 1_000_000).Draw(rt, "pending"),
			running: rapid.IntRange(0, 600).Draw(rt, "running"),
			extra:   rapid.Float64Range(-500, 500).Draw(rt, "extra"),
		}
		cand := gorgo.Candidate{Pod: pod, Profile: c.profs[prof].name, PromptTokens: prompt, CachedTokens: tm.cached,
			PendingPrefillTokens: tm.pending, Running: tm.running, ExtraMs: tm.extra}
		est := model.Estimate(&cand).TotalMs
		lb := c.lowerBound(&tm)
		if lb > est {
			rt.Fatalf("bound %v > estimate %v for %+v", lb, est, cand)
		}
		if tm.running < model.Nominal(cand.Profile).MaxConcurrency && lb != est {
			rt.Fatalf("unsaturated: bound %v != estimate %v", lb, est)
		}
		// The floor at the depth whose cached tokens these are.
		if tm.extra >= 0 && tm.pending >= 0 {
			depth := rapid.IntRange(0, prompt/64+1).Draw(rt, "depth")
			tm.cached = min(int(float64(min(depth*64, prompt))*c.scoring.prefix.weight), prompt)
			c.matches = append(c.matches[:0], index.Match{Blocks: depth})
			c.next = 0
			if fl := c.floorAt(); fl > c.lowerBound(&tm) {
				rt.Fatalf("floor %v > bound %v at depth %d", fl, c.lowerBound(&tm), depth)
			}
		}
	})
}

// TestListBoundUnderPriced: the first bound of a pod (list, read from its
// first cache line) never exceeds the bound pricing it gives (priceAt), on
// pods with a backlog of either kind, the other replicas' load, a scraped
// KV utilisation and their own calibrated speed, under random weights.
func TestListBoundUnderPriced(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := gorgo.DefaultConfig()
		cfg.QueueWeight = rapid.SampledFrom([]float64{0, 0.5, 1, 3}).Draw(rt, "qw")
		f := newFixtureT(rt, 0)
		var infos []PodInfo
		for i := range rapid.IntRange(1, 6).Draw(rt, "pods") {
			infos = append(infos, PodInfo{Name: fmt.Sprintf("pod-%d", i), Endpoint: "http://x",
				Profile: rapid.SampledFrom([]string{"h100", "b200", "unknown"}).Draw(rt, "profile")})
		}
		f.dec.model, f.dec.queueWeight = drawModel(rt, cfg, infos), cfg.QueueWeight
		ch := chain(1, 16)
		var loads []PeerLoad
		for _, info := range infos {
			p, _, err := f.reg.Upsert(info)
			if err != nil {
				rt.Fatal(err)
			}
			if d := rapid.IntRange(0, 16).Draw(rt, "depth"); d > 0 {
				_ = f.idx.Register(p.ID, index.TierGPU, ch[:d])
			}
			for range rapid.IntRange(0, 3).Draw(rt, "admits") {
				p.Admit(rapid.IntRange(0, 5000).Draw(rt, "uncached"),
					time.Duration(rapid.IntRange(0, 3000).Draw(rt, "work_ms"))*time.Millisecond,
					f.clock.Add(-time.Duration(rapid.IntRange(0, 3000).Draw(rt, "ago_ms"))*time.Millisecond))
			}
			p.SetKVUtil(rapid.SampledFrom([]float64{0, 0.5, 0.85, 1}).Draw(rt, "kv"))
			loads = append(loads, PeerLoad{Pod: info.Name, InFlight: int64(rapid.IntRange(0, 5).Draw(rt, "peer_inflight")),
				PendingPrefill: int64(rapid.SampledFrom([]int{0, 1, 500}).Draw(rt, "peer_pending"))})
		}
		f.reg.SetPeerLoads("r2", 1, 1, loads, -1, f.clock)
		r := req(ch)
		r.BlockSize = rapid.SampledFrom([]int{1, 64}).Draw(rt, "block")
		r.PromptTokens = len(ch)*r.BlockSize + rapid.IntRange(0, 3).Draw(rt, "tail")
		s := &scoring{}
		if w := rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(rt, "w_prefix"); w > 0 {
			s.prefix = &prefixScorer{weight: w}
		}
		if w := rapid.SampledFrom([]float64{0, 0.5, 1, 2}).Draw(rt, "w_queue"); w > 0 {
			s.queue = &queueScorer{weight: w}
		}
		if ms := rapid.SampledFrom([]float64{0, 2, 7.5}).Draw(rt, "running_ms"); ms > 0 {
			s.running = &runningScorer{perRequestMs: ms}
		}
		if ms := rapid.SampledFrom([]float64{0, 100}).Draw(rt, "kv_ms"); ms > 0 {
			s.kvUtil = &kvUtilScorer{fullMs: ms}
		}
		c := newCycle(f.idx.PodCapacity())
		c.begin(f.dec, r, f.reg.Pods(), f.clock, false)
		defer c.end()
		c.layout(s)
		for i := range c.order {
			c.list(i)
			first := c.bound[i]
			c.priceAt(i)
			if first > c.bound[i] {
				rt.Fatalf("%s: first bound %v > priced bound %v (%+v)", c.order[i].Name, first, c.bound[i], c.terms[i])
			}
		}
	})
}

// drawRegion is a random region for the pruned pricing: pods at random
// depths of one chain, some past their concurrency limit (so bounds fall
// short of estimates), some with a backlog, some carrying the other
// replicas' load, many alike (so totals tie, or nearly), and maybe a
// session's pinned pod with its bonus. Small blocks make neighbouring
// depths nearly as good as each other, so load decides and the groups'
// floors are put to work.
func drawRegion(rt *rapid.T) (*fixture, *Request) {
	f := newFixtureT(rt, 0)
	pods := rapid.IntRange(1, 24).Draw(rt, "pods")
	ch := chain(1, 16)
	var loads []PeerLoad
	for i := range pods {
		name := fmt.Sprintf("pod-%02d", i)
		p, _, err := f.reg.Upsert(PodInfo{Name: name, Endpoint: "http://x",
			Profile: rapid.SampledFrom([]string{"h100", "b200"}).Draw(rt, "profile")})
		if err != nil {
			rt.Fatal(err)
		}
		if d := rapid.SampledFrom([]int{0, 0, 4, 8, 8, 9, 16, rapid.IntRange(0, 16).Draw(rt, "d")}).Draw(rt, "depth"); d > 0 {
			_ = f.idx.Register(p.ID, index.TierGPU, ch[:d])
		}
		for range rapid.SampledFrom([]int{0, 0, 1, 2, 3, 300}).Draw(rt, "inflight") {
			p.Admit(0, 0, f.clock)
		}
		if rapid.Bool().Draw(rt, "backlog") {
			p.Admit(0, time.Duration(rapid.IntRange(1, 20).Draw(rt, "ms"))*time.Millisecond, f.clock)
		}
		if n := rapid.SampledFrom([]int{0, 0, 0, 5, 40, 4000}).Draw(rt, "pending"); n > 0 {
			// Tokens before their first byte, with a prefill time that
			// may be over (the backlog is then the tokens alone).
			p.Admit(n, time.Duration(rapid.IntRange(0, 20).Draw(rt, "pending_ms"))*time.Millisecond, f.clock.Add(-10*time.Millisecond))
		}
		if n := rapid.SampledFrom([]int{0, 0, 1, 3, 300}).Draw(rt, "peer_inflight"); n > 0 {
			loads = append(loads, PeerLoad{Pod: name, InFlight: int64(n), PendingPrefill: int64(rapid.SampledFrom([]int{0, 1, 500}).Draw(rt, "peer_pending"))})
		}
	}
	f.reg.SetPeerLoads("r2", 1, 1, loads, -1, f.clock)
	if rapid.Bool().Draw(rt, "pinned") {
		f.dec.sessions.Note("s", fmt.Sprintf("pod-%02d", rapid.IntRange(0, pods-1).Draw(rt, "pin")), f.clock)
	}
	r := req(ch)
	r.SessionID = rapid.SampledFrom([]string{"s", "t", ""}).Draw(rt, "session")
	r.BlockSize = rapid.SampledFrom([]int{1, 2, 64}).Draw(rt, "block")
	r.PromptTokens = len(ch)*r.BlockSize + rapid.IntRange(0, 3).Draw(rt, "tail")
	return f, r
}

// pricedAll is the truth the pruned pricing is held to: the cycle's
// candidates all priced and estimated, with some totals overridden (as
// the picker's tier weighting raises them).
func pricedAll(f *fixture, r *Request, tp *ttftPicker) func(raised map[int]float64) []float64 {
	all := newCycle(f.idx.PodCapacity())
	all.begin(f.dec, r, f.reg.Pods(), f.clock, false)
	all.layout(&tp.scoring)
	all.priceAll()
	tot := make([]float64, len(all.order))
	for i := range tot {
		cand := all.candidate(i)
		tot[i] = f.dec.model.Estimate(&cand).TotalMs
	}
	all.end()
	return func(raised map[int]float64) []float64 {
		out := slices.Clone(tot)
		for i, v := range raised {
			out[i] = v
		}
		return out
	}
}

// TestLowestMatchesSort drives the pruned ranking (lowest) on random
// regions (drawRegion) and checks it against estimating every candidate
// and sorting, before and after some estimates are raised (as the
// picker's tier weighting does).
func TestLowestMatchesSort(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		f, r := drawRegion(rt)
		c := newCycle(f.idx.PodCapacity())
		c.begin(f.dec, r, f.reg.Pods(), f.clock, true)
		defer c.end()
		tp := f.dec.pipe.Load().pickers[PolicyTTFT].(*ttftPicker)
		n := len(c.pods)
		c.layout(&tp.scoring)
		totals := pricedAll(f, r, tp)
		truth := func(raised map[int]float64) []int {
			tot := totals(raised)
			pos := make([]int, n)
			for i := range pos {
				pos[i] = i
			}
			slices.SortStableFunc(pos, func(a, b int) int { return cmp.Compare(tot[a], tot[b]) })
			return pos
		}
		k := rapid.IntRange(1, n).Draw(rt, "k")
		got := slices.Clone(c.lowest(k))
		want := truth(nil)[:k]
		if !slices.Equal(got, want) {
			rt.Fatalf("lowest(%d) = %v, want %v", k, got, want)
		}
		// Raise some estimates, then rank again.
		raised := map[int]float64{}
		for _, i := range got {
			if rapid.Bool().Draw(rt, "raise") {
				c.est[i].TotalMs += rapid.Float64Range(0, 2000).Draw(rt, "by")
				raised[i] = c.est[i].TotalMs
			}
		}
		k = rapid.IntRange(1, n).Draw(rt, "k2")
		if got, want := c.lowest(k), truth(raised)[:k]; !slices.Equal(got, want) {
			rt.Fatalf("after raising %v: lowest(%d) = %v, want %v", raised, k, got, want)
		}
	})
}

// TestTieMatchesFull: the tie-break on the pruned pricing picks what it
// picks with every candidate estimated — the highest rendezvous hash of
// the request's tie key and the pod among all candidates within tieMs of
// the best — on random regions with many equal and nearly equal totals
// (drawRegion), tieMs from none to wider than a whole depth group, and
// the best few's totals maybe raised first (as the tier weighting does).
// A candidate the best few's bound left unestimated can win the tie by its
// hash: pruning by the k-th estimate alone fails this.
func TestTieMatchesFull(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		f, r := drawRegion(rt)
		tieMs := rapid.SampledFrom([]float64{0, 0.01, 0.5, 5, 50, 1000}).Draw(rt, "tie_ms")
		c := newCycle(f.idx.PodCapacity())
		c.begin(f.dec, r, f.reg.Pods(), f.clock, true)
		defer c.end()
		tp := f.dec.pipe.Load().pickers[PolicyTTFT].(*ttftPicker)
		n := len(c.pods)
		c.layout(&tp.scoring)
		order := slices.Clone(c.lowest(min(rapid.IntRange(2, 4).Draw(rt, "k"), n)))
		raised := map[int]float64{}
		for _, i := range order {
			if rapid.Bool().Draw(rt, "raise") {
				c.est[i].TotalMs += rapid.SampledFrom([]float64{0.001, 0.5, 3, 2000}).Draw(rt, "by")
				raised[i] = c.est[i].TotalMs
			}
		}
		best := order[0]
		for _, i := range order {
			if c.est[i].TotalMs < c.est[best].TotalMs {
				best = i
			}
		}
		tot := pricedAll(f, r, tp)(raised)
		if tot[best] != c.est[best].TotalMs {
			rt.Fatalf("best %d: pruned total %v, full %v", best, c.est[best].TotalMs, tot[best])
		}
		key := tieKey(r)
		want, tied := best, 0
		for i := range tot {
			if tot[i] <= tot[best]+tieMs {
				tied++
				if rendezvous(key, c.order[i].Name) > rendezvous(key, c.order[want].Name) {
					want = i
				}
			}
		}
		if got := c.breakTie(best, tieMs); got != want {
			rt.Fatalf("tie within %v ms of %d (%v ms, %d tied): got %d (%v ms), want %d (%v ms)",
				tieMs, best, tot[best], tied, got, tot[got], want, tot[want])
		}
	})
}

// newFixtureT is newFixture for a rapid check.
// drawModel is a cost model whose profiles may have an attention term,
// and whose pods may run at their own calibrated speed: for each of pods a
// drawn factor is published by feeding a Calibrator exact observations of
// a pod that much slower or faster than its profile.
func drawModel(rt *rapid.T, cfg gorgo.Config, pods []PodInfo) *gorgo.Model {
	profiles := gorgo.DefaultProfiles()
	for i := range profiles {
		profiles[i].AttnTokens = rapid.SampledFrom([]float64{0, 8000, 53800}).Draw(rt, "attn_"+profiles[i].Name)
	}
	model, err := gorgo.New(cfg, profiles...)
	if err != nil {
		rt.Fatal(err)
	}
	cal := gorgo.NewCalibrator(model, gorgo.CalibratorConfig{MinSamples: 3, MaxStep: 1, RateBand: [2]float64{0.5, 2}, MaxRelSE: 1})
	for _, p := range pods {
		factor := rapid.SampledFrom([]float64{1, 1, 0.6, 0.8, 1.3}).Draw(rt, "factor_"+p.Name)
		if factor == 1 {
			continue
		}
		nominal := model.Nominal(p.Profile)
		for i := 1; i <= 40; i++ {
			u := 500 * i
			cal.Observe(gorgo.Observation{Profile: p.Profile, Pod: p.Name, UncachedTokens: u,
				TTFTMs: nominal.OverheadMs + model.PrefillMs(p.Profile, "", 0, u)*factor})
		}
	}
	return model
}

func newFixtureT(rt *rapid.T, pods int) *fixture {
	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		rt.Fatal(err)
	}
	f := &fixture{idx: idx, reg: NewRegistry(idx), clock: time.Unix(1000, 0)}
	for i := 0; i < pods; i++ {
		if _, _, err := f.reg.Upsert(PodInfo{Name: fmt.Sprintf("pod-%d", i), Endpoint: "http://x", Model: "m", Profile: "h100"}); err != nil {
			rt.Fatal(err)
		}
	}
	model, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		rt.Fatal(err)
	}
	if f.dec, err = NewDecider(DefaultConfig(), idx, f.reg, model, func() time.Time { return f.clock }); err != nil {
		rt.Fatal(err)
	}
	return f
}

// The per-request path allocates nothing once its buffers have grown.
func TestDecideAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	f := newFixture(t, 64, nil)
	c := chain(1, 40)
	for i, name := range []string{"pod-1", "pod-7", "pod-30"} {
		_ = f.idx.Register(f.pod(t, name).ID, index.TierGPU, c[:10*(i+1)])
	}
	f.pod(t, "pod-2").Admit(100, time.Second, f.clock)
	r := req(c)
	r.SessionID = "s"
	f.dec.Sessions().Note("s", "pod-7", f.clock)
	var dec Decision
	if err := f.dec.DecideInto(r, &dec); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(200, func() {
		if err := f.dec.DecideInto(r, &dec); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("DecideInto allocates %v times per decision", n)
	}
	var pl Placement
	remotes := []gorgo.Candidate{{Region: "b", Remote: true, Profile: "h100", PromptTokens: r.PromptTokens, CachedTokens: 640, RTTMs: 70}}
	shares := gorgo.NewShareTracker(time.Minute)
	if err := f.dec.PlaceInto(r, "a", true, remotes, shares, &pl); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(200, func() {
		if err := f.dec.PlaceInto(r, "a", true, remotes, shares, &pl); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("PlaceInto allocates %v times per placement", n)
	}
	if math.IsNaN(pl.Cost.Estimates[0].TotalMs) {
		t.Fatal("no estimate")
	}
}

// TestPodFactorRefresh: pods keep the rate correction they read, labelled
// with the model's PodFactorGen; a factor published after one decision
// must be the one the next decision prices with (a stale one would make
// the bounds wrong, and the pruning with them).
func TestPodFactorRefresh(t *testing.T) {
	f := newFixture(t, 8, nil)
	model := f.dec.Model()
	r := req(chain(1, 40))
	price := func() map[string]float64 {
		c := newCycle(f.idx.PodCapacity())
		c.begin(f.dec, r, f.reg.Pods(), f.clock, true)
		defer c.end()
		tp := f.dec.pipe.Load().pickers[PolicyTTFT].(*ttftPicker)
		c.layout(&tp.scoring)
		c.priceAll()
		rates := map[string]float64{}
		for i, p := range c.order {
			rates[p.Name] = c.terms[i].rate
		}
		return rates
	}
	check := func(when string) {
		t.Helper()
		for name, got := range price() {
			want, _ := model.RateFor("h100", name)
			if got != want {
				t.Fatalf("%s: %s priced at %v ms/token, want %v", when, name, got, want)
			}
		}
	}
	check("before any factor")
	cal := gorgo.NewCalibrator(model, gorgo.CalibratorConfig{MinSamples: 3, MaxStep: 1, RateBand: [2]float64{0.5, 2}, MaxRelSE: 1})
	for round, factor := range []float64{1.3, 0.7} {
		before := model.PodFactorGen()
		nominal := model.Nominal("h100")
		for i := 1; i <= 40; i++ {
			u := 500 * i
			cal.Observe(gorgo.Observation{Profile: "h100", Pod: "pod-3", UncachedTokens: u,
				TTFTMs: nominal.OverheadMs + model.PrefillMs("h100", "", 0, u)*factor})
		}
		if model.PodFactorGen() == before || model.PodFactor("pod-3") == 1 {
			t.Fatalf("round %d: the calibrator published nothing for pod-3", round)
		}
		check(fmt.Sprintf("after publishing %v", factor))
	}
}
