package regional

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/discovery"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

const (
	testModel       = "test-model"
	engineBlockSize = 16
	routerBlockSize = 64
)

// testEngine is a minimal vLLM-like cache that emits KV events: it holds
// blocks in a hash chain of its own, stores the new full blocks of a prompt,
// and removes leaf blocks first (as vLLM's free queue does).
type testEngine struct {
	name  string
	epoch uint64
	seq   uint64
	held  map[uint64]engineBlock
	enc   kvevents.Encoding
}

type engineBlock struct {
	parent uint64 // 0 for a first block
	tokens []uint32
	pos    int
}

func newTestEngine(name string, epoch uint64) *testEngine {
	return &testEngine{name: name, epoch: epoch, held: map[uint64]engineBlock{}}
}

func engineHash(parent uint64, tokens []uint32) uint64 {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.BigEndian, parent)
	_ = binary.Write(&b, binary.BigEndian, tokens)
	return xxhash.Sum64(b.Bytes()) | 1
}

// store announces the full blocks of tokens the engine does not hold yet.
func (e *testEngine) store(tokens []uint32) kvevents.Event {
	ev := &kvevents.BlockStored{BlockSize: engineBlockSize, Medium: kvevents.Some("GPU")}
	var parent uint64
	for pos := 0; (pos+1)*engineBlockSize <= len(tokens); pos++ {
		blk := tokens[pos*engineBlockSize : (pos+1)*engineBlockSize]
		h := engineHash(parent, blk)
		if _, ok := e.held[h]; !ok {
			if len(ev.BlockHashes) == 0 && parent != 0 {
				ev.ParentBlockHash = kvevents.Some(parent)
			}
			e.held[h] = engineBlock{parent: parent, tokens: slices.Clone(blk), pos: pos}
			ev.BlockHashes = append(ev.BlockHashes, h)
			ev.TokenIDs = append(ev.TokenIDs, blk...)
		} else if len(ev.BlockHashes) > 0 {
			panic("store of a held block after new ones")
		}
		parent = h
	}
	return ev
}

// evictLeaves removes up to n blocks that no held block extends (chosen at
// random among the leaves, which are kept up to date as parents become
// leaves).
func (e *testEngine) evictLeaves(rng *rand.Rand, n int) kvevents.Event {
	ev := &kvevents.BlockRemoved{Medium: kvevents.Some("GPU")}
	children := map[uint64]int{}
	for _, b := range e.held {
		children[b.parent]++
	}
	var leaves []uint64
	for h := range e.held {
		if children[h] == 0 {
			leaves = append(leaves, h)
		}
	}
	slices.Sort(leaves)
	for ; n > 0 && len(leaves) > 0; n-- {
		i := rng.IntN(len(leaves))
		h := leaves[i]
		leaves[i] = leaves[len(leaves)-1]
		leaves = leaves[:len(leaves)-1]
		parent := e.held[h].parent
		delete(e.held, h)
		ev.BlockHashes = append(ev.BlockHashes, h)
		if parent != 0 {
			if children[parent]--; children[parent] == 0 {
				leaves = append(leaves, parent)
			}
		}
	}
	return ev
}

func (e *testEngine) batch(events ...kvevents.Event) []byte {
	b, err := e.enc.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: events})
	if err != nil {
		panic(err)
	}
	return b
}

func (e *testEngine) headers() []kafka.Header {
	e.seq++
	return []kafka.Header{
		{Key: kvevents.HeaderModel, Value: []byte(testModel)},
		{Key: kvevents.HeaderSeq, Value: binary.BigEndian.AppendUint64(nil, e.seq-1)},
		{Key: kvevents.HeaderEpoch, Value: binary.BigEndian.AppendUint64(nil, e.epoch)},
	}
}

func (e *testEngine) podUp() kvevents.Event {
	return &kvevents.PodUp{Pod: e.name, Endpoint: "http://" + e.name, Model: testModel, Hardware: "h100", Epoch: e.epoch}
}

// expected returns the router chains the index should hold for this engine:
// one chain per held engine block that ends a router block.
func (e *testEngine) expected() [][]uint64 {
	var out [][]uint64
	ns := index.Namespace{Model: testModel, BlockSize: routerBlockSize}
	for h, b := range e.held {
		if (b.pos+1)*engineBlockSize%routerBlockSize != 0 {
			continue
		}
		var tokens []uint32
		for cur := h; cur != 0; cur = e.held[cur].parent {
			tokens = append(slices.Clone(e.held[cur].tokens), tokens...)
		}
		out = append(out, index.ChainHashes(ns, tokens, nil))
	}
	return out
}

// checkIndex compares the index with the engines' caches.
func checkIndex(t *testing.T, idx *index.Index, reg *route.Registry, engines []*testEngine) {
	t.Helper()
	st := idx.Stats()
	for _, e := range engines {
		p, ok := reg.Get(e.name)
		if !ok {
			t.Fatalf("pod %s not registered", e.name)
		}
		want := e.expected()
		if got := st.PodBlocks[p.ID.Slot()]; got != len(want) {
			t.Fatalf("pod %s: index holds %d router blocks, engine %d", e.name, got, len(want))
		}
		for _, c := range want {
			found := false
			for _, m := range idx.Lookup(c, nil) {
				if m.Pod == p.ID {
					found = m.Blocks == len(c)
				}
			}
			if !found {
				t.Fatalf("pod %s: chain of %d blocks not matched in full", e.name, len(c))
			}
		}
	}
}

func newTestIngester(t *testing.T) (*Ingester, *index.Index, *route.Registry, *prometheus.Registry, *lockedBuffer) {
	t.Helper()
	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg := route.NewRegistry(idx)
	pr := prometheus.NewRegistry()
	logs := &lockedBuffer{}
	cfg := DefaultIngestConfig()
	cfg.Brokers, cfg.Region, cfg.BlockSize = []string{"127.0.0.1:1"}, "test", routerBlockSize
	clock := time.Unix(1000, 0)
	g, err := NewIngester(cfg, IngestDeps{Index: idx, Pods: reg, Logger: slog.New(slog.NewTextHandler(logs, nil)), Metrics: pr, Clock: func() time.Time { return clock },
		Announcements: newPodGate(PodsConfig{AllowedEndpoints: []string{"pod-*"}}).check})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the ingester's log:\n%s", logs.String())
		}
	})
	return g, idx, reg, pr, logs
}

// lockedBuffer is a log sink goroutines write to while a test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// LockedBuffer is lockedBuffer for the external tests (package regional_test).
type LockedBuffer = lockedBuffer

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// workload produces messages from a few engines: prompts sharing prefixes,
// leaf evictions, one engine restart. It returns the messages with their
// partition and offset assigned (one partition per engine), and the engines
// in their final state.
func workload(seed uint64, pods int) ([]Message, []*testEngine) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var engines []*testEngine
	var msgs []Message
	offsets := map[int]int64{}
	send := func(part int, e *testEngine, events ...kvevents.Event) {
		msgs = append(msgs, Message{Partition: part, Offset: offsets[part], Key: []byte(e.name), Headers: e.headers(), Value: e.batch(events...)})
		offsets[part]++
	}
	prefixes := make([][]uint32, 4)
	for i := range prefixes {
		for j := 0; j < 64*(1+i); j++ {
			prefixes[i] = append(prefixes[i], uint32(rng.IntN(50000)))
		}
	}
	for p := 0; p < pods; p++ {
		e := newTestEngine(fmt.Sprintf("pod-%d", p), 1)
		engines = append(engines, e)
		send(p, e, e.podUp())
	}
	for step := 0; step < 60; step++ {
		p := rng.IntN(pods)
		e := engines[p]
		switch k := rng.IntN(10); {
		case k < 6:
			prompt := slices.Clone(prefixes[rng.IntN(len(prefixes))])
			for j := rng.IntN(300); j > 0; j-- {
				prompt = append(prompt, uint32(rng.IntN(50000)))
			}
			send(p, e, e.store(prompt))
		case k < 9:
			send(p, e, e.evictLeaves(rng, 1+rng.IntN(8)))
		default:
			// The engine restarts: a new epoch, an empty cache, a new PodUp.
			fresh := newTestEngine(e.name, e.epoch+1)
			engines[p] = fresh
			send(p, fresh, fresh.podUp())
		}
	}
	return msgs, engines
}

func TestIngestAppliesEventsExactly(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	msgs, engines := workload(1, 3)
	for _, m := range msgs {
		g.Apply(m)
	}
	checkIndex(t, idx, reg, engines)
	before := idx.Stats().Blocks

	// Replays (a consumer restart resuming from an older commit) change nothing.
	for _, m := range msgs[len(msgs)/2:] {
		g.Apply(m)
	}
	checkIndex(t, idx, reg, engines)
	if idx.Stats().Blocks != before {
		t.Fatal("replay changed the index")
	}
}

// Per-pod order is all Kafka promises: any interleaving of the pods'
// partitions gives the same index.
func TestIngestInterleavingsAgree(t *testing.T) {
	msgs, engines := workload(7, 4)
	for trial := 0; trial < 5; trial++ {
		g, idx, reg, _, _ := newTestIngester(t)
		rng := rand.New(rand.NewPCG(uint64(trial), 9))
		byPart := map[int][]Message{}
		for _, m := range msgs {
			byPart[m.Partition] = append(byPart[m.Partition], m)
		}
		for len(byPart) > 0 {
			parts := make([]int, 0, len(byPart))
			for p := range byPart {
				parts = append(parts, p)
			}
			slices.Sort(parts)
			p := parts[rng.IntN(len(parts))]
			g.Apply(byPart[p][0])
			if byPart[p] = byPart[p][1:]; len(byPart[p]) == 0 {
				delete(byPart, p)
			}
		}
		checkIndex(t, idx, reg, engines)
	}
}

// A batch that mixes block events with PodUp and PodDown (block events are
// re-keyed in runs between them) leaves the index as the same events sent
// one per message do.
func TestIngestMixedBatchMatchesOneEventPerMessage(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	e := newTestEngine("pod-0", 1)
	prompts := make([][]uint32, 6)
	for i := range prompts {
		prompts[i] = slices.Clone(testPrompt(i % 3)) // 0-2 again from 3: shared prefixes
		for j := rng.IntN(200); j > 0; j-- {
			prompts[i] = append(prompts[i], uint32(rng.IntN(50000)))
		}
	}
	events := []kvevents.Event{e.store(prompts[0]), e.podUp(), e.store(prompts[1]), e.store(prompts[2]),
		e.evictLeaves(rng, 5), e.store(prompts[3]), &kvevents.PodDown{Pod: e.name, Epoch: 1}}
	clear(e.held) // the pod went down: it starts again empty
	events = append(events, e.store(prompts[4]), e.podUp(), e.store(prompts[5]), e.evictLeaves(rng, 3))
	held := func(g *Ingester, idx *index.Index, reg *route.Registry) string {
		p, ok := reg.Get(e.name)
		if !ok {
			return "not registered"
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "%d blocks:", idx.Stats().PodBlocks[p.ID.Slot()])
		for _, pr := range prompts {
			for _, m := range idx.Lookup(index.ChainHashes(index.Namespace{Model: testModel, BlockSize: routerBlockSize}, pr, nil), nil) {
				if m.Pod == p.ID {
					fmt.Fprintf(&sb, " %d", m.Blocks)
				}
			}
		}
		return sb.String()
	}
	g1, idx1, reg1, _, _ := newTestIngester(t)
	g1.Apply(Message{Key: []byte(e.name), Headers: e.headers(), Value: e.batch(events...)})
	g2, idx2, reg2, _, _ := newTestIngester(t)
	for i, ev := range events {
		g2.Apply(Message{Offset: int64(i), Key: []byte(e.name), Headers: e.headers(), Value: e.batch(ev)})
	}
	got, want := held(g1, idx1, reg1), held(g2, idx2, reg2)
	if got != want {
		t.Fatalf("one batch: %s; one event per message: %s", got, want)
	}
	if strings.HasPrefix(got, "0 ") || got == "not registered" {
		t.Fatalf("the pod holds nothing after the batch: %s", got)
	}
	t.Log(got)
}

func TestIngestMalformedCountedAndSkipped(t *testing.T) {
	g, idx, reg, pr, logs := newTestIngester(t)
	msgs, engines := workload(3, 2)
	rng := rand.New(rand.NewPCG(5, 5))
	var mixed []Message
	bad := map[string]int{}
	offset := map[int]int64{}
	next := func(m Message) Message {
		m.Offset = offset[m.Partition]
		offset[m.Partition]++
		return m
	}
	for _, m := range msgs {
		for rng.IntN(3) == 0 {
			var b Message
			switch rng.IntN(4) {
			case 0:
				b = Message{Partition: m.Partition, Key: m.Key, Value: []byte{0x93, 0xcb}} // truncated
				bad["truncated"]++
			case 1:
				b = Message{Partition: m.Partition, Key: m.Key, Value: []byte("not msgpack at all")}
				bad["other"]++ // counted under whatever reason the decoder gives
			case 2:
				b = Message{Partition: m.Partition, Value: m.Value} // no key
				bad["no_pod_key"]++
			case 3:
				b = Message{Partition: m.Partition, Key: m.Key, Value: bytes.Repeat([]byte{0xc1}, 10)}
				bad["bad_msgpack"]++
			}
			mixed = append(mixed, next(b))
		}
		mixed = append(mixed, next(m))
	}
	for _, m := range mixed {
		g.Apply(m)
	}
	checkIndex(t, idx, reg, engines)
	total := 0.0
	for _, reason := range []string{"truncated", "bad_msgpack", "no_pod_key", "bad_envelope", "bad_field_type"} {
		total += testutil.ToFloat64(g.m.decodeErrors.WithLabelValues(reason))
	}
	want := bad["truncated"] + bad["other"] + bad["no_pod_key"] + bad["bad_msgpack"]
	if int(total) != want {
		t.Fatalf("counted %v malformed messages, sent %d (%v)", total, want, bad)
	}
	if got := testutil.ToFloat64(g.m.decodeErrors.WithLabelValues("no_pod_key")); int(got) != bad["no_pod_key"] {
		t.Fatalf("no_pod_key counted %v, sent %d", got, bad["no_pod_key"])
	}
	// Logged once per reason (rate limited), not once per message.
	if n := strings.Count(logs.String(), "no_pod_key"); n != 1 && bad["no_pod_key"] > 0 {
		t.Fatalf("no_pod_key logged %d times for %d messages", n, bad["no_pod_key"])
	}
	if _, err := testutil.GatherAndCount(pr, "meridian_ingest_decode_errors_total"); err != nil {
		t.Fatal(err)
	}
}

func TestIngestSequenceResetClearsPod(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	e := newTestEngine("pod-x", 0)
	tokens := make([]uint32, 256)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	seqHeader := func(seq uint64) []kafka.Header {
		return []kafka.Header{{Key: kvevents.HeaderModel, Value: []byte(testModel)},
			{Key: kvevents.HeaderSeq, Value: binary.BigEndian.AppendUint64(nil, seq)}}
	}
	g.Apply(Message{Offset: 0, Key: []byte(e.name), Headers: seqHeader(5), Value: e.batch(e.store(tokens))})
	p, _ := reg.Get("pod-x")
	if got := idx.Stats().PodBlocks[p.ID.Slot()]; got != 4 {
		t.Fatalf("pod holds %d blocks, want 4", got)
	}
	// vLLM restarted without a lifecycle event: its seq starts again at 0.
	e2 := newTestEngine("pod-x", 0)
	g.Apply(Message{Offset: 1, Key: []byte(e.name), Headers: seqHeader(0), Value: e2.batch(e2.store(tokens[:128]))})
	if got := idx.Stats().PodBlocks[p.ID.Slot()]; got != 2 {
		t.Fatalf("after restart pod holds %d blocks, want the 2 stored since", got)
	}
}

func TestIngestConfigValidate(t *testing.T) {
	for name, mut := range map[string]func(*IngestConfig){
		"brokers":               func(c *IngestConfig) { c.Brokers = nil },
		"region":                func(c *IngestConfig) { c.Region = "" },
		"block_size":            func(c *IngestConfig) { c.BlockSize = 0 },
		"host:port":             func(c *IngestConfig) { c.Brokers = []string{"localhost"} },
		"backoff":               func(c *IngestConfig) { c.BackoffMax = time.Millisecond },
		"kv_blocks_per_pod":     func(c *IngestConfig) { c.KVBlocksPerPod = -1 },
		"fetch_max_bytes":       func(c *IngestConfig) { c.FetchMaxBytes = 1 << 10 },
		"read_ahead_bytes":      func(c *IngestConfig) { c.ReadAheadBytes = c.FetchMaxBytes - 1 },
		"read_ahead_bytes = -1": func(c *IngestConfig) { c.ReadAheadBytes = -1 },
	} {
		c := DefaultIngestConfig()
		c.Brokers, c.Region = []string{"127.0.0.1:9092"}, "r"
		mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// read_ahead_bytes: 0 is 16 fetches; a value set is used as it is.
func TestIngestConfigReadAhead(t *testing.T) {
	c := DefaultIngestConfig()
	c.Brokers, c.Region = []string{"127.0.0.1:9092"}, "r"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.readAhead(), int64(16*c.FetchMaxBytes); got != want {
		t.Errorf("default read-ahead %d, want %d", got, want)
	}
	c.ReadAheadBytes = c.FetchMaxBytes
	if err := c.Validate(); err != nil {
		t.Fatalf("read_ahead_bytes = fetch_max_bytes: %v", err)
	}
	if got := c.readAhead(); got != int64(c.FetchMaxBytes) {
		t.Errorf("read-ahead %d, want %d", got, c.FetchMaxBytes)
	}
}

// A producer's retried write delivers a batch twice (at a new offset): the
// sequence number tells it is a duplicate, and it is skipped.
func TestIngestSkipsDuplicateSeq(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	e := newTestEngine("pod-d", 0)
	tokens := make([]uint32, 256)
	for i := range tokens {
		tokens[i] = uint32(i + 7)
	}
	hdr := func(seq uint64) []kafka.Header {
		return []kafka.Header{{Key: kvevents.HeaderModel, Value: []byte(testModel)},
			{Key: kvevents.HeaderSeq, Value: binary.BigEndian.AppendUint64(nil, seq)}}
	}
	first := e.batch(e.store(tokens[:128]))
	g.Apply(Message{Offset: 0, Key: []byte(e.name), Headers: hdr(1), Value: first})
	g.Apply(Message{Offset: 1, Key: []byte(e.name), Headers: hdr(1), Value: first}) // the retry
	second := e.batch(e.store(tokens))
	g.Apply(Message{Offset: 2, Key: []byte(e.name), Headers: hdr(2), Value: second})
	p, _ := reg.Get("pod-d")
	if got := idx.Stats().PodBlocks[p.ID.Slot()]; got != 4 {
		t.Fatalf("pod holds %d blocks, want 4", got)
	}
	// Evicting engine blocks 4..15 once leaves router block 0 only: had the
	// duplicate counted blocks 0..7 twice, router block 1 would survive.
	g.Apply(Message{Offset: 3, Key: []byte(e.name), Headers: hdr(3), Value: e.batch(e.evictLeaves(rand.New(rand.NewPCG(1, 1)), 12))})
	if got := idx.Stats().PodBlocks[p.ID.Slot()]; got != 1 {
		t.Fatalf("after evicting engine blocks 4..15: %d router blocks, want 1", got)
	}
	if got := testutil.ToFloat64(g.m.skipped.WithLabelValues("duplicate_seq")); got != 1 {
		t.Fatalf("duplicates skipped: %v", got)
	}
	// A bridge's restart marker resets the numbering.
	e2 := newTestEngine("pod-d", 0)
	marker := []kafka.Header{{Key: kvevents.HeaderModel, Value: []byte(testModel)}, {Key: kvevents.HeaderMarker, Value: []byte("restart")}}
	g.Apply(Message{Offset: 4, Key: []byte(e.name), Headers: marker, Value: e2.batch(&kvevents.AllBlocksCleared{})})
	g.Apply(Message{Offset: 5, Key: []byte(e.name), Headers: hdr(0), Value: e2.batch(e2.store(tokens[:64]))})
	if got := idx.Stats().PodBlocks[p.ID.Slot()]; got != 1 {
		t.Fatalf("after the restart marker and a new store: %d blocks, want 1", got)
	}
}

// TestIngestRefusesForgedPodUp: a PodUp is believed only when its pod is
// the message's key, its endpoint an http(s) URL on an allowed host, and,
// with an announce key, its MAC verifies. A refused one changes nothing (the
// victim keeps its endpoint), is counted by reason and logged once per pod.
func TestIngestRefusesForgedPodUp(t *testing.T) {
	g, _, reg, _, logs := newTestIngester(t)
	key := "0123456789abcdef0123456789abcdef"
	g.gate = newPodGate(PodsConfig{AllowedEndpoints: []string{"10.0.0.0/8", "pod-*"}, AnnounceKey: key}).check
	victim := newTestEngine("pod-v", 1)
	offset := int64(0)
	send := func(msgKey string, u *kvevents.PodUp, mac string) {
		hs := victim.headers()
		if mac != "" {
			hs = append(hs, kafka.Header{Key: kvevents.HeaderAnnounceMAC, Value: []byte(mac)})
		}
		g.Apply(Message{Key: []byte(msgKey), Headers: hs, Value: victim.batch(u), Offset: offset})
		offset++
	}
	signed := func(u *kvevents.PodUp) string { return kvevents.AnnounceMAC([]byte(key), u) }
	good := &kvevents.PodUp{Pod: "pod-v", Endpoint: "http://10.0.0.7:8000", Model: testModel, Hardware: "h100", Epoch: 1}
	send("pod-v", good, signed(good))
	if p, ok := reg.Get("pod-v"); !ok || p.Info().Endpoint != "http://10.0.0.7:8000" {
		t.Fatalf("the signed announcement was not believed: %+v", p)
	}
	for _, c := range []struct {
		name, key string
		up        kvevents.PodUp
		mac       string // "sign": a valid one
		reason    string
	}{
		{"another pod's key", "pod-v", kvevents.PodUp{Pod: "pod-x", Endpoint: "http://10.0.0.8:8000", Epoch: 1}, "sign", rejectKeyMismatch},
		{"script endpoint", "pod-v", kvevents.PodUp{Pod: "pod-v", Endpoint: "javascript:alert(1)", Epoch: 2}, "sign", rejectBadEndpoint},
		{"credentials in the URL", "pod-v", kvevents.PodUp{Pod: "pod-v", Endpoint: "http://u:p@10.0.0.9", Epoch: 2}, "sign", rejectBadEndpoint},
		{"host not allowed", "pod-v", kvevents.PodUp{Pod: "pod-v", Endpoint: "http://attacker.example:8000", Epoch: 2}, "sign", rejectNotAllowed},
		{"no MAC", "pod-v", kvevents.PodUp{Pod: "pod-v", Endpoint: "http://10.0.0.66:8000", Epoch: 2}, "", rejectBadMAC},
		{"MAC of another announcement", "pod-v", kvevents.PodUp{Pod: "pod-v", Endpoint: "http://10.0.0.66:8000", Epoch: 2}, signed(good), rejectBadMAC},
	} {
		u := c.up
		u.Model, u.Hardware = testModel, "h100"
		mac := c.mac
		if mac == "sign" {
			mac = signed(&u)
		}
		before := testutil.ToFloat64(g.m.podUpRejected.WithLabelValues(c.reason))
		send(c.key, &u, mac)
		send(c.key, &u, mac) // twice: logged once
		if got := testutil.ToFloat64(g.m.podUpRejected.WithLabelValues(c.reason)) - before; got != 2 {
			t.Errorf("%s: counted %v under %s, want 2", c.name, got, c.reason)
		}
		if p, _ := reg.Get("pod-v"); p.Info().Endpoint != "http://10.0.0.7:8000" || p.Info().Epoch != 1 {
			t.Fatalf("%s: the victim's announcement changed: %+v", c.name, p.Info())
		}
	}
	if _, ok := reg.Get("pod-x"); ok {
		t.Fatal("a pod announced under another pod's key was registered")
	}
	if n := strings.Count(logs.String(), "reason="+rejectBadMAC); n != 1 {
		t.Fatalf("bad_mac for pod-v logged %d times, want once", n)
	}
}

// TestIngestBelievesDiscoveredPods: a pod that discovery found is allowed
// by construction: its PodUp (the bridge announces the pods it discovers)
// is believed for the discovered endpoint although allowed_endpoints does
// not name its host, and for no other endpoint.
func TestIngestBelievesDiscoveredPods(t *testing.T) {
	g, _, reg, _, _ := newTestIngester(t)
	gate := newPodGate(PodsConfig{AllowedEndpoints: []string{"10.0.0.0/8"}})
	g.gate = gate.check
	gate.setDiscovered(map[string]string{"vllm-172-16-0-7": "http://172.16.0.7:8000"})
	e := newTestEngine("vllm-172-16-0-7", 1)
	offset := int64(0)
	send := func(endpoint string) {
		u := &kvevents.PodUp{Pod: "vllm-172-16-0-7", Endpoint: endpoint, Model: testModel, Epoch: 1}
		g.Apply(Message{Key: []byte(u.Pod), Headers: e.headers(), Value: e.batch(u), Offset: offset})
		offset++
	}
	send("http://172.16.0.9:8000")
	if p, ok := reg.Get("vllm-172-16-0-7"); ok && p.Info().Endpoint != "" {
		t.Fatalf("an endpoint discovery did not find was believed: %+v", p.Info())
	}
	send("http://172.16.0.7:8000")
	if p, ok := reg.Get("vllm-172-16-0-7"); !ok || p.Info().Endpoint != "http://172.16.0.7:8000" {
		t.Fatalf("the discovered pod's announcement was refused: %+v", p)
	}
}

func TestPodsConfig(t *testing.T) {
	var c Config
	if err := yaml.Unmarshal([]byte("pods:\n  - name: a\n    endpoint: http://10.0.0.1:8000\n"), &c); err != nil || len(c.Pods.Static) != 1 {
		t.Fatalf("the list form: %+v %v", c.Pods, err)
	}
	if err := yaml.Unmarshal([]byte("pods:\n  static: [{name: a, endpoint: 'http://10.0.0.1:8000'}]\n  allowed_endpoints: [10.0.0.0/8]\n"), &c); err != nil || len(c.Pods.AllowedEndpoints) != 1 {
		t.Fatalf("the map form: %+v %v", c.Pods, err)
	}
	if err := yaml.Unmarshal([]byte("pods:\n  allowed_endpoint: [10.0.0.0/8]\n"), &c); err == nil || !strings.Contains(err.Error(), "allowed_endpoint") {
		t.Fatalf("a misspelt key: %v", err)
	}
	for name, pc := range map[string]PodsConfig{
		"pods.static[0]":            {Static: []route.PodInfo{{Name: "a", Endpoint: "ftp://x"}}},
		"pods.allowed_endpoints[0]": {AllowedEndpoints: []string{"10.0.0.0/33"}},
		"pods.announce_key":         {AnnounceKey: "short"},
	} {
		if err := pc.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := yaml.Unmarshal([]byte("pods:\n  discovery:\n    dns: {name: vllm.ns.svc.cluster.local., kv_events_port: 5557}\n"), &c); err != nil || c.Pods.Discovery.DNS.Name == "" {
		t.Fatalf("the discovery section: %+v %v", c.Pods, err)
	}
	if err := yaml.Unmarshal([]byte("pods:\n  discovery:\n    dns: {nam: x}\n"), &c); err == nil || !strings.Contains(err.Error(), "nam") {
		t.Fatalf("a misspelt discovery key: %v", err)
	}
	if err := (PodsConfig{Discovery: discovery.Config{DNS: discovery.DNSConfig{Name: "bad name"}}}).Validate(); err == nil ||
		!strings.Contains(err.Error(), "pods.discovery: dns.name") {
		t.Errorf("an invalid discovery section: %v", err)
	}
	// The default: the static pods' hosts and loopback.
	g := newPodGate(PodsConfig{Static: []route.PodInfo{{Name: "a", Endpoint: "http://vllm-a.internal:8000"}}})
	for host, want := range map[string]bool{"vllm-a.internal": true, "127.0.0.1": true, "::1": true, "localhost": true, "10.0.0.1": false, "vllm-b.internal": false} {
		if got := g.allows(host); got != want {
			t.Errorf("default gate allows %s: %v, want %v", host, got, want)
		}
	}
}

// TestIngestOffsetRegressionIsAReset: a message at or below the applied
// offset is a replay while the partition ends beyond what was applied, and
// proof of a reset when the partition now ends before it (a broker that
// lost its data, a topic created again): then it and its successors apply.
func TestIngestOffsetRegressionIsAReset(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	e := newTestEngine("pod-0", 1)
	sent := map[int64]Message{}
	send := func(off, hwm int64, evs ...kvevents.Event) {
		m := Message{Key: []byte("pod-0"), Headers: e.headers(), Value: e.batch(evs...), Offset: off, HighWaterMark: hwm}
		sent[off] = m
		g.Apply(m)
	}
	send(0, 10, e.podUp())
	for off := int64(1); off < 10; off++ {
		send(off, 10, e.store(testPrompt(int(off))))
	}
	g.Apply(sent[5]) // redelivered after a consumer restart: a replay, skipped
	if got := testutil.ToFloat64(g.m.skipped.WithLabelValues("replay")); got != 1 {
		t.Fatalf("replays skipped: %v", got)
	}
	// The broker comes back empty: offsets start again at 0.
	fresh := e.store(testPrompt(1000))
	send(0, 2, fresh)
	send(1, 2, e.store(testPrompt(1001)))
	if got := testutil.ToFloat64(g.m.resets.WithLabelValues("offset_regression")); got != 1 {
		t.Fatalf("resets counted %v", got)
	}
	if got := testutil.ToFloat64(g.m.skipped.WithLabelValues("replay")); got != 1 {
		t.Fatalf("new messages after the reset were skipped as replays (%v skipped)", got)
	}
	if len(g.Rebuilding()) != 0 {
		t.Fatalf("still rebuilding after reaching the new end: %v", g.Rebuilding())
	}
	checkIndex(t, idx, reg, []*testEngine{e})
}

// testPrompt is 128 tokens (two router blocks) unique to seed.
func testPrompt(seed int) []uint32 {
	out := make([]uint32, 2*routerBlockSize)
	for i := range out {
		out[i] = uint32(seed*1000 + i + 1)
	}
	return out
}

// TestMessageFetchedBeforeAResetIsSuperseded: the consumer may hand over a
// message it fetched before a reset (found by the probe, on another
// goroutine) after the reset forgot the partition's offsets. Applied, it
// would count as new, and the fresh group's re-read of the messages
// before it would be skipped as replays: the index would hold only the
// tail. It is dropped; the re-read applies everything.
func TestMessageFetchedBeforeAResetIsSuperseded(t *testing.T) {
	g, idx, reg, _, _ := newTestIngester(t)
	e := newTestEngine("pod-0", 1)
	evs := []kvevents.Event{e.podUp()}
	for i := range 4 {
		evs = append(evs, e.store(testPrompt(i)))
	}
	msgs := make([]Message, len(evs))
	for i, ev := range evs {
		msgs[i] = Message{Partition: 0, Offset: int64(i), HighWaterMark: int64(len(evs)), Key: []byte(e.name), Headers: e.headers(), Value: e.batch(ev)}
	}
	for _, m := range msgs[:3] {
		applyNow(g, m, 0, nil)
	}
	g.mu.Lock()
	g.resetLocked([]int{0}, map[int]int64{0: int64(len(msgs))}, "rewritten")
	gen := g.groupGen
	g.mu.Unlock()
	applyNow(g, msgs[3], gen-1, nil) // fetched by the old group, handed over late
	if got := testutil.ToFloat64(g.m.skipped.WithLabelValues("superseded")); got != 1 {
		t.Fatalf("superseded messages: %v, want 1", got)
	}
	if _, ok := g.Applied()[0]; ok {
		t.Fatalf("a message of the superseded group moved the offsets: %v", g.Applied())
	}
	for _, m := range msgs { // the fresh group reads the partition from its start
		applyNow(g, m, gen, nil)
	}
	checkIndex(t, idx, reg, []*testEngine{e})
}

// The consumer's apply takes a message's mark lazily (computed when a
// probe takes it as an anchor); Apply computes it at once. Both give the
// same marks and anchors, and the same index, for the same messages.
func TestIngestLazyMarksMatchEager(t *testing.T) {
	msgs, engines := workload(21, 3)
	eager, _, _, _, _ := newTestIngester(t)
	lazy, idx, reg, _, _ := newTestIngester(t)
	dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		m.Time = time.Unix(int64(i), 0)
		eager.Apply(m)
		var pre decoded
		pre.batch, pre.err = dec.Decode(m.Value)
		applyNow(lazy, m, -1, &pre)
		if i%7 == 0 { // a probe verified the anchors: the last marks are the next
			eager.advanceAnchorsLocked(nil)
			lazy.advanceAnchorsLocked(nil)
		}
	}
	checkIndex(t, idx, reg, engines)
	lazyMarks := map[int]logMark{}
	for p, m := range lazy.marks {
		lazyMarks[p] = m.get()
	}
	eagerMarks := map[int]logMark{}
	for p, m := range eager.marks {
		if m.lazy {
			t.Fatalf("Apply left the mark of partition %d lazy", p)
		}
		eagerMarks[p] = m.mark
	}
	if len(eagerMarks) == 0 || !maps.Equal(lazyMarks, eagerMarks) {
		t.Fatalf("marks: lazy %v, eager %v", lazyMarks, eagerMarks)
	}
	if !maps.Equal(lazy.anchors, eager.anchors) {
		t.Fatalf("anchors: lazy %v, eager %v", lazy.anchors, eager.anchors)
	}
}

// meridian_ingest_events_total counts every applied event by kind, a run
// of block events at a time: as many as the messages hold.
func TestIngestCountsEventsByKind(t *testing.T) {
	msgs, _ := blockEventMessages(func(msgs, _ int) bool { return msgs < 60 })
	g, _, _, _, _ := newTestIngester(t)
	dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for i, m := range msgs {
		m.Offset = int64(i)
		g.Apply(m)
		b, err := dec.Decode(m.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			want[ev.Kind().String()]++
		}
	}
	if want[kvevents.KindBlockStored.String()] == 0 || want[kvevents.KindBlockRemoved.String()] == 0 || want[kvevents.KindPodUp.String()] == 0 {
		t.Fatalf("the workload lacks a kind: %v", want)
	}
	for _, k := range []kvevents.Kind{kvevents.KindBlockStored, kvevents.KindBlockRemoved, kvevents.KindAllBlocksCleared, kvevents.KindPodUp, kvevents.KindPodDown} {
		if got := testutil.ToFloat64(g.m.events.WithLabelValues(k.String())); int(got) != want[k.String()] {
			t.Errorf("%s: counted %v, the messages hold %d", k, got, want[k.String()])
		}
	}
}

// applyNow is the consumer's two stages on one goroutine: msg re-keyed
// (apply), then its index writes applied (runJob).
func applyNow(g *Ingester, msg Message, gen int, pre *decoded) {
	var j indexJob
	g.apply(msg, gen, pre, &j)
	g.runJob(&j)
}
