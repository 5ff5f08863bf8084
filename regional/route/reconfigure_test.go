package route

import (
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/index"
)

// TestReconfigure: a new pipeline takes over from the next decision (the
// prefix weight off, a pod that holds the prefix no longer wins by it; a
// filter added, it filters); an invalid configuration changes nothing; the
// settings that size the session table keep their values.
func TestReconfigure(t *testing.T) {
	f := newFixture(t, 4, nil)
	c := chain(1, 40)
	_ = f.idx.Register(f.pod(t, "pod-2").ID, index.TierGPU, c[:30])
	d, err := f.dec.Decide(req(c))
	if err != nil || d.PodName != "pod-2" || d.CachedTokens == 0 {
		t.Fatalf("before: %+v, %v", d, err)
	}

	// Round robin ignores the cache: four decisions visit every pod.
	cfg := f.dec.Config()
	cfg.Policy = PolicyRoundRobin
	cfg.SessionTTL, cfg.MaxSessions, cfg.SpeculationTTL = time.Second, 7, 0
	inForce, err := f.dec.Reconfigure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultConfig()
	if inForce.Policy != PolicyRoundRobin || inForce.SessionTTL != def.SessionTTL || inForce.MaxSessions != def.MaxSessions ||
		inForce.SpeculationTTL != def.SpeculationTTL || f.dec.Config().Policy != PolicyRoundRobin {
		t.Fatalf("in force after Reconfigure: %+v", inForce)
	}
	seen := map[string]bool{}
	for range 4 {
		d, err := f.dec.Decide(req(c))
		if err != nil {
			t.Fatal(err)
		}
		seen[d.PodName] = true
	}
	if len(seen) != 4 {
		t.Fatalf("round robin after Reconfigure visited %v", seen)
	}

	// An invalid configuration is refused whole.
	bad := f.dec.Config()
	bad.Policy, bad.Filters = PolicyTTFT, []string{"alive", "no-such-filter"}
	if _, err := f.dec.Reconfigure(bad); err == nil {
		t.Fatal("a configuration naming an unknown filter was accepted")
	}
	if got := f.dec.Config(); got.Policy != PolicyRoundRobin || len(got.Filters) != len(def.Filters) {
		t.Fatalf("a refused configuration changed the pipeline: %+v", got)
	}

	// Back to ttft with the prefix weight off: the cached pod wins no more
	// by its cache (the least loaded pod, tied, is taken by the hash).
	cfg = f.dec.Config()
	cfg.Policy = PolicyTTFT
	cfg.Weights = map[string]float64{"prefix": 0, "queue": 1, "running": 1, "kv_util": 1, "affinity": 1}
	if _, err := f.dec.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	d, err = f.dec.Decide(req(c))
	if err != nil {
		t.Fatal(err)
	}
	if d.Policy != PolicyTTFT || d.CachedTokens != 0 {
		t.Fatalf("with the prefix weight off the decision still counts the cache: %+v", d)
	}
}

// TestReconfigureConcurrent: decisions taken while the pipeline is
// replaced each use one whole pipeline (run with -race).
func TestReconfigureConcurrent(t *testing.T) {
	f := newFixture(t, 4, nil)
	c := chain(1, 10)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.dec.Decide(req(c)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := range 200 {
		cfg := f.dec.Config()
		cfg.Policy = []string{PolicyTTFT, PolicyRoundRobin, PolicyLeastLoaded}[i%3]
		if _, err := f.dec.Reconfigure(cfg); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
