package main

import (
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// at gives each target its slices in turn, and measures a slice's
// moments from warm on; the reference walks the slices one by one.
func TestSlicingAt(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		sl := slicing{every: time.Duration(1+rng.IntN(1000)) * time.Millisecond}
		sl.warm = time.Duration(rng.Int64N(int64(sl.every)))
		n := 1 + rng.IntN(4)
		elapsed := time.Duration(rng.Int64N(int64(100 * time.Second)))
		k, measured := sl.at(elapsed, n)
		wantK, rest := 0, elapsed
		for rest >= sl.every {
			rest -= sl.every
			wantK = (wantK + 1) % n
		}
		if n == 1 {
			wantK, rest = 0, sl.warm // one target: every moment is measured
		}
		if k != wantK || measured != (rest >= sl.warm) {
			t.Fatalf("%+v, %d targets, at %v: got target %d measured %v, want %d %v", sl, n, elapsed, k, measured, wantK, rest >= sl.warm)
		}
	}
	if k, m := (slicing{}).at(5*time.Second, 3); k != 0 || !m {
		t.Errorf("no slicing: got target %d measured %v, want the first, measured", k, m)
	}
}

// The difference's point estimate is the difference of the two targets'
// added latencies as estimateAdded gives them; a target that adds 250 us
// more is shown to, and equal targets are not shown to differ in most
// windows.
func TestEstimateDifference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := window{direct: latencies(rng, 8000, 200, 100), proxied: latencies(rng, 16000, 300, 100)}
	b := window{direct: latencies(rng, 8000, 200, 100), proxied: latencies(rng, 16000, 550, 100)}
	df := estimateDifference(a, b, 300, 1)
	ea, eb := estimateAdded(a, 0, 1), estimateAdded(b, 0, 1)
	if df.p50 != ea.p50-eb.p50 || df.p99 != ea.p99-eb.p99 {
		t.Errorf("difference %v/%v, want the added estimates' %v/%v", df.p50, df.p99, ea.p50-eb.p50, ea.p99-eb.p99)
	}
	for _, c := range []struct {
		name string
		ci   [2]float64
	}{{"p50", df.p50CI}, {"p99", df.p99CI}} {
		if !(c.ci[0] <= -250 && -250 <= c.ci[1]) || c.ci[1] >= 0 {
			t.Errorf("added %s difference CI %v: want it to hold -250 and not 0", c.name, c.ci)
		}
	}
	if got := lower(df.p99CI, "a", "b"); got != "a lower" {
		t.Errorf("lower: %q, want a lower", got)
	}
	if again := estimateDifference(a, b, 300, 1); again != df {
		t.Errorf("the same samples and seed gave %+v, then %+v", df, again)
	}
	const trials = 40
	shown := 0
	for range trials {
		a := window{direct: latencies(rng, 1500, 200, 100), proxied: latencies(rng, 1500, 400, 100)}
		b := window{direct: latencies(rng, 1500, 200, 100), proxied: latencies(rng, 1500, 400, 100)}
		if lower(estimateDifference(a, b, 200, rng.Uint64()).p99CI, "a", "b") != "none shown" {
			shown++
		}
	}
	if shown > trials*15/100 {
		t.Errorf("equal targets were shown to differ in %d of %d windows, want <= 15%%", shown, trials)
	}
	if df := estimateDifference(a, window{direct: b.direct}, 100, 1); df.p99CI == df.p99CI {
		t.Errorf("a target with no samples: CI %v, want undefined", df.p99CI)
	}
}

// okAfter answers the first n chat requests 200 and every one after 500.
func okAfter(n int64) http.HandlerFunc {
	var seen atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if seen.Add(1) > n {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}
}

// Alternating between a target that answers and one that fails every
// request after open's checks, each window holds its own target's
// samples and the direct requests of its own slices: every proxied
// request of the failing target's window failed, none of the other's,
// and no direct request. (Failures, not latencies, mark the targets: the
// test does not depend on the machine's speed.)
func TestRunAlternates(t *testing.T) {
	good := httptest.NewServer(okAfter(1 << 62))
	defer good.Close()
	const conns = 8
	bad := httptest.NewServer(okAfter(conns)) // open checks each connection once
	defer bad.Close()
	path := "/v1/chat/completions"
	d := &driver{body: chatBody(false)}
	if err := d.open(good.URL+path, []string{good.URL + path, bad.URL + path}, conns); err != nil {
		t.Fatal(err)
	}
	defer d.close()
	ws := d.run(1000, 0.5, 300, 30*time.Second, slicing{every: 50 * time.Millisecond, warm: 10 * time.Millisecond})
	if len(ws) != 2 {
		t.Fatalf("%d windows, want 2", len(ws))
	}
	for k, w := range ws {
		if len(w.direct) < 300 || len(w.proxied) < 300 || len(w.direct)+len(w.proxied) > w.offered {
			t.Errorf("target %d: %d direct and %d proxied samples of %d offered, want >= 300 each and the warm-ups unmeasured",
				k, len(w.direct), len(w.proxied), w.offered)
		}
		if n := failed(window{direct: w.direct}); n != 0 {
			t.Errorf("target %d: %d direct requests failed", k, n)
		}
		if w.wall <= 0 || len(w.directRound) != len(w.direct) || len(w.proxiedRound) != len(w.proxied) {
			t.Errorf("target %d: wall %v, %d/%d rounds for %d/%d samples", k, w.wall, len(w.directRound), len(w.proxiedRound), len(w.direct), len(w.proxied))
		}
	}
	if n := failed(window{proxied: ws[0].proxied}); n != 0 {
		t.Errorf("the answering target's window has %d failed requests of %d", n, len(ws[0].proxied))
	}
	if n := failed(window{proxied: ws[1].proxied}); n != len(ws[1].proxied) {
		t.Errorf("the failing target's window has %d failed requests of %d, want all", n, len(ws[1].proxied))
	}
	for arm, idle := range d.idle {
		if len(idle) != conns {
			t.Errorf("arm %d: %d connections idle after the run, want %d", arm, len(idle), conns)
		}
	}
}

// The weighted quantiles of a resample of rounds are what repeating each
// sample by its round's weight, sorting and picking gives.
func TestWeightedQuantilesMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 300 {
		n, rounds := 1+rng.IntN(300), 1+rng.IntN(12)
		lat, round := make([]float64, n), make([]int32, n)
		for i := range lat {
			lat[i] = float64(rng.IntN(50)) // ties
			round[i] = int32(rng.IntN(rounds))
		}
		weights := make([]int32, rounds)
		drawRounds(weights, rng)
		if trial%10 == 0 {
			clear(weights)
			weights[0] = 1 // perhaps no sample's round drawn
		}
		sorted := sortedArm(lat, round)
		qs := [][]float64{{0.5, 0.99}, {0, 1}, {0.25, 0.5, 0.999}}[trial%3]
		fast, naive := make([]float64, len(qs)), make([]float64, len(qs))
		weightedQuantiles(sorted.lat, sorted.round, weights, qs, fast)
		weightedQuantilesNaive(lat, round, weights, qs, naive)
		for j := range qs {
			if fast[j] != naive[j] && !(math.IsNaN(fast[j]) && math.IsNaN(naive[j])) {
				t.Fatalf("trial %d, n=%d, weights %v, ps %v: got %v, want %v", trial, n, weights, qs, fast, naive)
			}
		}
	}
}

// stalled draws an alternating run's window for one target: rounds
// rounds of n samples per arm, the proxied arm adding extra, and in each
// round with probability pStall a stall of the proxy slowing a tenth of
// the round's proxied samples by 2 ms (a collection's mark, say).
func stalled(rng *rand.Rand, rounds, n int, pStall, extra float64) window {
	var w window
	for r := range rounds {
		stall := rng.Float64() < pStall
		for range n {
			for arm := range 2 {
				l := 200 + rng.ExpFloat64()*100
				if arm == 1 {
					l += extra
				}
				if stall && arm == 1 && rng.IntN(10) == 0 {
					l += 2000
				}
				if arm == 0 {
					w.direct, w.directRound = append(w.direct, l), append(w.directRound, int32(r))
				} else {
					w.proxied, w.proxiedRound = append(w.proxied, l), append(w.proxiedRound, int32(r))
				}
			}
		}
	}
	return w
}

// Stalls that slow a run of requests make the samples of a round move
// together. Resampling rounds keeps the intervals honest there: equal
// targets are rarely shown to differ, where resampling requests shows a
// difference often (the windows of two equal controllers in one run did
// that: added p99 +530 us [334, 773]). A real difference is still shown.
func TestEstimateDifferenceBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const trials = 60
	shownBlocks, shownRequests := 0, 0
	for range trials {
		a, b := stalled(rng, 20, 300, 0.15, 100), stalled(rng, 20, 300, 0.15, 100)
		seed := rng.Uint64()
		if lower(estimateDifference(a, b, 200, seed).p99CI, "a", "b") != "none shown" {
			shownBlocks++
		}
		a.directRound, a.proxiedRound, b.directRound, b.proxiedRound = nil, nil, nil, nil
		if lower(estimateDifference(a, b, 200, seed).p99CI, "a", "b") != "none shown" {
			shownRequests++
		}
	}
	t.Logf("equal targets shown to differ: %d of %d resampling rounds, %d resampling requests", shownBlocks, trials, shownRequests)
	if shownBlocks > trials*15/100 {
		t.Errorf("resampling rounds, equal targets were shown to differ in %d of %d runs, want <= 15%%", shownBlocks, trials)
	}
	if shownRequests <= shownBlocks {
		t.Errorf("resampling requests showed a difference in %d runs, rounds in %d: the stalls do not test what they should", shownRequests, shownBlocks)
	}
	a, b := stalled(rng, 20, 300, 0, 100), stalled(rng, 20, 300, 0, 400)
	if df := estimateDifference(a, b, 300, 1); lower(df.p99CI, "a", "b") != "a lower" || lower(df.p50CI, "a", "b") != "a lower" {
		t.Errorf("a target adding 300 us more: difference p50 %v %v, p99 %v %v, want both shown", df.p50, df.p50CI, df.p99, df.p99CI)
	}
	if e := estimateAdded(b, 300, 1); !(e.p50CI[0] <= 400 && 400 <= e.p50CI[1]) {
		t.Errorf("added p50 %v CI %v resampling rounds, want it to hold 400", e.p50, e.p50CI)
	}
}
