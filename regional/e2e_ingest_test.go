package regional_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// indexMatches compares the index with what each engine simulator's cache
// holds: every full router block (4 engine blocks of 16 tokens) of every
// cached chain, and nothing else.
func indexMatches(idx *index.Index, reg *route.Registry, engines []*enginesim.Engine) error {
	st := idx.Stats()
	for _, e := range engines {
		p, ok := reg.Get(e.Name())
		if !ok {
			return fmt.Errorf("pod %s not registered", e.Name())
		}
		ns := index.Namespace{Model: e.Config().Model, BlockSize: 64}
		want := 0
		for _, b := range e.CachedBlocks() {
			if (b.Position+1)*e.Config().BlockSize%64 != 0 {
				continue
			}
			want++
			chain := index.ChainHashes(ns, b.Prefix, nil)
			found := false
			for _, m := range idx.Lookup(chain, nil) {
				if m.Pod == p.ID && m.Blocks == len(chain) {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("pod %s: cached chain of %d router blocks not in the index", e.Name(), len(chain))
			}
		}
		if got := st.PodBlocks[p.ID.Slot()]; got != want {
			return fmt.Errorf("pod %s: index holds %d router blocks, engine %d", e.Name(), got, want)
		}
	}
	return nil
}

// Issue acceptance: engine simulators produce over TCP to a Kafka-protocol
// broker; an ingester consumes; after traffic stops the index holds exactly
// the blocks the simulators hold — through evictions, a pod restart, a
// consumer restart mid-stream and a group-coordinator move.
func TestE2EIngestMatchesEngines(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	broker, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	openEngine := func(i int) *enginesim.Engine {
		cfg := enginesim.DefaultConfig()
		cfg.Name, cfg.Region, cfg.HashSeed = fmt.Sprintf("pod-%d", i), "test", "ingest"
		cfg.TimeScale, cfg.CacheBlocks, cfg.DefaultMaxTokens = 0.01, 300, 2 // small caches: many evictions
		cfg.Kafka = &enginesim.KafkaConfig{Brokers: broker.ListenAddrs()}
		e, err := enginesim.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	engines := make([]*enginesim.Engine, 4)
	for i := range engines {
		engines[i] = openEngine(i)
	}
	defer func() {
		for _, e := range engines {
			_ = e.Close(context.Background())
		}
	}()

	idx, _ := index.New(index.DefaultConfig())
	reg := route.NewRegistry(idx)
	icfg := regional.DefaultIngestConfig()
	icfg.Brokers, icfg.Region, icfg.BlockSize = broker.ListenAddrs(), "test", 64
	ing, err := regional.NewIngester(icfg, regional.IngestDeps{Index: idx, Pods: reg, Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	runIngester := func() func() {
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = ing.Run(rctx); close(done) }()
		return func() { rcancel(); <-done }
	}
	stop := runIngester()

	rng := rand.New(rand.NewPCG(3, 3))
	prefixes := make([]string, 6)
	for i := range prefixes {
		prefixes[i] = fmt.Sprintf("prefix %d ", i) + words(rng, 100+rng.IntN(400))
	}
	var mu sync.Mutex
	traffic := func(n int) {
		var wg sync.WaitGroup
		jobs := make(chan int)
		for w := 0; w < 6; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range jobs {
					mu.Lock()
					e := engines[rng.IntN(len(engines))]
					msgs := []chatMsg{{"system", prefixes[rng.IntN(len(prefixes))]}, {"user", words(rng, 10+rng.IntN(200))}}
					mu.Unlock()
					if r := chat(ctx, e.URL(), msgs, "", ""); r.err != nil {
						t.Errorf("engine %s: %v", e.Name(), r.err)
					}
				}
			}()
		}
		for i := 0; i < n; i++ {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
	}

	traffic(120)
	stop() // the consumer dies mid-stream
	traffic(60)
	stop = runIngester()
	broker.RehashCoordinators()
	traffic(60)
	// pod-2 restarts: PodDown, then a new process (new epoch, new hashes).
	_ = engines[2].Close(ctx)
	mu.Lock()
	engines[2] = openEngine(2)
	mu.Unlock()
	traffic(120)

	if err := ing.WaitFor(ctx, func() bool { return indexMatches(idx, reg, engines) == nil }); err != nil {
		t.Fatalf("index never matched the engines: %v", indexMatches(idx, reg, engines))
	}
	stop()
	st := idx.Stats()
	t.Logf("index holds %d router blocks for %d pods; engines evicted and restarted", st.Blocks, st.LivePods)
	if st.Blocks == 0 {
		t.Fatal("empty index")
	}
}
