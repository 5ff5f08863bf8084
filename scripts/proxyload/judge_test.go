package main

import (
	"bufio"
	"bytes"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"
)

// latencies draws n latencies in microseconds: base plus an exponential
// tail of the given mean (the shape of a fast backend's answers).
func latencies(rng *rand.Rand, n int, base, mean float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = base + rng.ExpFloat64()*mean
	}
	return out
}

// The counting resample gives exactly what drawing, sorting and picking
// gives, for the same random stream: ties, infinities and tiny arms too.
func TestResampleQuantilesMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + rng.IntN(400)
		sorted := make([]float64, n)
		for i := range sorted {
			switch rng.IntN(10) {
			case 0:
				sorted[i] = math.Inf(1)
			case 1, 2:
				sorted[i] = float64(rng.IntN(3)) // ties
			default:
				sorted[i] = rng.Float64() * 1000
			}
		}
		slices.Sort(sorted)
		qs := [][]float64{{0.5, 0.99}, {0, 1}, {0.25, 0.5, 0.75, 0.999}}[trial%3]
		fast, naive := make([]float64, len(qs)), make([]float64, len(qs))
		counts := make([]int32, n)
		seed := uint64(trial)
		for range 5 {
			resampleQuantiles(sorted, qs, counts, fast, rand.New(rand.NewPCG(seed, 7)))
			resampleQuantilesNaive(sorted, qs, naive, rand.New(rand.NewPCG(seed, 7)))
			if !slices.Equal(fast, naive) {
				t.Fatalf("n=%d ps=%v seed %d: counting gives %v, sorting %v", n, qs, seed, fast, naive)
			}
			seed += 1000
		}
	}
}

func TestQuantile(t *testing.T) {
	s := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {0.5, 6}, {0.99, 10}, {1, 10}} {
		if got := quantile(s, c.p); got != c.want {
			t.Errorf("quantile(1..10, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if !math.IsNaN(quantile(nil, 0.5)) {
		t.Error("quantile of no samples is not NaN")
	}
}

// A proxy that adds a fixed 300 us to a backend's latencies adds 300 us
// at every percentile: the estimate and its CI must say so.
func TestEstimateAddedShift(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	w := window{direct: latencies(rng, 20000, 200, 100), proxied: latencies(rng, 40000, 500, 100), offered: 60000}
	e := estimateAdded(w, 400, 1)
	for _, c := range []struct {
		name string
		est  float64
		ci   [2]float64
	}{{"p50", e.p50, e.p50CI}, {"p99", e.p99, e.p99CI}} {
		if !(c.ci[0] <= c.est && c.est <= c.ci[1]) {
			t.Errorf("added %s %v outside its CI %v", c.name, c.est, c.ci)
		}
		if !(c.ci[0] <= 300 && 300 <= c.ci[1]) {
			t.Errorf("added %s CI %v misses the true 300 us", c.name, c.ci)
		}
	}
	// The p99 of an exponential tail of mean 100 from 20k samples is known
	// to about +-15 us: the CI should be that narrow, not hundreds wide.
	if width := e.p99CI[1] - e.p99CI[0]; width > 120 || width < 10 {
		t.Errorf("added p99 CI %v is %v us wide, want 10-120", e.p99CI, width)
	}
	if again := estimateAdded(w, 400, 1); again != e {
		t.Errorf("the same samples and seed gave %+v, then %+v", e, again)
	}
}

// The 95% CI covers the true added p99 in most of many independent
// windows (the percentile bootstrap of a p99 is a little optimistic at
// small samples; far below 95% would mean the interval is wrong).
func TestEstimateAddedCoverage(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const trials = 60
	covered := 0
	for range trials {
		w := window{direct: latencies(rng, 1500, 200, 100), proxied: latencies(rng, 1500, 450, 100)}
		if e := estimateAdded(w, 300, rng.Uint64()); e.p99CI[0] <= 250 && 250 <= e.p99CI[1] {
			covered++
		}
	}
	if covered < trials*85/100 {
		t.Errorf("the CI covered the true added p99 in %d of %d windows, want >= 85%%", covered, trials)
	}
}

// Failed requests count as infinitely slow: more than 1% of them through
// the proxy makes its p99 infinite, a failure; through both arms the
// difference is undefined, and the window invalid.
func TestEstimateAddedFailures(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	c := criteria{limit: 1000, maxLate: 0.01}
	proxied := latencies(rng, 10000, 300, 50)
	for i := range 300 {
		proxied[i] = math.Inf(1)
	}
	w := window{direct: latencies(rng, 10000, 200, 50), proxied: proxied}
	e := estimateAdded(w, 200, 1)
	if v := decide(e, 0, c); v != fail || !math.IsInf(e.p99, 1) {
		t.Errorf("3%% of proxied requests failed: added p99 %v, CI %v, verdict %s; want +Inf and fail", e.p99, e.p99CI, v)
	}
	w.direct = slices.Clone(proxied)
	if v := decide(estimateAdded(w, 200, 1), 0, c); v != invalid {
		t.Errorf("3%% of requests failed in both arms: verdict %s, want invalid", v)
	}
}

func TestDecide(t *testing.T) {
	c := criteria{limit: 1000, maxLate: 0.01}
	nan := math.NaN()
	for _, tc := range []struct {
		ci   [2]float64
		late float64
		want verdict
	}{
		{[2]float64{200, 900}, 0, pass},
		{[2]float64{-300, 1000}, 0, pass}, // the upper bound at the limit is within it
		{[2]float64{1001, 3000}, 0, fail},
		{[2]float64{1000, 3000}, 0, straddle}, // a lower bound at the limit is not above it
		{[2]float64{900, 1100}, 0, straddle},
		{[2]float64{200, 900}, 0.02, invalid}, // the generator fell behind: no verdict
		{[2]float64{1001, 3000}, 0.02, invalid},
		{[2]float64{200, 900}, 0.01, pass},
		{[2]float64{nan, 900}, 0, invalid},
		{[2]float64{200, nan}, 0, invalid},
	} {
		if got := decide(estimate{p99CI: tc.ci}, tc.late, c); got != tc.want {
			t.Errorf("CI %v, late %v: %s, want %s", tc.ci, tc.late, got, tc.want)
		}
	}
}

// judge pools windows while the CI straddles the limit, stops at the
// first pass or fail, measures again without pooling a window where the
// generator fell behind, and gives up after tries windows.
func TestJudge(t *testing.T) {
	c := criteria{limit: 1000, maxLate: 0.01, tries: 3, resamples: 300, seed: 1}
	rng := rand.New(rand.NewPCG(10, 11))
	// mk returns a window whose added p99 is about added, from n samples
	// per arm, with late of its requests sent late.
	mk := func(added float64, n int, late float64) window {
		return window{direct: latencies(rng, n, 200, 100), proxied: latencies(rng, n, 200+added, 100),
			offered: 2 * n, late: int(late * float64(2*n)), wall: 1, genCPU: 0.5}
	}
	for _, tc := range []struct {
		name     string
		windows  []window
		want     verdict
		measured int
		pooled   int // proxied samples judged
	}{
		{"clear pass", []window{mk(200, 5000, 0)}, pass, 1, 5000},
		{"clear fail", []window{mk(3000, 5000, 0)}, fail, 1, 5000},
		{"straddles, then pooled passes", []window{mk(1000, 2000, 0), mk(500, 20000, 0)}, pass, 2, 22000},
		{"straddles to the end", []window{mk(1000, 2000, 0), mk(1000, 2000, 0), mk(1000, 2000, 0), mk(200, 2000, 0)}, straddle, 3, 6000},
		{"late, then a valid pass", []window{mk(200, 5000, 0.05), mk(200, 4000, 0)}, pass, 2, 4000},
		{"late every time", []window{mk(200, 5000, 0.05), mk(200, 5000, 0.05), mk(200, 5000, 0.05)}, invalid, 3, 5000},
		// Workers that waited for a CPU are the machine's load, carried by
		// both arms: a window is not invalid for them, however many.
		{"workers late, pacer on time", []window{workerLateWin(mk(200, 5000, 0), 0.5)}, pass, 1, 5000},
		{"workers late, fails", []window{workerLateWin(mk(3000, 5000, 0), 0.9)}, fail, 1, 5000},
	} {
		i := 0
		s := judge(1500, func(rate float64) window {
			if rate != 1500 {
				t.Fatalf("%s: measured at %v, want 1500", tc.name, rate)
			}
			i++
			return tc.windows[i-1]
		}, c)
		if s.verdict != tc.want || s.windows != tc.measured || i != tc.measured || len(s.win.proxied) != tc.pooled {
			t.Errorf("%s: %s after %d windows (%d measured) judging %d samples; want %s after %d judging %d (CI %v)",
				tc.name, s.verdict, s.windows, i, len(s.win.proxied), tc.want, tc.measured, tc.pooled, s.est.p99CI)
		}
	}
}

// workerLateWin is w with share of its requests started late by their
// workers.
func workerLateWin(w window, share float64) window {
	w.workerLate = int(share * float64(w.offered))
	return w
}

// The pacer's lag is counted from due to when the pacer handed the
// request on, the worker's start delay from then to when it was written;
// each over a millisecond, and a queued request has none of the
// worker's.
func TestLateness(t *testing.T) {
	due := time.Unix(1000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name              string
		dispatched, sent  time.Duration // after due
		queued            bool
		pacer, workerLate bool
	}{
		{"on time", 0, 100 * time.Microsecond, false, false, false},
		{"both at the bound", ms, 2 * ms, false, false, false},
		{"pacer just late", ms + 1, ms + 2, false, true, false},
		// Sent 5 ms after due, all of it the pacer's: the worker started
		// at once.
		{"pacer late, worker prompt", 5 * ms, 5*ms + 500*time.Microsecond, false, true, false},
		// Sent 3 ms after due, all of it the worker's wait: not the
		// pacer's lag.
		{"worker late, pacer prompt", 100 * time.Microsecond, 3 * ms, false, false, true},
		{"worker just late", 0, ms + 1, false, false, true},
		// A queued request waited for a connection (the proxy's queue).
		{"queued", 0, 30 * ms, true, false, false},
		{"queued, pacer late", 2 * ms, 30 * ms, true, true, false},
	} {
		at, sent := due.Add(tc.dispatched), due.Add(tc.sent)
		if got := pacerLate(due, at); got != tc.pacer {
			t.Errorf("%s: pacerLate %v, want %v", tc.name, got, tc.pacer)
		}
		if got := workerLate(at, sent, tc.queued); got != tc.workerLate {
			t.Errorf("%s: workerLate %v, want %v", tc.name, got, tc.workerLate)
		}
	}
}

// Pooled windows add up both kinds of lateness, and the two shares are
// of the requests offered.
func TestWindowAddLateness(t *testing.T) {
	var w window
	w.add(window{offered: 100, late: 1, workerLate: 10, queued: 2})
	w.add(window{offered: 300, late: 3, workerLate: 30})
	if w.late != 4 || w.workerLate != 40 || w.queued != 2 || w.lateShare() != 0.01 || w.workerLateShare() != 0.1 {
		t.Errorf("pooled %+v: late share %v, worker late share %v; want 4, 40, 2, 0.01, 0.1", w, w.lateShare(), w.workerLateShare())
	}
}

// search never reports a rate that did not pass, and ends within a few
// percent of the true capacity of a fake proxy (passes up to capacity,
// straddles just above, fails beyond; the generator invalid above its
// own limit), from above and below the starting rate.
func TestSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 13))
	for trial := range 500 {
		capacity := 100 + rng.Float64()*40000
		genLimit := math.Inf(1)
		if trial%4 == 0 {
			genLimit = 100 + rng.Float64()*40000
		}
		var tried []float64
		best, steps := search(1000, 250, 40000, 3, func(r float64) step {
			tried = append(tried, r)
			v := fail
			switch {
			case r > genLimit:
				v = invalid
			case r <= capacity:
				v = pass
			case r <= capacity*1.02:
				v = straddle
			}
			return step{rate: r, verdict: v}
		})
		if len(steps) != len(tried) {
			t.Fatalf("search returned %d steps for %d rates tried", len(steps), len(tried))
		}
		truth := math.Min(capacity, genLimit)
		if best.rate > truth {
			t.Fatalf("capacity %.0f, generator limit %.0f: search reported %.0f (tried %v)", capacity, genLimit, best.rate, tried)
		}
		if best.rate > 0 && best.verdict != pass {
			t.Fatalf("search reported %.0f, whose verdict is %s", best.rate, best.verdict)
		}
		// How close: the gap left after three halvings, relative.
		var floor float64
		switch {
		case truth < 250:
			floor = 0 // below the lowest rate tried
		case truth >= 1000 && truth*1.5 <= 40000:
			floor = truth / 1.07
		case truth < 1000:
			floor = truth / 1.13
		}
		if best.rate < floor {
			t.Fatalf("capacity %.0f, generator limit %.0f: search reported %.0f, want >= %.0f (tried %v)", capacity, genLimit, best.rate, floor, tried)
		}
		if len(tried) > 15 {
			t.Fatalf("search tried %d rates: %v", len(tried), tried)
		}
	}
}

// A window against the backend itself (as both arms) sends what it
// should: every request offered is one arm's sample, both arms reach the
// count asked for, none fails, and the workers are all idle after it.
func TestWindowAgainstBackend(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serve(ln)
	url := "http://" + ln.Addr().String() + "/v1/chat/completions"
	d := &driver{body: chatBody(false), block: 20 * time.Millisecond}
	if err := d.open(url, []string{url}, 8); err != nil {
		t.Fatal(err)
	}
	defer d.close()
	w := d.window(2000, 1, 300, 30*time.Second)
	// Each sample has its round, in the order due: rounds of 20 ms at
	// 4,000 requests a second hold about 80, so a window of 600 or more
	// has at least 7.
	for arm, rounds := range map[string][]int32{"direct": w.directRound, "proxied": w.proxiedRound} {
		n := map[string]int{"direct": len(w.direct), "proxied": len(w.proxied)}[arm]
		if len(rounds) != n || !slices.IsSorted(rounds) || len(rounds) == 0 || rounds[len(rounds)-1] < 6 {
			t.Errorf("%s arm: %d rounds for %d samples, sorted %v, last %v; want one each, in order, the last >= 6",
				arm, len(rounds), n, slices.IsSorted(rounds), rounds[max(len(rounds)-1, 0):])
		}
	}
	if len(w.direct) < 300 || len(w.proxied) < 300 || len(w.direct)+len(w.proxied) != w.offered {
		t.Errorf("window of %d requests gave %d direct and %d proxied samples, want >= 300 each, %d in all",
			w.offered, len(w.direct), len(w.proxied), w.offered)
	}
	if n := failed(w); n != 0 {
		t.Errorf("%d requests failed", n)
	}
	if w.late > w.offered || w.workerLate > w.offered || w.queued > w.offered || w.wall <= 0 {
		t.Errorf("late %d, workers late %d, queued %d of %d offered, wall %v", w.late, w.workerLate, w.queued, w.offered, w.wall)
	}
	if len(d.idle[0]) != 8 || len(d.idle[1]) != 8 {
		t.Errorf("%d+%d connections idle after the window, want 8+8", len(d.idle[0]), len(d.idle[1]))
	}
}

// serveOneEach answers one request on each connection ln accepts, then
// closes it; with announce, its answer says so (Connection: close).
func serveOneEach(ln net.Listener, announce bool) {
	answer := chatAnswer
	if announce {
		answer = bytes.Replace(chatAnswer, []byte("\r\n\r\n"), []byte("\r\nConnection: close\r\n\r\n"), 1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			if _, err := br.ReadSlice('\n'); err != nil {
				return
			}
			length := int64(0)
			for {
				k, v, end, err := headerLine(br)
				if err != nil {
					return
				}
				if end {
					break
				}
				if bytes.EqualFold(k, []byte("Content-Length")) {
					length, _ = strconv.ParseInt(string(v), 10, 64)
				}
			}
			if _, err := readRequestBody(br, nil, length, false); err == nil {
				_, _ = c.Write(answer)
			}
		}()
	}
}

// Connections the other end closes are dialed again when next given a
// request, by the pacer's hand-off or from the queue: with one connection
// per arm, every request after the first of each arm is sent on a new
// one, most of them queued. Announced closes lose no request; unannounced
// ones may lose a request written just as the close arrives, but the
// window ends, every request accounted for, and the connections are idle.
func TestWindowRedials(t *testing.T) {
	for _, announce := range []bool{true, false} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go serveOneEach(ln, announce)
		url := "http://" + ln.Addr().String() + "/v1/chat/completions"
		d := &driver{body: chatBody(false)}
		if err := d.open(url, []string{url}, 1); err != nil {
			t.Fatal(err)
		}
		w := d.window(2000, 1, 200, 30*time.Second)
		if len(w.direct) < 200 || len(w.proxied) < 200 || len(w.direct)+len(w.proxied) != w.offered {
			t.Errorf("announce %v: window of %d requests gave %d direct and %d proxied samples, want >= 200 each, %d in all",
				announce, w.offered, len(w.direct), len(w.proxied), w.offered)
		}
		// Announced, no request may fail. Unannounced, how many are
		// written on a connection as its close arrives depends on how
		// fast the driver's readers see the close, so on the machine's
		// load: what must hold is that the driver redials, so that
		// requests on new connections are answered (the server closed
		// the connection open checked after that check: every answer in
		// the window came on a redialed one).
		if n := failed(w); announce && n != 0 {
			t.Errorf("announce %v: %d of %d requests failed", announce, n, w.offered)
		}
		for arm, v := range [][]float64{w.direct, w.proxied} {
			if ok := len(v) - failed(window{direct: v}); ok < 2 {
				t.Errorf("announce %v: arm %d had %d answered requests of %d, want >= 2 (redialed)", announce, arm, ok, len(v))
			}
		}
		if len(d.idle[0]) != 1 || len(d.idle[1]) != 1 {
			t.Errorf("announce %v: %d+%d connections idle after the window, want 1+1", announce, len(d.idle[0]), len(d.idle[1]))
		}
		d.close()
		ln.Close()
	}
}

// Pooled windows were measured one after the other: the second's rounds
// follow the first's, never merge with them.
func TestWindowAddRounds(t *testing.T) {
	var w window
	w.add(window{direct: []float64{1, 2}, directRound: []int32{0, 3}, proxied: []float64{1}, proxiedRound: []int32{1}})
	w.add(window{direct: []float64{1}, directRound: []int32{0}, proxied: []float64{1, 2}, proxiedRound: []int32{0, 2}})
	if want := []int32{0, 3, 4}; !slices.Equal(w.directRound, want) {
		t.Errorf("direct rounds %v, want %v", w.directRound, want)
	}
	if want := []int32{1, 4, 6}; !slices.Equal(w.proxiedRound, want) {
		t.Errorf("proxied rounds %v, want %v", w.proxiedRound, want)
	}
}
