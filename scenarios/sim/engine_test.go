package sim

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// engineJobs runs jobs (admitted at their instants, in order) through one
// engine alone and returns each job's first-byte and end instants.
func engineRun(perf enginePerf, admits []time.Duration, cached, uncached, out []int) (first, end []time.Duration) {
	e := &engine{perf: perf}
	first, end = make([]time.Duration, len(admits)), make([]time.Duration, len(admits))
	jobs := make([]*job, len(admits))
	idx := map[*job]int{}
	now := time.Duration(0)
	next := 0
	for {
		// The earlier of the next admission and the engine's next event.
		wake := e.plan()
		var at time.Duration
		switch {
		case next < len(admits) && (wake < 0 || admits[next] <= now+wake):
			at = admits[next]
		case wake >= 0:
			at = now + wake
		default:
			return first, end
		}
		now = at
		e.advance(now)
		for j := e.popPrefilled(); j != nil; j = e.popPrefilled() {
			i := idx[j]
			first[i] = now
			if out[i] > 1 {
				e.startDecode(j, out[i])
			} else {
				end[i] = now
			}
		}
		for j := e.popDecoded(); j != nil; j = e.popDecoded() {
			end[idx[j]] = now
		}
		for next < len(admits) && admits[next] <= now {
			j := &job{}
			jobs[next], idx[j] = j, next
			e.enqueue(j, cached[next], uncached[next])
			next++
		}
	}
}

// One request alone: its first byte comes after its chunked prefill
// (soloTTFTMs), then one token per step of a batch of one.
func TestEngineSoloRequest(t *testing.T) {
	perf := enginePerfs()["h100"]
	for _, tc := range []struct{ cached, uncached, out int }{{0, 500, 1}, {0, 5000, 10}, {20000, 3000, 100}, {0, 20000, 2}} {
		first, end := engineRun(perf, []time.Duration{0}, []int{tc.cached}, []int{tc.uncached}, []int{tc.out})
		want := perf.soloTTFTMs(tc.cached, tc.uncached)
		if got := float64(first[0]) / 1e6; math.Abs(got-want) > 0.01*want+0.01 {
			t.Errorf("%+v: first byte at %.2f ms, want %.2f", tc, got, want)
		}
		step := perf.StepMs + perf.KVReadMsPerToken*float64(tc.cached+tc.uncached)
		if got, want := float64(end[0]-first[0])/1e6, float64(tc.out-1)*step; math.Abs(got-want) > 0.02*want+0.01 {
			t.Errorf("%+v: decode took %.2f ms, want about %.2f", tc, got, want)
		}
	}
}

// The published anchor: 5,000 uncached tokens on an H100 pod alone take
// NIM's 406.77 ms to the first token.
func TestEngineMatchesNIMAnchor(t *testing.T) {
	if got := enginePerfs()["h100"].soloTTFTMs(0, 5000); math.Abs(got-406.77) > 1 {
		t.Fatalf("5,000-token TTFT %.2f ms, want 406.77", got)
	}
	// Decode slows with the batch: 50 requests of 5,250 tokens of context.
	e := enginePerfs()["h100"]
	if itl := e.StepMs + e.KVReadMsPerToken*50*5250; itl < 20 || itl > 30 {
		t.Fatalf("decode step with 50 in the batch %.1f ms", itl)
	}
}

// Any arrivals: first bytes come in admission order (FIFO prefill), never
// before the request's own tokens could be computed, and every request
// ends; the decode of many requests is never faster than of one. (The
// model is fluid: a request finishing inside a shared step gets its first
// byte when its last token is computed, up to one step before the step
// ends.)
func TestEngineProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		perf := enginePerfs()[rapid.SampledFrom([]string{"h100", "h200", "b200"}).Draw(rt, "profile")]
		n := rapid.IntRange(1, 12).Draw(rt, "n")
		var admits []time.Duration
		var cached, uncached, out []int
		at := time.Duration(0)
		for range n {
			at += time.Duration(rapid.IntRange(0, 2000).Draw(rt, "gap_ms")) * time.Millisecond
			admits = append(admits, at)
			cached = append(cached, rapid.IntRange(0, 30000).Draw(rt, "cached"))
			uncached = append(uncached, rapid.IntRange(1, 30000).Draw(rt, "uncached"))
			out = append(out, rapid.IntRange(1, 300).Draw(rt, "out"))
		}
		first, end := engineRun(perf, admits, cached, uncached, out)
		for i := range n {
			if i > 0 && first[i] < first[i-1] {
				rt.Fatalf("request %d's first byte at %v before request %d's at %v", i, first[i], i-1, first[i-1])
			}
			work := time.Duration(float64(uncached[i])*perf.PrefillMsPerToken*0.999*1e6) - time.Microsecond
			if first[i]-admits[i] < work {
				rt.Fatalf("request %d prefilled in %v, faster than its own tokens (%v)", i, first[i]-admits[i], work)
			}
			if end[i] < first[i] {
				rt.Fatalf("request %d ended before its first byte", i)
			}
			minDecode := time.Duration(float64(out[i]-1)*perf.StepMs*0.99*1e6) - time.Millisecond
			if end[i]-first[i] < minDecode {
				rt.Fatalf("request %d decoded %d tokens in %v, under %v", i, out[i], end[i]-first[i], minDecode)
			}
		}
	})
}

// The router's profile is the operator's fit of a single-request
// benchmark: it meets the engine at 500, 5,000 and 50,000 tokens.
func TestRouterProfileFitsEngine(t *testing.T) {
	for name, e := range enginePerfs() {
		p := e.routerProfile()
		for _, u := range []int{500, 5000, 50000} {
			model := p.OverheadMs + float64(u)*p.PrefillMsPerToken*(1+float64(u)/2/p.AttnTokens)
			if got := e.soloTTFTMs(0, u); math.Abs(model-got) > 0.01*got+0.5 {
				t.Errorf("%s at %d tokens: router %.1f ms, engine %.1f", name, u, model, got)
			}
		}
	}
}
