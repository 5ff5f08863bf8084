package summary

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/index"
)

func randomHashes(seed uint64, n int) []uint64 {
	rng := rand.New(rand.NewPCG(seed, 99))
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = rng.Uint64() | 1
	}
	return hs
}

// TestBuildFitsBudget: at 100k, 1M and 4M blocks the default build fits
// 64 KiB, with the smallest rate that does (one less would not fit its
// expected sample).
func TestBuildFitsBudget(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 100_000, 1_000_000, 4_000_000} {
		s, err := Build(testInput("us-east-1", 1), randomHashes(uint64(n), n), DefaultBuildConfig())
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		b, _ := s.MarshalBinary()
		if len(b) > DefaultMaxSize || len(b) != s.EncodedSize() {
			t.Fatalf("n=%d: %d bytes (EncodedSize %d), budget %d", n, len(b), s.EncodedSize(), DefaultMaxSize)
		}
		t.Logf("n=%d: rate %d, %d sampled, %d bytes", n, s.SampleRate, s.Sampled, len(b))
		if s.Blocks != uint64(n) {
			t.Fatalf("n=%d: Blocks = %d", n, s.Blocks)
		}
		if s.SampleRate > 1 {
			room := DefaultMaxSize - (s.EncodedSize() - s.FilterBytes())
			if fuseBytes(n/int(s.SampleRate-1)) <= room*9/10 {
				t.Errorf("n=%d: rate %d is wasteful: rate %d would fit with room to spare", n, s.SampleRate, s.SampleRate-1)
			}
		}
	}
}

// TestSamplerFraction: the rule keeps 1/S of uniform hashes.
func TestSamplerFraction(t *testing.T) {
	hs := randomHashes(4, 1_000_000)
	for _, rate := range []uint32{1, 2, 7, 18, 100} {
		s := NewSampler(rate)
		kept := 0
		for _, h := range hs {
			if s.Keep(h) {
				kept++
			}
		}
		want := float64(len(hs)) / float64(rate)
		if got := float64(kept); got < want*0.97-50 || got > want*1.03+50 {
			t.Errorf("rate %d kept %d of %d, want about %.0f", rate, kept, len(hs), want)
		}
	}
}

func TestBuildFixedRateTooLarge(t *testing.T) {
	_, err := Build(testInput("r", 1), randomHashes(1, 200_000), BuildConfig{MaxBytes: 64 << 10, SampleRate: 1})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
}

// TestBuildRejectsBadInput: each kind of bad input gets an error naming the
// field.
func TestBuildRejectsBadInput(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*Input)
		field string
	}{
		{"empty region", func(in *Input) { in.Region = "" }, "Region"},
		{"long region", func(in *Input) { in.Region = strings.Repeat("r", 65) }, "Region"},
		{"control char", func(in *Input) { in.Region = "us\x00east" }, "Region"},
		{"zero time", func(in *Input) { in.BuiltAt = time.Time{} }, "BuiltAt"},
		{"block size", func(in *Input) { in.BlockSize = 0 }, "BlockSize"},
		{"model", func(in *Input) { in.Models = []string{""} }, "Models[0]"},
		{"too many models", func(in *Input) { in.Models = make([]string, MaxModels+1) }, "Models"},
		{"profile name", func(in *Input) { in.Load[0].Profile = "" }, "Load[0].Profile"},
		{"duplicate profile", func(in *Input) { in.Load = append(in.Load, in.Load[0]) }, "Load[1].Profile"},
		{"negative pending", func(in *Input) { in.Load[0].PendingPrefillTokens = -1 }, "PendingPrefillTokens"},
		{"negative pods", func(in *Input) { in.Load[0].Pods = -1 }, "Pods"},
	}
	for _, c := range cases {
		in := testInput("r", 1)
		in.Load = append([]ProfileLoad(nil), in.Load...)
		c.edit(&in)
		_, err := Build(in, nil, DefaultBuildConfig())
		if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: err = %v, want ErrInvalidInput naming %s", c.name, err, c.field)
		}
	}
	if _, err := Build(testInput("r", 1), nil, BuildConfig{MaxBytes: 10}); err == nil || !strings.Contains(err.Error(), "MaxBytes") {
		t.Errorf("tiny budget: err = %v", err)
	}
}

// TestFromIndex builds from a live index: blocks of a removed pod drop out,
// and the remote estimate of a held chain is the naive sampled scan.
func TestFromIndex(t *testing.T) {
	x, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := index.Namespace{Model: "m", BlockSize: 4}
	tokens := make([]uint32, 4*3000)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	chain := index.ChainHashes(ns, tokens, nil)
	other := index.ChainHashes(index.Namespace{Model: "other", BlockSize: 4}, tokens, nil)
	a, _ := x.AddPod("a")
	b, _ := x.AddPod("b")
	if err := x.Register(a, index.TierGPU, chain[:2000]); err != nil {
		t.Fatal(err)
	}
	if err := x.Register(b, index.TierGPU, other); err != nil {
		t.Fatal(err)
	}
	if err := x.RemovePod(b); err != nil {
		t.Fatal(err)
	}
	in := testInput("eu-west-1", 2)
	in.BlockSize = 4
	s, err := FromIndex(x, in, BuildConfig{MaxBytes: 4 << 10, SampleRate: 0})
	if err != nil {
		t.Fatal(err)
	}
	held := heldSet(chain[:2000])
	lower, upper := naiveSampledDepth(held, s.Sampler(), chain)
	d := s.Depth(chain)
	if !falsePositiveIn(s, held, chain) && (d.Lower != lower || d.Upper != upper) {
		t.Fatalf("Depth = %+v, naive [%d, %d]", d, lower, upper)
	}
	if lower > 2000 || upper < 2000 {
		t.Fatalf("naive bracket [%d, %d] misses 2000", lower, upper)
	}
	for _, h := range other {
		if s.Sampler().Keep(h) && s.filter.contains(h) && !falsePositiveIn(s, held, []uint64{h}) {
			t.Fatalf("a removed pod's block is in the summary")
		}
	}
	if n, _ := s.MarshalBinary(); len(n) > 4<<10 {
		t.Fatalf("%d bytes over a 4 KiB budget", len(n))
	}
}

func TestCandidate(t *testing.T) {
	in := testInput("us-west-2", 3)
	in.Load = []ProfileLoad{
		{Profile: "b200", Pods: 1, PendingPrefillTokens: 1000, Running: 3, Slots: 256},
		{Profile: "h100", Pods: 3, PendingPrefillTokens: 8000, Running: 10, Slots: 768},
	}
	f := newForest(2, 2000, 0, 2000, 2000)
	s, err := Build(in, f.hashes(nil), BuildConfig{MaxBytes: 1 << 20, SampleRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	q := f.chain(0, 1000, nil)
	c := s.Candidate(testTime.Add(7*time.Second), q, 1000*64+10)
	if !c.Remote || c.Region != "us-west-2" || c.Profile != "h100" {
		t.Fatalf("identity: %+v", c)
	}
	if c.CachedTokens != 1000*64 || c.PromptTokens != 64010 {
		t.Fatalf("tokens: %+v", c)
	}
	// The age is the caller's (gossip's RegionView.Age, which knows when
	// the summary arrived): TestRegionCandidate.
	if c.PendingPrefillTokens != 2250 || c.Running != 4 || c.SummaryAge != 0 {
		t.Fatalf("load/age: %+v", c)
	}
	if c := s.Candidate(testTime.Add(-time.Second), q, 100); c.CachedTokens != 100 || c.SummaryAge != 0 {
		t.Fatalf("cap: %+v", c)
	}
	if !s.Serves("kimi-k2") || s.Serves("llama") {
		t.Fatal("Serves")
	}
}

func TestNextGeneration(t *testing.T) {
	if g := NextGeneration(5, testTime); g != uint64(testTime.UnixMilli()) {
		t.Fatalf("clock ahead: %d", g)
	}
	far := uint64(testTime.UnixMilli()) + 1000
	if g := NextGeneration(far, testTime); g != far+1 {
		t.Fatalf("clock behind: %d", g)
	}
}
