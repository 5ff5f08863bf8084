package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestDeterministic: the same configuration gives the same report, whether
// the worlds run one at a time or side by side.
func TestDeterministic(t *testing.T) {
	for _, kind := range []string{WorkloadShort, WorkloadCoding} {
		cfg := DefaultConfig()
		cfg.Workload.Kind = kind
		cfg.Workload.Duration = 40 * time.Second
		cfg.Fleet.PodsPerRegion = 4
		var reps []*Report
		for _, par := range []int{1, 3} {
			rep, err := Run(context.Background(), cfg, Options{Parallel: par})
			if err != nil {
				t.Fatal(err)
			}
			for i := range rep.Results {
				rep.Results[i].WallS, rep.Results[i].DecideUs, rep.Results[i].HeapMB = 0, 0, 0
			}
			reps = append(reps, rep)
		}
		if !reflect.DeepEqual(reps[0], reps[1]) {
			a, _ := json.Marshal(reps[0].Rows())
			b, _ := json.Marshal(reps[1].Rows())
			t.Errorf("%s: reports differ:\n%s\n%s", kind, a, b)
		}
		cfg.Seed++
		other, err := Run(context.Background(), cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if reflect.DeepEqual(reps[0].Rows(), other.Rows()) {
			t.Errorf("%s: another seed gave the same report", kind)
		}
	}
}

// TestResidencyUnderPressure: with half the conversations from the EU PHI
// tenant, most of them entering in the US, Meridian's policies never serve
// one outside its allowed regions (4 regions, every workload), while the
// residency-blind baselines do.
//
// Each world runs on one goroutine, and the race detector makes it many
// times dearer for nothing it can find inside one: under it the workloads
// run 10 s of simulated time (the runner's goroutines still run under it,
// here and in TestDeterministic), and make test runs the full 40 s in its
// race-free step.
func TestResidencyUnderPressure(t *testing.T) {
	duration := 40 * time.Second
	if raceEnabled {
		duration = 10 * time.Second
	}
	for _, kind := range []string{WorkloadShort, WorkloadRAG, WorkloadCoding} {
		cfg := DefaultConfig()
		cfg.Fleet.Regions = RegionNames(4)
		cfg.Fleet.PodsPerRegion = 3
		cfg.Workload.Kind = kind
		cfg.Workload.Duration = duration
		cfg.Workload.EUHealthShare = 0.5
		cfg.Workload.ClassShares = map[string]float64{"phi": 0.6, "public": 0.4}
		cfg.Workload.OriginShares = []float64{0.4, 0.3, 0.1, 0.2}
		rep, err := Run(context.Background(), cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			switch {
			case residencySafe(r.Policy):
				if r.ResidencyViolations != 0 {
					t.Errorf("%s/%s: %d residency violations", kind, r.Policy, r.ResidencyViolations)
				}
				if r.CrossRegionRequests == 0 {
					t.Errorf("%s/%s: no request crossed a region, though EU PHI entered in the US", kind, r.Policy)
				}
			default:
				if r.ResidencyViolations == 0 {
					t.Errorf("%s/%s: no violation counted for a residency-blind baseline", kind, r.Policy)
				}
			}
			// gorgo's remote-share cap does not apply when residency leaves
			// no local candidate, so no request is refused.
			if r.Completed == 0 || r.Rejected != 0 {
				t.Errorf("%s/%s: %d completed, %d rejected (%v)", kind, r.Policy, r.Completed, r.Rejected, r.Reasons)
			}
		}
	}
}

// TestRunOutputs: the table, the JSON rows (exactly the documented fields)
// and the charts.
func TestRunOutputs(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Kind = WorkloadRAG
	cfg.Workload.Duration = 20 * time.Second
	cfg.Fleet.PodsPerRegion = 2
	dir := t.TempDir()
	var out bytes.Buffer
	if err := Execute(context.Background(), cfg, nil, Output{Stdout: &out, JSON: true, Charts: dir}); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if len(rows) != len(PolicyNames()) {
		t.Fatalf("%d rows, want %d", len(rows), len(PolicyNames()))
	}
	want := []string{"policy", "hit_rate", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p95_ms",
		"cross_region_requests", "egress_gb", "residency_violations", "load_dispersion"}
	for i, r := range rows {
		if len(r) != len(want) {
			t.Errorf("row %d has %d fields, want %d: %v", i, len(r), len(want), r)
		}
		for _, f := range want {
			if _, ok := r[f]; !ok {
				t.Errorf("row %d lacks %s", i, f)
			}
		}
		if r["policy"] != PolicyNames()[i] {
			t.Errorf("row %d is %v, want %s", i, r["policy"], PolicyNames()[i])
		}
	}
	for _, f := range []string{"ttft_cdf.svg", "hit_rate.svg", "load_dispersion.svg", "cross_region.svg", "residency.svg", "report.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".svg") && (!bytes.HasPrefix(b, []byte("<svg")) || !bytes.Contains(b, []byte(PolicyMeridian))) {
			t.Errorf("%s: not an SVG naming the policies", f)
		}
	}
	out.Reset()
	if err := Execute(context.Background(), cfg, nil, Output{Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	for _, p := range PolicyNames() {
		if !strings.Contains(out.String(), p) {
			t.Errorf("table lacks %s:\n%s", p, out.String())
		}
	}
}

// TestProgressBar: a run longer than ProgressAfter draws the bar and ends
// it with a newline.
func TestProgressBar(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Kind = WorkloadShort
	// Long enough for a run; what is checked is the bar's last drawing.
	cfg.Workload.Duration = 10 * time.Second
	cfg.Policies = []string{PolicyMeridian}
	var bar bytes.Buffer
	if _, err := Run(context.Background(), cfg, Options{Progress: &bar, ProgressAfter: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	// The bar is drawn at least once when the run ends.
	if s := bar.String(); !strings.Contains(s, "100%") || !strings.HasSuffix(s, "\n") {
		t.Errorf("progress output %q", s)
	}
}

// TestRunCancelled: a cancelled context stops the run with its error.
func TestRunCancelled(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Kind = WorkloadShort
	// The context is cancelled before Run starts: the workload's length
	// (the default's 10 minutes took ~25 s to generate under -race) only
	// costs its generation. A Run that ignored ctx returns no error.
	cfg.Workload.Duration = 10 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, cfg, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
}

// TestRunRejects: a bad configuration or residency policy is refused
// before anything runs.
func TestRunRejects(t *testing.T) {
	cfg := DefaultConfig()
	if _, err := Run(context.Background(), cfg, Options{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("trace workload without a trace: %v", err)
	}
	cfg.Workload.Kind = WorkloadShort
	cfg.Residency = []byte("version: 1\n")
	if _, err := Run(context.Background(), cfg, Options{}); err == nil || !strings.Contains(err.Error(), "residency") {
		t.Errorf("bad policy: %v", err)
	}
	cfg.Residency = ResidencyPolicy([]string{"us-east-1"})
	if _, err := Run(context.Background(), cfg, Options{}); err == nil || !strings.Contains(err.Error(), "us-west-2") {
		t.Errorf("policy lacking a region: %v", err)
	}
}

// BenchmarkConversationTrace: the whole conversation trace (12,031
// requests), every policy, on 3 regions x 8 pods, at load 0.5.
func BenchmarkConversationTrace(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Workload.Trace = conversationTrace(b)
	cfg.Workload.Load = 0.5
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Run(context.Background(), cfg, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
