package route

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/index"
)

// mixedFixture is a region of pods with the given profiles, named pod-0...
func mixedFixture(t fataler, mut func(*Config), profiles ...string) *fixture {
	t.Helper()
	f := newFixture(t, 0, mut)
	for i, prof := range profiles {
		if _, _, err := f.reg.Upsert(PodInfo{Name: fmt.Sprintf("pod-%d", i), Endpoint: "http://x", Model: "m", Profile: prof}); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func pickWith(t *testing.T, f *fixture, r *Request, policy string) *Decision {
	t.Helper()
	r.Policy = policy
	d, err := f.dec.Decide(r)
	if err != nil {
		t.Fatal(err)
	}
	if d.Reason != policy {
		t.Fatalf("reason %q, want %q", d.Reason, policy)
	}
	return d
}

// TestWeightedRoundRobinPicker: over whole cycles a B200 (2.28x an H100's
// prefill speed) takes about 2.28 turns for each H100's one, in an even
// interleaving; a pod that joins later does not take a burst.
func TestWeightedRoundRobinPicker(t *testing.T) {
	f := mixedFixture(t, nil, "b200", "h100", "h100")
	counts := map[string]int{}
	for range 428 { // 100 rounds of 2.28 + 1 + 1
		counts[pickWith(t, f, req(chain(1, 2)), PolicyWeightedRoundRobin).PodName]++
	}
	ratio := float64(counts["pod-0"]) / float64(counts["pod-1"])
	if math.Abs(ratio-0.36/0.158) > 0.05 || counts["pod-1"] != counts["pod-2"] {
		t.Fatalf("counts %v: b200/h100 ratio %.3f, want %.3f", counts, ratio, 0.36/0.158)
	}
	if _, _, err := f.reg.Upsert(PodInfo{Name: "pod-3", Endpoint: "http://x", Model: "m", Profile: "h100"}); err != nil {
		t.Fatal(err)
	}
	run := 0
	for range 10 {
		if pickWith(t, f, req(chain(1, 2)), PolicyWeightedRoundRobin).PodName == "pod-3" {
			run++
		}
	}
	if run > 3 {
		t.Fatalf("a joining pod took %d of the next 10 turns", run)
	}
}

// TestWeightedRoundRobinMatchesMerge: from a fresh start over a fixed set of
// pods, the first N picks are exactly the N smallest of every pod's
// multiples of its stride (0, stride, 2 stride, ...), ties by name: stride
// scheduling's definition, computed here by brute force.
func TestWeightedRoundRobinMatchesMerge(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		profiles := rapid.SliceOfN(rapid.SampledFrom([]string{"h100", "h200", "b200"}), 1, 6).Draw(rt, "profiles")
		n := rapid.IntRange(1, 200).Draw(rt, "picks")
		f := mixedFixture(rt, nil, profiles...)
		got := map[string]int{}
		for range n {
			d, err := f.dec.Decide(&Request{Chain: chain(1, 1), BlockSize: 64, PromptTokens: 64, Policy: PolicyWeightedRoundRobin})
			if err != nil {
				rt.Fatal(err)
			}
			got[d.PodName]++
		}
		type turn struct {
			pass float64
			pod  string
		}
		var all []turn
		for _, p := range f.reg.Pods() {
			stride := 1 / f.dec.speed(p)
			for j := 0; j < n; j++ {
				all = append(all, turn{float64(j) * stride, p.Name})
			}
		}
		sort.Slice(all, func(i, j int) bool {
			if all[i].pass != all[j].pass {
				return all[i].pass < all[j].pass
			}
			return all[i].pod < all[j].pod
		})
		want := map[string]int{}
		for _, tt := range all[:n] {
			want[tt.pod]++
		}
		for _, p := range f.reg.Pods() {
			if got[p.Name] != want[p.Name] {
				rt.Fatalf("after %d picks %s took %d turns, the merge says %d (%v vs %v)", n, p.Name, got[p.Name], want[p.Name], got, want)
			}
		}
	})
}

// TestWeightedLeastLoadedPicker: idle pods are taken fastest first; then in
// flight per unit of speed decides.
func TestWeightedLeastLoadedPicker(t *testing.T) {
	f := mixedFixture(t, nil, "h100", "b200", "h100")
	if d := pickWith(t, f, req(chain(1, 2)), PolicyWeightedLeastLoaded); d.PodName != "pod-1" {
		t.Fatalf("idle fleet: chose %s, want the b200", d.PodName)
	}
	// b200 with 2 in flight: (2+1)/2.28 = 1.32 > (0+1)/1: an idle h100.
	f.pod(t, "pod-1").Admit(0, 0, f.clock)
	f.pod(t, "pod-1").Admit(0, 0, f.clock)
	if d := pickWith(t, f, req(chain(1, 2)), PolicyWeightedLeastLoaded); d.PodName == "pod-1" {
		t.Fatalf("chose the b200 with 2 in flight over idle h100s")
	}
}

// TestLeastOutstandingTokensPicker: the pod whose prompt tokens in flight
// drain first at its speed, this request's included; Done releases them.
func TestLeastOutstandingTokensPicker(t *testing.T) {
	f := mixedFixture(t, nil, "h100", "h100", "b200")
	r := req(chain(1, 40)) // 2,570 tokens
	first := pickWith(t, f, r, PolicyLeastOutstandingTokens)
	if first.PodName != "pod-2" {
		t.Fatalf("idle fleet: chose %s, want the b200", first.PodName)
	}
	ticket := f.dec.Admit(first)
	if got := f.pod(t, "pod-2").Load().OutstandingTokens; got != int64(r.PromptTokens) {
		t.Fatalf("outstanding %d, want %d", got, r.PromptTokens)
	}
	// b200: (2570+2570) x 0.158 = 812 ms of prefill, an idle h100: 2570 x
	// 0.36 = 925 ms: the b200 still drains first.
	if d := pickWith(t, f, req(chain(1, 40)), PolicyLeastOutstandingTokens); d.PodName != "pod-2" {
		t.Fatalf("chose %s, want the b200 (5140 tokens at 2.28x drain before 2570 at 1x)", d.PodName)
	}
	big := req(chain(2, 400)) // 25,610 tokens
	f.dec.Admit(pickWith(t, f, big, PolicyLeastOutstandingTokens))
	if d := pickWith(t, f, req(chain(1, 40)), PolicyLeastOutstandingTokens); d.PodName == "pod-2" {
		t.Fatalf("chose the b200 with %d tokens outstanding", f.pod(t, "pod-2").Load().OutstandingTokens)
	}
	ticket.Done(f.clock)
	if got := f.pod(t, "pod-2").Load().OutstandingTokens; got != int64(big.PromptTokens) {
		t.Fatalf("after Done: outstanding %d, want %d", got, big.PromptTokens)
	}
}

// TestBoundedAffinityPicker: a session sticks to its pod until the pod
// reaches its bound, then overflows to the next pod on the ring, and comes
// back when the load drains; no pod ever exceeds its bound.
func TestBoundedAffinityPicker(t *testing.T) {
	f := mixedFixture(t, nil, "h100", "h100", "h100", "b200")
	r := req(chain(1, 2))
	r.SessionID = "conv-7"
	home := pickWith(t, f, r, PolicyBoundedAffinity).PodName
	for range 5 {
		if d := pickWith(t, f, r, PolicyBoundedAffinity); d.PodName != home {
			t.Fatalf("session moved from %s to %s with no load", home, d.PodName)
		}
	}
	var tickets []*Ticket
	moved := false
	for range 30 {
		d := pickWith(t, f, r, PolicyBoundedAffinity)
		if d.PodName != home {
			moved = true
		}
		tickets = append(tickets, f.dec.Admit(d))
		var total int64
		sum := 0.0
		for _, p := range f.reg.Pods() {
			total += p.inflight.Load()
			sum += f.dec.speed(p)
		}
		for _, p := range f.reg.Pods() {
			// Admitted under the bound of the total before it: at most
			// ceil(1.25 x total x speed/sum).
			if lim := int64(math.Ceil(1.25 * float64(total) * f.dec.speed(p) / sum)); p.inflight.Load() > lim {
				t.Fatalf("%s holds %d in flight, bound %d", p.Name, p.inflight.Load(), lim)
			}
		}
	}
	if !moved {
		t.Fatal("30 requests of one session never overflowed its pod")
	}
	for _, tk := range tickets {
		tk.Done(f.clock)
	}
	if d := pickWith(t, f, r, PolicyBoundedAffinity); d.PodName != home {
		t.Fatalf("after the load drained the session went to %s, not home %s", d.PodName, home)
	}
}

// TestHashRingMatchesNaive: over random fleets, loads, candidate subsets
// and keys, the ring's binary search and walk pick exactly what a scan of
// the sorted list of every point picks.
func TestHashRingMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		vn := rapid.IntRange(1, 40).Draw(rt, "virtual_nodes")
		factor := rapid.SampledFrom([]float64{1, 1.25, 2}).Draw(rt, "factor")
		profiles := rapid.SliceOfN(rapid.SampledFrom([]string{"h100", "h200", "b200"}), 1, 10).Draw(rt, "profiles")
		f := mixedFixture(rt, func(c *Config) {
			c.BoundedAffinity = BoundedAffinityConfig{LoadFactor: factor, VirtualNodes: vn}
		}, profiles...)
		for _, p := range f.reg.Pods() {
			for range rapid.IntRange(0, 6).Draw(rt, "load") {
				p.Admit(0, 0, f.clock)
			}
		}
		ring := newHashRing(f.reg.Pods(), f.dec, vn)
		for range 20 {
			r := req(chain(1, 1))
			r.SessionID = fmt.Sprint(rapid.Uint64().Draw(rt, "key"))
			c := f.cycle(r)
			keep := rapid.SliceOfN(rapid.Bool(), len(c.pods), len(c.pods)).Draw(rt, "keep")
			var cands []*Pod
			for i, p := range c.pods {
				if keep[i] {
					cands = append(cands, p)
				}
			}
			if len(cands) == 0 {
				continue
			}
			c.pods = cands
			got := ring.pick(c, r.SessionID, factor)
			want := naiveBoundedAffinity(f.dec, c.pods, r)
			if got != want {
				rt.Fatalf("key %s: ring chose %s, naive %s", r.SessionID, c.pods[got].Name, c.pods[want].Name)
			}
			if !slices.Contains(cands, c.pods[got]) {
				rt.Fatalf("chose a non-candidate")
			}
		}
	})
}

// TestPrecisePrefixPicker follows llm-d's scoring: prefix 2 x normalised
// match, + KV free, + normalised queue.
func TestPrecisePrefixPicker(t *testing.T) {
	f := mixedFixture(t, nil, "h100", "h100", "h100")
	cc := chain(1, 40)
	_ = f.idx.Register(f.pod(t, "pod-0").ID, index.TierGPU, cc[:30])
	_ = f.idx.Register(f.pod(t, "pod-1").ID, index.TierGPU, cc[:10])
	// pod-0: prefix 1, kv 1, queue 1 = 4; pod-1: 0 + 1 + 1 = 2; pod-2: 2.
	if d := pickWith(t, f, req(cc), PolicyPrecisePrefix); d.PodName != "pod-0" || d.MatchedBlocks != 30 {
		t.Fatalf("chose %s (%d blocks), want pod-0", d.PodName, d.MatchedBlocks)
	}
	// A long waiting queue and a full KV cache cancel the longest prefix
	// (pod-1's match is the minimum, so its prefix score is 0):
	f.pod(t, "pod-0").SetEngineQueue(-1, 8)
	f.pod(t, "pod-0").SetKVUtil(1)
	f.pod(t, "pod-2").SetKVUtil(0.5)
	// pod-0: 2+0+0 = 2; pod-1: 0+1+1 = 2; pod-2: 0+0.5+1 = 1.5.
	seen := map[string]bool{}
	for range 6 {
		seen[pickWith(t, f, req(cc), PolicyPrecisePrefix).PodName] = true
	}
	if seen["pod-2"] || !seen["pod-0"] || !seen["pod-1"] {
		t.Fatalf("ties should rotate between pod-0 and pod-1 only: %v", seen)
	}
}

// TestFairBaselinesCountOtherReplicas: weighted_least_loaded and
// bounded_affinity count the requests the region's other replicas report
// in flight on a pod, as least_loaded and Meridian's own policy do: a pod
// another replica has loaded is not idle to them.
func TestFairBaselinesCountOtherReplicas(t *testing.T) {
	f := mixedFixture(t, nil, "h100", "b200", "h100")
	// Idle, the b200 is taken first; with 5 of another replica's requests
	// on it ((5+1)/2.28 > 1/1) an idle h100 is.
	f.reg.SetPeerLoads("r2", 1, 1, []PeerLoad{{Pod: "pod-1", InFlight: 5}}, -1, f.clock)
	if d := pickWith(t, f, req(chain(1, 2)), PolicyWeightedLeastLoaded); d.PodName == "pod-1" {
		t.Fatal("weighted_least_loaded chose the b200 another replica holds 5 requests on")
	}

	g := mixedFixture(t, nil, "h100", "h100", "h100", "b200")
	r := req(chain(1, 2))
	r.SessionID = "conv-7"
	home := pickWith(t, g, r, PolicyBoundedAffinity).PodName
	// Another replica's 4 requests on the session's home pod put it over
	// its bound (ceil(1.25 x 5 x its share of the speed) is at most 3 < 5):
	// the session overflows (the bounded-load filter before the ring and
	// the ring's own walk both count the region's in flight).
	g.reg.SetPeerLoads("r2", 1, 1, []PeerLoad{{Pod: home, InFlight: 4}}, -1, g.clock)
	if d := pickWith(t, g, r, PolicyBoundedAffinity); d.PodName == home {
		t.Fatalf("bounded_affinity kept the session on %s, which another replica loaded over its bound", home)
	}
}
