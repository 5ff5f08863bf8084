package regional

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

// startKafka runs an in-process Kafka-protocol broker cluster (franz-go's
// kfake) on loopback and a kafka-go writer keyed by pod (Hash balancer).
//
// Its ports are below the kernel's ephemeral range (restartPort): a test
// may stop it and start another on the same addresses.
func startKafka(t testing.TB, brokers int, topic string) (*kfake.Cluster, *kafka.Writer) {
	t.Helper()
	ports := make([]int, brokers)
	for i := range ports {
		ports[i] = restartPort(t)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.Ports(ports...), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	tr := &kafka.Transport{}
	w := &kafka.Writer{Addr: kafka.TCP(c.ListenAddrs()...), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, Transport: tr, AllowAutoTopicCreation: true}
	t.Cleanup(func() {
		_ = w.Close()
		tr.CloseIdleConnections()
		c.Close()
	})
	return c, w
}

// restartPort is a loopback port for a broker a test stops and starts
// again on the same address: free now, and below the ephemeral range, so
// that no outgoing connection takes it as its source port in between
// (gossiptest.FreeAddr).
func restartPort(t testing.TB) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(gossiptest.FreeAddr(t))
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func produce(t testing.TB, w *kafka.Writer, msgs []Message) {
	t.Helper()
	kms := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		kms[i] = kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := w.WriteMessages(ctx, kms...)
		if err == nil {
			return
		}
		// The first write may race the topic's auto-creation.
		if !errors.Is(err, kafka.UnknownTopicOrPartition) && !errors.Is(err, kafka.LeaderNotAvailable) || ctx.Err() != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// runIngester runs g in the background until stop is called; stop waits
// for Run to return and returns its error.
func runIngester(ctx context.Context, g *Ingester) (stop func() error) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// stopCleanly stops a run of runIngester and fails t unless Run returned
// because it was stopped.
func stopCleanly(t testing.TB, stop func() error) {
	t.Helper()
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
}

func applied(g *Ingester) int64 {
	var n int64
	for _, off := range g.Applied() {
		n += off + 1
	}
	return n
}

// End to end over a Kafka-protocol broker: the index ends up holding exactly
// what the engines hold, through a consumer restart mid-stream (redelivered
// messages are skipped) and a group-coordinator move.
func TestIngestOverKafka(t *testing.T) {
	msgs, engines := workload(11, 4)
	g, idx, reg, _, _ := newTestIngester(t)
	cluster, w := startKafka(t, 3, kvevents.TopicFor("test"))
	g.cfg.Brokers = cluster.ListenAddrs()

	half := len(msgs) / 2
	produce(t, w, msgs[:half])

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func() (stop func()) {
		end := runIngester(ctx, g)
		return func() { stopCleanly(t, end) }
	}
	stop := run()
	if err := g.WaitFor(ctx, func() bool { return applied(g) >= int64(half/2) }); err != nil {
		t.Fatalf("waiting for the first messages: %v (applied %d)", err, applied(g))
	}
	stop() // the consumer dies mid-stream

	produce(t, w, msgs[half:])
	stop = run()
	defer stop()
	cluster.RehashCoordinators()
	if err := g.WaitFor(ctx, func() bool { return applied(g) >= int64(len(msgs)) }); err != nil {
		t.Fatalf("waiting for all %d messages: %v (applied %d)", len(msgs), err, applied(g))
	}
	checkIndex(t, idx, reg, engines)
	if !g.CaughtUp() {
		t.Error("not caught up after applying everything")
	}
	if got := fmt.Sprint(g.Lag()); got != "0" {
		t.Errorf("lag %s after the last message", got)
	}
}

// Malformed messages among good ones, through the broker and the
// consumer (which decodes ahead of applying): each is counted and skipped,
// and the index ends up holding exactly what the engines hold.
func TestIngestOverKafkaSkipsMalformed(t *testing.T) {
	msgs, engines := workload(13, 3)
	g, idx, reg, _, _ := newTestIngester(t)
	cluster, w := startKafka(t, 1, kvevents.TopicFor("test"))
	g.cfg.Brokers = cluster.ListenAddrs()
	rng := rand.New(rand.NewPCG(6, 6))
	var mixed []Message
	bad := 0
	for _, m := range msgs {
		for rng.IntN(3) == 0 {
			switch rng.IntN(3) {
			case 0:
				mixed = append(mixed, Message{Key: m.Key, Value: []byte{0x93, 0xcb}}) // truncated
			case 1:
				mixed = append(mixed, Message{Key: m.Key, Value: []byte("not msgpack at all")})
			case 2:
				mixed = append(mixed, Message{Key: m.Key, Value: bytes.Repeat([]byte{0xc1}, 10)})
			}
			bad++
		}
		mixed = append(mixed, m)
	}
	produce(t, w, mixed)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer stopCleanly(t, runIngester(ctx, g))
	if err := g.WaitFor(ctx, func() bool { return applied(g) >= int64(len(mixed)) }); err != nil {
		t.Fatalf("waiting for all %d messages: %v (applied %d)", len(mixed), err, applied(g))
	}
	checkIndex(t, idx, reg, engines)
	total := 0.0
	for _, reason := range kvevents.Reasons() {
		total += testutil.ToFloat64(g.m.decodeErrors.WithLabelValues(string(reason)))
	}
	if int(total) != bad {
		t.Fatalf("counted %v malformed messages, sent %d", total, bad)
	}
}

// A controller rebuilding its index from a broker whose answers to fetches
// come late (a loaded host, a distant broker): every pod's PodUp and events
// are still read. kafka-go takes MaxWait (100ms) as the deadline of the
// whole fetch, so an answer more than 25ms late was cut off by an i/o
// timeout and the partition fetched again from the same offset, for ever:
// the fleet's restarted replicas counted "1 of 2 pods registered" until
// their deadline.
func TestIngestRebuildsThroughLateFetchAnswers(t *testing.T) {
	msgs, engines := workload(12, 3)
	g, idx, reg, _, _ := newTestIngester(t)
	cluster, w := startKafka(t, 1, kvevents.TopicFor("test"))
	g.cfg.Brokers = cluster.ListenAddrs()
	produce(t, w, msgs)

	// Every fetch is answered late: held for 2s, past kafka-go's deadline
	// (MaxWait) and its own allowance for the round trip (1s), and well
	// within fetchRoundTrip.
	late := 2 * time.Second
	cluster.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		cluster.SleepControl(func() { <-time.After(late) })
		return nil, nil, false // then answered as usual
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer stopCleanly(t, runIngester(context.Background(), g))
	if err := g.WaitFor(ctx, func() bool { return applied(g) >= int64(len(msgs)) }); err != nil {
		t.Fatalf("waiting for all %d messages: %v (applied %d, offsets %v)", len(msgs), err, applied(g), g.Applied())
	}
	for _, e := range engines {
		p, ok := reg.Get(e.name)
		if !ok || p.Info().Endpoint == "" {
			t.Errorf("pod %s not registered with its endpoint", e.name)
		}
	}
	checkIndex(t, idx, reg, engines)
	if !g.CaughtUp() {
		t.Error("not caught up after applying everything")
	}
}

// BenchmarkIngestKafka is ingestion end to end: batches of KV events already
// in a Kafka-protocol broker (kfake on loopback) are fetched by the
// ingester's kafka-go consumer group, decoded, re-keyed (engine blocks of
// 16 tokens into router blocks of 64) and applied to the index. Each pod
// announces its KV capacity in its PodUp, as engine sims and real fleets
// do, so its re-keyer is sized up front. It reports block events (each
// stored or removed engine block is one) per second of wall clock
// (events/s), from the consumer's start (it joins its group and fetches)
// until the last message is applied; the consumer's shutdown (its last
// commit, leaving the group) is not ingestion and is left out. It reports
// too the time from the start to the first message applied (start-ms: the
// group join and the first fetch), the rate from then on (steady-events/s:
// what a running consumer sustains), and block events per second of this
// process's CPU time (cpu-events/s, which counts the in-process broker
// too: less sensitive than the wall clock to other load on a shared
// machine).
func BenchmarkIngestKafka(b *testing.B) {
	msgs, blocks := blockEventMessages(func(msgs, _ int) bool { return msgs < 2000 })
	cluster, w := startKafka(b, 1, kvevents.TopicFor("bench"))
	publish(b, w, msgs)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var start, steady time.Duration
	cpu0, cpuOK := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		idx, _ := index.New(index.DefaultConfig())
		reg := route.NewRegistry(idx)
		cfg := DefaultIngestConfig()
		cfg.Brokers, cfg.Region, cfg.BlockSize = cluster.ListenAddrs(), "bench", routerBlockSize
		g, err := NewIngester(cfg, benchIngestDeps(idx, reg))
		if err != nil {
			b.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		t0 := time.Now()
		go func() { _ = g.Run(rctx); close(done) }()
		if err := g.WaitFor(ctx, func() bool { return applied(g) > 0 }); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := g.WaitFor(ctx, func() bool { return applied(g) >= int64(len(msgs)) }); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		start, steady = start+t1.Sub(t0), steady+time.Since(t1)
		rcancel()
		<-done
		checkBenchPods(b, reg)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(start.Milliseconds())/float64(b.N), "start-ms")
	b.ReportMetric(float64(blocks)*float64(b.N)/steady.Seconds(), "steady-events/s")
	if cpu1, ok := processCPU(); cpuOK && ok && cpu1 > cpu0 {
		b.ReportMetric(float64(blocks)*float64(b.N)/(cpu1-cpu0).Seconds(), "cpu-events/s")
	}
	b.ReportMetric(float64(len(msgs))*float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkIngestApply is BenchmarkIngestKafka's consumer side alone: the
// same messages handed to Ingester.Apply on one goroutine (decode, re-key,
// index), no broker and no Kafka client: the work of the consumer's
// stages (decode ahead, re-key, index writes) on one core. It reports block
// events per second of wall clock (events/s) and of the thread's CPU time
// (cpu-events/s: the cost on one core, little affected by other load on a
// shared machine).
func BenchmarkIngestApply(b *testing.B) {
	msgs, blocks := blockEventMessages(func(msgs, _ int) bool { return msgs < 2000 })
	for i := range msgs {
		msgs[i].Offset = int64(i)
	}
	b.ReportAllocs()
	lockThread()
	defer unlockThread()
	cpu0, cpuOK := threadCPU()
	for b.Loop() {
		idx, _ := index.New(index.DefaultConfig())
		reg := route.NewRegistry(idx)
		cfg := DefaultIngestConfig()
		cfg.Brokers, cfg.Region, cfg.BlockSize = []string{"127.0.0.1:1"}, "bench", routerBlockSize
		g, err := NewIngester(cfg, benchIngestDeps(idx, reg))
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			g.Apply(m)
		}
		if applied(g) != int64(len(msgs)) {
			b.Fatalf("applied %d of %d messages", applied(g), len(msgs))
		}
		checkBenchPods(b, reg)
	}
	b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if cpu1, ok := threadCPU(); cpuOK && ok && cpu1 > cpu0 {
		b.ReportMetric(float64(blocks)*float64(b.N)/(cpu1-cpu0).Seconds(), "cpu-events/s")
	}
}

// BenchmarkCatchUp is how long a new replica takes to become ready: a
// topic retaining about a million block events (eight pods storing and
// evicting prompts of 1,024 tokens), a new ingester (its own consumer
// group, as every controller start has) from the start of the topic until
// it has caught up with the high-water marks it found at start, which is
// when /readyz turns 200. It reports seconds per million block events.
//
//	go test ./regional -run '^$' -bench CatchUp -benchtime 3x
func BenchmarkCatchUp(b *testing.B) {
	msgs, blocks := blockEventMessages(func(_, blocks int) bool { return blocks < 1_000_000 })
	cluster, w := startKafka(b, 1, kvevents.TopicFor("bench"))
	publish(b, w, msgs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		idx, _ := index.New(index.Config{PodCapacity: 64, ExpectedBlocks: blocks / 4})
		reg := route.NewRegistry(idx)
		cfg := DefaultIngestConfig()
		cfg.Brokers, cfg.Region, cfg.BlockSize = cluster.ListenAddrs(), "bench", routerBlockSize
		g, err := NewIngester(cfg, benchIngestDeps(idx, reg))
		if err != nil {
			b.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = g.Run(rctx); close(done) }()
		if err := g.WaitFor(ctx, g.CaughtUp); err != nil {
			b.Fatal(err)
		}
		if n := applied(g); n < int64(len(msgs)) {
			b.Fatalf("caught up with %d of %d messages applied", n, len(msgs))
		}
		rcancel()
		<-done
	}
	perRun := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(perRun/(float64(blocks)/1e6), "s/M-block-events")
	b.ReportMetric(float64(blocks), "block-events")
}

// benchIngestDeps are the ingest benchmarks' dependencies: the pods'
// PodUps are believed (their endpoints, "http://pod-N", are allowed), so
// that each pod's re-keyer is sized from the KV capacity it announces, as
// the benchmarks say. With the default gate (loopback endpoints only) the
// PodUps were refused and every re-keyer grew from empty.
func benchIngestDeps(idx *index.Index, reg *route.Registry) IngestDeps {
	return IngestDeps{Index: idx, Pods: reg, Metrics: prometheus.NewRegistry(),
		Announcements: newPodGate(PodsConfig{AllowedEndpoints: []string{"pod-*"}}).check}
}

// The pods of blockEventMessages, and the KV capacity each announces.
const benchPods, benchKVBlocks = 8, 8192

// checkBenchPods fails b unless the pods of blockEventMessages were
// registered from their PodUps, with the KV capacity these announce.
func checkBenchPods(b *testing.B, reg *route.Registry) {
	b.Helper()
	for p := range benchPods {
		name := fmt.Sprintf("pod-%d", p)
		if pod, ok := reg.Get(name); !ok || pod.Info().KVBlocks != benchKVBlocks || pod.Info().Endpoint == "" {
			b.Fatalf("pod %s not registered from its PodUp (announced %d KV blocks)", name, benchKVBlocks)
		}
	}
}

// publish writes msgs to the topic, retrying while it is being created.
func publish(b *testing.B, w *kafka.Writer, msgs []Message) {
	b.Helper()
	kms := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		kms[i] = kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for len(kms) > 0 {
		n := min(len(kms), 500)
		for err := w.WriteMessages(ctx, kms[:n]...); err != nil; err = w.WriteMessages(ctx, kms[:n]...) {
			if ctx.Err() != nil {
				b.Fatal(err)
			}
		}
		kms = kms[n:]
	}
}

// blockEventMessages generates the topic of eight pods storing prompts of
// 1,024 tokens (64 engine blocks each, 8 prompts a message) and evicting
// leaves once they hold 4,096 blocks, while more(messages, block events)
// holds. Each pod announces its KV capacity in its PodUp, so its re-keyer
// is sized up front. A block event is one stored or removed engine block.
func blockEventMessages(more func(msgs, blocks int) bool) ([]Message, int) {
	const pods, storesPerMsg, kvBlocks = benchPods, 8, benchKVBlocks
	rng := rand.New(rand.NewPCG(1, 1))
	engines := make([]*testEngine, pods)
	var msgs []Message
	blocks := 0
	for p := range engines {
		engines[p] = newTestEngine(fmt.Sprintf("pod-%d", p), 1)
		up := engines[p].podUp().(*kvevents.PodUp)
		up.KVBlocks = kvBlocks // as engine sims and real fleets announce it
		msgs = append(msgs, Message{Key: []byte(engines[p].name), Headers: engines[p].headers(), Value: engines[p].batch(up)})
	}
	for more(len(msgs), blocks) {
		e := engines[rng.IntN(pods)]
		var evs []kvevents.Event
		for i := 0; i < storesPerMsg; i++ {
			prompt := make([]uint32, 1024) // 64 engine blocks
			for j := range prompt {
				prompt[j] = uint32(rng.IntN(50000))
			}
			ev := e.store(prompt)
			blocks += len(ev.(*kvevents.BlockStored).BlockHashes)
			evs = append(evs, ev)
		}
		if len(e.held) > 4096 {
			rm := e.evictLeaves(rng, storesPerMsg*64)
			blocks += len(rm.(*kvevents.BlockRemoved).BlockHashes)
			evs = append(evs, rm)
		}
		msgs = append(msgs, Message{Key: []byte(e.name), Headers: e.headers(), Value: e.batch(evs...)})
	}
	return msgs, blocks
}

// TestIngestConnectedFollowsTheBrokers: "connected" is whether the brokers
// answer, probed with metadata calls, not whether events arrive: true on a
// topic nothing was ever published to, false while the broker is down, and
// true again as soon as it is back, before any event.
func TestIngestConnectedFollowsTheBrokers(t *testing.T) {
	g, _, _, _, _ := newTestIngester(t)
	portN := restartPort(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(portN), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	addr := cluster.ListenAddrs()[0]
	g.cfg.Brokers, g.cfg.ProbeInterval = []string{addr}, 20*time.Millisecond

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer runIngester(ctx, g)() // a broker going away may end Run with its error
	wait := func(what string, want bool) {
		t.Helper()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for g.Connected() != want {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: connected is still %v", what, !want)
			case <-tick.C:
			}
		}
	}
	wait("a broker with nothing published", true)
	cluster.Close()
	wait("the broker gone", false)
	cluster, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(portN), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	wait("the broker back, no event yet", true)
}

// TestIngestFollowsABrokerReset: the broker comes back empty (offsets from
// 0 again, as after data loss or a new cluster). The ingester notices (the
// partitions end below what it applied, or the cluster id changed), starts
// over in a fresh consumer group, and the index takes the new events: it
// ends up holding exactly what the engine holds.
func TestIngestFollowsABrokerReset(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	topic := kvevents.TopicFor("test")
	cluster, w := startKafka(t, 1, topic)
	addr := cluster.ListenAddrs()[0]
	_, port, _ := net.SplitHostPort(addr)
	portN, _ := strconv.Atoi(port)
	g.cfg.Brokers, g.cfg.Topic, g.cfg.ProbeInterval = []string{addr}, topic, 20*time.Millisecond

	e := newTestEngine("pod-0", 1)
	msg := func(evs ...kvevents.Event) Message {
		return Message{Key: []byte(e.name), Headers: e.headers(), Value: e.batch(evs...)}
	}
	first := []Message{msg(e.podUp())}
	for i := range 20 {
		first = append(first, msg(e.store(testPrompt(i))))
	}
	produce(t, w, first)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	defer runIngester(ctx, g)() // a broker going away may end Run with its error
	holds := func() bool {
		st := idx.Stats()
		p, ok := reg.Get(e.name)
		return ok && st.PodBlocks[p.ID.Slot()] == len(e.expected())
	}
	if err := g.WaitFor(ctx, holds); err != nil {
		t.Fatalf("before the reset: %v", err)
	}

	cluster.Close()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(portN), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	var second []Message
	for i := range 5 {
		second = append(second, msg(e.store(testPrompt(100+i))))
	}
	tr := &kafka.Transport{}
	w2 := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Transport: tr, AllowAutoTopicCreation: true}
	defer func() { _ = w2.Close(); tr.CloseIdleConnections() }()
	produce(t, w2, second)
	if err := g.WaitFor(ctx, holds); err != nil {
		t.Fatalf("the index did not take the events published after the reset: %v (resets %v)", err, g.Rebuilding())
	}
	checkIndex(t, idx, reg, []*testEngine{e})
	resets := testutil.ToFloat64(g.m.resets.WithLabelValues("offset_regression")) + testutil.ToFloat64(g.m.resets.WithLabelValues("cluster_changed"))
	if resets < 1 {
		t.Fatal("no reset counted")
	}
}

// TestIngestFollowsABrokerResetPastTheOffset: the broker comes back empty,
// and by the time the ingester looks again the engine has published more
// than it had applied before: no offset tells the reset (every partition
// ends past what was applied, the cluster id is the same), and the
// messages at the old offsets would be skipped as replays, while those
// past them apply. The probe finds another message at an offset it
// applied before: the pod is cleared and its partition re-read from the
// start (cause "rewritten"), so that the index holds exactly what the new
// partition says, as a naive scan of it would.
func TestIngestFollowsABrokerResetPastTheOffset(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	topic := kvevents.TopicFor("test")
	cluster, w := startKafka(t, 1, topic)
	addr := cluster.ListenAddrs()[0]
	_, port, _ := net.SplitHostPort(addr)
	portN, _ := strconv.Atoi(port)
	g.cfg.Brokers, g.cfg.Topic, g.cfg.ProbeInterval = []string{addr}, topic, 20*time.Millisecond

	e := newTestEngine("pod-0", 1)
	msg := func(evs ...kvevents.Event) Message {
		return Message{Key: []byte(e.name), Headers: e.headers(), Value: e.batch(evs...)}
	}
	first := []Message{msg(e.podUp())}
	for i := range 10 {
		first = append(first, msg(e.store(testPrompt(i))))
	}
	produce(t, w, first)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	run := func() (stop func()) {
		end := runIngester(ctx, g)
		return func() { _ = end() }
	}
	holds := func(e *testEngine) func() bool {
		return func() bool {
			st := idx.Stats()
			p, ok := reg.Get(e.name)
			return ok && st.PodBlocks[p.ID.Slot()] == len(e.expected())
		}
	}
	anchored := func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.anchors) > 0
	}
	stop := run()
	if err := g.WaitFor(ctx, holds(e)); err != nil {
		t.Fatalf("before the reset: %v", err)
	}
	tick := time.NewTicker(5 * time.Millisecond) // the probe runs every 20 ms
	defer tick.Stop()
	for !anchored() {
		select {
		case <-ctx.Done():
			t.Fatal("the probe took no anchor")
		case <-tick.C:
		}
	}
	stop()
	before := g.Applied()

	// The broker comes back empty and takes more messages than were
	// applied before, while the ingester is away.
	cluster.Close()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(portN), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	var second []Message
	logView := newTestEngine(e.name, 1) // what the new partition says
	for i := range len(first) + 5 {
		second = append(second, msg(e.store(testPrompt(100+i))))
		logView.store(testPrompt(100 + i))
	}
	tr := &kafka.Transport{}
	w2 := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Transport: tr, AllowAutoTopicCreation: true}
	defer func() { _ = w2.Close(); tr.CloseIdleConnections() }()
	produce(t, w2, second)
	ends, err := g.highWaterMarks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for p, end := range ends {
		if last, ok := before[p]; ok && end <= last {
			t.Fatalf("partition %d ends at %d, not past the %d applied: the offsets would tell", p, end, last)
		}
	}

	stop = run()
	defer stop()
	if err := g.WaitFor(ctx, holds(logView)); err != nil {
		t.Fatalf("the index does not hold what the rewritten partition says: %v", err)
	}
	checkIndex(t, idx, reg, []*testEngine{logView})
	if n := testutil.ToFloat64(g.m.resets.WithLabelValues("rewritten")); n < 1 {
		t.Fatalf("no rewritten partition counted (resets: regression %v, cluster %v)",
			testutil.ToFloat64(g.m.resets.WithLabelValues("offset_regression")), testutil.ToFloat64(g.m.resets.WithLabelValues("cluster_changed")))
	}
}

// TestCheckEndsComparesWhatWasAppliedBefore: the probe reads the ends, and
// the consumer may apply newer messages while the answer is on its way; an
// end at the offset applied only since is no reset. One at or below what
// was applied before the probe asked is.
func TestCheckEndsComparesWhatWasAppliedBefore(t *testing.T) {
	g, _, _, _, _ := newTestIngester(t)
	g.mu.Lock()
	g.applied[0], g.applied[1] = 5, 9
	g.mu.Unlock()
	resets := func() float64 { return testutil.ToFloat64(g.m.resets.WithLabelValues("offset_regression")) }
	// Partition 0 ended at 5 when asked: offset 5 was applied after.
	g.checkEnds("", map[int]int64{0: 5, 1: 10}, map[int]int64{0: 4, 1: 9})
	if n := resets(); n != 0 || len(g.Rebuilding()) != 0 {
		t.Fatalf("a message applied while the probe's answer was on its way counted as a reset: %v, rebuilding %v", n, g.Rebuilding())
	}
	// Partition 1 ends at 3 while 9 was applied before the probe asked.
	g.checkEnds("", map[int]int64{0: 6, 1: 3}, map[int]int64{0: 5, 1: 9})
	if n := resets(); n != 1 || len(g.Rebuilding()) != 1 || g.Rebuilding()[1] != 3 {
		t.Fatalf("a partition ending below what was applied: resets %v, rebuilding %v", n, g.Rebuilding())
	}
}
