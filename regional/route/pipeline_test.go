package route

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// Each stage of the pipeline on its own: a cycle begun for a request over
// the fixture's pods, one stage applied, its effect checked.

func (f *fixture) cycle(r *Request) *cycle {
	c := newCycle(f.idx.PodCapacity())
	c.begin(f.dec, r, f.reg.Pods(), f.clock, false)
	return c
}

func podNames(ps []*Pod) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func wantPods(t *testing.T, c *cycle, stage string, want ...string) {
	t.Helper()
	if got := podNames(c.pods); !slices.Equal(got, want) {
		t.Fatalf("after %s: pods %v, want %v", stage, got, want)
	}
}

func TestExcludeFilter(t *testing.T) {
	f := newFixture(t, 3, nil)
	r := req(chain(1, 2))
	r.Exclude = []*Pod{f.pod(t, "pod-1")}
	c := f.cycle(r)
	excludeFilter{}.apply(c)
	wantPods(t, c, "retried", "pod-0", "pod-2")
	if c.filtered["retried"] != 1 {
		t.Fatalf("filtered %v", c.filtered)
	}
}

func TestAliveFilter(t *testing.T) {
	f := newFixture(t, 3, nil)
	c := f.cycle(req(chain(1, 2)))
	_ = f.idx.RemovePod(f.pod(t, "pod-0").ID) // gone from the index, not yet from the snapshot
	aliveFilter{}.apply(c)
	wantPods(t, c, FilterAlive, "pod-1", "pod-2")
	if c.filtered[FilterAlive] != 1 {
		t.Fatalf("filtered %v", c.filtered)
	}
}

func TestModelFilter(t *testing.T) {
	f := newFixture(t, 0, nil)
	for _, p := range []PodInfo{{Name: "a", Model: "m"}, {Name: "b", Model: "other"}, {Name: "c"}} {
		if _, _, err := f.reg.Upsert(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		model string
		want  []string
	}{{"m", []string{"a", "c"}}, {"other", []string{"b", "c"}}, {"", []string{"a", "b", "c"}}} {
		r := req(chain(1, 2))
		r.Model = tc.model
		c := f.cycle(r)
		modelFilter{}.apply(c)
		wantPods(t, c, FilterModel, tc.want...)
	}
}

func TestHealthyFilter(t *testing.T) {
	f := newFixture(t, 3, nil)
	for range 5 {
		f.reg.Report(f.pod(t, "pod-2"), false, f.clock, DefaultOutlierConfig())
	}
	c := f.cycle(req(chain(1, 2)))
	healthyFilter{}.apply(c)
	wantPods(t, c, FilterHealthy, "pod-0", "pod-1")
	// Back after the ejection time.
	f.clock = f.clock.Add(DefaultOutlierConfig().BaseEjection)
	c = f.cycle(req(chain(1, 2)))
	healthyFilter{}.apply(c)
	wantPods(t, c, FilterHealthy, "pod-0", "pod-1", "pod-2")
}

func TestBoundedLoadFilter(t *testing.T) {
	f := newFixture(t, 4, nil)
	for range 5 {
		f.pod(t, "pod-0").Admit(0, 0, f.clock)
	}
	f.pod(t, "pod-1").Admit(0, 0, f.clock)
	// 6 in flight; factor 2: each of 4 equal pods may hold ceil(2*7/4) = 4.
	c := f.cycle(req(chain(1, 2)))
	boundedLoadFilter{factor: 2}.apply(c)
	wantPods(t, c, FilterBoundedLoad, "pod-1", "pod-2", "pod-3")
	// Factor 4: ceil(4*7/4) = 7 > 5+1: nobody is over.
	c = f.cycle(req(chain(1, 2)))
	boundedLoadFilter{factor: 4}.apply(c)
	wantPods(t, c, FilterBoundedLoad, "pod-0", "pod-1", "pod-2", "pod-3")
}

func TestNewSessionFilter(t *testing.T) {
	f := newFixture(t, 4, nil)
	for range 2 {
		f.pod(t, "pod-0").Admit(0, 0, f.clock)
	}
	f.pod(t, "pod-2").Admit(0, 0, f.clock)
	r := req(chain(1, 2))
	// No session: nothing to place.
	c := f.cycle(r)
	newSessionFilter{}.apply(c)
	wantPods(t, c, FilterNewSession, "pod-0", "pod-1", "pod-2", "pod-3")
	// A new session: within one request of the least loaded.
	r.SessionID = "new"
	c = f.cycle(r)
	newSessionFilter{}.apply(c)
	wantPods(t, c, FilterNewSession, "pod-1", "pod-2", "pod-3")
	// A pinned session: left to affinity.
	f.dec.Sessions().Note("new", "pod-0", f.clock)
	c = f.cycle(r)
	newSessionFilter{}.apply(c)
	wantPods(t, c, FilterNewSession, "pod-0", "pod-1", "pod-2", "pod-3")
}

// scored runs the ttft picker's candidate set-up with only the scorer s.
func scored(f *fixture, r *Request, s scorer) *cycle {
	c := f.cycle(r)
	(&ttftPicker{scoring: newScoring([]scorer{s}), topK: 1}).pick(c, &Decision{})
	c.priceAll() // the picker prices only what can win
	return c
}

func candOf(t *testing.T, c *cycle, pod string) gorgo.Candidate {
	t.Helper()
	for i, p := range c.order {
		if p.Name == pod {
			return c.candidate(i)
		}
	}
	t.Fatalf("no candidate %s", pod)
	return gorgo.Candidate{}
}

func TestPrefixScorer(t *testing.T) {
	f := newFixture(t, 2, nil)
	cc := chain(1, 10)
	_ = f.idx.Register(f.pod(t, "pod-1").ID, index.TierGPU, cc[:4])
	r := req(cc)
	c := scored(f, r, prefixScorer{weight: 0.5})
	if got := candOf(t, c, "pod-1").CachedTokens; got != 4*64/2 {
		t.Fatalf("cached tokens %d, want %d", got, 4*64/2)
	}
	if got := candOf(t, c, "pod-0").CachedTokens; got != 0 {
		t.Fatalf("cold pod: %d", got)
	}
}

func TestQueueScorer(t *testing.T) {
	f := newFixture(t, 2, nil)
	rate, _ := f.dec.model.Rate("h100")
	work := time.Duration(1000 * rate * float64(time.Millisecond))
	f.pod(t, "pod-0").Admit(1000, work, f.clock)
	c := scored(f, req(chain(1, 2)), queueScorer{weight: 1})
	if got := candOf(t, c, "pod-0").PendingPrefillTokens; got < 999 || got > 1000 {
		t.Fatalf("backlog %d tokens, want ~1000", got)
	}
	if got := candOf(t, c, "pod-1").PendingPrefillTokens; got != 0 {
		t.Fatalf("idle pod: %d", got)
	}
}

func TestRunningAndKVUtilScorers(t *testing.T) {
	f := newFixture(t, 2, nil)
	f.pod(t, "pod-0").Admit(0, 0, f.clock)
	f.pod(t, "pod-0").Admit(0, 0, f.clock)
	c := scored(f, req(chain(1, 2)), runningScorer{perRequestMs: 3})
	if got := candOf(t, c, "pod-0").ExtraMs; got != 6 {
		t.Fatalf("running: %v ms, want 6", got)
	}
	f.pod(t, "pod-1").SetKVUtil(0.9)
	f.pod(t, "pod-0").SetKVUtil(0.5)
	c = scored(f, req(chain(1, 2)), kvUtilScorer{fullMs: 100})
	if got := candOf(t, c, "pod-1").ExtraMs; got < 49.99 || got > 50.01 {
		t.Fatalf("kv at 90%%: %v ms, want 50", got)
	}
	if got := candOf(t, c, "pod-0").ExtraMs; got != 0 {
		t.Fatalf("kv at 50%%: %v ms, want 0", got)
	}
}

func TestAffinityScorer(t *testing.T) {
	f := newFixture(t, 2, nil)
	cc := chain(1, 10)
	_ = f.idx.Register(f.pod(t, "pod-1").ID, index.TierGPU, cc)
	r := req(cc)
	r.SessionID = "s"
	f.dec.Sessions().Note("s", "pod-1", f.clock)
	rate, _ := f.dec.model.Rate("h100")
	s := affinityScorer{weight: 1, bonusMs: 50, cacheWeight: 1, thick: 2}
	c := scored(f, r, s)
	if got, want := candOf(t, c, "pod-1").ExtraMs, -(50 + 640*rate); got != want {
		t.Fatalf("pinned pod: %v ms, want %v", got, want)
	}
	if got := candOf(t, c, "pod-0").ExtraMs; got != 0 {
		t.Fatalf("other pod: %v", got)
	}
	// Thick: two requests of the session in flight; no bonus.
	f.dec.Sessions().Begin("s", "pod-1", f.clock)
	f.dec.Sessions().Begin("s", "pod-1", f.clock)
	c = scored(f, r, s)
	if got := candOf(t, c, "pod-1").ExtraMs; got != 0 {
		t.Fatalf("thick session: %v", got)
	}
}

func TestPickers(t *testing.T) {
	f := newFixture(t, 3, nil)
	r := req(chain(1, 2))
	var order []string
	for range 6 {
		c := f.cycle(r)
		order = append(order, c.pods[roundRobinPicker{}.pick(c, &Decision{})].Name)
	}
	if order[0] == order[1] || order[0] != order[3] || order[2] != order[5] {
		t.Fatalf("round robin %v", order)
	}
	f.pod(t, "pod-0").Admit(0, 0, f.clock)
	f.pod(t, "pod-2").Admit(0, 0, f.clock)
	for range 3 {
		c := f.cycle(r)
		if got := c.pods[leastLoadedPicker{}.pick(c, &Decision{})].Name; got != "pod-1" {
			t.Fatalf("least loaded chose %s", got)
		}
	}
	r.SessionID = "abc"
	c := f.cycle(r)
	first := c.pods[sessionHashPicker{}.pick(c, &Decision{})].Name
	c.pods = slices.Clone(c.pods)
	slices.Reverse(c.pods)
	if got := c.pods[sessionHashPicker{}.pick(c, &Decision{})].Name; got != first {
		t.Fatalf("session hash depends on the order of the pods: %s then %s", first, got)
	}
	// ttft: the warm pod, explained.
	cc := chain(2, 20)
	_ = f.idx.Register(f.pod(t, "pod-2").ID, index.TierGPU, cc)
	c = f.cycle(req(cc))
	dec := &Decision{}
	tp := f.dec.pipe.Load().pickers[PolicyTTFT]
	if got := c.pods[tp.pick(c, dec)].Name; got != "pod-2" || dec.Reason != "lowest_ttft" || len(dec.Top) != 3 || dec.Top[0].Pod != "pod-2" {
		t.Fatalf("ttft chose %s: %+v", got, dec)
	}
}

// TestBacklogShiftsOncePerWave: three requests booked 100 ms of prefill each
// all answer 10 s late, one after the other; the backlog model shifts once
// for the wave and is drained when the last one answers, where shifting
// by each one's lateness left 20 s of phantom backlog on an idle pod.
func TestBacklogShiftsOncePerWave(t *testing.T) {
	f := newFixture(t, 1, nil)
	p := f.pod(t, "pod-0")
	t0 := f.clock
	var tickets []*Ticket
	for range 3 {
		tickets = append(tickets, p.Admit(100, 100*time.Millisecond, t0))
	}
	for i, tk := range tickets {
		tk.FirstByte(t0.Add(10*time.Second + time.Duration(i)*100*time.Millisecond))
	}
	end := t0.Add(10*time.Second + 200*time.Millisecond)
	if b := p.PrefillBacklog(end); b != 0 {
		t.Fatalf("backlog %v after the wave's last first byte, want 0", b)
	}
	if got := BacklogTokens(p, end, 0.36); got != 0 {
		t.Fatalf("backlog %d tokens, want 0", got)
	}
	// A request still before its first byte keeps its tokens ahead even
	// when the model thinks its work done.
	p.Admit(500, 10*time.Millisecond, end)
	if got := BacklogTokens(p, end.Add(time.Minute), 0.36); got != 500 {
		t.Fatalf("stalled request: %d tokens ahead, want 500", got)
	}
}

// TestEligibleKept: one cycle, decision after decision, keeps the checks'
// outcome on the snapshot and drops it at every change the checks would
// see: a pod ejected, its ejection over, a pod lapsed and back, a pod gone
// from the index before the snapshot, a new description, a new pod.
func TestEligibleKept(t *testing.T) {
	f := newFixture(t, 4, func(c *Config) { c.Filters = []string{FilterAlive, FilterModel, FilterHealthy} })
	c := newCycle(f.idx.PodCapacity())
	check := func(step string, kept bool, want ...string) {
		t.Helper()
		r := req(chain(1, 2))
		snap := f.reg.snapshot()
		c.begin(f.dec, r, *snap, f.clock, false)
		c.snap, c.whole = snap, true
		hit := c.elig.valid(c, eligibleKey{snap: snap, changes: f.reg.changes.Load(), live: f.idx.LivenessGen(),
			on: 1<<checkAlive | 1<<checkModel | 1<<checkHealthy, model: c.cat.models["m"]}, f.clock.UnixNano())
		for _, fl := range f.dec.pipe.Load().filters {
			fl.apply(c)
		}
		if hit != kept {
			t.Errorf("%s: kept outcome used %v, want %v", step, hit, kept)
		}
		wantPods(t, c, step, want...)
		fresh := f.cycle(r)
		for _, fl := range f.dec.pipe.Load().filters {
			fl.apply(fresh)
		}
		if !reflect.DeepEqual(c.filtered, fresh.filtered) || c.load != fresh.load {
			t.Errorf("%s: kept %v %+v, fresh %v %+v", step, c.filtered, c.load, fresh.filtered, fresh.load)
		}
		c.end()
	}
	check("first", false, "pod-0", "pod-1", "pod-2", "pod-3")
	check("again", true, "pod-0", "pod-1", "pod-2", "pod-3")
	f.pod(t, "pod-1").Admit(100, time.Millisecond, f.clock) // load is read anew, never kept
	check("load", true, "pod-0", "pod-1", "pod-2", "pod-3")
	f.reg.Eject(f.pod(t, "pod-2"), f.clock, DefaultOutlierConfig())
	check("ejected", false, "pod-0", "pod-1", "pod-3")
	check("still ejected", true, "pod-0", "pod-1", "pod-3")
	f.clock = f.clock.Add(DefaultOutlierConfig().BaseEjection)
	check("ejection over", false, "pod-0", "pod-1", "pod-2", "pod-3")
	f.pod(t, "pod-3").SetLapsed(true)
	check("lapsed", false, "pod-0", "pod-1", "pod-2")
	f.pod(t, "pod-3").SetLapsed(false)
	check("back", false, "pod-0", "pod-1", "pod-2", "pod-3")
	_ = f.idx.RemovePod(f.pod(t, "pod-0").ID)
	check("gone from the index", false, "pod-1", "pod-2", "pod-3")
	if _, _, err := f.reg.Upsert(PodInfo{Name: "pod-1", Endpoint: "http://x", Model: "other", Profile: "h100"}); err != nil {
		t.Fatal(err)
	}
	check("other model", false, "pod-2", "pod-3")
	if _, _, err := f.reg.Upsert(PodInfo{Name: "pod-4", Endpoint: "http://y", Model: "m", Profile: "h100"}); err != nil {
		t.Fatal(err)
	}
	check("new pod", false, "pod-2", "pod-3", "pod-4")
	check("settled", true, "pod-2", "pod-3", "pod-4")
}
