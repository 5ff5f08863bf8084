package gorgo

import (
	"fmt"
	"testing"

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
