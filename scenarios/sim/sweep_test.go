package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// goldenSweep is a small sweep: short prompts on 3 regions x 2 pods, two
// loads, two seeds, a few policies.
func goldenSweep(t *testing.T) *SweepReport {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Workload.Kind = WorkloadShort
	cfg.Workload.Duration = 30 * time.Second
	cfg.Fleet.PodsPerRegion = 2
	cfg.Policies = []string{PolicyLeastOutstandingTokens, PolicyGORGO, PolicyCacheLocal, PolicyMeridian, AblationNoCache}
	rep, err := Sweep(context.Background(), cfg, SweepConfig{Loads: []float64{0.3, 0.7}, Seeds: 2}, Options{Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestSweepGolden: the --json rows of a sweep, byte for byte (go test
// -update rewrites testdata/sweep_short.json after a deliberate change).
func TestSweepGolden(t *testing.T) {
	var got bytes.Buffer
	if err := goldenSweep(t).WriteJSON(&got); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "sweep_short.json")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestSweepGolden -update)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("sweep rows differ from %s (go test -update after a deliberate change):\n%s", path, got.String())
	}
}

// TestSweepJSONShape: {"runs": [...]}, one object per (load, policy) with
// exactly the documented fields, the interval around the mean.
func TestSweepJSONShape(t *testing.T) {
	rep := goldenSweep(t)
	var out bytes.Buffer
	if err := rep.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]any
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil || len(doc) != 1 {
		t.Fatalf("not {\"runs\": [...]}: %v\n%s", err, out.String())
	}
	want := []string{"load", "utilization", "policy", "seeds", "hit_rate", "ttft_p50_ms", "ttft_p95_ms", "ttft_p95_ci95_ms",
		"e2e_p95_ms", "load_dispersion", "cross_region_requests", "egress_gb", "residency_violations"}
	runs := doc["runs"]
	if len(runs) != 2*5 {
		t.Fatalf("%d runs, want 10", len(runs))
	}
	for i, r := range runs {
		if len(r) != len(want) {
			t.Errorf("run %d has %d fields, want %d: %v", i, len(r), len(want), r)
		}
		for _, f := range want {
			if _, ok := r[f]; !ok {
				t.Errorf("run %d lacks %s", i, f)
			}
		}
		ci := r["ttft_p95_ci95_ms"].([]any)
		if p95 := r["ttft_p95_ms"].(float64); ci[0].(float64) > p95+1e-9 || ci[1].(float64) < p95-1e-9 {
			t.Errorf("run %d: p95 %v outside its interval %v", i, p95, ci)
		}
		if r["seeds"].(float64) != 2 {
			t.Errorf("run %d: seeds %v", i, r["seeds"])
		}
	}
	for _, x := range rep.Runs {
		if residencySafe(x.Policy) && x.ResidencyViolations != 0 {
			t.Errorf("%s at %.1f: %d violations", x.Policy, x.Load, x.ResidencyViolations)
		}
	}
}

func TestCI95(t *testing.T) {
	lo, hi := ci95([]float64{10, 12, 14})
	// mean 12, sd 2, t(2) = 4.303: 12 -+ 4.303 x 2 / sqrt 3.
	if half := 4.303 * 2 / math.Sqrt(3); math.Abs(lo-(12-half)) > 1e-9 || math.Abs(hi-(12+half)) > 1e-9 {
		t.Fatalf("ci %v..%v", lo, hi)
	}
	if lo, hi := ci95([]float64{7}); lo != 7 || hi != 7 {
		t.Fatalf("one value: %v..%v", lo, hi)
	}
}

// TestSweepReport: the HTML report is one self-contained page with the
// parameters, Meridian against the baselines, and every chart with both
// axes; each policy drawn with its own dash pattern and marker.
func TestSweepReport(t *testing.T) {
	rep := goldenSweep(t)
	var b bytes.Buffer
	if err := rep.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{"<h2>Parameters</h2>", "best fair baseline", "ttft_p95_vs_load", "hit_rate_vs_load",
		"cross_region_vs_load", "egress_vs_load", "residency", "ablation", "decision", "loads"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://", "<link", "<img"} {
		if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Errorf("report is not self-contained: has %q", bad)
		}
	}
	svgs := regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAllString(page, -1)
	if len(svgs) < 7 {
		t.Fatalf("%d charts", len(svgs))
	}
	for i, s := range svgs {
		// Two axis lines (x and y) and tick labels on both.
		if strings.Count(s, `stroke="#333"/>`) < 4 || !strings.Contains(s, `text-anchor="end"`) {
			t.Errorf("chart %d lacks axes or ticks", i)
		}
	}
	lines := svgs[0]
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`<polyline fill="none" stroke="([^"]*)" stroke-width="2" stroke-dasharray="([^"]*)"`).FindAllStringSubmatch(lines, -1) {
		key := m[1] + "|" + m[2]
		if seen[key] {
			t.Errorf("two series drawn alike: %s", key)
		}
		seen[key] = true
	}
	if len(seen) != len(rep.mainPolicies()) {
		t.Errorf("%d distinct series, want %d", len(seen), len(rep.mainPolicies()))
	}
}

func TestLineStylesDistinct(t *testing.T) {
	all := append(PolicyNames(), AblationNames()...)
	seen := map[seriesStyle]string{}
	for _, p := range all {
		s := styleFor(p)
		if other, ok := seen[s]; ok {
			t.Errorf("%s and %s share a style", p, other)
		}
		seen[s] = p
	}
}
