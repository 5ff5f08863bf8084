package kvbridge_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/discovery/discoverytest"
	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

const serviceName = "vllm.inference.svc.cluster.local."

// servicePods starts, at 127.0.0.<h> for each host h, an engine serving
// HTTP on one port and publishing over ZMQ as vLLM does (no PodUp) on
// another, the same ports for every pod, as a Service's pods are.
func servicePods(t *testing.T, hosts ...byte) (map[byte]*engine, int, int) {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		ports := make([]int, 2)
		for i := range ports {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", hosts[0]))
			if err != nil {
				t.Skipf("no loopback address 127.0.0.%d: %v", hosts[0], err)
			}
			ports[i] = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
		}
		httpPort, zmqPort := ports[0], ports[1]
		out := map[byte]*engine{}
		ok := true
		for _, h := range hosts {
			host := fmt.Sprintf("127.0.0.%d", h)
			zc := enginesim.ZMQConfig{Endpoint: "tcp://" + net.JoinHostPort(host, strconv.Itoa(zmqPort)), Mode: "bind",
				VLLMOnly: true, Linger: 100 * time.Millisecond}
			pub, err := enginesim.NewZMQPublisher(zc)
			if err != nil {
				ok = false
				break
			}
			t.Cleanup(func() { _ = pub.Close() })
			cfg := engineConfig(fmt.Sprintf("vllm-127-0-0-%d", h))
			cfg.Addr = net.JoinHostPort(host, strconv.Itoa(httpPort))
			cfg.Publisher = pub
			e, err := enginesim.Open(cfg)
			if err != nil {
				ok = false
				break
			}
			tr := &http.Transport{}
			en := &engine{t: t, e: e, pub: pub, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr: tr}
			t.Cleanup(en.close)
			out[h] = en
		}
		if ok {
			return out, httpPort, zmqPort
		}
	}
	t.Fatal("no pair of ports free on every loopback address")
	return nil, 0, 0
}

// Issue acceptance (faults, discovery): `meridian kv-bridge` given only a
// DNS name (a headless Service; no pod list) subscribes to the engines the
// name resolves to and announces them with their HTTP endpoints, which
// vLLM never does; a controller's ingester, given no pods at all, then
// knows each pod's endpoint and indexes its events. Pods that join are
// followed; a pod that leaves the Service is unsubscribed from and
// announced down, and the controller forgets it.
func TestBridgeFollowsDiscoveredEngines(t *testing.T) {
	engines, httpPort, zmqPort := servicePods(t, 2, 3, 4)
	dns := discoverytest.Start(t)
	service := func(hosts ...byte) discoverytest.Service {
		svc := discoverytest.Service{Name: serviceName, TTL: 1, Ports: []discoverytest.Port{{Name: "http", Port: uint16(httpPort)}}}
		for _, h := range hosts {
			svc.Pods = append(svc.Pods, discoverytest.Pod{IP: netip.AddrFrom4([4]byte{127, 0, 0, h})})
		}
		return svc
	}
	dns.SetService(service(2, 3))

	cluster := startKafka(t)
	cfg := bridgeConfig(cluster)
	d := &cfg.Discovery.DNS
	d.Name, d.Server, d.KVEventsPort, d.Model, d.Profile = serviceName, dns.Addr(), zmqPort, testModel, "h100"
	d.Interval, d.MinInterval, d.Grace, d.DropAfterMisses = 50*time.Millisecond, 10*time.Millisecond, 0, 1
	cfg.AnnounceInterval = 200 * time.Millisecond
	b := openBridge(t, cfg)

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

	// pods lists the registered pods with their endpoints.
	pods := func() []string {
		var out []string
		for _, p := range reg.Pods() {
			if idx.Alive(p.ID) && p.Info().Endpoint != "" {
				out = append(out, p.Name+"="+p.Info().Endpoint)
			}
		}
		return out
	}
	ep := func(h byte) string { return fmt.Sprintf("vllm-127-0-0-%d=http://127.0.0.%d:%d", h, h, httpPort) }
	// indexed waits until the pod's requests show in the index.
	indexed := func(h byte) {
		t.Helper()
		en := engines[h]
		for _, p := range []*enginesim.ZMQPublisher{en.pub} {
			waitPub(t, p, "the bridge's subscription", func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 })
		}
		for i := range 4 {
			en.request(int(h)*10 + i)
		}
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer wcancel()
		name := fmt.Sprintf("vllm-127-0-0-%d", h)
		if err := g.WaitFor(wctx, func() bool {
			p, ok := reg.Get(name)
			return ok && idx.Stats().PodBlocks[p.ID.Slot()] > 0
		}); err != nil {
			t.Fatalf("%s's events did not reach the index: %v (bridge %+v)", name, err, b.Stats())
		}
	}
	wait := func(want ...string) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer wcancel()
		if err := g.WaitFor(wctx, func() bool { return slices.Equal(pods(), want) }); err != nil {
			t.Fatalf("pods %v, want %v (bridge %+v)", pods(), want, b.Stats())
		}
	}

	wait(ep(2), ep(3))
	indexed(2)
	indexed(3)

	dns.SetService(service(2, 3, 4)) // scaled up
	wait(ep(2), ep(3), ep(4))
	indexed(4)

	dns.SetService(service(3, 4)) // 127.0.0.2 left the Service
	wait(ep(3), ep(4))
	waitPub(t, engines[2].pub, "the bridge to unsubscribe", func(s enginesim.ZMQStats) bool { return s.Subscribers == 0 })
	waitBridge(t, b, "the PodDown's acknowledgement", func(s kvbridge.Stats) bool { return s.PodsDown == 1 })
	if st := b.Stats(); st.Announcements < 3 {
		t.Fatalf("bridge stats %+v: want an announcement per pod", st)
	}
}
