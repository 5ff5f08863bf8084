package sim

import (
	"math"
	"testing"
	"time"
)

// Arrivals are scaled to the offered load asked for: exactly for a trace,
// within a few percent for the Poisson workloads (the rate is corrected
// from the load it gives).
func TestOfferedLoadScaling(t *testing.T) {
	for _, kind := range []string{WorkloadTrace, WorkloadShort, WorkloadRAG, WorkloadSharedDocs} {
		for _, target := range []float64{0.2, 0.7} {
			cfg := DefaultConfig()
			cfg.Workload.Kind = kind
			cfg.Workload.Load = target
			cfg.Workload.Duration = time.Minute
			if kind == WorkloadTrace {
				cfg.Workload.Trace = conversationTrace(t)
				cfg.Workload.Limit = 2000
			}
			in, err := prepare(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tol := 0.05
			if kind == WorkloadTrace {
				tol = 1e-6
			}
			if math.Abs(in.offered-target) > tol*target {
				t.Errorf("%s at %.1f: offered load %.4f", kind, target, in.offered)
			}
		}
	}
}

// A window of the trace: the fraction of its span asked for, at an offset
// that moves with the seed, starting at 0.
func TestTraceWindow(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Trace = conversationTrace(t)
	cfg.Workload.Window = 0.25
	full := cfg.Workload.Trace[len(cfg.Workload.Trace)-1].Timestamp - cfg.Workload.Trace[0].Timestamp
	starts := map[int]bool{}
	for seed := uint64(1); seed <= 4; seed++ {
		cfg.Seed = seed
		w := traceWindow(&cfg)
		if len(w) == 0 || w[0].Timestamp < 0 || w[len(w)-1].Timestamp > full/4 {
			t.Fatalf("seed %d: window of %d records spanning %d ms of %d", seed, len(w), w[len(w)-1].Timestamp, full)
		}
		starts[len(w)] = true
	}
	if len(starts) < 2 {
		t.Errorf("every seed replayed the same window")
	}
}

// Coding sessions grow with the load asked for.
func TestCodingSessionsForLoad(t *testing.T) {
	cfg := DefaultConfig()
	f := newFleetSpec(&cfg)
	lo, hi := codingSessionsFor(0.2, f), codingSessionsFor(0.8, f)
	if lo < 1 || hi < 3*lo {
		t.Fatalf("sessions %d at 0.2, %d at 0.8", lo, hi)
	}
}
