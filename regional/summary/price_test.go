package summary

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/gorgo"
)

func defaultModel(t testing.TB) *gorgo.Model {
	t.Helper()
	m, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A cold prompt is priced on the fast pool while its backlog allows, at
// that pool's own backlog and rate; the slow pool wins once the fast one
// is busier by more than the prefill it saves.
func TestPrice(t *testing.T) {
	m := defaultModel(t)
	for _, tc := range []struct {
		name     string
		b200     int64 // b200 pool's backlog (tokens at the b200 rate), 1 pod
		profile  string
		pending  int
		running  int
		totalMs  float64
		wantMean int // what Candidate alone says (h100, region mean)
	}{
		// b200: 0.75 x 1,000 x 0.158 + 10,000 x 0.158 + 31 = 1,729.5 ms;
		// h100: 0.75 x 2,667 x 0.36 + 10,000 x 0.36 + 75 = 4,395.1 ms.
		{"fast pool idle enough", 1000, "b200", 1000, 3, 1729.5, 2250},
		// b200: 0.75 x 40,000 x 0.158 + 1,611 = 6,351 ms: the h100s win.
		{"fast pool busy", 40000, "h100", 2667, 4, 0.75*2667*0.36 + 3600 + 75, 12000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput("us-west-2", 3)
			in.Load = []ProfileLoad{
				{Profile: "b200", Pods: 1, PendingPrefillTokens: tc.b200, Running: 3, Slots: 256},
				{Profile: "h100", Pods: 3, PendingPrefillTokens: 8000, Running: 10, Slots: 768},
			}
			s, err := Build(in, nil, BuildConfig{MaxBytes: 1 << 20, SampleRate: 1})
			if err != nil {
				t.Fatal(err)
			}
			c := s.Candidate(testTime, nil, 10_000)
			if c.Profile != "h100" || c.PendingPrefillTokens != tc.wantMean {
				t.Fatalf("unpriced candidate: %+v", c)
			}
			c.RTTMs, c.SummaryAge = 0, 2*time.Second
			s.Price(&c, m)
			if c.Profile != tc.profile || c.PendingPrefillTokens != tc.pending || c.Running != tc.running {
				t.Fatalf("priced: %+v, want profile %s, pending %d, running %d", c, tc.profile, tc.pending, tc.running)
			}
			if got := m.Estimate(&c).TotalMs; got < tc.totalMs-0.01 || got > tc.totalMs+0.01 {
				t.Fatalf("estimate %.2f ms, want %.2f", got, tc.totalMs)
			}
			if c.Region != "us-west-2" || !c.Remote || c.PromptTokens != 10_000 || c.SummaryAge != 2*time.Second {
				t.Fatalf("identity changed: %+v", c)
			}
		})
	}
}

// Price leaves a candidate alone when the summary has no pool with pods,
// and allocates nothing (it is on the request path).
func TestPriceNoLoadAndAllocs(t *testing.T) {
	m := defaultModel(t)
	in := testInput("eu-west-1", 1)
	in.Load = []ProfileLoad{{Profile: "b200", Pods: 0}}
	s, err := Build(in, nil, BuildConfig{MaxBytes: 1 << 20, SampleRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Candidate(testTime, nil, 500)
	want := c
	s.Price(&c, m)
	if c != want {
		t.Fatalf("changed without pools: %+v, want %+v", c, want)
	}
	s2, err := Build(testInput("eu-west-1", 2), nil, BuildConfig{MaxBytes: 1 << 20, SampleRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(100, func() { c := s2.Candidate(testTime, nil, 500); s2.Price(&c, m) }); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

// Against a naive reference: every pool priced as its own candidate, the
// least estimate taken (first on ties); Price agrees, and changes nothing
// but the profile, backlog and requests in flight.
func TestPriceMatchesNaive(t *testing.T) {
	m := defaultModel(t)
	rapid.Check(t, func(t *rapid.T) {
		profiles := []string{"h100", "h200", "b200", "unknown"}
		var load []ProfileLoad
		for i := rapid.IntRange(0, 4).Draw(t, "pools"); i > 0; i-- {
			load = append(load, ProfileLoad{
				Profile:              rapid.SampledFrom(profiles).Draw(t, "profile"),
				Pods:                 rapid.IntRange(0, 16).Draw(t, "pods"),
				PendingPrefillTokens: rapid.Int64Range(0, 2_000_000).Draw(t, "pending"),
				Running:              rapid.IntRange(0, 5000).Draw(t, "running"),
			})
		}
		s := &Summary{Region: "r", Load: load}
		prompt := rapid.IntRange(0, 200_000).Draw(t, "prompt")
		c := gorgo.Candidate{Region: "r", Remote: true, Profile: "h100", PromptTokens: prompt,
			CachedTokens: rapid.IntRange(0, prompt).Draw(t, "cached"), PendingPrefillTokens: 17, Running: 2,
			RTTMs: float64(rapid.IntRange(0, 300).Draw(t, "rtt")), SummaryAge: time.Duration(rapid.IntRange(0, 90).Draw(t, "age")) * time.Second}

		want := c
		bestMs := 0.0
		found := false
		for _, l := range load {
			if l.Pods == 0 {
				continue
			}
			try := c
			try.Profile = l.Profile
			try.PendingPrefillTokens = int((l.PendingPrefillTokens + int64(l.Pods) - 1) / int64(l.Pods))
			try.Running = int((int64(l.Running) + int64(l.Pods) - 1) / int64(l.Pods))
			if ms := m.Estimate(&try).TotalMs; !found || ms < bestMs {
				want, bestMs, found = try, ms, true
			}
		}
		got := c
		s.Price(&got, m)
		if got != want {
			t.Fatalf("Price: %+v, naive %+v", got, want)
		}
	})
}
