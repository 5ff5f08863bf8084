package kvbridge_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

const routerBlockSize = 8 // two engine blocks of 4 tokens

// indexMismatch says how the index differs from what the engines' caches
// hold, router block by router block; "" when it holds exactly that.
func indexMismatch(idx *index.Index, reg *route.Registry, engines []*engine) string {
	st := idx.Stats()
	for _, en := range engines {
		name := en.e.Name()
		p, ok := reg.Get(name)
		if !ok {
			return name + " not registered"
		}
		var want [][]uint64
		for _, b := range en.e.CachedBlocks() {
			if (b.Position+1)%(routerBlockSize/en.e.Config().BlockSize) != 0 {
				continue
			}
			ns := index.Namespace{Model: testModel, LoRA: b.LoRA, CacheSalt: b.CacheSalt, BlockSize: routerBlockSize}
			want = append(want, index.ChainHashes(ns, b.Prefix, nil))
		}
		if len(want) == 0 {
			return name + ": the engine holds no full router block (the workload is too small)"
		}
		if got := st.PodBlocks[p.ID.Slot()]; got != len(want) {
			return fmt.Sprintf("%s: index holds %d router blocks, engine %d", name, got, len(want))
		}
		for _, chain := range want {
			full := false
			for _, m := range idx.Lookup(chain, nil) {
				if m.Pod == p.ID {
					full = m.Blocks == len(chain)
				}
			}
			if !full {
				return fmt.Sprintf("%s: a chain of %d blocks is not matched in full", name, len(chain))
			}
		}
	}
	return ""
}

// requestPrompt sends one completion of prompt.
func (en *engine) requestPrompt(prompt string) {
	en.t.Helper()
	body := fmt.Sprintf(`{"model": %q, "max_tokens": 2, "prompt": %q}`, testModel, prompt)
	resp, err := en.client.Post(en.e.URL()+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		en.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		en.t.Fatalf("request: %d %s", resp.StatusCode, b)
	}
}

// The whole path: engine simulators publishing over ZMQ -> kv-bridge ->
// Kafka (kfake) -> the regional ingester -> the block index. Traffic before
// the bridge starts (replayed at join), batches withheld on one engine's PUB
// socket (repaired through its replay socket), evictions, and a restart of
// the other engine on the same endpoints; once traffic stops the index holds
// exactly, router block for router block, what the engines' caches hold.
func TestEndToEndIndexMatchesEngines(t *testing.T) {
	cluster := startKafka(t)
	zc1 := zmqConfig()
	zc1.DropEvery = 4
	pub1, pub2 := newPublisher(t, zc1), newPublisher(t, zmqConfig())
	cfg1, cfg2 := engineConfig("pod-1"), engineConfig("pod-2")
	cfg1.CacheBlocks = 30
	e1, e2 := startEngine(t, cfg1, pub1), startEngine(t, cfg2, pub2)
	for i := range 6 {
		e1.request(i)
		e2.request(50 + i)
	}

	b := openBridge(t, bridgeConfig(cluster,
		kvbridge.PodConfig{Name: "pod-1", Endpoint: pub1.Addr(), ReplayEndpoint: pub1.ReplayAddr(), Hardware: "h100"},
		kvbridge.PodConfig{Name: "pod-2", Endpoint: pub2.Addr(), ReplayEndpoint: pub2.ReplayAddr(), Hardware: "h100"}))

	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg := route.NewRegistry(idx)
	icfg := regional.DefaultIngestConfig()
	icfg.Brokers, icfg.Region, icfg.BlockSize = cluster.ListenAddrs(), testRegion, routerBlockSize
	g, err := regional.NewIngester(icfg, regional.IngestDeps{Index: idx, Pods: reg, Logger: testLogger(), Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("ingester: %v", err)
		}
	})

	for _, p := range []*enginesim.ZMQPublisher{pub1, pub2} {
		waitPub(t, p, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	}
	for i := 6; i < 30; i++ {
		e1.request(i)
		e2.request(50 + i)
	}

	// pod-2's process restarts on the same endpoints.
	e2.close()
	if err := pub2.Close(); err != nil {
		t.Fatal(err)
	}
	pub2b := reopen(t, pub2)
	waitPub(t, pub2b, "the bridge's subscription to the new pod-2", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	e2b := startEngine(t, cfg2, pub2b)
	for i := 30; i < 45; i++ {
		e1.request(i)
		e2b.request(50 + i)
	}
	// Stop withholding and publish once more, so pod-1's last gap is seen.
	pub1.SetDropEvery(0)
	e1.requestPrompt(strings.Repeat("a final prompt of words never seen before ", 3))

	engines := []*engine{e1, e2b}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := g.WaitFor(wctx, func() bool { return indexMismatch(idx, reg, engines) == "" }); err != nil {
		t.Fatalf("the index never matched the engines: %s (bridge %+v)", indexMismatch(idx, reg, engines), b.Stats())
	}
	st := b.Stats()
	if st.GapsRecovered == 0 || st.GapsLost != 0 || st.JoinsFull != 2 || st.Restarts != 1 || pub1.Stats().FaultDropped == 0 {
		t.Fatalf("bridge stats %+v, pod-1 withheld %d", st, pub1.Stats().FaultDropped)
	}
	t.Logf("pod-1: %d cached blocks, %d batches (%d withheld and repaired); pod-2: %d cached blocks; bridge forwarded %d, replayed %d",
		len(e1.e.CachedBlocks()), pub1.Stats().Published, pub1.Stats().FaultDropped, len(e2b.e.CachedBlocks()), st.Forwarded, st.Replayed)
}

// vllmBatch is a batch as vLLM sends it (no lifecycle events): one
// BlockStored of two 4-token blocks, a chain of its own, with hashes and
// tokens unique to (incarnation, seq).
func vllmBatch(inc int, seq uint64) (enginesim.Batch, []uint32) {
	base := uint32(inc*100000 + int(seq)*8)
	tokens := []uint32{base, base + 1, base + 2, base + 3, base + 4, base + 5, base + 6, base + 7}
	h := uint64(inc)<<32 | seq<<1
	return enginesim.Batch{Pod: "pod-v", Seq: seq, TS: time.Unix(1700000000, int64(seq)), Events: []enginesim.Event{{
		Kind: enginesim.BlockStored, BlockHashes: []uint64{h | 1<<62, h | 1<<62 | 1}, TokenIDs: tokens,
		BlockSize: 4, Medium: enginesim.MediumGPU}}}, tokens
}

// A vLLM engine restarts while the bridge is cut off, and its new process
// publishes past the last seq the bridge forwarded; its replay buffer still
// holds that seq but no longer seq 0. The ingester's own rule (seq going
// back) cannot fire: only the bridge's restart marker clears the old
// process's blocks. The index ends with exactly the new process's blocks
// that reached Kafka.
func TestEndToEndRestartMarkerClearsOldBlocks(t *testing.T) {
	cluster := startKafka(t)
	pubA := newPublisher(t, zmqConfig())
	px := newProxy(t, strings.TrimPrefix(pubA.Addr(), "tcp://"))
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-v", Endpoint: px.endpoint(),
		ReplayEndpoint: pubA.ReplayAddr(), Model: testModel}))

	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg := route.NewRegistry(idx)
	icfg := regional.DefaultIngestConfig()
	icfg.Brokers, icfg.Region, icfg.BlockSize = cluster.ListenAddrs(), testRegion, routerBlockSize
	g, err := regional.NewIngester(icfg, regional.IngestDeps{Index: idx, Pods: reg, Logger: testLogger(), Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("ingester: %v", err)
		}
	})
	ns := index.Namespace{Model: testModel, BlockSize: routerBlockSize}
	// holds reports whether the index holds exactly these chains for pod-v.
	holds := func(chains [][]uint32) bool {
		p, ok := reg.Get("pod-v")
		if !ok || idx.Stats().PodBlocks[p.ID.Slot()] != len(chains) {
			return false
		}
		for _, toks := range chains {
			m := idx.Lookup(index.ChainHashes(ns, toks, nil), nil)
			if len(m) != 1 || m[0].Pod != p.ID {
				return false
			}
		}
		return true
	}
	wait := func(what string, chains [][]uint32) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer wcancel()
		if err := g.WaitFor(wctx, func() bool { return holds(chains) }); err != nil {
			p, _ := reg.Get("pod-v")
			got := -1
			if p != nil {
				got = idx.Stats().PodBlocks[p.ID.Slot()]
			}
			t.Fatalf("%s: the index holds %d blocks for pod-v, want %d (bridge %+v)", what, got, len(chains), b.Stats())
		}
	}

	waitPub(t, pubA, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	var first [][]uint32
	for s := range uint64(3) {
		batch, toks := vllmBatch(0, s)
		first = append(first, toks)
		if err := pubA.Publish(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	wait("the first process", first)

	px.cut()
	waitBridge(t, b, "the disconnection", func(s kvbridge.Stats) bool { return s.Connections == 0 })
	if err := pubA.Close(); err != nil {
		t.Fatal(err)
	}
	zc := zmqConfig()
	zc.Endpoint, zc.ReplayEndpoint, zc.BufferSteps = pubA.Addr(), pubA.ReplayAddr(), 6
	pubB := newPublisher(t, zc)
	var second [][]uint32
	publish := func(s uint64) {
		batch, toks := vllmBatch(1, s)
		if s >= 2 { // seqs 0 and 1 leave the 6-batch buffer before the bridge asks
			second = append(second, toks)
		}
		if err := pubB.Publish(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	for s := range uint64(7) {
		publish(s)
	}
	px.restore()
	waitPub(t, pubB, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	publish(7)
	wait("the second process", second)
	// The ingester can apply the marker before the bridge's Kafka write
	// returns and counts it: settle first.
	waitBridge(t, b, "the acknowledgement of everything received", func(s kvbridge.Stats) bool { return s.Pending == 0 })
	st := b.Stats()
	if st.Restarts != 1 || st.BatchesLost != 2 || st.Markers != 2 {
		t.Fatalf("bridge stats %+v", st)
	}
}
