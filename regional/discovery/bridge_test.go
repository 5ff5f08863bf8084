package discovery

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/discovery/discoverytest"
)

// A pod found by DNS carries, beside its HTTP endpoint, its engine's ZMQ
// endpoints at the configured ports of the same address: what the bridge
// subscribes to.
func TestDNSPodsCarryZMQEndpoints(t *testing.T) {
	srv := discoverytest.Start(t)
	svc := service(7)
	svc.Pods = append(svc.Pods, discoverytest.Pod{IP: netip.MustParseAddr("fd00::3:7")})
	srv.SetService(svc)
	cfg := manual(srv.Addr())
	cfg.KVEventsPort, cfg.ReplayPort = 5557, 5558
	cfg.Model, cfg.Profile = "llama", "h100"
	d, _ := newDNS(t, cfg, nil)
	r := start(t, d)
	got := r.waitFor(t, "vllm-10-0-3-7,vllm-fd00--3-7")
	want := []Pod{
		{Name: "vllm-10-0-3-7", Endpoint: "http://10.0.3.7:8000", Model: "llama", Profile: "h100",
			Addr: netip.MustParseAddr("10.0.3.7"), KVEvents: "tcp://10.0.3.7:5557", Replay: "tcp://10.0.3.7:5558"},
		{Name: "vllm-fd00--3-7", Endpoint: "http://[fd00::3:7]:8000", Model: "llama", Profile: "h100",
			Addr: netip.MustParseAddr("fd00::3:7"), KVEvents: "tcp://[fd00::3:7]:5557", Replay: "tcp://[fd00::3:7]:5558"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pods\n%+v\nwant\n%+v", got, want)
	}

	// Without the ports, no ZMQ endpoints.
	cfg.KVEventsPort, cfg.ReplayPort = 0, 0
	d2, _ := newDNS(t, cfg, nil)
	r2 := start(t, d2)
	for _, p := range r2.waitFor(t, "vllm-10-0-3-7,vllm-fd00--3-7") {
		if p.KVEvents != "" || p.Replay != "" {
			t.Fatalf("pod %+v has ZMQ endpoints without configured ports", p)
		}
	}
}

// bridgeModel is what the bridge does with snapshots: subscribe to each
// joined engine's PUB endpoint and announce its pod (PodUp with the HTTP
// endpoint), resubscribe a changed one, unsubscribe from one that left.
type bridgeModel struct {
	prev          []Pod
	subscriptions map[string]string // pod name -> ZMQ endpoint
	log           []string
}

func (b *bridgeModel) apply(pods []Pod) {
	d := Diff(b.prev, pods)
	for _, p := range d.Left {
		delete(b.subscriptions, p.Name)
		b.log = append(b.log, "unsubscribe "+p.Name)
	}
	for _, p := range append(slices.Clone(d.Joined), d.Changed...) {
		b.subscriptions[p.Name] = p.KVEvents
		b.log = append(b.log, "subscribe "+p.Name+" "+p.KVEvents+"; PodUp "+p.Endpoint)
	}
	b.prev = pods
}

// The bridge, given only the Service's name, follows engines joining and
// leaving.
func TestBridgeFollowsEngines(t *testing.T) {
	srv := discoverytest.Start(t)
	srv.SetService(service(1))
	cfg := DefaultConfig().DNS
	cfg.Name, cfg.Server, cfg.KVEventsPort = svcName, srv.Addr(), 5557
	cfg.Interval, cfg.MinInterval, cfg.Grace, cfg.DropAfterMisses = 20*time.Millisecond, 5*time.Millisecond, 0, 1
	d, _ := newDNS(t, cfg, nil)
	r := start(t, d)
	b := &bridgeModel{subscriptions: map[string]string{}}

	b.apply(r.waitFor(t, vllm(1)))
	srv.SetService(service(1, 2))
	b.apply(r.waitFor(t, vllm(1, 2)))
	srv.SetService(service(2))
	b.apply(r.waitFor(t, vllm(2)))

	want := []string{
		"subscribe vllm-10-0-3-1 tcp://10.0.3.1:5557; PodUp http://10.0.3.1:8000",
		"subscribe vllm-10-0-3-2 tcp://10.0.3.2:5557; PodUp http://10.0.3.2:8000",
		"unsubscribe vllm-10-0-3-1",
	}
	if !slices.Equal(b.log, want) {
		t.Fatalf("bridge did\n%q\nwant\n%q", b.log, want)
	}
	if len(b.subscriptions) != 1 || b.subscriptions["vllm-10-0-3-2"] != "tcp://10.0.3.2:5557" {
		t.Fatalf("subscriptions %v", b.subscriptions)
	}
}
