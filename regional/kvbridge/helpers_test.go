package kvbridge_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

const (
	testRegion = "test"
	testTopic  = "meridian.kv-events.test"
	testModel  = "meridian/sim-70b"
)

// testLogger writes to stderr when KVBRIDGE_TEST_LOG is set, else nowhere.
func testLogger() *slog.Logger {
	if os.Getenv("KVBRIDGE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startKafka runs an in-process Kafka-protocol broker with the region's
// topic (one partition, so one reader sees every pod's order).
func startKafka(t *testing.T) *kfake.Cluster { return startKafkaB(t) }

func startKafkaB(t testing.TB) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, testTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// bridgeConfig is a bridge on cluster (nil: set Brokers) with fast retries.
func bridgeConfig(cluster *kfake.Cluster, pods ...kvbridge.PodConfig) kvbridge.Config {
	cfg := kvbridge.DefaultConfig()
	cfg.Region = testRegion
	if cluster != nil {
		cfg.Brokers = cluster.ListenAddrs()
	}
	cfg.Pods = pods
	cfg.BackoffMin, cfg.BackoffMax = 5*time.Millisecond, 50*time.Millisecond
	cfg.DialTimeout, cfg.ReplayTimeout = 2*time.Second, 5*time.Second
	cfg.Logger = testLogger()
	cfg.Registerer = prometheus.NewRegistry()
	return cfg
}

func openBridge(t *testing.T, cfg kvbridge.Config) *kvbridge.Bridge {
	t.Helper()
	b, err := kvbridge.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return b
}

func waitBridge(t *testing.T, b *kvbridge.Bridge, what string, cond func(kvbridge.Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitForwarded waits until the last batch the bridge forwarded of pod is
// seq (the engine's last) and Kafka has acknowledged everything received.
func waitForwarded(t *testing.T, b *kvbridge.Bridge, pod string, seq uint64) {
	t.Helper()
	waitStream(t, b, pod, fmt.Sprintf("seq %d", seq), func(last uint64) bool { return last == seq })
}

// waitForwardedAtLeast is waitForwarded while the engine may publish more.
func waitForwardedAtLeast(t *testing.T, b *kvbridge.Bridge, pod string, seq uint64) {
	t.Helper()
	waitStream(t, b, pod, fmt.Sprintf("seq %d or later", seq), func(last uint64) bool { return last >= seq })
}

func waitStream(t *testing.T, b *kvbridge.Bridge, pod, what string, cond func(last uint64) bool) {
	t.Helper()
	waitBridge(t, b, pod+" forwarded through "+what, func(s kvbridge.Stats) bool {
		if s.Pending != 0 {
			return false
		}
		for _, st := range b.Streams() {
			if st.Pod == pod && cond(st.LastSeq) {
				return true
			}
		}
		return false
	})
}

func waitPub(t *testing.T, p *enginesim.ZMQPublisher, what string, cond func(enginesim.ZMQStats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// engine is a simulated vLLM pod publishing over ZMQ.
type engine struct {
	t      *testing.T
	e      *enginesim.Engine
	pub    *enginesim.ZMQPublisher
	client *http.Client
	tr     *http.Transport
	closed bool
}

// engineConfig is a fast engine with 4-token blocks, a small cache and one
// event per batch (many batches, so many seqs to lose and repair).
func engineConfig(name string) enginesim.Config {
	cfg := enginesim.DefaultConfig()
	cfg.EventBatchSize = 1
	cfg.Name = name
	cfg.HashSeed = "seed-" + name
	cfg.TimeScale = 0.001
	cfg.BlockSize = 4
	cfg.CacheBlocks = 40
	return cfg
}

// zmqConfig binds ephemeral loopback ports for PUB and replay.
func zmqConfig() enginesim.ZMQConfig {
	return enginesim.ZMQConfig{Endpoint: "tcp://127.0.0.1:0", Mode: "bind", ReplayEndpoint: "tcp://127.0.0.1:0", Linger: 100 * time.Millisecond}
}

func newPublisher(t *testing.T, zc enginesim.ZMQConfig) *enginesim.ZMQPublisher {
	t.Helper()
	pub, err := enginesim.NewZMQPublisher(zc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// startEngine opens an engine publishing through pub.
func startEngine(t *testing.T, cfg enginesim.Config, pub *enginesim.ZMQPublisher) *engine {
	t.Helper()
	cfg.Publisher = pub
	e, err := enginesim.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	en := &engine{t: t, e: e, pub: pub, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr: tr}
	t.Cleanup(en.close)
	return en
}

// close stops the engine (its last batch is PodDown) and then its
// publisher, and returns the last seq published.
func (en *engine) close() {
	if en.closed {
		return
	}
	en.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := en.e.Close(ctx); err != nil {
		en.t.Error(err)
	}
	en.tr.CloseIdleConnections()
}

// request sends completion i: prompts share prefixes in a few families and
// grow, so the cache both hits and evicts.
func (en *engine) request(i int) {
	en.t.Helper()
	prompt := strings.Repeat(fmt.Sprintf("family %d shared words ", i%3), 4+i%5) + fmt.Sprintf("tail %d", i)
	body := fmt.Sprintf(`{"model": %q, "max_tokens": 2, "prompt": %q}`, testModel, prompt)
	resp, err := en.client.Post(en.e.URL()+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		en.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		en.t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
	}
}

// record is one Kafka message as the tests look at it.
type record struct {
	key     string
	headers map[string]string
	seq     uint64
	hasSeq  bool
	marker  string
	value   []byte
}

func (r record) String() string {
	if r.marker != "" {
		return "M(" + r.marker + ")"
	}
	return fmt.Sprint(r.seq)
}

// readTopic reads n messages from the topic's partition 0.
func readTopic(t *testing.T, cluster *kfake.Cluster, n int) []record {
	t.Helper()
	return readTopicFrom(t, cluster.ListenAddrs(), nil, n)
}

// readTopicFrom reads n records from brokers, dialled with dialer (nil:
// kafka-go's default, plaintext).
func readTopicFrom(t *testing.T, brokers []string, dialer *kafka.Dialer, n int) []record {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: testTopic, Partition: 0, MaxWait: 50 * time.Millisecond, Dialer: dialer})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make([]record, 0, n)
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read message %d of %d: %v", len(out), n, err)
		}
		rec := record{key: string(m.Key), headers: map[string]string{}, value: m.Value}
		for _, h := range m.Headers {
			rec.headers[h.Key] = string(h.Value)
			if h.Key == kvevents.HeaderSeq && len(h.Value) == 8 {
				rec.seq, rec.hasSeq = binary.BigEndian.Uint64(h.Value), true
			}
		}
		rec.marker = rec.headers[kvbridge.HeaderMarker]
		out = append(out, rec)
	}
	return out
}

// seqs renders records as "M(join) 0 1 2 ...".
func seqs(recs []record) string {
	parts := make([]string, len(recs))
	for i, r := range recs {
		parts[i] = r.String()
	}
	return strings.Join(parts, " ")
}

// run renders "M(why)? from..to" as the expected form of seqs.
func run(from, to uint64) string {
	parts := make([]string, 0, to-from+1)
	for s := from; s <= to; s++ {
		parts = append(parts, fmt.Sprint(s))
	}
	return strings.Join(parts, " ")
}

// proxy is a loopback TCP forwarder that can be cut (connections closed,
// port refused) and restored on the same port: a network outage.
type proxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.start(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) endpoint() string { return "tcp://" + p.addr }

func (p *proxy) start(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					_, _ = io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
}

// cut closes the listener and every connection, and waits for the
// forwarding goroutines.
func (p *proxy) cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}

// restore listens again on the same port.
func (p *proxy) restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.start(ln)
}
