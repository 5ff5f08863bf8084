package enginesim

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kafkasec/kafkasectest"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// TestKafkaPublishingOverTLSAndSCRAM: an engine that serves https publishes
// its events to a broker that speaks only TLS and SCRAM-SHA-512; a reader
// with the same credentials finds its PodUp (announcing the https
// endpoint) first and its PodDown last, and nothing failed on the way.
func TestKafkaPublishingOverTLSAndSCRAM(t *testing.T) {
	const topic = "meridian.kv-events.tls-region"
	b := kafkasectest.Start(t, kafkasectest.Options{Mechanism: kafkasec.ScramSHA512, Topics: []string{topic}, Partitions: 1})
	cfg := fastConfig()
	cfg.Region, cfg.Name = "tls-region", "pod-tls"
	cfg.TLSCert, cfg.TLSKey = b.PKI.Controllers[0].Cert, b.PKI.Controllers[0].Key
	cfg.Kafka = &KafkaConfig{Brokers: b.Addrs, Security: b.Config}
	te := openTestEngine(t, cfg)
	if !strings.HasPrefix(te.URL(), "https://127.0.0.1:") {
		t.Fatalf("URL %s: want https", te.URL())
	}
	roots, err := (&identity.ClientTLSConfig{CA: b.PKI.CACert}).Load("test")
	if err != nil {
		t.Fatal(err)
	}
	te.client.Transport.(*http.Transport).TLSClientConfig = roots
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if status, body := te.post(ctx, "/v1/completions", `{"model": "meridian/sim-70b", "max_tokens": 2, "prompt": "over https and tls kafka"}`); status != 200 {
		t.Fatalf("https completion: %d %s", status, body)
	}
	if err := te.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := metricValue(t, te.Engine, "meridian_enginesim_kv_publish_errors_total"); n != 0 {
		t.Fatalf("%v publish errors", n)
	}

	sec, err := b.Config.Open("kafka", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: b.Addrs, Topic: topic, Partition: 0, MaxWait: 50 * time.Millisecond,
		Dialer: sec.Dialer(5 * time.Second)})
	defer r.Close()
	dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	var kinds []kvevents.Kind
	for len(kinds) == 0 || kinds[len(kinds)-1] != kvevents.KindPodDown {
		msg, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read: %v (after %v)", err, kinds)
		}
		batch, err := dec.Decode(msg.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range batch.Events {
			kinds = append(kinds, ev.Kind())
			if up, ok := ev.(*kvevents.PodUp); ok && up.Endpoint != te.URL() {
				t.Fatalf("PodUp announces %s, want %s", up.Endpoint, te.URL())
			}
		}
	}
	if kinds[0] != kvevents.KindPodUp {
		t.Fatalf("kinds %v: want PodUp first", kinds)
	}
}

// TestKafkaPublishRefused: with a wrong password, or against a broker whose
// certificate another CA signed, every publish fails, is counted, and says
// what to check; a plaintext broker beyond loopback is refused up front.
func TestKafkaPublishRefused(t *testing.T) {
	b := kafkasectest.Start(t, kafkasectest.Options{})
	foreign := kafkasectest.Start(t, kafkasectest.Options{ForeignCert: true})
	for _, c := range []struct {
		name string
		addr []string
		sec  kafkasec.Config
		want string
	}{
		{"wrong password", b.Addrs, b.WrongPassword(t), `the brokers refused scram-sha-256 as "meridian-test"`},
		{"broker of another CA", foreign.Addrs, foreign.Config, "the broker's certificate is not signed by a CA in kafka.tls.ca"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewKafkaPublisher(KafkaConfig{Brokers: c.addr, Topic: "meridian.kv-events.refused", Security: c.sec,
				BatchTimeout: time.Millisecond, WriteTimeout: 5 * time.Second}, PodInfo{Name: "pod-x", Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = p.Publish(ctx, Batch{TS: time.Unix(1, 0), Events: []Event{{Kind: AllBlocksCleared}}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Publish = %v, want an error saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), kafkasectest.Password) {
				t.Fatalf("the error holds the password: %v", err)
			}
		})
	}

	cfg := fastConfig()
	cfg.Region = "r"
	cfg.Kafka = &KafkaConfig{Brokers: []string{"kafka.example:9092"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "kafka.brokers kafka.example:9092: not loopback and kafka.tls is not set") {
		t.Fatalf("plaintext beyond loopback: %v", err)
	}
	cfg.Kafka.Insecure = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("plaintext beyond loopback, insecure: %v", err)
	}
	cfg.Kafka = nil
	cfg.TLSCert = "cert.pem"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "TLSCert") {
		t.Fatalf("TLSCert without TLSKey: %v", err)
	}
}
