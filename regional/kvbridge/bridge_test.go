package kvbridge_test

import (
	"context"
	"encoding/binary"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// replayBlocks applies the block events of engine batches to a set of
// engine hashes.
func replayBlocks(t *testing.T, recs []record) map[uint64]bool {
	t.Helper()
	dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	held := map[uint64]bool{}
	for _, r := range recs {
		b, err := dec.Decode(r.value)
		if err != nil {
			t.Fatalf("seq %v: %v", r, err)
		}
		for _, ev := range b.Events {
			switch ev := ev.(type) {
			case *kvevents.BlockStored:
				for _, h := range ev.BlockHashes {
					held[h] = true
				}
			case *kvevents.BlockRemoved:
				for _, h := range ev.BlockHashes {
					delete(held, h)
				}
			case *kvevents.AllBlocksCleared:
				clear(held)
			}
		}
	}
	return held
}

func cached(e *enginesim.Engine) map[uint64]bool {
	out := map[uint64]bool{}
	for _, b := range e.CachedBlocks() {
		out[b.Hash] = true
	}
	return out
}

// An engine that published before the bridge came: at the first live batch
// the bridge replays the whole history from seq 0 (after a join marker),
// then forwards live. Kafka gets every batch once, in order, keyed by pod,
// with pod/model/hardware/seq headers, and the events rebuild the cache.
func TestBridgeForwardsInOrder(t *testing.T) {
	cluster := startKafka(t)
	pub := newPublisher(t, zmqConfig())
	en := startEngine(t, engineConfig("pod-a"), pub)
	for i := range 4 {
		en.request(i)
	}
	reg := prometheus.NewRegistry()
	cfg := bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-a", Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr(),
		Model: testModel, Hardware: "h100", Engine: kvevents.EngineSGLang, KVBlocks: 1 << 17})
	cfg.Registerer = reg
	b := openBridge(t, cfg)
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	for i := 4; i < 12; i++ {
		en.request(i)
	}
	want := cached(en.e)
	en.close()
	last := pub.Stats().LastSeq
	waitForwarded(t, b, "pod-a", last)

	recs := readTopic(t, cluster, int(last)+2)
	if got := seqs(recs); got != "M(join) "+run(0, last) {
		t.Fatalf("kafka holds %s", got)
	}
	for _, r := range recs {
		h := r.headers
		if r.key != "pod-a" || h[kvevents.HeaderPod] != "pod-a" || h[kvevents.HeaderModel] != testModel || h[kvevents.HeaderHardware] != "h100" ||
			h[kvevents.HeaderEngine] != kvevents.EngineSGLang || h[kvevents.HeaderKVBlocks] != "\x00\x00\x00\x00\x00\x02\x00\x00" {
			t.Fatalf("message %v: key %q headers %v", r, r.key, h)
		}
		if _, ok := h[kvevents.HeaderEpoch]; ok {
			t.Fatalf("message %v has an epoch header", r)
		}
	}
	if got := replayBlocks(t, recs[1:]); len(want) == 0 || !maps.Equal(got, want) {
		t.Fatalf("kafka's events rebuild %d blocks, the engine holds %d", len(got), len(want))
	}
	st := b.Stats()
	if st.JoinsFull != 1 || st.Markers != 1 || st.Forwarded != last+1 || st.Replayed == 0 || st.GapsDetected != 0 || st.Restarts != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Everything is acknowledged: the one stream's counts are the totals.
	if ss := b.Streams(); len(ss) != 1 || ss[0].Forwarded != st.Forwarded || ss[0].Replayed != st.Replayed || ss[0].Counts != st.Counts {
		t.Fatalf("streams %+v, totals %+v", ss, st)
	}
	if v := metricValue(t, reg, "meridian_kvbridge_batches_forwarded_total"); v != float64(last+1) {
		t.Fatalf("meridian_kvbridge_batches_forwarded_total = %v, want %d", v, last+1)
	}
}

// metricValue sums the samples of a counter family in reg whose labels
// include the given name=value pairs.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	found := false
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			found = true
			v += m.GetCounter().GetValue()
		}
	}
	if !found {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// The PUB side withholds every third batch: each is a gap the bridge fills
// from vLLM's replay socket ([empty, seq, payload] replies), so Kafka still
// gets every seq once, in order.
func TestBridgeRepairsGaps(t *testing.T) {
	cluster := startKafka(t)
	zc := zmqConfig()
	zc.DropEvery = 3
	pub := newPublisher(t, zc)
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-g", Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr(), Model: testModel}))
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	en := startEngine(t, engineConfig("pod-g"), pub)
	for i := range 15 {
		en.request(i)
	}
	pub.SetDropEvery(0) // the last batch (PodDown) arrives, so the last gap is seen
	want := cached(en.e)
	en.close()
	ps := pub.Stats()
	waitForwarded(t, b, "pod-g", ps.LastSeq)

	recs := readTopic(t, cluster, int(ps.LastSeq)+2)
	if got := seqs(recs); got != "M(join) "+run(0, ps.LastSeq) {
		t.Fatalf("kafka holds %s", got)
	}
	if got := replayBlocks(t, recs[1:]); !maps.Equal(got, want) {
		t.Fatalf("kafka's events rebuild %d blocks, the engine holds %d", len(got), len(want))
	}
	st := b.Stats()
	if ps.FaultDropped < 3 || st.GapsDetected != ps.FaultDropped || st.GapsRecovered != st.GapsDetected ||
		st.Replayed != ps.FaultDropped || st.BatchesLost != 0 || st.ReplayRequests != ps.FaultDropped {
		t.Fatalf("withheld %d batches; bridge stats %+v", ps.FaultDropped, st)
	}
}

// fakeRouter answers replay requests in the 3-frame shape of llm-d's
// simulator and TRT-LLM: [topic, seq, payload] per batch, then
// ["", 0xFF x 8, ""], from the payloads it is given.
type fakeRouter struct {
	ln       net.Listener
	topic    []byte
	mu       sync.Mutex
	payloads map[uint64][]byte
	requests int
	wg       sync.WaitGroup
}

func newFakeRouter(t *testing.T, topic string) *fakeRouter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRouter{ln: ln, topic: []byte(topic), payloads: map[uint64][]byte{}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer nc.Close()
				r.serve(nc)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	return r
}

func (r *fakeRouter) endpoint() string { return "tcp://" + r.ln.Addr().String() }

func (r *fakeRouter) put(seq uint64, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.payloads[seq] = payload
}

func (r *fakeRouter) serve(nc net.Conn) {
	conn, err := zmq4.Open(nc, null.Security(), zmq4.Router, nil, true, nil)
	if err != nil {
		return
	}
	for {
		msg, err := conn.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) != 2 || len(msg.Frames[1]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(msg.Frames[1])
		r.mu.Lock()
		r.requests++
		var out [][][]byte
		for s := start; ; s++ {
			p, ok := r.payloads[s]
			if !ok {
				break
			}
			out = append(out, [][]byte{r.topic, binary.BigEndian.AppendUint64(nil, s), p})
		}
		r.mu.Unlock()
		out = append(out, [][]byte{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}})
		for _, f := range out {
			if conn.SendMsg(zmq4.NewMsgFrom(f...)) != nil {
				return
			}
		}
	}
}

// testBatch is a small engine batch with seq; its payload, as the ZMQ
// publisher encodes it, is returned too.
func testBatch(t *testing.T, pod string, seq uint64) (enginesim.Batch, []byte) {
	t.Helper()
	b := enginesim.Batch{Pod: pod, Seq: seq, TS: time.Unix(1700000000, int64(seq)), Events: []enginesim.Event{{
		Kind: enginesim.BlockStored, BlockHashes: []uint64{1000 + seq}, TokenIDs: []uint32{1, 2, 3, 4},
		BlockSize: 4, Medium: enginesim.MediumGPU, HasParent: seq > 0, ParentHash: 999 + seq}}}
	kb := b.KVBatch()
	p, err := kvevents.Encoding{}.AppendBatch(nil, &kb)
	if err != nil {
		t.Fatal(err)
	}
	return b, p
}

// Gaps repaired through a replay socket that answers in the 3-frame shape.
func TestBridgeReplayThreeFrameReplies(t *testing.T) {
	cluster := startKafka(t)
	zc := zmqConfig()
	zc.ReplayEndpoint, zc.DropEvery, zc.Topic = "", 2, "kv@pod-3@"+testModel
	pub := newPublisher(t, zc)
	router := newFakeRouter(t, zc.Topic)
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Endpoint: pub.Addr(), ReplayEndpoint: router.endpoint()}))
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	var payloads [][]byte
	for s := range uint64(9) {
		batch, p := testBatch(t, "pod-3", s)
		router.put(s, p)
		payloads = append(payloads, p)
		if err := pub.Publish(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	waitForwarded(t, b, "pod-3", 8)
	recs := readTopic(t, cluster, 10)
	if got := seqs(recs); got != "M(join) "+run(0, 8) {
		t.Fatalf("kafka holds %s", got)
	}
	for i, r := range recs[1:] {
		if string(r.value) != string(payloads[i]) || r.key != "pod-3" || r.headers[kvevents.HeaderModel] != testModel {
			t.Fatalf("seq %d: key %q headers %v, payload differs: %v", i, r.key, r.headers, string(r.value) != string(payloads[i]))
		}
	}
	if st := b.Stats(); st.GapsRecovered != 4 || st.Replayed != 4 || st.GapsLost != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A replay buffer of one batch cannot give back a withheld batch once the
// next is published: each such gap is counted lost, and Kafka holds the
// rest in order.
func TestBridgeCountsUnrecoverableGaps(t *testing.T) {
	cluster := startKafka(t)
	zc := zmqConfig()
	zc.BufferSteps, zc.DropEvery = 1, 3
	pub := newPublisher(t, zc)
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-u", Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr()}))
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	for s := range uint64(10) {
		if s == 9 {
			pub.SetDropEvery(0)
		}
		batch, _ := testBatch(t, "pod-u", s)
		if err := pub.Publish(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	waitForwarded(t, b, "pod-u", 9)
	recs := readTopic(t, cluster, 8)
	if got := seqs(recs); got != "M(join) 0 1 3 4 6 7 9" {
		t.Fatalf("kafka holds %s", got)
	}
	st := b.Stats()
	if st.GapsDetected != 3 || st.GapsLost != 3 || st.BatchesLost != 3 || st.GapsRecovered != 0 || st.ReplayRequests != 3 {
		t.Fatalf("stats %+v", st)
	}
	if ss := b.Streams(); len(ss) != 1 || ss[0].BatchesLost != 3 || ss[0].Pod != "pod-u" || ss[0].LastSeq != 9 {
		t.Fatalf("streams %+v", ss)
	}
}

// reopen starts a new engine process on the same endpoints as pub's.
func reopen(t *testing.T, pub *enginesim.ZMQPublisher) *enginesim.ZMQPublisher {
	t.Helper()
	zc := zmqConfig()
	zc.Endpoint, zc.ReplayEndpoint = pub.Addr(), pub.ReplayAddr()
	return newPublisher(t, zc)
}

// The engine process goes away and a new one comes up on the same
// endpoints: the bridge reconnects, sees seq start again, writes a restart
// marker and the new incarnation's history from seq 0.
func TestBridgeDetectsEngineRestart(t *testing.T) {
	cluster := startKafka(t)
	pub := newPublisher(t, zmqConfig())
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-r", Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr()}))
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	first := startEngine(t, engineConfig("pod-r"), pub)
	for i := range 12 {
		first.request(i)
	}
	first.close()
	last1 := pub.Stats().LastSeq
	waitForwarded(t, b, "pod-r", last1)
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	waitBridge(t, b, "the disconnection", func(s kvbridge.Stats) bool { return s.Connections == 0 })

	pub2 := reopen(t, pub)
	waitPub(t, pub2, "the bridge's new subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	second := startEngine(t, engineConfig("pod-r"), pub2)
	for i := range 3 {
		second.request(100 + i)
	}
	want := cached(second.e)
	second.close()
	last2 := pub2.Stats().LastSeq
	if last2 >= last1 {
		t.Fatalf("the second engine published %d batches, the first %d: not a seq reset", last2+1, last1+1)
	}
	waitForwarded(t, b, "pod-r", last2)

	recs := readTopic(t, cluster, int(last1)+int(last2)+4)
	if got, wantSeqs := seqs(recs), "M(join) "+run(0, last1)+" M(restart) "+run(0, last2); got != wantSeqs {
		t.Fatalf("kafka holds %s\nwant       %s", got, wantSeqs)
	}
	if got := replayBlocks(t, recs[last1+3:]); !maps.Equal(got, want) {
		t.Fatalf("the second incarnation's events rebuild %d blocks, the engine holds %d", len(got), len(want))
	}
	if st := b.Stats(); st.Restarts != 1 || st.Reconnects < 1 || st.Markers != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A network outage between bridge and engine: the engine keeps publishing,
// the bridge reconnects with backoff, checks that the engine's batch at its
// last seq is the one it forwarded (same incarnation), and fills the gap
// from the replay socket. No restart, nothing lost.
func TestBridgeReconnectsAfterOutage(t *testing.T) {
	cluster := startKafka(t)
	pub := newPublisher(t, zmqConfig())
	px := newProxy(t, strings.TrimPrefix(pub.Addr(), "tcp://"))
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-o", Endpoint: px.endpoint(), ReplayEndpoint: pub.ReplayAddr()}))
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	en := startEngine(t, engineConfig("pod-o"), pub)
	for i := range 5 {
		en.request(i)
	}
	waitForwardedAtLeast(t, b, "pod-o", pub.Stats().LastSeq)

	px.cut()
	waitBridge(t, b, "the disconnection", func(s kvbridge.Stats) bool { return s.Connections == 0 })
	before := pub.Stats().Published
	for i := 5; i < 10; i++ {
		en.request(i) // published while the bridge is away
	}
	waitPub(t, pub, "batches during the outage", func(s enginesim.ZMQStats) bool { return s.Published > before })
	waitBridge(t, b, "a refused reconnect", func(s kvbridge.Stats) bool { return s.ConnectErrors >= 1 })
	px.restore()
	waitBridge(t, b, "the reconnection", func(s kvbridge.Stats) bool { return s.Reconnects >= 1 && s.Connections == 1 })
	waitPub(t, pub, "the bridge's new subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	for i := 10; i < 13; i++ {
		en.request(i)
	}
	want := cached(en.e)
	en.close()
	last := pub.Stats().LastSeq
	waitForwarded(t, b, "pod-o", last)

	recs := readTopic(t, cluster, int(last)+2)
	if got := seqs(recs); got != "M(join) "+run(0, last) {
		t.Fatalf("kafka holds %s", got)
	}
	if got := replayBlocks(t, recs[1:]); !maps.Equal(got, want) {
		t.Fatalf("kafka's events rebuild %d blocks, the engine holds %d", len(got), len(want))
	}
	if st := b.Stats(); st.Restarts != 0 || st.GapsRecovered != 1 || st.GapsLost != 0 || st.ConnectErrors == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// While the bridge is cut off, the engine restarts and its new incarnation
// publishes past the last seq the bridge forwarded: seq did not go back, but
// the replay buffer's batch at that seq differs from the one forwarded, so
// the bridge still sees the restart.
func TestBridgeDetectsRestartAtTheLastSeq(t *testing.T) {
	cluster := startKafka(t)
	pub := newPublisher(t, zmqConfig())
	px := newProxy(t, strings.TrimPrefix(pub.Addr(), "tcp://"))
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Name: "pod-d", Endpoint: px.endpoint(), ReplayEndpoint: pub.ReplayAddr()}))
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	first := startEngine(t, engineConfig("pod-d"), pub)
	for i := range 3 {
		first.request(i)
	}
	waitForwardedAtLeast(t, b, "pod-d", pub.Stats().LastSeq)
	px.cut()
	waitBridge(t, b, "the disconnection", func(s kvbridge.Stats) bool { return s.Connections == 0 && s.Pending == 0 })
	last1 := b.Streams()[0].LastSeq // what the bridge forwarded of the first incarnation
	first.close()
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	pub2 := reopen(t, pub)
	second := startEngine(t, engineConfig("pod-d"), pub2)
	for i := 0; pub2.Stats().LastSeq <= last1+2; i++ {
		second.request(200 + i)
	}
	px.restore()
	waitPub(t, pub2, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	second.request(300)
	want := cached(second.e)
	second.close()
	last2 := pub2.Stats().LastSeq
	waitForwarded(t, b, "pod-d", last2)

	st := b.Stats()
	if st.Restarts != 1 {
		t.Fatalf("stats %+v", st)
	}
	n := int(st.Forwarded + st.Markers)
	recs := readTopic(t, cluster, n)
	i := len(recs) - int(last2) - 2
	if i < 0 || seqs(recs[i:]) != "M(restart) "+run(0, last2) {
		t.Fatalf("kafka holds %s: want a restart marker then seq 0..%d", seqs(recs), last2)
	}
	if got := replayBlocks(t, recs[i+1:]); !maps.Equal(got, want) {
		t.Fatalf("the second incarnation's events rebuild %d blocks, the engine holds %d", len(got), len(want))
	}
}

// bind: engines connect to the bridge (vLLM connects when its endpoint names
// a host); pod and model names come from the topics kv@<pod>@<model>.
func TestBridgeBindModeNamesPodsFromTopics(t *testing.T) {
	cluster := startKafka(t)
	b := openBridge(t, bridgeConfig(cluster, kvbridge.PodConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, Hardware: "b200"}))
	addr := b.Addrs()[0]
	var pubs []*enginesim.ZMQPublisher
	for _, pod := range []string{"pod-x", "pod-y"} {
		pubs = append(pubs, newPublisher(t, enginesim.ZMQConfig{Endpoint: addr, Topic: "kv@" + pod + "@" + testModel,
			ReconnectMin: 5 * time.Millisecond, Linger: 100 * time.Millisecond}))
	}
	for _, p := range pubs {
		waitPub(t, p, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	}
	for s := range uint64(3) {
		for i, pod := range []string{"pod-x", "pod-y"} {
			batch, _ := testBatch(t, pod, s)
			if err := pubs[i].Publish(context.Background(), batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitForwarded(t, b, "pod-x", 2)
	waitForwarded(t, b, "pod-y", 2)
	byPod := map[string][]record{}
	for _, r := range readTopic(t, cluster, 8) {
		byPod[r.key] = append(byPod[r.key], r)
		if r.headers[kvevents.HeaderPod] != r.key || r.headers[kvevents.HeaderModel] != testModel || r.headers[kvevents.HeaderHardware] != "b200" {
			t.Fatalf("message %v: headers %v", r, r.headers)
		}
	}
	for _, pod := range []string{"pod-x", "pod-y"} {
		if got := seqs(byPod[pod]); got != "M(join) 0 1 2" {
			t.Fatalf("%s: kafka holds %s", pod, got)
		}
	}
	if st := b.Stats(); st.Connections != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// rawPub is a PUB peer for the bridge to dial that sends whatever frames a
// test gives it.
type rawPub struct {
	t    *testing.T
	ln   net.Listener
	conn chan *zmq4.Conn
}

func newRawPub(t *testing.T) *rawPub {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPub{t: t, ln: ln, conn: make(chan *zmq4.Conn, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { nc.Close() })
		conn, err := zmq4.Open(nc, null.Security(), zmq4.Pub, nil, true, nil)
		if err != nil {
			return
		}
		if _, err := conn.RecvMsg(); err != nil { // the subscription
			return
		}
		p.conn <- conn
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return p
}

func (p *rawPub) endpoint() string { return "tcp://" + p.ln.Addr().String() }

// Malformed input: a payload that is not a vLLM batch is counted and still
// forwarded (the ingester counts and skips it); a message that is not
// [topic, seq, payload], or whose topic names no pod, is counted and
// dropped, as is a batch of a stream beyond max_streams; seq going back on
// one connection is a restart.
func TestBridgeMalformedInput(t *testing.T) {
	cluster := startKafka(t)
	raw := newRawPub(t)
	reg := prometheus.NewRegistry()
	cfg := bridgeConfig(cluster, kvbridge.PodConfig{Endpoint: raw.endpoint()})
	cfg.Registerer = reg
	cfg.MaxStreams = 1
	b := openBridge(t, cfg)
	var conn *zmq4.Conn
	select {
	case conn = <-raw.conn:
	case <-time.After(20 * time.Second):
		t.Fatal("the bridge did not connect")
	}
	_, good := testBatch(t, "pod-m", 0)
	seq := func(s uint64) []byte { return binary.BigEndian.AppendUint64(nil, s) }
	topic := []byte("kv@pod-m@" + testModel)
	for _, f := range [][][]byte{
		{topic, seq(0), good},
		{topic, seq(1), []byte{0x93, 0xcb}},             // truncated: forwarded, counted
		{topic, seq(2), []byte{0x92, 0x00, 0x91, 0x05}}, // one bad event: forwarded, counted
		{topic, seq(2)},                                 // two frames: dropped
		{[]byte("vllm"), seq(2), good},                  // no pod in the topic: dropped
		{topic, []byte{1, 2}, good},                     // short seq: dropped
		{[]byte("kv@pod-n@m"), seq(0), good},            // a second stream, over max_streams: dropped
		{topic, seq(3), good},                           // next
		{topic, seq(0), good},                           // back to 0 on one connection: a restart
		{topic, seq(1), good},
	} {
		if err := conn.SendMsg(zmq4.NewMsgFrom(f...)); err != nil {
			t.Fatal(err)
		}
	}
	waitBridge(t, b, "all ten messages", func(s kvbridge.Stats) bool { return s.Received == 10 && s.Pending == 0 })
	recs := readTopic(t, cluster, 8)
	if got := seqs(recs); got != "M(join) 0 1 2 3 M(restart) 0 1" {
		t.Fatalf("kafka holds %s", got)
	}
	if v := metricValue(t, reg, "meridian_kvbridge_events_malformed_total", "reason", "bad_event"); v != 1 {
		t.Errorf("events_malformed{reason=bad_event} = %v, want 1", v)
	}
	if string(recs[2].value) != "\x93\xcb" {
		t.Fatalf("the malformed payload was changed: %q", recs[2].value)
	}
	st := b.Stats()
	if st.Malformed != 1 || st.Dropped != 4 || st.Restarts != 1 {
		t.Fatalf("stats %+v", st)
	}
	for reason, want := range map[string]float64{"bad_frames": 2, "no_pod": 1, "too_many_streams": 1} {
		if v := metricValue(t, reg, "meridian_kvbridge_batches_dropped_total", "reason", reason); v != want {
			t.Errorf("dropped{reason=%s} = %v, want %v", reason, v, want)
		}
	}
}

// No engine listening: the bridge keeps retrying with backoff (counted),
// Close stops it promptly, twice.
func TestBridgeRetriesAndCloses(t *testing.T) {
	cluster := startKafka(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "tcp://" + ln.Addr().String()
	ln.Close()
	b, err := kvbridge.Open(bridgeConfig(cluster, kvbridge.PodConfig{Name: "gone", Endpoint: dead}))
	if err != nil {
		t.Fatal(err)
	}
	waitBridge(t, b, "connect retries", func(s kvbridge.Stats) bool { return s.ConnectErrors >= 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal("second close:", err)
	}
	if _, err := kvbridge.Open(kvbridge.Config{}); err == nil || !strings.Contains(err.Error(), "brokers") {
		t.Fatalf("open without brokers: %v", err)
	}
	// Two bridges on one port: the second cannot bind.
	cfg := bridgeConfig(cluster, kvbridge.PodConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true})
	one := openBridge(t, cfg)
	cfg.Pods[0].Endpoint = one.Addrs()[0]
	cfg.Registerer = prometheus.NewRegistry()
	if _, err := kvbridge.Open(cfg); err == nil || !strings.Contains(err.Error(), "bind") {
		t.Fatalf("second bind: %v", err)
	}
}
