package regional_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// Issue acceptance (faults, broker reset), end to end: a running
// controller, two engine simulators and a real Kafka-protocol broker under
// traffic. The broker comes back empty on the same address (offsets from 0
// again, a new cluster id). The controller notices, re-reads the topic
// from its new start, and ingests the events the engines publish from then
// on within seconds: for new prompts the prefix it predicts is cached on
// the pod it picks is what that pod reports as cached (in whole router
// blocks of 64 tokens: the engine's 16-token blocks past the last whole
// one are not indexed), as before the reset. Before the fix every new event was dropped as a replay: the
// predictions fell to zero while the pods kept caching.
func TestE2EBrokerResetPredictionsMatchAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	newBroker := func(port int) *kfake.Cluster {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// A port below the ephemeral range: free again for the broker that
	// comes back, whatever connections open meanwhile.
	_, port, _ := net.SplitHostPort(gossiptest.FreeAddr(t))
	portN, _ := strconv.Atoi(port)
	broker := newBroker(portN)
	addr := broker.ListenAddrs()[0]
	var engines []*enginesim.Engine
	for i := range 2 {
		cfg := enginesim.DefaultConfig()
		cfg.Name, cfg.Region, cfg.TimeScale, cfg.DefaultMaxTokens = fmt.Sprintf("pod-%d", i), "test", 0.1, 2
		cfg.HashSeed, cfg.AnnounceInterval = "e2e", time.Second
		cfg.Kafka = &enginesim.KafkaConfig{Brokers: []string{addr}}
		e, err := enginesim.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	cfg := regional.DefaultConfig()
	cfg.Region, cfg.ControllerID, cfg.Listen = "test", "ctl-1", "127.0.0.1:0"
	cfg.Kafka.Brokers = []string{addr}
	cfg.Models = []regional.ModelConfig{{Name: simModel, Tokenizer: enginesim.DefaultConfig().Tokenizer}}
	cfg.ScrapeInterval = 100 * time.Millisecond
	cfg.Decision.SpeculationTTL = 0 // predictions from the index alone, that is from the events
	ctl, err := regional.Open(context.Background(), cfg, regional.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the controller, then the engines, then the broker they write to
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ctl.Close(ctx); err != nil {
			t.Errorf("controller close: %v", err)
		}
		for _, e := range engines {
			_ = e.Close(ctx)
		}
		broker.Close()
	})
	waitFor(t, "both pods registered", func() bool {
		n := 0
		for _, p := range ctl.Registry.Pods() {
			if p.Info().Endpoint != "" {
				n++
			}
		}
		return n == 2
	})

	rng := rand.New(rand.NewPCG(5, 6))
	// matches sends a new prompt, then the same system prompt with another
	// question until the controller predicts, on the pod it chose, the
	// cached prefix that pod reports (rounded down to whole router blocks).
	matches := func(what string) {
		t.Helper()
		sys := fmt.Sprintf("%s. ", what) + words(rng, 400)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		first := chat(ctx, ctl.URL(), []chatMsg{{"system", sys}, {"user", "first question"}}, "", "")
		if first.err != nil {
			t.Fatalf("%s: first request: %v", what, first.err)
		}
		var last result
		defer func() {
			if t.Failed() {
				t.Logf("%s: last answer %+v; resets %v", what, last, ctl.Ingester.Rebuilding())
			}
		}()
		waitFor(t, what+": the cached prefix predicted as the pod reports it", func() bool {
			last = chat(ctx, ctl.URL(), []chatMsg{{"system", sys}, {"user", "second question"}}, "", "")
			return last.err == nil && last.cachedTokens >= cfg.BlockSize && last.predicted == last.cachedTokens/cfg.BlockSize*cfg.BlockSize
		})
		t.Logf("%s: predicted %d cached tokens on %s, the pod reported %d", what, last.predicted, last.pod, last.cachedTokens)
	}
	matches("before the reset")

	resets := func() float64 {
		return metricValue(t, ctl.URL(), `meridian_ingest_resets_total{cause="offset_regression"}`) +
			metricValue(t, ctl.URL(), `meridian_ingest_resets_total{cause="cluster_changed"}`) +
			metricValue(t, ctl.URL(), `meridian_ingest_resets_total{cause="rewritten"}`)
	}
	broker.Close()
	broker = newBroker(portN)
	waitFor(t, "the controller to notice the broker reset", func() bool { return resets() >= 1 })
	matches("after the reset")
	if code, body := getReady(t, ctl.URL()); code != 200 {
		t.Fatalf("readyz after the reset and the catch-up: %d %v", code, body)
	}
}
