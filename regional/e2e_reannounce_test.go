package regional_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// Issue acceptance (faults, pods that come and go): the broker loses its
// data (a new cluster on the same address), so the topic no longer holds
// the pods' first PodUp. A controller rebuilt from it learns the pods from
// their repeated announcements and serves them within one re-announce
// period: at most the announcement in flight and the next one.
func TestControllerRebuiltWithoutPodUpServesAfterReannounce(t *testing.T) {
	_, port, _ := net.SplitHostPort(gossiptest.FreeAddr(t)) // below the ephemeral range: free again for the restart
	portN, _ := strconv.Atoi(port)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(portN), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	addr := cluster.ListenAddrs()[0]
	const every = time.Second
	var engines []*enginesim.Engine
	for i := range 2 {
		cfg := enginesim.DefaultConfig()
		cfg.Name, cfg.Region, cfg.TimeScale, cfg.DefaultMaxTokens = fmt.Sprintf("pod-%d", i), "test", 0.1, 2
		cfg.AnnounceInterval = every
		cfg.Kafka = &enginesim.KafkaConfig{Brokers: []string{addr}}
		e, err := enginesim.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		})
	}
	open := func() *regional.Controller {
		cfg := regional.DefaultConfig()
		cfg.Region, cfg.ControllerID, cfg.Listen = "test", "ctl-1", "127.0.0.1:0"
		cfg.Kafka.Brokers = []string{addr}
		cfg.Models = []regional.ModelConfig{{Name: simModel, Tokenizer: enginesim.DefaultConfig().Tokenizer}}
		cfg.Server.AllowPolicyOverride = true
		ctl, err := regional.Open(context.Background(), cfg, regional.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		return ctl
	}
	closeCtl := func(ctl *regional.Controller) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ctl.Close(ctx); err != nil {
			t.Errorf("controller close: %v", err)
		}
	}
	endpoints := func(ctl *regional.Controller) int {
		n := 0
		for _, p := range ctl.Registry.Pods() {
			if p.Info().Endpoint != "" {
				n++
			}
		}
		return n
	}

	// Before: a controller learns both pods from their first PodUp.
	first := open()
	waitFor(t, "the first controller to learn both pods", func() bool { return endpoints(first) == 2 })
	closeCtl(first)

	// The broker loses everything it held.
	cluster.Close()
	cluster, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(portN), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range engines { // their last events go to this broker
			_ = e.Close(ctx)
		}
		cluster.Close()
	})

	before := []int64{engines[0].Announcements(), engines[1].Announcements()}
	ctl := open()
	t.Cleanup(func() { closeCtl(ctl) })
	waitFor(t, "the rebuilt controller to learn both pods' endpoints", func() bool { return endpoints(ctl) == 2 })
	for i, e := range engines {
		if n := e.Announcements() - before[i]; n > 2 {
			t.Errorf("%s announced %d times before the rebuilt controller knew it, want at most 2 (one period)", e.Name(), n)
		}
	}
	servedBy(t, ctl.URL(), "pod-0", "pod-1")
	_, body := getReady(t, ctl.URL())
	if body["pods"] != float64(2) {
		t.Fatalf("readyz pods %v, want 2", body["pods"])
	}
}

// getReady reads /readyz.
func getReady(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}
