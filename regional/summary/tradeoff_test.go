package summary

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
)

var tradeoff = flag.Bool("tradeoff", false, "measure the full trade-off table (100k, 1M and 10M blocks) and rewrite TRADEOFF.md")

// The decision setting of the report: two regions, the remote 65 ms away,
// H100 prefill at 0.36 ms/token (gorgo's default profile), 64-token blocks.
const (
	tradeoffBlockSize = 64
	tradeoffRTTMs     = 65
)

type tradeoffRow struct {
	Blocks     int
	Budget     int    // bytes; 0 for a fixed rate
	Rate       uint32 // S
	Bytes      int    // encoded summary
	Sampled    int
	BuildTime  time.Duration
	Queries    int
	MeanLower  float64 // truth - Lower, blocks
	P99Lower   float64
	MeanMid    float64 // |truth - Mid|, blocks
	P99Mid     float64
	FalseMatch float64 // queries whose Lower exceeds the truth (a false positive raised it)
	Fallbacks  float64 // queries where the check caught a false positive

	Forwards      int // decisions forwarding with the Lower estimate
	ExactForwards int // ... with the exact depth
	FalseForwards int // forwarding with Lower, not with the exact depth, and Lower > truth
	Missed        int // forwarding with the exact depth, not with Lower
	MidWrong      int // forwarding with Mid, not with the exact depth
	MidForwards   int
}

func (r tradeoffRow) falseForwardShare() float64 {
	if r.Forwards == 0 {
		return 0
	}
	return float64(r.FalseForwards) / float64(r.Forwards)
}

// evalTradeoff builds a summary of a synthetic n-block cache (budget bytes
// with the rate chosen to fit, or a fixed rate) and runs queries against it:
// query chains share a random-depth prefix with a random cached chain and
// continue with up to 256 fresh blocks. Each query is also a gorgo decision
// between the local region (holding, half of the time, a random prefix of
// the query) and the remote one, made with the estimated and the exact
// remote depth.
func evalTradeoff(t testing.TB, f *forest, hashes []uint64, budget int, rate uint32, queries int, seed uint64) tradeoffRow {
	cfg := BuildConfig{MaxBytes: budget, SampleRate: rate}
	if budget == 0 {
		cfg.MaxBytes = math.MaxInt32
	}
	start := time.Now()
	s, err := Build(testInput("us-west-2", 1), hashes, cfg)
	if err != nil {
		t.Fatal(err)
	}
	row := tradeoffRow{Blocks: len(hashes), Budget: budget, Rate: s.SampleRate, Bytes: s.EncodedSize(), Sampled: int(s.Sampled), BuildTime: time.Since(start), Queries: queries}
	model, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 77))
	f.rng = rand.New(rand.NewPCG(seed, 78))
	var q []uint64
	errLower := make([]float64, 0, queries)
	errMid := make([]float64, 0, queries)
	var dec gorgo.Decision
	cands := make([]gorgo.Candidate, 2)
	forward := func(remoteBlocks, localBlocks, prompt int) bool {
		cands[0] = gorgo.Candidate{Region: "us-east-1", Pod: "p0", Profile: "h100", PromptTokens: prompt, CachedTokens: localBlocks * tradeoffBlockSize}
		cands[1] = gorgo.Candidate{Region: "us-west-2", Remote: true, Profile: "h100", PromptTokens: prompt,
			CachedTokens: remoteBlocks * tradeoffBlockSize, RTTMs: tradeoffRTTMs}
		model.Choose(cands, nil, testTime, &dec)
		return dec.Winner == 1
	}
	falseMatch, fallbacks := 0, 0
	for range queries {
		var truth int
		q, truth = f.query(256, q)
		d := s.Depth(q)
		if d.Lower > truth {
			falseMatch++
		}
		if d.Fallback {
			fallbacks++
		}
		errLower = append(errLower, float64(truth-d.Lower))
		errMid = append(errMid, math.Abs(float64(truth-d.Mid())))

		prompt := len(q)*tradeoffBlockSize + rng.IntN(tradeoffBlockSize)
		local := 0
		if rng.IntN(2) == 0 {
			local = rng.IntN(len(q) + 1)
		}
		exact := forward(truth, local, prompt)
		est := forward(d.Lower, local, prompt)
		mid := forward(d.Mid(), local, prompt)
		if exact {
			row.ExactForwards++
		}
		if est {
			row.Forwards++
			if !exact && d.Lower > truth {
				row.FalseForwards++
			}
		}
		if exact && !est {
			row.Missed++
		}
		if mid {
			row.MidForwards++
			if !exact {
				row.MidWrong++
			}
		}
	}
	row.MeanLower, row.P99Lower = meanP99(errLower)
	row.MeanMid, row.P99Mid = meanP99(errMid)
	row.FalseMatch = float64(falseMatch) / float64(queries)
	row.Fallbacks = float64(fallbacks) / float64(queries)
	return row
}

func meanP99(xs []float64) (mean, p99 float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	slices.Sort(xs)
	for _, x := range xs {
		mean += x
	}
	return mean / float64(len(xs)), xs[min(len(xs)-1, int(math.Ceil(0.99*float64(len(xs))))-1)]
}

func tradeoffForest(n int) (*forest, []uint64) {
	f := newForest(uint64(n), n, 0.7, 4, 2048)
	return f, f.hashes(make([]uint64, 0, n))
}

// TestTradeoffTarget checks the targets at 1M blocks with the default
// budget: at most 64 KiB, and at most 1% of forwarding decisions caused by a
// false match.
func TestTradeoffTarget(t *testing.T) {
	f, hashes := tradeoffForest(1_000_000)
	row := evalTradeoff(t, f, hashes, DefaultMaxSize, 0, 5000, 1)
	t.Logf("%+v", row)
	if row.Bytes > DefaultMaxSize {
		t.Errorf("summary of 1M blocks is %d bytes, target <= %d", row.Bytes, DefaultMaxSize)
	}
	if row.Forwards < 100 {
		t.Fatalf("only %d forwarding decisions: the setting does not exercise forwarding", row.Forwards)
	}
	if share := row.falseForwardShare(); share > 0.01 {
		t.Errorf("%.2f%% of forwarding decisions caused by a false match, target <= 1%%", 100*share)
	}
}

// TestTradeoffReport measures the full table and rewrites TRADEOFF.md:
//
//	go test ./regional/summary -run TestTradeoffReport -tradeoff -v -timeout 30m
func TestTradeoffReport(t *testing.T) {
	if !*tradeoff {
		t.Skip("run with -tradeoff to measure the full table and rewrite TRADEOFF.md")
	}
	const queries = 20_000
	var rows []tradeoffRow
	for _, n := range []int{100_000, 1_000_000, 10_000_000} {
		f, hashes := tradeoffForest(n)
		for _, budget := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
			rows = append(rows, evalTradeoff(t, f, hashes, budget, 0, queries, 2))
			t.Logf("%+v", rows[len(rows)-1])
		}
		rows = append(rows, evalTradeoff(t, f, hashes, 0, 1, queries, 2))
		t.Logf("%+v", rows[len(rows)-1])
		runtime.GC()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Region summary trade-off\n\n")
	fmt.Fprintf(&b, "Produced by `go test ./regional/summary -run TestTradeoffReport -tradeoff -v -timeout 30m`\n")
	fmt.Fprintf(&b, "(%s, %s/%s, %d CPUs). Do not edit by hand.\n\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	b.WriteString(tradeoffPreamble)
	b.WriteString("| cached blocks | budget | S | bytes | sampled | build | Lower error mean / p99 (blocks) | Lower error mean / p99 (tokens) | Mid abs error mean / p99 (blocks) | false match | FP caught | forwards (est / exact) | forwards caused by a false match | missed forwards | Mid: wrong forwards |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		budget := "fixed"
		if r.Budget > 0 {
			budget = fmt.Sprintf("%d KiB", r.Budget>>10)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %s | %.2f / %.0f | %.0f / %.0f | %.2f / %.0f | %.3f%% | %.3f%% | %d / %d | %d (%.2f%%) | %d | %d of %d |\n",
			humanBlocks(r.Blocks), budget, r.Rate, r.Bytes, r.Sampled, r.BuildTime.Round(time.Millisecond),
			r.MeanLower, r.P99Lower, r.MeanLower*tradeoffBlockSize, r.P99Lower*tradeoffBlockSize, r.MeanMid, r.P99Mid,
			100*r.FalseMatch, 100*r.Fallbacks, r.Forwards, r.ExactForwards, r.FalseForwards, 100*r.falseForwardShare(),
			r.Missed, r.MidWrong, r.MidForwards)
	}
	fmt.Print(b.String())
	if err := os.WriteFile("TRADEOFF.md", []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func humanBlocks(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

const tradeoffPreamble = `Workload: a synthetic prefix-closed cache of N blocks — chains whose suffixes are
log-uniform in [4, 2048] blocks, 70% of them branching off an earlier chain at a uniform depth.
20,000 queries per row: a random cached chain cut at a uniform true depth, continued with up to 256
fresh blocks. Depth errors are true depth minus the estimate, in blocks of 64 tokens (a mean below
zero: filter false positives raised estimates above the truth more than sampling lowered them).
"False match": queries whose estimate exceeds the true depth. "FP caught": queries where the check
before the answer found a false positive and the consecutive scan answered instead.

Decisions: gorgo.DefaultConfig (forwarding margin 25 ms and 10% of the local estimate), both regions
H100 (0.36 ms/token prefill, 75 ms overhead), remote RTT 65 ms, no queues. The local region holds,
half of the time, a uniform-depth prefix of the query, otherwise nothing. "Forwards caused by a false
match": decisions that forward with the estimate, would not with the exact depth, and whose estimate
exceeds the true depth (only a filter false positive does that). "Missed forwards": the exact depth
forwards, the estimate does not (the price of the conservative Lower estimate). The Mid column shows
why Mid is not used: it forwards wrongly whenever it over-shoots.

`
