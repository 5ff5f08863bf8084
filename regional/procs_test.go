package regional

import (
	"strings"
	"testing"
)

func TestProcsGovernor(t *testing.T) {
	const dt = procsInterval
	// Each step: the cores used over one interval, and the GOMAXPROCS
	// the governor wants after it.
	type step struct {
		s    procsSample
		want int
	}
	quiet, slow := int(procsQuietFor/dt), int(procsSlowFor/dt)
	steps := func(n int, used float64, want int) []step {
		s := make([]step, n)
		for i := range s {
			s[i] = step{procsSample{used: used, waits: 1000, slow: 1}, want}
		}
		return s
	}
	// waited: n intervals of 0.2 cores in which slow of 100 goroutines
	// made ready waited procsSlowWait or longer.
	waited := func(n int, slow uint64, want int) []step {
		s := make([]step, n)
		for i := range s {
			s[i] = step{procsSample{used: 0.2, waits: 100, slow: slow}, want}
		}
		return s
	}
	join := func(parts ...[]step) []step {
		var all []step
		for _, p := range parts {
			all = append(all, p...)
		}
		return all
	}
	// toOne: quiet until the governor takes GOMAXPROCS from max to 1.
	toOne := func(max int) []step { return join(steps(quiet-1, 0.2, max), steps(1, 0.2, 1)) }
	for _, tc := range []struct {
		name  string
		max   int
		steps []step
	}{
		{"quiet for procsQuietFor: one P", 4, join(steps(quiet-1, 0.1, 4), steps(1, 0.1, 1))},
		{"busy: stays at the default", 4, steps(3*quiet, 0.8, 4)},
		{"between the thresholds: no change", 2, steps(3*quiet, 0.45, 2)},
		{"one busy interval restarts the quiet time", 2,
			join(steps(quiet-1, 0.1, 2), steps(1, 0.35, 2), steps(quiet-1, 0.1, 2), steps(1, 0.1, 1))},
		{"busy again: the default at once", 8, join(steps(quiet-1, 0.2, 8), steps(1, 0.2, 1), steps(1, 0.59, 1), steps(1, 0.6, 8))},
		{"goroutines keep waiting to run: the default", 2, join(toOne(2), waited(slow-1, 5, 1), waited(1, 5, 2))},
		{"a passing stall does not count", 2, join(toOne(2), waited(slow-1, 5, 1), waited(1, 4, 1), waited(slow-1, 5, 1))},
		{"and stays while they wait", 2, join(toOne(2), waited(slow-1, 5, 1), waited(3*quiet, 5, 2))},
		{"too few made ready to tell", 2, join(toOne(2),
			[]step{{procsSample{used: 0.1, waits: procsMinWaits - 1, slow: procsMinWaits - 1}, 1}})},
		{"and quiet again", 2, join(steps(quiet-1, 0.2, 2), steps(2, 0.2, 1), steps(1, 1.5, 2), steps(quiet-1, 0.2, 2), steps(1, 0.2, 1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &procsGovernor{max: tc.max, cur: tc.max}
			for i, s := range tc.steps {
				if got := g.observe(s.s, dt); got != s.want {
					t.Fatalf("step %d (%+v): GOMAXPROCS %d, want %d", i, s.s, got, s.want)
				}
			}
		})
	}
}

func TestRuntimeConfigValidate(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 64} {
		if err := (RuntimeConfig{MaxProcs: n}).Validate(); err != nil {
			t.Errorf("max_procs %d: %v", n, err)
		}
	}
	err := RuntimeConfig{MaxProcs: -2}.Validate()
	if err == nil || !strings.Contains(err.Error(), "runtime.max_procs = -2") {
		t.Errorf("max_procs -2: %v, want an error naming the field", err)
	}
}
