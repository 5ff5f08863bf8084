package gorgo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"
)

// One pod 30% slower than its profile beside one that runs at it: each
// pod's rate converges to its own, the pool of the two settles between
// them, and the profile's rate does not move (it also prices other
// regions' pods).
func TestCalibratorRecoversPodRate(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	c := NewCalibrator(m, DefaultCalibratorConfig())
	rng := rand.New(rand.NewPCG(1, 2))
	nominal, overhead := m.Rate("h100")
	for range 3000 {
		u, q := rng.IntN(20000), rng.IntN(5000)
		y := overhead + 1.3*nominal*float64(u+q)
		y *= 1 + 0.05*rng.NormFloat64()
		c.Observe(Observation{Profile: "h100", Pod: "slow", UncachedTokens: u, PendingPrefillTokens: q, TTFTMs: y + 65, RTTMs: 65})
		c.Observe(Observation{Profile: "h100", Pod: "right", UncachedTokens: u, PendingPrefillTokens: q, TTFTMs: overhead + nominal*float64(u+q)})
	}
	if r, _ := m.RateFor("h100", "slow"); math.Abs(r/nominal-1.3) > 0.03 {
		t.Fatalf("slow pod's rate %.4f = %.3f x nominal, want 1.3", r, r/nominal)
	}
	if r, _ := m.RateFor("h100", "right"); math.Abs(r/nominal-1) > 0.03 {
		t.Fatalf("right pod's rate %.3f x nominal, want 1", r/nominal)
	}
	if r, _ := m.Rate("h100"); r != nominal {
		t.Fatalf("the profile's rate moved: %v", r)
	}
	fits := c.Fits()
	if len(fits) != 3 || fits[1].Pod != "slow" || fits[1].Samples != 3000 || fits[1].Confidence < 0.9 ||
		!fits[2].Pooled || fits[2].Samples != 6000 || fits[2].Factor < 1.05 || fits[2].Factor > 1.25 {
		t.Fatalf("fits %+v", fits)
	}
}

// Eight pods of one profile, all 25% slower than its nominal rate and
// each observed through heavy noise: every pod gets the pool's 25%, and
// none a correction of its own, since none can tell its difference from
// the others' from noise. Without the shrinkage (ShrinkZ < 0) the same
// observations spread the pods' rates apart.
func TestCalibratorIdenticalPodsKeepOneRate(t *testing.T) {
	spread := func(z float64) (lo, hi float64) {
		m := mustModel(t, DefaultConfig())
		cfg := DefaultCalibratorConfig()
		cfg.ShrinkZ = z
		c := NewCalibrator(m, cfg)
		rng := rand.New(rand.NewPCG(7, 8))
		nominal, overhead := m.Rate("b200")
		for i := range 8 * 400 {
			u := 500 + rng.IntN(30000)
			y := (overhead + 1.25*nominal*float64(u)) * (1 + 0.3*rng.NormFloat64())
			c.Observe(Observation{Profile: "b200", Pod: fmt.Sprintf("pod-%d", i%8), UncachedTokens: u, TTFTMs: max(y, 0)})
		}
		lo, hi = math.Inf(1), math.Inf(-1)
		for i := range 8 {
			f := m.PodFactor(fmt.Sprintf("pod-%d", i))
			lo, hi = min(lo, f), max(hi, f)
		}
		return lo, hi
	}
	lo, hi := spread(DefaultCalibratorConfig().ShrinkZ)
	if lo < 1.2 || hi > 1.3 || hi-lo > 0.01 {
		t.Fatalf("identical pods published factors from %.4f to %.4f, want one, about 1.25", lo, hi)
	}
	if lo, hi := spread(-1); hi-lo < 0.02 {
		t.Fatalf("without shrinkage the factors spread only %.4f..%.4f: the test does not exercise it", lo, hi)
	}
}

// After convergence a burst of wild TTFTs (a stalled pod, a GC pause) is
// rejected and moves nothing; without a pod the profile is calibrated.
func TestCalibratorRejectsOutliers(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	c := NewCalibrator(m, DefaultCalibratorConfig())
	rng := rand.New(rand.NewPCG(3, 4))
	nominal, overhead := m.Rate("b200")
	for range 1000 {
		u := rng.IntN(20000)
		c.Observe(Observation{Profile: "b200", UncachedTokens: u, TTFTMs: overhead + 1.2*nominal*float64(u)})
	}
	before, _ := m.Rate("b200")
	if math.Abs(before/nominal-1.2) > 0.02 {
		t.Fatalf("profile factor %.3f, want 1.2", before/nominal)
	}
	for range 500 {
		c.Observe(Observation{Profile: "b200", UncachedTokens: rng.IntN(100), TTFTMs: 60000 + float64(rng.IntN(100000))})
	}
	if after, _ := m.Rate("b200"); after != before {
		t.Fatalf("outliers moved the rate from %v to %v", before, after)
	}
	if f := c.Fits(); f[0].Rejected != 500 {
		t.Fatalf("rejected %d of 500 outliers", f[0].Rejected)
	}
}

// Few, scattered samples: low confidence, so the factor stays near 1 even
// when the fitted slope is far off.
func TestCalibratorConfidence(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	c := NewCalibrator(m, DefaultCalibratorConfig())
	rng := rand.New(rand.NewPCG(5, 6))
	nominal, _ := m.Rate("h100")
	for range 60 {
		u := 1000 + rng.IntN(500)
		c.Observe(Observation{Profile: "h100", Pod: "p", UncachedTokens: u, TTFTMs: 2 * nominal * float64(u) * (1 + rng.Float64())})
	}
	f := c.Fits()[0]
	if f.Confidence > 0.2 || math.Abs(m.PodFactor("p")-1) > 0.1 {
		t.Fatalf("confidence %.2f, factor %.3f from 60 noisy samples", f.Confidence, m.PodFactor("p"))
	}
}

// The rules hold for any sequence of observations: every pod's published
// factor stays in the band and moves at most MaxStep per observation of
// its profile (its own fit's step, and its pool's between and at its own
// observations); the profile's rate does not move.
func TestCalibratorBoundedSteps(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := mustModel(rt, DefaultConfig())
		nominal, _ := m.Rate("h100")
		cfg := DefaultCalibratorConfig()
		cfg.MinSamples = rapid.IntRange(2, 40).Draw(rt, "min_samples")
		cfg.MaxStep = rapid.Float64Range(0.001, 0.2).Draw(rt, "max_step")
		c := NewCalibrator(m, cfg)
		prev := map[string]float64{"a": 1, "b": 1}
		since := map[string]int{}
		for range rapid.IntRange(1, 400).Draw(rt, "n") {
			pod := rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "pod")
			c.Observe(Observation{Profile: "h100", Pod: pod, UncachedTokens: rapid.IntRange(0, 100000).Draw(rt, "u"),
				CachedTokens: rapid.IntRange(0, 100000).Draw(rt, "c"), PendingPrefillTokens: rapid.IntRange(0, 50000).Draw(rt, "q"),
				TTFTMs: rapid.Float64Range(0, 1e6).Draw(rt, "ttft")})
			since["a"]++
			since["b"]++
			f := m.PodFactor(pod)
			if f < cfg.RateBand[0]-1e-12 || f > cfg.RateBand[1]+1e-12 {
				rt.Fatalf("factor %v outside %v", f, cfg.RateBand)
			}
			up, down := math.Pow(1+cfg.MaxStep, float64(since[pod]+1)), math.Pow(1-cfg.MaxStep, float64(since[pod]+1))
			if r := f / prev[pod]; r > up*(1+1e-9) || r < down*(1-1e-9) {
				rt.Fatalf("factor moved by %.4f over %d observations of the profile (max step %.4f)", r-1, since[pod], cfg.MaxStep)
			}
			prev[pod], since[pod] = f, 0
			if r, _ := m.Rate("h100"); r != nominal {
				rt.Fatalf("the profile's rate moved to %v", r)
			}
		}
	})
}

// The incremental weighted fit equals weighted least squares recomputed
// from scratch over the accepted observations, each weighted by its age.
func TestCalibratorMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := mustModel(rt, DefaultConfig())
		cfg := DefaultCalibratorConfig()
		cfg.HalfLife = rapid.IntRange(5, 1000).Draw(rt, "half_life")
		cfg.MinSamples = rapid.IntRange(3, 30).Draw(rt, "min_samples")
		c := NewCalibrator(m, cfg)
		slope := rapid.Float64Range(0.01, 1).Draw(rt, "slope")
		type obs struct{ x, y float64 }
		var accepted []obs
		for i := range rapid.IntRange(1, 300).Draw(rt, "n") {
			u := rapid.IntRange(0, 50000).Draw(rt, "u")
			y := 20 + slope*float64(u)*rapid.Float64Range(0.5, 1.5).Draw(rt, "noise")
			if rapid.IntRange(0, 20).Draw(rt, "wild") == 0 {
				y *= 50
			}
			before := 0
			if f := c.fits[fitKey{profile: "h100", pod: "p"}]; f != nil {
				before = f.n
			}
			c.Observe(Observation{Profile: "h100", Pod: "p", UncachedTokens: u, TTFTMs: y})
			f := c.fits[fitKey{profile: "h100", pod: "p"}]
			if f.n > before {
				accepted = append(accepted, obs{float64(u), y})
			}
			if len(accepted) < cfg.MinSamples || !f.valid {
				continue
			}
			// Naive: explicit weights, centred formula.
			decay := math.Exp2(-1 / float64(cfg.HalfLife))
			var sw, mx, my float64
			for k, o := range accepted {
				w := math.Pow(decay, float64(len(accepted)-1-k))
				sw += w
				mx += w * o.x
				my += w * o.y
			}
			mx, my = mx/sw, my/sw
			var sxy, sxx float64
			for k, o := range accepted {
				w := math.Pow(decay, float64(len(accepted)-1-k))
				sxy += w * (o.x - mx) * (o.y - my)
				sxx += w * (o.x - mx) * (o.x - mx)
			}
			if sxx <= 1e-6*sw*(mx*mx+1) {
				continue // not identifiable; the fit keeps its last value
			}
			rate := sxy / sxx
			if math.Abs(rate-f.rate) > 1e-6*max(math.Abs(rate), 1) {
				rt.Fatalf("step %d: incremental rate %v, naive %v", i, f.rate, rate)
			}
			if oh := my - rate*mx; math.Abs(oh-f.overhead) > 1e-6*max(math.Abs(oh), 1) {
				rt.Fatalf("step %d: incremental overhead %v, naive %v", i, f.overhead, oh)
			}
		}
	})
}

// With the profile's attention term, work counts the context: the same
// uncached tokens after a long cached prefix are more work.
func TestCalibratorWorkCountsAttention(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DefaultProfile = "p"
	m, err := New(cfg, Profile{Name: "p", PrefillMsPerToken: 0.1, MaxConcurrency: 8, AttnTokens: 10000})
	if err != nil {
		t.Fatal(err)
	}
	p := m.profile("p")
	short := work(p, Observation{UncachedTokens: 1000})
	long := work(p, Observation{UncachedTokens: 1000, CachedTokens: 20000})
	if math.Abs(short-1050) > 1e-9 || math.Abs(long-3050) > 1e-9 {
		t.Fatalf("work %v and %v, want 1050 and 3050", short, long)
	}
	if got := m.PrefillMs("p", "", 20000, 1000); math.Abs(got-305) > 1e-9 {
		t.Fatalf("prefill %v ms, want 305", got)
	}
}

// An exact fit has a standard error of 0: with ShrinkZ = +Inf ("publish
// no departure from the pool") the shrinkage must not turn 0 x Inf into a
// NaN factor.
func TestCalibratorShrinkInfExactFit(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	cfg := DefaultCalibratorConfig()
	cfg.ShrinkZ = math.Inf(1)
	c := NewCalibrator(m, cfg)
	nominal, overhead := m.Rate("h100")
	for i := range 200 {
		u := 1000 * (1 + i%16)
		c.Observe(Observation{Profile: "h100", Pod: "p", UncachedTokens: u, TTFTMs: overhead + 1.2*nominal*float64(u)})
	}
	if f := m.PodFactor("p"); math.IsNaN(f) || f < cfg.RateBand[0] || f > cfg.RateBand[1] {
		t.Fatalf("pod factor %v", f)
	}
}
