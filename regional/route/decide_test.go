package route

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

type fixture struct {
	idx   *index.Index
	reg   *Registry
	dec   *Decider
	clock time.Time
}

// fataler is what the fixtures need of a test: *testing.T or *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

func newFixture(t fataler, pods int, mut func(*Config)) *fixture {
	t.Helper()
	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{idx: idx, reg: NewRegistry(idx), clock: time.Unix(1000, 0)}
	for i := 0; i < pods; i++ {
		if _, _, err := f.reg.Upsert(PodInfo{Name: fmt.Sprintf("pod-%d", i), Endpoint: fmt.Sprintf("http://127.0.0.1:%d", 9000+i), Model: "m", Profile: "h100"}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	if mut != nil {
		mut(&cfg)
	}
	model, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	f.dec, err = NewDecider(cfg, idx, f.reg, model, func() time.Time { return f.clock })
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) pod(t *testing.T, name string) *Pod {
	p, ok := f.reg.Get(name)
	if !ok {
		t.Fatalf("no pod %s", name)
	}
	return p
}

func chain(prefix uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = prefix<<32 | uint64(i+1)
	}
	return c
}

func req(c []uint64) *Request {
	return &Request{Model: "m", Chain: c, BlockSize: 64, PromptTokens: len(c)*64 + 10}
}

func TestDecidePrefersCachedPrefix(t *testing.T) {
	f := newFixture(t, 4, nil)
	c := chain(1, 40)
	_ = f.idx.Register(f.pod(t, "pod-2").ID, index.TierGPU, c[:30])
	_ = f.idx.Register(f.pod(t, "pod-1").ID, index.TierGPU, c[:5])
	d, err := f.dec.Decide(req(c))
	if err != nil {
		t.Fatal(err)
	}
	if d.PodName != "pod-2" || d.MatchedBlocks != 30 || d.CachedTokens != 30*64 || d.Reason != "lowest_ttft" {
		t.Fatalf("decision %+v", d)
	}
	if len(d.Top) != 3 || d.Top[0].Pod != "pod-2" || d.Top[1].Pod != "pod-1" {
		t.Fatalf("top %+v", d.Top)
	}
}

func TestDecideNoPrefixSpreadsByLoad(t *testing.T) {
	f := newFixture(t, 4, nil)
	seen := map[string]int{}
	for i := 0; i < 8; i++ {
		d, err := f.dec.Decide(req(chain(uint64(100+i), 10)))
		if err != nil {
			t.Fatal(err)
		}
		f.dec.Admit(d) // stays in flight
		seen[d.PodName]++
	}
	for name, n := range seen {
		if n != 2 {
			t.Fatalf("cold requests not spread by load: %v (%s)", seen, name)
		}
	}
}

func TestDecideLoadOutweighsSmallPrefix(t *testing.T) {
	f := newFixture(t, 2, nil)
	c := chain(1, 10)
	warm := f.pod(t, "pod-0")
	_ = f.idx.Register(warm.ID, index.TierGPU, c[:2])
	warm.Admit(50000, 18*time.Second, f.clock) // 50k prefill tokens queued on the warm pod
	d, err := f.dec.Decide(req(c))
	if err != nil {
		t.Fatal(err)
	}
	if d.PodName != "pod-1" {
		t.Fatalf("queued pod chosen for a 128-token saving: %+v", d)
	}
}

// A hot prefix held by one pod: bounded load keeps every pod within
// BoundedLoadFactor x its fair share of in-flight requests.
func TestDecideHotPrefixBoundedLoad(t *testing.T) {
	f := newFixture(t, 8, nil)
	c := chain(7, 32)
	_ = f.idx.Register(f.pod(t, "pod-3").ID, index.TierGPU, c)
	counts := map[string]int{}
	var tickets []*Ticket
	for i := 0; i < 80; i++ {
		d, err := f.dec.Decide(req(c))
		if err != nil {
			t.Fatal(err)
		}
		counts[d.PodName]++
		tickets = append(tickets, f.dec.Admit(d))
	}
	limit := int(f.dec.Config().BoundedLoadFactor * 80 / 8)
	for name, n := range counts {
		if n > limit {
			t.Fatalf("%s took %d of 80 in-flight requests: %v", name, n, counts)
		}
	}
	if counts["pod-3"] < 10 {
		t.Fatalf("the warm pod should still take its share: %v", counts)
	}
	for _, tk := range tickets {
		tk.Done(f.clock)
	}
	for _, p := range f.reg.Pods() {
		if l := p.Load(); l.InFlight != 0 || l.PendingPrefill != 0 {
			t.Fatalf("%s load after all done: %+v", p.Name, l)
		}
	}
}

func TestDecideSessionAffinityAndThickSplit(t *testing.T) {
	f := newFixture(t, 4, func(c *Config) { c.ThickSession = 2 })
	r := req(chain(9, 4))
	r.SessionID = "s1"
	first, err := f.dec.Decide(r)
	if err != nil {
		t.Fatal(err)
	}
	f.dec.Admit(first).Done(f.clock)
	// Kept on its pod even though others are equally cold and idle.
	for i := 0; i < 5; i++ {
		d, _ := f.dec.Decide(r)
		f.dec.Admit(d).Done(f.clock)
		if d.PodName != first.PodName {
			t.Fatalf("session moved from %s to %s", first.PodName, d.PodName)
		}
	}
	// Concurrent requests past the threshold spread.
	pods := map[string]bool{}
	for i := 0; i < 4; i++ {
		d, _ := f.dec.Decide(r)
		f.dec.Admit(d)
		pods[d.PodName] = true
	}
	if len(pods) < 2 {
		t.Fatalf("thick session stayed on one pod: %v", pods)
	}
	if pin, _, _ := f.dec.Sessions().Pinned("s1", f.clock); pin != first.PodName {
		t.Fatalf("thick overflow moved the pin to %s", pin)
	}
}

func TestDecideFilters(t *testing.T) {
	f := newFixture(t, 3, nil)
	c := chain(3, 8)
	p0 := f.pod(t, "pod-0")
	_ = f.idx.Register(p0.ID, index.TierGPU, c)
	// Ejected: 5 consecutive failures.
	for i := 0; i < 5; i++ {
		f.reg.Report(p0, false, f.clock, DefaultOutlierConfig())
	}
	d, err := f.dec.Decide(req(c))
	if err != nil || d.PodName == "pod-0" || d.Filtered[FilterHealthy] != 1 {
		t.Fatalf("ejected pod chosen or not counted: %+v %v", d, err)
	}
	// Only one of three may be ejected at once (10%, at least one).
	p1 := f.pod(t, "pod-1")
	for i := 0; i < 5; i++ {
		f.reg.Report(p1, false, f.clock, DefaultOutlierConfig())
	}
	if p1.Ejected(f.clock) {
		t.Fatal("second pod ejected past the ejection cap")
	}
	// Readmitted after 30s.
	f.clock = f.clock.Add(31 * time.Second)
	d, _ = f.dec.Decide(req(c))
	if d.PodName != "pod-0" {
		t.Fatalf("readmitted warm pod not chosen: %+v", d)
	}
	// Wrong model.
	r := req(c)
	r.Model = "other"
	if _, err := f.dec.Decide(r); !errors.Is(err, ErrNoHealthyPod) {
		t.Fatalf("model filter: %v", err)
	}
	// A removed pod is never chosen.
	f.reg.Remove("pod-0")
	for i := 0; i < 10; i++ {
		d, err := f.dec.Decide(req(c))
		if err != nil || d.PodName == "pod-0" {
			t.Fatalf("removed pod: %+v %v", d, err)
		}
	}
}

func TestDecideTierWeighting(t *testing.T) {
	f := newFixture(t, 2, nil)
	c := chain(5, 20)
	_ = f.idx.Register(f.pod(t, "pod-0").ID, index.TierDisk, c)
	_ = f.idx.Register(f.pod(t, "pod-1").ID, index.TierGPU, c[:16])
	d, err := f.dec.Decide(req(c))
	if err != nil {
		t.Fatal(err)
	}
	// 20 blocks on disk are worth 10 on GPU: the 16 on GPU win.
	if d.PodName != "pod-1" {
		t.Fatalf("disk-tier prefix outranked a GPU one: %+v", d)
	}
}

func TestDecideBaselinePolicies(t *testing.T) {
	f := newFixture(t, 3, func(c *Config) { c.Policy = PolicyRoundRobin })
	var order []string
	for i := 0; i < 6; i++ {
		d, _ := f.dec.Decide(req(chain(1, 2)))
		order = append(order, d.PodName)
	}
	if order[0] == order[1] || order[0] != order[3] || order[1] != order[4] {
		t.Fatalf("round robin order %v", order)
	}
	r := req(chain(1, 2))
	r.Policy, r.SessionID = PolicySessionHash, "abc"
	first, _ := f.dec.Decide(r)
	for i := 0; i < 5; i++ {
		if d, _ := f.dec.Decide(r); d.PodName != first.PodName {
			t.Fatal("session hash not stable")
		}
	}
	r = req(chain(1, 2))
	r.Policy = PolicyLeastLoaded
	f.pod(t, "pod-0").Admit(0, 0, f.clock)
	f.pod(t, "pod-1").Admit(0, 0, f.clock)
	if d, _ := f.dec.Decide(r); d.PodName != "pod-2" {
		t.Fatalf("least loaded chose %s", d.PodName)
	}
}

func TestDecisionConfigValidate(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"policy":                func(c *Config) { c.Policy = "random" },
		"filters":               func(c *Config) { c.Filters = []string{"alive", "nope"} },
		"weights":               func(c *Config) { c.Weights = map[string]float64{"magic": 1} },
		"bounded_load_factor":   func(c *Config) { c.BoundedLoadFactor = 0.5 },
		"thick_session":         func(c *Config) { c.ThickSession = 0 },
		"affinity_cache_weight": func(c *Config) { c.AffinityCacheWeight = -1 },
		"tier_weights":          func(c *Config) { c.TierWeights[2] = 2 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// On a mixed fleet the bound follows prefill speed: a B200 (2.3x an H100's
// prefill rate) may carry proportionally more of a hot prefix.
func TestDecideBoundedLoadWeightsBySpeed(t *testing.T) {
	f := newFixture(t, 0, func(c *Config) { c.BoundedLoadFactor = 2 })
	c := chain(11, 32)
	for i, prof := range []string{"b200", "h100", "h100", "h100"} {
		p, _, err := f.reg.Upsert(PodInfo{Name: fmt.Sprintf("pod-%d", i), Endpoint: "http://x", Model: "m", Profile: prof})
		if err != nil {
			t.Fatal(err)
		}
		_ = f.idx.Register(p.ID, index.TierGPU, c)
	}
	counts := map[string]int{}
	for i := 0; i < 40; i++ {
		d, err := f.dec.Decide(req(c))
		if err != nil {
			t.Fatal(err)
		}
		counts[d.PodName]++
		f.dec.Admit(d)
	}
	speed := func(p *Pod) float64 { return 1 / f.dec.model.Nominal(p.Info().Profile).PrefillMsPerToken }
	fast, slow := speed(f.pod(t, "pod-0")), speed(f.pod(t, "pod-1"))
	sum, k := fast+3*slow, f.dec.Config().BoundedLoadFactor
	if lim := int(k*41*fast/sum + 1); counts["pod-0"] > lim {
		t.Fatalf("b200 took %d, bound %d: %v", counts["pod-0"], lim, counts)
	}
	for _, name := range []string{"pod-1", "pod-2", "pod-3"} {
		if lim := int(k*41*slow/sum + 1); counts[name] > lim {
			t.Fatalf("%s took %d, bound %d: %v", name, counts[name], lim, counts)
		}
		if counts[name] >= counts["pod-0"] {
			t.Fatalf("the faster pod should carry more: %v", counts)
		}
	}
}

// TestDecideAffinityCacheWeight: a conversation's pinned pod holds its
// 2,560-token history behind a prefill backlog that makes an idle cold pod
// faster for this one request. Without the cache weight the conversation
// moves; with weight 1 it stays until the cold pod is faster by more than
// the history's prefill time, and then it moves.
func TestDecideAffinityCacheWeight(t *testing.T) {
	model, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rate, _ := model.Rate("h100")
	const history = 40 * 64
	qw := gorgo.DefaultConfig().QueueWeight
	bonus, penalty := DefaultConfig().AffinityBonusMs, DefaultConfig().RunningPenaltyMs
	// The warm pod's queue term at which the cold pod starts to win without
	// the cache weight, and with it.
	moveAt := history*rate + bonus - penalty
	moveAtWeighted := moveAt + history*rate
	decide := func(weight, queueMs float64) string {
		f := newFixture(t, 2, func(c *Config) { c.AffinityCacheWeight = weight })
		c := chain(7, 40)
		warm := f.pod(t, "pod-0")
		_ = f.idx.Register(warm.ID, index.TierGPU, c)
		r := req(c)
		r.SessionID = "conv"
		first, err := f.dec.Decide(r)
		if err != nil || first.PodName != "pod-0" {
			t.Fatalf("first turn: %+v, %v", first, err)
		}
		f.dec.Admit(first).Done(f.clock)
		// Work routed ahead of it that has not had its first byte (one
		// pending token: a backlog with nothing pending is no backlog).
		warm.Admit(1, time.Duration(queueMs/qw*float64(time.Millisecond)), f.clock)
		d, err := f.dec.Decide(r)
		if err != nil {
			t.Fatal(err)
		}
		return d.PodName
	}
	for _, tc := range []struct {
		weight, queueMs float64
		want            string
	}{
		{0, moveAt - 20, "pod-0"},
		{0, moveAt + 20, "pod-1"},
		{1, moveAt + 20, "pod-0"},
		{1, moveAtWeighted - 20, "pod-0"},
		{1, moveAtWeighted + 20, "pod-1"},
	} {
		if got := decide(tc.weight, tc.queueMs); got != tc.want {
			t.Errorf("affinity_cache_weight %v, warm pod's queue term %.0f ms (moves at %.0f / %.0f): chose %s, want %s",
				tc.weight, tc.queueMs, moveAt, moveAtWeighted, got, tc.want)
		}
	}
}

// TestPodLayout: the fields every decision reads of every pod (the other
// replicas' in-flight count among them: InFlight adds it) share one cache
// line, and a Pod is whole lines, so each one's starts a line.
func TestPodLayout(t *testing.T) {
	var p Pod
	for name, end := range map[string]uintptr{
		"peerInflight": unsafe.Offsetof(p.peerInflight) + unsafe.Sizeof(p.peerInflight),
		"peerPending":  unsafe.Offsetof(p.peerPending) + unsafe.Sizeof(p.peerPending),
		"lapsed":       unsafe.Offsetof(p.lapsed) + unsafe.Sizeof(p.lapsed),
	} {
		if end > 64 {
			t.Errorf("hot field %s ends at byte %d, past the first cache line", name, end)
		}
	}
	if sz := unsafe.Sizeof(p); sz%64 != 0 {
		t.Errorf("Pod is %d bytes, not whole cache lines", sz)
	}
}
