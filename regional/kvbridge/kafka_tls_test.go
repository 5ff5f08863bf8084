package kvbridge_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kafkasec/kafkasectest"
	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// TestKafkaBridgeOverTLSAndSCRAM: the bridge produces to a broker that
// speaks only TLS and SCRAM-SHA-512, with the kafka section a controller
// uses; Kafka gets every batch once, in order, and they rebuild the
// engine's cache.
func TestKafkaBridgeOverTLSAndSCRAM(t *testing.T) {
	broker := kafkasectest.Start(t, kafkasectest.Options{Mechanism: kafkasec.ScramSHA512, Topics: []string{testTopic}, Partitions: 1})
	pub := newPublisher(t, zmqConfig())
	en := startEngine(t, engineConfig("pod-a"), pub)
	cfg := bridgeConfig(nil, kvbridge.PodConfig{Name: "pod-a", Endpoint: pub.Addr(), ReplayEndpoint: pub.ReplayAddr(), Model: testModel})
	cfg.Brokers, cfg.Kafka = broker.Addrs, broker.Config
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	b := openBridge(t, cfg)
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	for i := range 8 {
		en.request(i)
	}
	want := cached(en.e)
	en.close()
	last := pub.Stats().LastSeq
	waitForwarded(t, b, "pod-a", last)

	sec, err := broker.Config.Open("kafka", nil)
	if err != nil {
		t.Fatal(err)
	}
	recs := readTopicFrom(t, broker.Addrs, sec.Dialer(5*time.Second), int(last)+2)
	if got := seqs(recs); got != "M(join) "+run(0, last) {
		t.Fatalf("kafka holds %s", got)
	}
	if got := replayBlocks(t, recs[1:]); len(want) == 0 || !maps.Equal(got, want) {
		t.Fatalf("kafka's events rebuild %d blocks, the engine holds %d", len(got), len(want))
	}
	if v := metricValue(t, reg, "meridian_kvbridge_produce_errors_total"); v != 0 {
		t.Fatalf("%v produce errors", v)
	}
}

// TestKafkaBridgeRefused: with a wrong password every write fails and is
// counted as an authentication failure (the bridge keeps retrying); a
// plaintext broker beyond loopback is refused unless insecure; the printed
// configuration names the password's file, not the password.
func TestKafkaBridgeRefused(t *testing.T) {
	broker := kafkasectest.Start(t, kafkasectest.Options{Topics: []string{testTopic}, Partitions: 1})
	pub := newPublisher(t, zmqConfig())
	en := startEngine(t, engineConfig("pod-a"), pub)
	cfg := bridgeConfig(nil, kvbridge.PodConfig{Name: "pod-a", Endpoint: pub.Addr(), Model: testModel})
	cfg.Brokers, cfg.Kafka = broker.Addrs, broker.WrongPassword(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	b, err := kvbridge.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitPub(t, pub, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
	en.request(0)
	waitBridge(t, b, "a refused write", func(s kvbridge.Stats) bool { return s.ProduceErrors >= 1 })
	if v := metricValue(t, reg, "meridian_kvbridge_produce_errors_total", "kind", "auth"); v < 1 {
		t.Fatalf("produce errors of kind auth: %v", v)
	}
	if st := b.Stats(); st.Forwarded != 0 {
		t.Fatalf("forwarded %d batches with a wrong password", st.Forwarded)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing can be forwarded: do not wait for it
	if err := b.Close(ctx); err == nil || !strings.Contains(err.Error(), "forwarding what was received") {
		t.Fatalf("Close = %v, want the unforwarded batches reported", err)
	}

	far := bridgeConfig(nil, kvbridge.PodConfig{Name: "p", Endpoint: "tcp://127.0.0.1:5557"})
	far.Brokers = []string{"kafka.example:9092"}
	if err := far.Validate(); err == nil || !strings.Contains(err.Error(), "kafka.brokers kafka.example:9092: not loopback and kafka.tls is not set") {
		t.Fatalf("plaintext beyond loopback: %v", err)
	}
	far.Insecure = true
	if err := far.Validate(); err != nil {
		t.Fatalf("plaintext beyond loopback, insecure: %v", err)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "password_file: "+cfg.Kafka.SASL.PasswordFile) || strings.Contains(string(out), kafkasectest.Password) {
		t.Fatalf("printed config:\n%s", out)
	}
}
