package route

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// TestTrendAdjust is the rule: a remote candidate is charged the growth
// of this region's backlog since its summary was built (now - age -
// RTT/2), in its profile's tokens; a fall charges nothing; local
// candidates are left alone.
func TestTrendAdjust(t *testing.T) {
	model, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rate, _ := model.Rate("b200")
	t0 := time.Unix(1000, 0)
	var tr Trend
	tr.Note(t0, 1000)
	tr.Note(t0.Add(time.Second), 4000)
	tr.Note(t0.Add(2*time.Second), 9000)
	now := t0.Add(2 * time.Second)
	cands := []gorgo.Candidate{
		{Region: "us", Pod: "p1", Profile: "b200", PendingPrefillTokens: 7},
		// Built at now - 1.45 s - 50 ms = t0 + 0.5 s: the reference is
		// t0's sample, so the growth is 8,000 ms.
		{Region: "eu", Remote: true, Profile: "b200", PendingPrefillTokens: 100, SummaryAge: 1450 * time.Millisecond, RTTMs: 100},
		// Built at now: nothing unseen.
		{Region: "ap", Remote: true, Profile: "b200", PendingPrefillTokens: 5, RTTMs: 0},
	}
	tr.Adjust(cands, now, model)
	if got, want := cands[1].PendingPrefillTokens, 100+int(8000/rate); got != want {
		t.Errorf("eu pending = %d, want %d", got, want)
	}
	if cands[0].PendingPrefillTokens != 7 || cands[2].PendingPrefillTokens != 5 {
		t.Errorf("a local candidate or a fresh summary changed: %+v", cands)
	}

	// The backlog falls: nothing is charged.
	tr.Note(t0.Add(3*time.Second), 500)
	cands[1].PendingPrefillTokens = 100
	tr.Adjust(cands[1:2], t0.Add(3*time.Second), model)
	if cands[1].PendingPrefillTokens != 100 {
		t.Errorf("a falling backlog charged %d tokens", cands[1].PendingPrefillTokens-100)
	}

	// No samples: nothing is charged.
	var empty Trend
	if g := empty.Growth(t0); g != 0 {
		t.Errorf("empty trend growth = %v", g)
	}
}

// naiveTrend is Trend's reference: every kept sample in a slice, thinned
// and bounded by the same rules, searched from the newest.
type naiveTrend struct{ s []trendSample }

func (n *naiveTrend) note(now time.Time, ms float64) {
	at := now.UnixNano()
	if len(n.s) > 0 && at < n.s[len(n.s)-1].at {
		return
	}
	if len(n.s) > 1 && at-n.s[len(n.s)-2].at < int64(trendStep) {
		n.s[len(n.s)-1] = trendSample{at, ms}
		return
	}
	n.s = append(n.s, trendSample{at, ms})
	if len(n.s) > trendSamples {
		n.s = n.s[1:]
	}
}

func (n *naiveTrend) growth(since time.Time) float64 {
	if len(n.s) == 0 {
		return 0
	}
	ref := n.s[0].ms
	for i := len(n.s) - 1; i >= 0; i-- {
		if n.s[i].at <= since.UnixNano() {
			ref = n.s[i].ms
			break
		}
	}
	return max(n.s[len(n.s)-1].ms-ref, 0)
}

// TestTrendMatchesNaive: the ring with its binary search answers as the
// slice scanned from the newest does, over histories longer than the ring.
func TestTrendMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var tr Trend
		var nv naiveTrend
		t0 := time.Unix(1000, 0)
		at := t0
		steps := rapid.IntRange(1, 3*trendSamples).Draw(rt, "steps")
		for range steps {
			// Mostly forward, sometimes a late sample (ignored).
			d := time.Duration(rapid.IntRange(-10, 120).Draw(rt, "dt_ms")) * time.Millisecond
			at = at.Add(d)
			ms := rapid.Float64Range(0, 1e5).Draw(rt, "ms")
			tr.Note(at, ms)
			nv.note(at, ms)
			if d < 0 {
				at = at.Add(-d)
			}
		}
		for range 20 {
			since := t0.Add(time.Duration(rapid.Int64Range(-1e9, int64(at.Sub(t0))+1e9).Draw(rt, "since")))
			if got, want := tr.Growth(since), nv.growth(since); got != want {
				rt.Fatalf("Growth(%v) = %v, naive %v", since.Sub(t0), got, want)
			}
		}
	})
}

// TestBacklogMsMatchesNaive: BacklogMs, which reads each profile's rate
// once and each pod's rate correction from the copy the pod keeps, gives
// exactly the mean its definition does (every live pod's backlog at
// RateFor by name), across profiles, per-pod corrections published
// between calls, and pods removed.
func TestBacklogMsMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		idx, err := index.New(index.DefaultConfig())
		if err != nil {
			rt.Fatal(err)
		}
		reg := NewRegistry(idx)
		n := rapid.IntRange(0, 24).Draw(rt, "pods")
		var infos []PodInfo
		for i := 0; i < n; i++ {
			info := PodInfo{Name: fmt.Sprintf("pod-%d", i), Endpoint: "http://x", Model: "m",
				Profile: rapid.SampledFrom([]string{"h100", "h200", "b200", "tpu-v9"}).Draw(rt, "profile")}
			if _, _, err := reg.Upsert(info); err != nil {
				rt.Fatal(err)
			}
			infos = append(infos, info)
		}
		model := drawModel(rt, gorgo.DefaultConfig(), infos)
		now := time.Unix(1000, 0)
		dec, err := NewDecider(DefaultConfig(), idx, reg, model, func() time.Time { return now })
		if err != nil {
			rt.Fatal(err)
		}
		naive := func() float64 {
			sum, k := 0.0, 0
			for _, p := range reg.Pods() {
				if !idx.Alive(p.ID) {
					continue
				}
				rate, _ := model.RateFor(p.Info().Profile, p.Name)
				sum += float64(BacklogTokens(p, now, rate)) * rate
				k++
			}
			if k == 0 {
				return 0
			}
			return sum / float64(k)
		}
		cal := gorgo.NewCalibrator(model, gorgo.CalibratorConfig{MinSamples: 3, MaxStep: 1, RateBand: [2]float64{0.5, 2}, MaxRelSE: 1})
		for step := range rapid.IntRange(1, 6).Draw(rt, "steps") {
			switch pods := reg.Pods(); {
			case len(pods) == 0:
			case rapid.IntRange(0, 3).Draw(rt, "op") == 0:
				reg.Remove(rapid.SampledFrom(pods).Draw(rt, "remove").Name)
			case rapid.Bool().Draw(rt, "publish"):
				p := rapid.SampledFrom(pods).Draw(rt, "calibrate")
				factor := rapid.SampledFrom([]float64{0.6, 0.8, 1.3}).Draw(rt, "factor")
				prof := p.Info().Profile
				for i := 1; i <= 40; i++ {
					u := 500 * i
					cal.Observe(gorgo.Observation{Profile: prof, Pod: p.Name, UncachedTokens: u,
						TTFTMs: model.Nominal(prof).OverheadMs + model.PrefillMs(prof, "", 0, u)*factor})
				}
			default:
				p := rapid.SampledFrom(pods).Draw(rt, "admit")
				p.Admit(rapid.IntRange(1, 50000).Draw(rt, "uncached"), time.Duration(rapid.IntRange(0, 5000).Draw(rt, "work_ms"))*time.Millisecond, now)
			}
			now = now.Add(time.Duration(rapid.IntRange(0, 2000).Draw(rt, "advance_ms")) * time.Millisecond)
			if got, want := dec.BacklogMs(now), naive(); got != want {
				rt.Fatalf("step %d: BacklogMs %v, naive %v", step, got, want)
			}
		}
	})
}
