package route

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/gorgo"
)

func TestForwardedAdjust(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var f Forwarded
	a := f.Add("eu", t0, 9000)                    // before the summary's horizon
	f.Add("eu", t0.Add(2*time.Second), 8000)      // after it
	b := f.Add("eu", t0.Add(3*time.Second), 4001) // after it, landed below
	f.Add("ap", t0.Add(3*time.Second), 1_000_000) // another region
	f.Landed("eu", b)
	f.Landed("eu", 12345) // unknown: ignored
	cands := []gorgo.Candidate{
		{Region: "us", Pod: "p1", PendingPrefillTokens: 7},
		{Region: "eu", Remote: true, PendingPrefillTokens: 100},
		{Region: "sa", Remote: true, PendingPrefillTokens: 5},
	}
	unseen := func(region string) (Unseen, bool) {
		if region != "eu" {
			return Unseen{}, false
		}
		// Received at t0+1.1s over a 100 ms RTT: forwards from t0+1s on
		// are not in it.
		return Unseen{ReceivedAt: t0.Add(1100 * time.Millisecond), RTT: 100 * time.Millisecond, Pods: 3}, true
	}
	f.Adjust(cands, unseen)
	if got, want := cands[1].PendingPrefillTokens, 100+(8000+2)/3; got != want {
		t.Errorf("eu pending = %d, want %d", got, want)
	}
	if cands[0].PendingPrefillTokens != 7 || cands[2].PendingPrefillTokens != 5 {
		t.Errorf("a local candidate or a region without a summary changed: %+v", cands)
	}
	f.Landed("eu", a)
	if got := f.Since("eu", t0); got != 8000 {
		t.Errorf("Since(eu, t0) = %d after landing the first, want 8000", got)
	}
}

// Forwarded against a naive list of every forward and whether it landed.
func TestForwardedMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		type fw struct {
			id     uint64
			region string
			at     int
			tokens int
			landed bool
		}
		var f Forwarded
		var all []fw
		regions := []string{"a", "b", "c"}
		t0 := time.Unix(0, 0)
		for range rapid.IntRange(0, 60).Draw(t, "ops") {
			region := rapid.SampledFrom(regions).Draw(t, "region")
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				at, tokens := rapid.IntRange(0, 100).Draw(t, "at"), rapid.IntRange(-5, 50_000).Draw(t, "tokens")
				id := f.Add(region, t0.Add(time.Duration(at)*time.Second), tokens)
				all = append(all, fw{id: id, region: region, at: at, tokens: max(tokens, 0)})
			case 1:
				if len(all) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(all)-1).Draw(t, "which")
				// Landed names the region it was sent to; a wrong region
				// changes nothing.
				r := rapid.SampledFrom([]string{all[i].region, region}).Draw(t, "landed_region")
				f.Landed(r, all[i].id)
				if r == all[i].region {
					all[i].landed = true
				}
			case 2:
				since := rapid.IntRange(0, 101).Draw(t, "since")
				want := 0
				for _, x := range all {
					if x.region == region && !x.landed && x.at >= since {
						want += x.tokens
					}
				}
				if got := f.Since(region, t0.Add(time.Duration(since)*time.Second)); got != want {
					t.Fatalf("Since(%s, %d) = %d, naive %d", region, since, got, want)
				}
			}
		}
	})
}
