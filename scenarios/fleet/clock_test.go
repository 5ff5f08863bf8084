package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional"
)

// Issue acceptance (faults, clocks): a controller whose wall clock is 90 s
// ahead (the one EU PHI enters, which must forward it) or 90 s behind (the
// one it is forwarded to) still forwards EU PHI correctly, on a fresh view
// of eu-west-1: summary ages are durations (the sender's reported age plus
// the time since receipt), never a difference of two machines' clocks, so
// the decision is "remote_only" with eu-west-1's summary seconds old, not
// "remote_only_unconfirmed" on a summary that looks 90 s stale (which
// ignores its cache and, for the automatic failover, is no evidence of the
// region's health). The skew itself is measured and shown in /readyz.
func TestClockSkewStillForwardsEUPHI(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	for _, tc := range []struct {
		region string
		skew   time.Duration
	}{
		{"us-east-1", 90 * time.Second},
		{"eu-west-1", -90 * time.Second},
	} {
		t.Run(fmt.Sprintf("%s %+v", tc.region, tc.skew), func(t *testing.T) {
			f := startFleet(t, Config{Deps: func(region string, d *regional.Deps) {
				if region == tc.region {
					d.Clock = func() time.Time { return time.Now().Add(tc.skew) }
				}
			}})
			east := f.Region("us-east-1").Controller
			phi := map[string]string{regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi"}
			served := 0
			for i := range 10 {
				a := ask(t, f.HTTP, east.URL(), "/v1/chat/completions", phi, fmt.Sprintf("EU PHI question %d", i))
				if a.status != 200 || a.region != "eu-west-1" {
					t.Errorf("EU PHI %d entering us-east-1: %d served in %q: %s", i, a.status, a.region, a.body)
					continue
				}
				served++
			}
			rr := routeOf(t, f.HTTP, east.URL(), phi, "EU PHI, explained")
			var ex regional.CostExplanation
			if err := json.Unmarshal(rr.Cost, &ex); err != nil {
				t.Fatalf("route cost %s: %v", rr.Cost, err)
			}
			age := int64(-1)
			for _, c := range ex.Candidates {
				if c.Region == "eu-west-1" {
					age = c.SummaryAgeMs
				}
			}
			if rr.Region != "eu-west-1" || ex.Reason != "remote_only" || age < 0 || age > 10000 {
				t.Errorf("EU PHI entering us-east-1 decided %q for %s on eu-west-1's summary %d ms old; want remote_only, eu-west-1, under 10 s",
					ex.Reason, rr.Region, age)
			}
			// us-east-1 measures eu-west-1's clock against its own.
			want := -tc.skew // us-east-1 ahead: eu-west-1 is behind it
			if tc.region == "eu-west-1" {
				want = tc.skew
			}
			var skew float64
			eventually(t, "us-east-1 to measure eu-west-1's clock skew", func() bool {
				resp, err := f.HTTP.Get(east.URL() + "/readyz")
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				var rd struct {
					Gossip map[string]struct {
						Skew *float64 `json:"clock_skew_seconds"`
						Age  float64  `json:"summary_age_seconds"`
					} `json:"gossip"`
				}
				if json.Unmarshal(b, &rd) != nil || rd.Gossip["eu-west-1"].Skew == nil {
					return false
				}
				skew = *rd.Gossip["eu-west-1"].Skew
				return true
			})
			if d := time.Duration(skew*float64(time.Second)) - want; d < -5*time.Second || d > 5*time.Second {
				t.Errorf("measured eu-west-1's clock %.1fs ahead of us-east-1's, want %v", skew, want)
			}
			t.Logf("EU PHI entering us-east-1 served in eu-west-1: %d of 10; decided %s on a summary %d ms old; measured skew %.1fs",
				served, ex.Reason, age, skew)
		})
	}
}
