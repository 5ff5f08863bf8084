package regional_test

import (
	"testing"

	"github.com/meridian-llm/meridian/regional"
)

// Issue acceptance: on a shared-prefix workload, Meridian's routing against
// round-robin through the same controller: hit rate >= 3x, TTFT p50 >= 3x
// lower, prediction within 5% of what the engines report.
func TestE2ESharedPrefixVersusRoundRobin(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	// 24 system prompts of ~1.5k tokens = ~2.3k blocks of 16 tokens; each pod
	// holds 600 blocks, so the fleet holds the working set only when each
	// prefix lives on few pods.
	f := startFleet(t, 8, 1000, nil)
	url := f.ctl.URL()

	rr := summarize(run(t, url, sharedPrefixWorkload(1, 48, 480, 16), 10, regional.PolicyRoundRobin))
	predBefore := metricValue(t, url, "meridian_router_predicted_cached_tokens_total")
	repBefore := metricValue(t, url, "meridian_router_reported_cached_tokens_total")
	merRes := run(t, url, sharedPrefixWorkload(2, 48, 480, 16), 10, "")
	mer := summarize(merRes)
	var under, over, zeroPred, zeroBoth int
	for _, r := range merRes {
		switch {
		case r.predicted == 0 && r.cachedTokens == 0:
			zeroBoth++
		case r.predicted == 0:
			zeroPred++
		case r.predicted < r.cachedTokens-64:
			under++
		case r.predicted > r.cachedTokens+64:
			over++
			if over <= 12 {
				t.Logf("over: pod %s predicted %d cached %d prompt %d ttft %v", r.pod, r.predicted, r.cachedTokens, r.promptTokens, r.ttft)
			}
		}
	}
	t.Logf("meridian diagnostics: both zero %d, predicted zero but cached %d, under %d, over %d", zeroBoth, zeroPred, under, over)
	pred := metricValue(t, url, "meridian_router_predicted_cached_tokens_total") - predBefore
	rep := metricValue(t, url, "meridian_router_reported_cached_tokens_total") - repBefore

	t.Logf("round-robin: %d requests, %d errors, hit rate %.3f, TTFT p50 %v", rr.n, rr.errors, rr.hitRate, rr.ttftP50)
	t.Logf("meridian:    %d requests, %d errors, hit rate %.3f, TTFT p50 %v", mer.n, mer.errors, mer.hitRate, mer.ttftP50)
	t.Logf("prediction: index predicted %.0f cached tokens, engines reported %.0f (%.2f%%)", pred, rep, 100*(pred-rep)/rep)
	if rr.errors+mer.errors > 0 {
		t.Fatalf("errors: round-robin %d, meridian %d", rr.errors, mer.errors)
	}
	if mer.hitRate < 3*rr.hitRate {
		t.Errorf("hit rate %.3f is not 3x round-robin's %.3f", mer.hitRate, rr.hitRate)
	}
	if 3*mer.ttftP50 > rr.ttftP50 {
		t.Errorf("TTFT p50 %v is not 3x lower than round-robin's %v", mer.ttftP50, rr.ttftP50)
	}
	if rep == 0 || (pred-rep)/rep > 0.05 || (rep-pred)/rep > 0.05 {
		t.Errorf("predicted %.0f vs reported %.0f cached tokens: off by more than 5%%", pred, rep)
	}
}
