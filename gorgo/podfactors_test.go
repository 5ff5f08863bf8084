package gorgo

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// MinPodFactor is the smallest published factor (and at most 1) after any
// sequence of publications, raising and lowering the smallest among them.
func TestMinPodFactorMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var p podFactors
		naive := map[string]float64{}
		for _, step := range rapid.SliceOfN(rapid.IntRange(0, 1e6), 1, 60).Draw(t, "steps") {
			pod := fmt.Sprint("pod-", step%5)
			f := 0.5 + float64(step%1000)/1000 // 0.5 .. 1.499
			p.set(pod, f)
			naive[pod] = f
			want := 1.0
			for _, v := range naive {
				want = min(want, v)
			}
			if got := p.min(); got != want {
				t.Fatalf("after %s = %v: min %v, want %v (%v)", pod, f, got, want, naive)
			}
		}
	})
}

// EstimateAt, given the rate Estimate would use (the profile's Rate times
// the pod's PodFactor for a local candidate, the profile's alone for a
// remote one), returns exactly what Estimate returns, on random candidates
// of known and unknown profiles, with and without a published factor.
func TestEstimateAtMatchesEstimate(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.Profiles = DefaultProfiles()
		cfg.Profiles[0].AttnTokens = rapid.SampledFrom([]float64{0, 4096}).Draw(t, "attn")
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if rapid.Bool().Draw(t, "factor") {
				m.pods.set(fmt.Sprint("pod-", i), rapid.Float64Range(0.5, 2).Draw(t, "f"))
			}
		}
		prompt := rapid.IntRange(0, 20000).Draw(t, "prompt")
		c := Candidate{
			Pod:                  fmt.Sprint("pod-", rapid.IntRange(0, 3).Draw(t, "pod")),
			Profile:              rapid.SampledFrom([]string{"h100", "b200", "unknown"}).Draw(t, "profile"),
			Remote:               rapid.Bool().Draw(t, "remote"),
			PromptTokens:         prompt,
			CachedTokens:         rapid.IntRange(-1, prompt+1).Draw(t, "cached"),
			PendingPrefillTokens: rapid.IntRange(-1, 50000).Draw(t, "pending"),
			Running:              rapid.IntRange(0, 300).Draw(t, "running"),
			ExtraMs:              rapid.Float64Range(-50, 50).Draw(t, "extra"),
			RTTMs:                rapid.Float64Range(0, 200).Draw(t, "rtt"),
			EgressBytes:          int64(rapid.IntRange(0, 1<<20).Draw(t, "egress")),
			SummaryAge:           time.Duration(rapid.IntRange(0, 120).Draw(t, "age_s")) * time.Second,
		}
		rate, _ := m.Rate(c.Profile)
		if !c.Remote {
			rate *= m.PodFactor(c.Pod)
		}
		if got, want := m.EstimateAt(&c, rate), m.Estimate(&c); got != want {
			t.Fatalf("EstimateAt(%+v, %v) = %+v, want %+v", c, rate, got, want)
		}
	})
}
