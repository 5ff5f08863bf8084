package regional_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// traffic keeps `clients` clients sending chat requests until stopped and
// records every result.
type traffic struct {
	mu      sync.Mutex
	results []result
	stop    chan struct{}
	wg      sync.WaitGroup
	sent    atomic.Int64
}

func startTraffic(url string, clients int, seed uint64) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	rng := rand.New(rand.NewPCG(seed, 9))
	sys := make([]string, 8)
	for i := range sys {
		sys[i] = fmt.Sprintf("System %d. ", i) + words(rng, 300)
	}
	for c := 0; c < clients; c++ {
		tr.wg.Add(1)
		go func(c int) {
			defer tr.wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			for {
				select {
				case <-tr.stop:
					return
				default:
				}
				msgs := []chatMsg{{"system", sys[r.IntN(len(sys))]}, {"user", words(r, 20)}}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				res := chat(ctx, url, msgs, "", route.PolicyRoundRobin)
				cancel()
				tr.sent.Add(1)
				tr.mu.Lock()
				tr.results = append(tr.results, res)
				tr.mu.Unlock()
			}
		}(c)
	}
	return tr
}

func (tr *traffic) stopAndCollect() []result {
	close(tr.stop)
	tr.wg.Wait()
	return tr.results
}

// waitFor polls cond with a bound; traffic keeps flowing meanwhile, and each
// condition is something the traffic makes happen (a pod ejected, a pod
// serving again).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// Issue acceptance: a pod returning 500s, a pod that stalls and a pod killed
// mid-stream. Clients see no errors but those of requests in flight on the
// killed pod; the sick pods are ejected and, once healthy, readmitted.
func TestE2EFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	f := startFleet(t, 8, 4000, func(c *regional.Config) {
		c.Server.Outlier.BaseEjection = time.Second
		// Long enough that a healthy pod on a loaded machine always
		// answers within it (a stall is a stall: it never answers).
		c.Server.FirstByteTimeout = 5 * time.Second
		c.Server.MaxRetries = 3
	})
	url := f.ctl.URL()
	pod := func(name string) *route.Pod {
		p, ok := f.ctl.Registry.Get(name)
		if !ok {
			t.Fatalf("no pod %s", name)
		}
		return p
	}
	routed := func(name string) int64 { return pod(name).Load().Routed }
	tr := startTraffic(url, 8, 1)

	// 1. pod-1 answers 500: its requests are retried elsewhere, and after 5
	// consecutive failures it is ejected.
	if err := f.engines[1].SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod-1 ejected", func() bool { return pod("pod-1").Ejected(f.clock.Now()) })
	// Healed; once its ejection time is over it takes traffic again.
	_ = f.engines[1].SetFaults(enginesim.Faults{})
	f.clock.Advance(2 * time.Second)
	before := routed("pod-1")
	waitFor(t, "pod-1 readmitted", func() bool { return !pod("pod-1").Ejected(f.clock.Now()) && routed("pod-1") > before+3 })

	// 2. pod-2 stalls before its first byte: abandoned after the first-byte
	// timeout, retried elsewhere, ejected.
	if err := f.engines[2].SetFaults(enginesim.Faults{StallRate: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod-2 ejected", func() bool { return pod("pod-2").Ejected(f.clock.Now()) })
	_ = f.engines[2].SetFaults(enginesim.Faults{})
	f.engines[2].ReleaseStalls()
	f.clock.Advance(3 * time.Second)
	before = routed("pod-2")
	waitFor(t, "pod-2 readmitted", func() bool { return !pod("pod-2").Ejected(f.clock.Now()) && routed("pod-2") > before+3 })

	// 3. pod-3 dies with streams in flight: only those fail; it leaves the
	// registry when its PodDown arrives, and traffic goes on without it.
	before = tr.sent.Load()
	waitFor(t, "streams in flight on pod-3", func() bool { return pod("pod-3").Load().InFlight > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = f.engines[3].Close(ctx)
	cancel()
	waitFor(t, "pod-3 gone", func() bool { _, ok := f.ctl.Registry.Get("pod-3"); return !ok })
	waitFor(t, "more traffic after the kill", func() bool { return tr.sent.Load() > before+40 })

	results := tr.stopAndCollect()
	var failed, onKilled int
	for _, r := range results {
		if r.err == nil {
			continue
		}
		if r.pod == "pod-3" {
			onKilled++
			continue
		}
		failed++
		if failed <= 5 {
			t.Errorf("request failed (pod %q): %v", r.pod, r.err)
		}
	}
	t.Logf("%d requests, %d failed on the killed pod, %d other failures", len(results), onKilled, failed)
	if failed > 0 {
		t.Fatalf("%d requests failed beyond those in flight on the killed pod", failed)
	}
}
