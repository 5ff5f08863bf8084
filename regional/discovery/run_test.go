package discovery

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// waitTimeout bounds every wait on a condition: a failing test fails
// instead of hanging, and no test waits this long when it passes.
const waitTimeout = 20 * time.Second

// fakeClock is the grace period's clock in tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// running is a source running in the background and the snapshots it
// published.
type running struct {
	src     Source
	updates chan []Pod
	mu      sync.Mutex
	last    []Pod
	calls   int
}

// start runs src until the test ends, then checks that Run returned the
// context's error.
func start(t *testing.T, src Source) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{src: src, updates: make(chan []Pod, 64)}
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(pods []Pod) {
			r.mu.Lock()
			r.last, r.calls = pods, r.calls+1
			r.mu.Unlock()
			select {
			case r.updates <- pods:
			default: // the test reads snapshots through waitFor; it may skip some
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	return r
}

// snapshot returns the last published set and how many were published.
func (r *running) snapshot() ([]Pod, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.calls
}

// waitFor waits until the published set of pods has the given names
// (comma-separated) and returns it.
func (r *running) waitFor(t *testing.T, names string) []Pod {
	t.Helper()
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for {
		if last, calls := r.snapshot(); calls > 0 && podNames(last) == names {
			return last
		}
		select {
		case <-r.updates:
		case <-timeout.C:
			last, calls := r.snapshot()
			t.Fatalf("published pods are %q after %d updates; waited %v for %q", podNames(last), calls, waitTimeout, names)
		}
	}
}

// refresh asks src to look up now and returns its error.
func refresh(t *testing.T, src Source) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	err := src.Refresh(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Refresh did not return within %v", waitTimeout)
	}
	return err
}

// lookups returns the counts of meridian_discovery_lookups_total by result.
func lookups(t *testing.T, reg *prometheus.Registry) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "meridian_discovery_lookups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = int(m.GetCounter().GetValue())
		}
	}
	return out
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, name)
	if err != nil || n != 1 {
		t.Fatalf("gather %s: %d series, %v", name, n, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			if g := mf.GetMetric()[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
