package regional_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/discovery/discoverytest"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

const discoveredService = "vllm.inference.svc.cluster.local."

// loopbackPods opens one engine simulator per address (127.0.0.x, all on
// one port, as a Service's pods are) and returns them with the port.
func loopbackPods(t *testing.T, hosts []byte, mut func(*enginesim.Config)) ([]*enginesim.Engine, int) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", hosts[0]))
		if err != nil {
			t.Skipf("no loopback address 127.0.0.%d: %v", hosts[0], err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		var engines []*enginesim.Engine
		for _, h := range hosts {
			cfg := enginesim.DefaultConfig()
			cfg.Addr = net.JoinHostPort(fmt.Sprintf("127.0.0.%d", h), strconv.Itoa(port))
			cfg.Name = fmt.Sprintf("vllm-127-0-0-%d", h)
			cfg.Region, cfg.TimeScale, cfg.HashSeed, cfg.DefaultMaxTokens = "test", 0.1, "e2e", 2
			if mut != nil {
				mut(&cfg)
			}
			e, err := enginesim.Open(cfg)
			if err != nil {
				break
			}
			engines = append(engines, e)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = e.Close(ctx)
			})
		}
		if len(engines) == len(hosts) {
			return engines, port
		}
		for _, e := range engines {
			_ = e.Close(context.Background())
		}
		if attempt > 20 {
			t.Fatal("no port free on every loopback address")
		}
	}
}

// service is the headless Service of the pods at 127.0.0.<hosts>.
func service(port int, hosts ...byte) discoverytest.Service {
	svc := discoverytest.Service{Name: discoveredService, TTL: 1, Ports: []discoverytest.Port{{Name: "http", Port: uint16(port)}}}
	for _, h := range hosts {
		svc.Pods = append(svc.Pods, discoverytest.Pod{IP: netip.AddrFrom4([4]byte{127, 0, 0, h})})
	}
	return svc
}

// servedBy sends requests until every pod of want has served one (or the
// bound), and fails when a pod outside want serves any.
func servedBy(t *testing.T, url string, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	for i := 0; i < 400 && len(seen) < len(want); i++ {
		res := chat(context.Background(), url, []chatMsg{{"user", fmt.Sprintf("question %d about discovery", i)}}, "", "round_robin")
		if res.err != nil {
			t.Fatalf("request %d: %v", i, res.err)
		}
		if !slices.Contains(want, res.pod) {
			t.Fatalf("request %d served by %s, want one of %v", i, res.pod, want)
		}
		seen[res.pod] = true
	}
	if len(seen) < len(want) {
		t.Fatalf("served by %v, want every one of %v", seen, want)
	}
}

// Issue acceptance (faults, discovery): a controller given only a DNS name
// (a headless Service; no static pods, no PodUp on its topic) serves the
// pods the name resolves to, and follows them joining and leaving.
func TestControllerFollowsDiscoveredPods(t *testing.T) {
	engines, port := loopbackPods(t, []byte{2, 3, 4}, nil)
	_ = engines
	dns := discoverytest.Start(t)
	dns.SetService(service(port, 2, 3))
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)

	cfg := regional.DefaultConfig()
	cfg.Region, cfg.ControllerID, cfg.Listen = "test", "ctl-1", "127.0.0.1:0"
	cfg.Kafka.Brokers = broker.ListenAddrs()
	cfg.Models = []regional.ModelConfig{{Name: simModel, Tokenizer: enginesim.DefaultConfig().Tokenizer}}
	cfg.Server.AllowPolicyOverride = true
	d := &cfg.Pods.Discovery.DNS
	d.Name, d.Server, d.Model = discoveredService, dns.Addr(), simModel
	d.Interval, d.MinInterval, d.Grace, d.DropAfterMisses = 50*time.Millisecond, 10*time.Millisecond, 0, 1
	ctl, err := regional.Open(context.Background(), cfg, regional.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ctl.Close(ctx); err != nil {
			t.Errorf("controller close: %v", err)
		}
	})
	pods := func() []string {
		var out []string
		for _, p := range ctl.Registry.Pods() {
			if ctl.Index.Alive(p.ID) && p.Info().Endpoint != "" {
				out = append(out, p.Name+"="+p.Info().Endpoint)
			}
		}
		return out
	}
	ep := func(h byte) string { return fmt.Sprintf("vllm-127-0-0-%d=http://127.0.0.%d:%d", h, h, port) }
	waitPods := func(want ...string) {
		t.Helper()
		waitFor(t, fmt.Sprintf("pods %v", want), func() bool { return slices.Equal(pods(), want) })
	}

	waitPods(ep(2), ep(3))
	servedBy(t, ctl.URL(), "vllm-127-0-0-2", "vllm-127-0-0-3")

	dns.SetService(service(port, 2, 3, 4)) // scaled up
	waitPods(ep(2), ep(3), ep(4))
	servedBy(t, ctl.URL(), "vllm-127-0-0-2", "vllm-127-0-0-3", "vllm-127-0-0-4")

	dns.SetService(service(port, 3, 4)) // scaled down: 127.0.0.2 is gone
	waitPods(ep(3), ep(4))
	servedBy(t, ctl.URL(), "vllm-127-0-0-3", "vllm-127-0-0-4")
	if got := metricValue(t, ctl.URL(), `meridian_ingest_discovered_pods_total{change="left"}`); got != 1 {
		t.Fatalf("%v pods counted as left, want 1", got)
	}
}
