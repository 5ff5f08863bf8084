package gorgo

import (
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func mustModel(t interface{ Fatal(...any) }, cfg Config) *Model {
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"QueueWeight":       func(c *Config) { c.QueueWeight = -1 },
		"RTTWeight":         func(c *Config) { c.RTTWeight = math.NaN() },
		"ForwardMarginFrac": func(c *Config) { c.ForwardMarginFrac = 1 },
		"MaxRemoteShare":    func(c *Config) { c.MaxRemoteShare = 0 },
		"IgnoreAfter":       func(c *Config) { c.IgnoreAfter = c.FreshFor },
		"ShareWindow":       func(c *Config) { c.ShareWindow = 0 },
		"ColdWorkWeight":    func(c *Config) { c.ColdWorkWeight = -0.5 },
	} {
		c := DefaultConfig()
		mut(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	c := DefaultConfig()
	c.DefaultProfile = "tpu"
	if _, err := New(c); err == nil {
		t.Error("unknown default profile accepted")
	}
	if _, err := New(DefaultConfig(), Profile{Name: "x"}); err == nil {
		t.Error("profile without a rate accepted")
	}
}

// The seed's example: 2K tokens on H100, ~80 ms on a hit and ~800 ms on a miss.
func TestEstimateMatchesSeedExample(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	hit := m.Estimate(&Candidate{Profile: "h100", PromptTokens: 2000, CachedTokens: 1984})
	miss := m.Estimate(&Candidate{Profile: "h100", PromptTokens: 2000})
	if hit.TotalMs < 70 || hit.TotalMs > 90 || miss.TotalMs < 750 || miss.TotalMs > 850 {
		t.Fatalf("hit %.1f ms, miss %.1f ms; want ~80 and ~800", hit.TotalMs, miss.TotalMs)
	}
}

// DESIGN.md: at ~0.1 ms/token and 240 ms extra RTT, a remote region must hold
// ~2,400 more cached tokens to win (ignoring margins). With the cold-work
// charge at weight 1, the local pod also pays for the 2,400 tokens it
// would redo, so ~1,200 suffice.
func TestRTTTradeOff(t *testing.T) {
	for _, tc := range []struct {
		coldWork         float64
		stays, forwarded int // cached tokens held by the remote region only
	}{{0, 2300, 2500}, {1, 1150, 1250}} {
		cfg := DefaultConfig()
		cfg.ForwardMarginMs, cfg.ForwardMarginFrac = 0, 0
		cfg.ColdWorkWeight = tc.coldWork
		cfg.DefaultProfile = "p"
		m, err := New(cfg, Profile{Name: "p", PrefillMsPerToken: 0.1, MaxConcurrency: 8})
		if err != nil {
			t.Fatal(err)
		}
		var d Decision
		for _, extra := range []struct {
			cached int
			remote bool
		}{{tc.stays, false}, {tc.forwarded, true}} {
			cands := []Candidate{
				{Region: "home", Pod: "a", Profile: "p", PromptTokens: 10000},
				{Region: "far", Remote: true, Profile: "p", PromptTokens: 10000, CachedTokens: extra.cached, RTTMs: 240},
			}
			m.Choose(cands, nil, time.Time{}, &d)
			if got := d.Winner == 1; got != extra.remote {
				t.Errorf("cold work %v: remote holds %d more tokens: forwarded=%v, want %v (%+v)", tc.coldWork, extra.cached, got, extra.remote, d)
			}
		}
	}
}

// A remote region with a shorter queue but no cache does not win against a
// warm local pod once the prefill it would redo is charged.
func TestColdWorkKeepsWarm(t *testing.T) {
	cands := []Candidate{
		{Region: "home", Pod: "a", Profile: "p", PromptTokens: 10000, CachedTokens: 9000, PendingPrefillTokens: 12000},
		{Region: "far", Remote: true, Profile: "p", PromptTokens: 10000, RTTMs: 60},
	}
	for _, tc := range []struct {
		coldWork float64
		remote   bool
	}{{0, true}, {1, false}} {
		cfg := DefaultConfig()
		cfg.QueueWeight, cfg.ColdWorkWeight, cfg.DefaultProfile = 1, tc.coldWork, "p"
		m, err := New(cfg, Profile{Name: "p", PrefillMsPerToken: 0.1, MaxConcurrency: 8})
		if err != nil {
			t.Fatal(err)
		}
		var d Decision
		m.Choose(cands, nil, time.Time{}, &d)
		// local: queue 1,200 + prefill 100; remote: 1,000 + 60 RTT (+ 900 cold work).
		if got := d.Winner == 1; got != tc.remote {
			t.Errorf("cold work %v: forwarded=%v, want %v (%+v)", tc.coldWork, got, tc.remote, d)
		}
		if tc.coldWork > 0 && d.Estimates[1].ColdWorkMs != 900 {
			t.Errorf("cold work of the remote = %v ms, want 900", d.Estimates[1].ColdWorkMs)
		}
	}
}

// Cold work is tokens, not hardware: a remote pool of faster pods that
// would compute as many tokens charges the slower local pod nothing, and
// a colder candidate pays for its extra tokens at its own rate.
func TestColdWorkIsTokens(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DefaultProfile = "slow"
	m, err := New(cfg, Profile{Name: "slow", PrefillMsPerToken: 0.4, MaxConcurrency: 8}, Profile{Name: "fast", PrefillMsPerToken: 0.1, MaxConcurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	cands := []Candidate{
		{Region: "home", Pod: "a", Profile: "slow", PromptTokens: 4000, CachedTokens: 1000},
		{Region: "far", Remote: true, Profile: "fast", PromptTokens: 4000, CachedTokens: 1000, RTTMs: 60},
		{Region: "farther", Remote: true, Profile: "fast", PromptTokens: 4000, RTTMs: 90},
	}
	var d Decision
	m.Choose(cands, nil, time.Time{}, &d)
	if d.Estimates[0].ColdWorkMs != 0 || d.Estimates[1].ColdWorkMs != 0 {
		t.Fatalf("as warm, slower or faster, charged cold work: %+v", d.Estimates)
	}
	// 1,000 tokens more than the warmest, at 0.1 ms each.
	if got := d.Estimates[2].ColdWorkMs; got != 100 {
		t.Fatalf("cold work of the colder fast pool = %v ms, want 100", got)
	}
}

func TestGuardrails(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	now := time.Unix(1000, 0)
	base := []Candidate{
		{Region: "us-east-1", Pod: "a", Profile: "h100", PromptTokens: 50000, PendingPrefillTokens: 2000},
		{Region: "us-west-2", Remote: true, Profile: "h100", PromptTokens: 50000, CachedTokens: 48000, RTTMs: 65},
	}
	var d Decision
	m.Choose(base, nil, now, &d)
	if d.Winner != 1 || d.Reason != ReasonRemoteSaves {
		t.Fatalf("warm remote not chosen: %+v", d)
	}
	// Stale summary: ignored.
	stale := append([]Candidate(nil), base...)
	stale[1].SummaryAge = 2 * time.Minute
	m.Choose(stale, nil, now, &d)
	if d.Winner != 0 || d.Estimates[1].Excluded != ExcludedStale {
		t.Fatalf("stale summary used: %+v", d)
	}
	// Ageing summary: partial weight.
	aging := append([]Candidate(nil), base...)
	aging[1].SummaryAge = 35 * time.Second
	if e := m.Estimate(&aging[1]); e.CacheWeight <= 0 || e.CacheWeight >= 1 {
		t.Fatalf("weight at 35s = %v", e.CacheWeight)
	}
	// Share cap.
	st := NewShareTracker(time.Minute)
	for i := 0; i < 10; i++ {
		st.Record("us-west-2", now)
	}
	m.Choose(base, st, now, &d)
	if d.Winner != 0 || d.Estimates[1].Excluded != ExcludedShareCap {
		t.Fatalf("share cap ignored: %+v", d)
	}
	// The cap forgets after the window.
	m.Choose(base, st, now.Add(2*time.Minute), &d)
	if d.Winner != 1 {
		t.Fatalf("share window did not slide: %+v", d)
	}
	// Small saving: stay home.
	small := append([]Candidate(nil), base...)
	small[0].PendingPrefillTokens = 0
	small[0].CachedTokens = 49000
	m.Choose(small, nil, now, &d)
	if d.Winner != 0 {
		t.Fatalf("forwarded without a saving: %+v", d)
	}
	// No local candidate: the best remote, whatever the margin, and
	// whatever its share (the traffic has nowhere else to go).
	m.Choose(base[1:], nil, now, &d)
	if d.Winner != 0 || d.Reason != ReasonRemoteOnly {
		t.Fatalf("remote-only: %+v", d)
	}
	capped := NewShareTracker(time.Minute)
	for i := 0; i < 10; i++ {
		capped.Record("us-west-2", now)
	}
	m.Choose(base[1:], capped, now, &d)
	if d.Winner != 0 || d.Reason != ReasonRemoteOnly {
		t.Fatalf("remote-only over its share cap: %+v", d)
	}
	// MaxRemoteShare 1 turns the cap off, even at a 100% share.
	off := DefaultConfig()
	off.MaxRemoteShare = 1
	mo := mustModel(t, off)
	mo.Choose(base, capped, now, &d)
	if d.Winner != 1 {
		t.Fatalf("cap of 1 still capped: %+v", d)
	}
	m.Choose(nil, nil, now, &d)
	if d.Winner != -1 || d.Reason != ReasonNone {
		t.Fatalf("empty: %+v", d)
	}
}

// naiveChoose restates the decision rule plainly, from the cost formula.
func naiveChoose(cfg Config, profiles map[string]Profile, cands []Candidate, share func(string) float64) int {
	// cost is the candidate's total; confirmed is false for a remote one
	// with a stale summary (counted as holding nothing) or a suspect region.
	// pf is the prefill of u uncached tokens after cached ones at c.
	pf := func(c Candidate, cached, u float64) float64 {
		p, ok := profiles[c.Profile]
		if !ok {
			p = profiles[cfg.DefaultProfile]
		}
		prefill := u * p.PrefillMsPerToken
		if p.AttnTokens > 0 {
			prefill *= 1 + (cached+u/2)/p.AttnTokens
		}
		return prefill
	}
	cost := func(c Candidate) (total, uncached float64, confirmed bool) {
		p, ok := profiles[c.Profile]
		if !ok {
			p = profiles[cfg.DefaultProfile]
		}
		w := 1.0
		confirmed = !(c.Remote && c.Suspect)
		if c.Remote && c.SummaryAge > cfg.FreshFor {
			if c.SummaryAge >= cfg.IgnoreAfter {
				w, confirmed = 0, false
			} else {
				w = 1 - float64(c.SummaryAge-cfg.FreshFor)/float64(cfg.IgnoreAfter-cfg.FreshFor)
			}
		}
		cached := math.Floor(float64(min(max(c.CachedTokens, 0), c.PromptTokens)) * w)
		q := float64(max(c.PendingPrefillTokens, 0)) * p.PrefillMsPerToken
		if c.Running >= p.MaxConcurrency {
			q += float64(c.Running-p.MaxConcurrency+1) * (p.OverheadMs + float64(p.MeanOutputTokens)*p.DecodeMsPerToken) / float64(p.MaxConcurrency)
		}
		u := math.Max(float64(c.PromptTokens)-cached, 0)
		prefill := pf(c, cached, u)
		total = cfg.QueueWeight*q + prefill + p.OverheadMs + cfg.RTTWeight*math.Max(c.RTTMs, 0) + c.ExtraMs
		if c.Remote && c.EgressBytes > 0 {
			total += float64(c.EgressBytes) / 1e9 * cfg.EgressUSDPerGB * cfg.MsPerUSD
		}
		return total, u, confirmed
	}
	type scored struct {
		i     int
		total float64
	}
	// With a remote candidate, every confirmed one pays for the prefill,
	// at its own rate, of the tokens it computes beyond the warmest
	// confirmed one's.
	anyRemote, fewest := false, math.Inf(1)
	for _, c := range cands {
		anyRemote = anyRemote || c.Remote
		if _, u, ok := cost(c); ok {
			fewest = math.Min(fewest, u)
		}
	}
	var locals, remotes, unconfirmed []scored
	for i, c := range cands {
		t, u, ok := cost(c)
		if ok && anyRemote && u > fewest {
			prompt := float64(c.PromptTokens)
			t += cfg.ColdWorkWeight * (pf(c, prompt-u, u) - pf(c, prompt-fewest, fewest))
		}
		if !ok {
			unconfirmed = append(unconfirmed, scored{i, t})
			continue
		}
		if !c.Remote {
			locals = append(locals, scored{i, t})
		} else {
			remotes = append(remotes, scored{i, t})
		}
	}
	if len(locals) > 0 && cfg.MaxRemoteShare < 1 {
		kept := remotes[:0]
		for _, r := range remotes {
			if share(cands[r.i].Region) < cfg.MaxRemoteShare {
				kept = append(kept, r)
			}
		}
		remotes = kept
	}
	best := func(s []scored) (scored, bool) {
		if len(s) == 0 {
			return scored{}, false
		}
		sort.SliceStable(s, func(a, b int) bool { return s[a].total < s[b].total })
		return s[0], true
	}
	l, okL := best(locals)
	r, okR := best(remotes)
	switch {
	case !okL && !okR:
		if u, ok := best(unconfirmed); ok {
			return u.i
		}
		return -1
	case !okL:
		return r.i
	case okR && l.total-r.total > math.Max(cfg.ForwardMarginMs, cfg.ForwardMarginFrac*l.total):
		return r.i
	}
	return l.i
}

func genCandidate(t *rapid.T, remote bool) Candidate {
	prompt := rapid.IntRange(0, 120000).Draw(t, "prompt")
	c := Candidate{
		Region:               rapid.SampledFrom([]string{"us-east-1", "us-west-2", "eu-west-1"}).Draw(t, "region"),
		Remote:               remote,
		Profile:              rapid.SampledFrom([]string{"h100", "h200", "b200", "unknown"}).Draw(t, "profile"),
		PromptTokens:         prompt,
		CachedTokens:         rapid.IntRange(-10, prompt+10).Draw(t, "cached"),
		PendingPrefillTokens: rapid.IntRange(0, 200000).Draw(t, "pending"),
		Running:              rapid.IntRange(0, 400).Draw(t, "running"),
		ExtraMs:              float64(rapid.IntRange(-50, 50).Draw(t, "extra")),
	}
	if remote {
		c.RTTMs = float64(rapid.IntRange(0, 300).Draw(t, "rtt"))
		c.SummaryAge = time.Duration(rapid.IntRange(0, 90).Draw(t, "age")) * time.Second
		c.EgressBytes = int64(prompt) * 4
		c.Suspect = rapid.IntRange(0, 4).Draw(t, "suspect") == 0
	} else {
		c.Pod = "pod"
	}
	return c
}

func TestChooseMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.EgressUSDPerGB = 0.02
		cfg.MsPerUSD = float64(rapid.IntRange(0, 1e6).Draw(t, "msPerUSD"))
		cfg.ColdWorkWeight = rapid.SampledFrom([]float64{0, 0.5, 1, 2}).Draw(t, "cold_work_weight")
		attn := rapid.SampledFrom([]float64{0, 26900, 5000}).Draw(t, "attn_tokens")
		profiles := map[string]Profile{}
		var list []Profile
		for _, p := range DefaultProfiles() {
			p.AttnTokens = attn
			profiles[p.Name] = p
			list = append(list, p)
		}
		m, err := New(cfg, list...)
		if err != nil {
			t.Fatal(err)
		}
		var cands []Candidate
		for i := rapid.IntRange(0, 6).Draw(t, "locals"); i > 0; i-- {
			cands = append(cands, genCandidate(t, false))
		}
		for i := rapid.IntRange(0, 4).Draw(t, "remotes"); i > 0; i-- {
			cands = append(cands, genCandidate(t, true))
		}
		shares := map[string]float64{"us-west-2": rapid.Float64Range(0, 1).Draw(t, "share")}
		view := shareFunc(func(r string) float64 { return shares[r] })
		var d Decision
		m.Choose(cands, view, time.Time{}, &d)
		if want := naiveChoose(cfg, profiles, cands, func(r string) float64 { return shares[r] }); d.Winner != want {
			t.Fatalf("Choose picked %d, naive %d\n%+v", d.Winner, want, d)
		}
		if d.Winner >= 0 && cands[d.Winner].Remote && d.BestLocal >= 0 {
			if saving := d.Estimates[d.BestLocal].TotalMs - d.Estimates[d.Winner].TotalMs; saving <= d.RequiredMs {
				t.Fatalf("forwarded with saving %.1f <= required %.1f", saving, d.RequiredMs)
			}
		}
		if w := d.Winner; w >= 0 && cands[w].Remote && (cands[w].SummaryAge >= cfg.IgnoreAfter || cands[w].Suspect) {
			if d.BestLocal >= 0 || d.Reason != ReasonRemoteUnconfirmed {
				t.Fatalf("a stale or suspect remote won over a confirmed place: %+v", d)
			}
			for i, c := range cands {
				if c.Remote && c.SummaryAge < cfg.IgnoreAfter && !c.Suspect {
					t.Fatalf("a stale or suspect remote won over confirmed remote %d", i)
				}
			}
		}
	})
}

type shareFunc func(string) float64

func (f shareFunc) Share(r string, _ time.Time) float64 { return f(r) }

// ShareTracker against a naive list of timestamped decisions.
func TestShareTrackerMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		window := time.Minute
		st := NewShareTracker(window)
		bucket := window / shareBuckets
		type rec struct {
			at     time.Time
			region string
		}
		var log []rec
		now := time.Unix(1_000_000, 0)
		for i := rapid.IntRange(0, 200).Draw(t, "n"); i > 0; i-- {
			now = now.Add(time.Duration(rapid.IntRange(0, 5000).Draw(t, "dt")) * time.Millisecond)
			r := rapid.SampledFrom([]string{"", "", "a", "b"}).Draw(t, "r")
			st.Record(r, now)
			log = append(log, rec{now, r})
			// Naive: decisions in buckets newer than (now's bucket - 60).
			cur := now.UnixNano() / int64(bucket)
			var all, a int
			for _, l := range log {
				if l.at.UnixNano()/int64(bucket) > cur-shareBuckets {
					all++
					if l.region == "a" {
						a++
					}
				}
			}
			want := 0.0
			if all > 0 {
				want = float64(a) / float64(all)
			}
			if got := st.Share("a", now); math.Abs(got-want) > 1e-12 {
				t.Fatalf("share of a = %v, naive %v", got, want)
			}
		}
	})
}

func benchCandidates(locals, remotes int) []Candidate {
	rng := rand.New(rand.NewPCG(3, 4))
	var cands []Candidate
	for i := 0; i < locals; i++ {
		cands = append(cands, Candidate{Region: "home", Pod: "pod", Profile: "h100", PromptTokens: 8000, CachedTokens: rng.IntN(8000), PendingPrefillTokens: rng.IntN(20000), Running: rng.IntN(40)})
	}
	for i := 0; i < remotes; i++ {
		cands = append(cands, Candidate{Region: "r", Remote: true, Profile: "b200", PromptTokens: 8000, CachedTokens: rng.IntN(8000), PendingPrefillTokens: rng.IntN(20000), RTTMs: 65, SummaryAge: time.Second})
	}
	return cands
}

func BenchmarkChoose(b *testing.B) {
	for _, c := range []struct {
		name            string
		locals, remotes int
	}{
		{"pods=256/remotes=0", 256, 0}, {"pods=1/remotes=3", 1, 3}, {"pods=1/remotes=10", 1, 10},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := mustModel(b, DefaultConfig())
			cands := benchCandidates(c.locals, c.remotes)
			st := NewShareTracker(time.Minute)
			now := time.Unix(0, 0)
			var d Decision
			b.ReportAllocs()
			for b.Loop() {
				m.Choose(cands, st, now, &d)
			}
		})
	}
}

// TestChooseUnconfirmedRemote: a remote region whose controllers miss pings
// (suspect) or whose summary is too old is no latency-driven choice, but
// traffic no other place may take still goes to the best of them.
func TestChooseUnconfirmedRemote(t *testing.T) {
	cfg := DefaultConfig()
	m := mustModel(t, cfg)
	local := Candidate{Region: "home", Pod: "p", Profile: "h100", PromptTokens: 8000}
	suspect := Candidate{Region: "eu-west-1", Remote: true, Profile: "h100", PromptTokens: 8000, CachedTokens: 7900, RTTMs: 75, Suspect: true}
	stale := Candidate{Region: "eu-central-1", Remote: true, Profile: "h100", PromptTokens: 8000, RTTMs: 20, SummaryAge: cfg.IgnoreAfter}
	var d Decision
	m.Choose([]Candidate{local, suspect, stale}, nil, time.Time{}, &d)
	if d.Winner != 0 || d.Estimates[1].Excluded != ExcludedSuspect || d.Estimates[2].Excluded != ExcludedStale {
		t.Fatalf("with a local candidate: %+v", d)
	}
	m.Choose([]Candidate{suspect, stale}, nil, time.Time{}, &d)
	// The suspect region's cache counts; the stale summary's does not.
	if d.Winner != 0 || d.Reason != ReasonRemoteUnconfirmed || d.BestRemote != 0 {
		t.Fatalf("remote only, unconfirmed: %+v", d)
	}
	fresh := suspect
	fresh.Suspect, fresh.Region = false, "eu-west-2"
	m.Choose([]Candidate{suspect, fresh}, nil, time.Time{}, &d)
	if d.Winner != 1 || d.Reason != ReasonRemoteOnly {
		t.Fatalf("a confirmed remote loses to a suspect one: %+v", d)
	}
}
