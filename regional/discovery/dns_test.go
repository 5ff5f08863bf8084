package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/discovery/discoverytest"
)

const svcName = "vllm.inference.svc.cluster.local."

// service is a headless Service with an http port 8000 and the given
// pods' IPv4 addresses' last bytes.
func service(last ...int) discoverytest.Service {
	svc := discoverytest.Service{Name: svcName, TTL: 5,
		Ports: []discoverytest.Port{{Name: "http", Port: 8000}, {Name: "kv", Port: 5557}}}
	for _, b := range last {
		svc.Pods = append(svc.Pods, discoverytest.Pod{IP: netip.AddrFrom4([4]byte{10, 0, 3, byte(b)})})
	}
	return svc
}

// names gives the pod names of service(last...) as a source names them.
func vllm(last ...int) string {
	var s []string
	for _, b := range last {
		s = append(s, fmt.Sprintf("vllm-10-0-3-%d", b))
	}
	slices.Sort(s) // as strings, as snapshots are
	return strings.Join(s, ",")
}

// manual is a DNS configuration that looks up only when asked (Refresh),
// after the first lookup at Run's start.
func manual(server string) DNSConfig {
	c := DefaultConfig().DNS
	c.Name, c.Server = svcName, server
	c.Interval, c.MinInterval = time.Hour, time.Hour
	return c
}

func newDNS(t *testing.T, cfg DNSConfig, clock *fakeClock) (*DNS, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	deps := Deps{Registerer: reg}
	if clock != nil {
		deps.Now = clock.Now
	}
	d, err := NewDNS(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return d, reg
}

// Pods joining and leaving the Service are followed on the source's own
// timer, without Refresh.
func TestDNSFollowsPodsJoiningAndLeaving(t *testing.T) {
	srv := discoverytest.Start(t)
	srv.SetService(service(7, 8))
	cfg := DefaultConfig().DNS
	cfg.Name, cfg.Server = svcName, srv.Addr()
	cfg.Interval, cfg.MinInterval = 20*time.Millisecond, 5*time.Millisecond
	cfg.Grace, cfg.DropAfterMisses = 0, 1
	d, reg := newDNS(t, cfg, nil)
	r := start(t, d)

	pods := r.waitFor(t, vllm(7, 8))
	if pods[0].Endpoint != "http://10.0.3.7:8000" || pods[0].Addr != netip.MustParseAddr("10.0.3.7") {
		t.Fatalf("pod %+v, want endpoint http://10.0.3.7:8000 and its address", pods[0])
	}
	srv.SetService(service(7, 8, 9, 10)) // scale up
	r.waitFor(t, vllm(7, 8, 9, 10))
	srv.SetService(service(8, 10)) // scale down
	r.waitFor(t, vllm(8, 10))
	srv.SetService(service()) // to zero: no records
	r.waitFor(t, "")
	srv.SetService(service(11))
	r.waitFor(t, vllm(11))
	srv.RemoveService(svcName) // NXDOMAIN
	r.waitFor(t, "")

	got := lookups(t, reg)
	if got[resultOK] < 4 || got[resultNotFound] < 2 || got[resultError] != 0 {
		t.Fatalf("lookups by result %v: want >= 4 ok, >= 2 not_found, no error", got)
	}
	if n := gauge(t, reg, "meridian_discovery_pods"); n != 0 {
		t.Fatalf("meridian_discovery_pods = %v, want 0", n)
	}
	if n := gauge(t, reg, "meridian_discovery_changes_total"); n != 6 {
		t.Fatalf("meridian_discovery_changes_total = %v, want 6", n)
	}
}

// A pod missing from some answers is kept until it has been missing from
// drop_after_misses answers and for grace; one that comes back within it
// never left.
func TestDNSFlappingPodsKeptUntilGrace(t *testing.T) {
	srv := discoverytest.Start(t)
	srv.SetService(service(1, 2, 3))
	clock := newFakeClock()
	cfg := manual(srv.Addr())
	cfg.Grace, cfg.DropAfterMisses = 30*time.Second, 2
	d, reg := newDNS(t, cfg, clock)
	r := start(t, d)
	r.waitFor(t, vllm(1, 2, 3))
	_, calls := r.snapshot()

	// Pod 2 flaps: absent from answers for 20s, then back.
	srv.SetService(service(1, 3))
	for range 5 {
		clock.Advance(5 * time.Second)
		if err := refresh(t, d); err != nil {
			t.Fatal(err)
		}
	}
	if got := gauge(t, reg, "meridian_discovery_pods_missing"); got != 1 {
		t.Fatalf("meridian_discovery_pods_missing = %v, want 1", got)
	}
	srv.SetService(service(1, 2, 3))
	clock.Advance(5 * time.Second)
	if err := refresh(t, d); err != nil {
		t.Fatal(err)
	}
	if last, c := r.snapshot(); c != calls || podNames(last) != vllm(1, 2, 3) {
		t.Fatalf("after a flap within grace: %d updates, pods %q; want none and %q", c-calls, podNames(last), vllm(1, 2, 3))
	}

	// Pod 3 leaves for good: kept for 30s, then dropped.
	srv.SetService(service(1, 2))
	for i := range 6 {
		if err := refresh(t, d); err != nil {
			t.Fatal(err)
		}
		if last, _ := r.snapshot(); podNames(last) != vllm(1, 2, 3) {
			t.Fatalf("%ds after pod 3 went missing, pods are %q", 5*i, podNames(last))
		}
		clock.Advance(5 * time.Second)
	}
	if err := refresh(t, d); err != nil {
		t.Fatal(err)
	}
	if last, _ := r.snapshot(); podNames(last) != vllm(1, 2) {
		t.Fatalf("30s after pod 3 went missing, pods are %q, want %q", podNames(last), vllm(1, 2))
	}

	// Two misses are needed even when time has passed: one answer after a
	// long silence drops nothing.
	srv.SetService(service(2))
	clock.Advance(time.Hour)
	if err := refresh(t, d); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	if last, _ := r.snapshot(); podNames(last) != vllm(1, 2) {
		t.Fatalf("one miss dropped a pod: pods are %q", podNames(last))
	}
}

// Failed lookups keep the last set, are counted, and do not count as
// misses; Refresh returns their error.
func TestDNSFailuresKeepTheLastSet(t *testing.T) {
	srv := discoverytest.Start(t)
	srv.SetService(service(1, 2))
	clock := newFakeClock()
	cfg := manual(srv.Addr())
	cfg.Grace, cfg.DropAfterMisses = 10*time.Second, 2
	d, reg := newDNS(t, cfg, clock)
	r := start(t, d)
	r.waitFor(t, vllm(1, 2))

	for _, rcode := range []int{dns.RcodeServerFailure, dns.RcodeRefused} {
		srv.SetRcode(rcode)
		for range 3 {
			clock.Advance(time.Minute)
			err := refresh(t, d)
			if err == nil {
				t.Fatalf("rcode %s: Refresh returned no error", dns.RcodeToString[rcode])
			}
		}
	}
	if got := lookups(t, reg); got[resultError] != 6 || got[resultOK] != 1 {
		t.Fatalf("lookups by result %v, want 1 ok and 6 error", got)
	}
	if last, _ := r.snapshot(); podNames(last) != vllm(1, 2) {
		t.Fatalf("after failed lookups pods are %q, want %q", podNames(last), vllm(1, 2))
	}

	// The server answers again without pod 2: a first miss, not a drop,
	// for all the time that passed while lookups failed.
	srv.SetRcode(dns.RcodeSuccess)
	srv.SetService(service(1))
	if err := refresh(t, d); err != nil {
		t.Fatal(err)
	}
	if last, _ := r.snapshot(); podNames(last) != vllm(1, 2) {
		t.Fatalf("first answer after failures dropped a pod: %q", podNames(last))
	}
	clock.Advance(10 * time.Second)
	if err := refresh(t, d); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, vllm(1))

	// A server that does not answer at all: the lookup times out.
	cfg.Server = unusedUDPAddr(t)
	cfg.Timeout = 50 * time.Millisecond
	d2, reg2 := newDNS(t, cfg, clock)
	start(t, d2)
	if err := refresh(t, d2); err == nil {
		t.Fatal("a lookup to a closed port returned no error")
	}
	if got := lookups(t, reg2); got[resultError] < 1 || got[resultOK]+got[resultNotFound] != 0 {
		t.Fatalf("lookups by result %v, want errors only", got)
	}
}

// A Service of many pods does not fit in a UDP answer: the resolver
// retries over TCP, and every pod is found.
func TestDNSLargeServiceOverTCP(t *testing.T) {
	srv := discoverytest.Start(t)
	var last []int
	for i := 1; i <= 120; i++ {
		last = append(last, i)
	}
	srv.SetService(service(last...))
	d, _ := newDNS(t, manual(srv.Addr()), nil)
	r := start(t, d)
	r.waitFor(t, vllm(last...))
	if srv.TCPQueries() == 0 {
		t.Fatal("no query came over TCP: the answer was not truncated, and the test tests nothing")
	}
}

// The next lookup comes when the shortest TTL runs out, within
// [min_interval, interval]; the TTL is read from UDP and TCP answers.
func TestDNSHonoursTTL(t *testing.T) {
	srv := discoverytest.Start(t)
	cfg := manual(srv.Addr())
	cfg.Interval, cfg.MinInterval = 10*time.Second, time.Second
	d, _ := newDNS(t, cfg, nil)
	for _, tc := range []struct {
		pods int
		ttl  uint32
		want time.Duration
	}{
		{2, 3, 3 * time.Second},
		{2, 0, time.Second},         // never cache: but not more often than min_interval
		{2, 3600, 10 * time.Second}, // an hour: but at least every interval
		{120, 4, 4 * time.Second},   // over TCP
	} {
		svc := service()
		for i := range tc.pods {
			svc.Pods = append(svc.Pods, discoverytest.Pod{IP: netip.AddrFrom4([4]byte{10, 0, 4, byte(i)})})
		}
		svc.TTL = tc.ttl
		srv.SetService(svc)
		a, err := d.lookup(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(a.pods) != tc.pods || a.ttl != time.Duration(tc.ttl)*time.Second {
			t.Fatalf("ttl %d, %d pods: lookup found %d pods, ttl %v", tc.ttl, tc.pods, len(a.pods), a.ttl)
		}
		if got := d.delay(a, nil, 0); got != tc.want {
			t.Errorf("ttl %d: next lookup after %v, want %v", tc.ttl, got, tc.want)
		}
	}
	// Without a TTL (no answer records), and after failures.
	if got := d.delay(answer{notFound: true}, nil, 0); got != 10*time.Second {
		t.Errorf("no TTL: next lookup after %v, want the interval", got)
	}
	for fails, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 60: 10 * time.Second} {
		if got := d.delay(answer{}, errors.New("servfail"), fails); got != want {
			t.Errorf("%d failures: next lookup after %v, want %v", fails, got, want)
		}
	}
}

// With lookup ip the A/AAAA records of the name are the pods, at the
// configured port; network chooses the family.
func TestDNSLookupIP(t *testing.T) {
	srv := discoverytest.Start(t)
	svc := service(7)
	svc.Pods = append(svc.Pods, discoverytest.Pod{IP: netip.MustParseAddr("fd00::3:7")})
	srv.SetService(svc)
	for _, tc := range []struct {
		network string
		want    string
	}{
		{"ip", "vllm-10-0-3-7=http://10.0.3.7:9000 vllm-fd00--3-7=http://[fd00::3:7]:9000"},
		{"ip4", "vllm-10-0-3-7=http://10.0.3.7:9000"},
		{"ip6", "vllm-fd00--3-7=http://[fd00::3:7]:9000"},
	} {
		cfg := manual(srv.Addr())
		cfg.Lookup, cfg.Port, cfg.Network = LookupIP, 9000, tc.network
		d, _ := newDNS(t, cfg, nil)
		a, err := d.lookup(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range a.pods {
			got = append(got, p.Name+"="+p.Endpoint)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("network %s: %q, want %q", tc.network, got, tc.want)
		}
	}
}

// name_from target names pods by their SRV target's host name (a
// StatefulSet's pods), and a dual-stack host takes its IPv4 address.
func TestDNSNameFromTarget(t *testing.T) {
	srv := discoverytest.Start(t)
	svc := service()
	svc.Pods = []discoverytest.Pod{
		{IP: netip.MustParseAddr("10.0.3.9"), Hostname: "vllm-1"},
		{IP: netip.MustParseAddr("fd00::9"), Hostname: "vllm-1"},
		{IP: netip.MustParseAddr("10.0.3.8"), Hostname: "vllm-0"},
	}
	srv.SetService(svc)
	cfg := manual(srv.Addr())
	cfg.NameFrom, cfg.Scheme = NameFromTarget, "https"
	d, _ := newDNS(t, cfg, nil)
	a, err := d.lookup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []Pod{
		{Name: "vllm-0", Endpoint: "https://10.0.3.8:8000", Addr: netip.MustParseAddr("10.0.3.8")},
		{Name: "vllm-1", Endpoint: "https://10.0.3.9:8000", Addr: netip.MustParseAddr("10.0.3.9")},
	}
	if fmt.Sprint(a.pods) != fmt.Sprint(want) {
		t.Fatalf("pods %+v\nwant %+v", a.pods, want)
	}
}

// The service and proto name the SRV records; a Service without that port
// answers no pods.
func TestDNSServiceAndProto(t *testing.T) {
	srv := discoverytest.Start(t)
	srv.SetService(service(1))
	cfg := manual(srv.Addr())
	cfg.Service = "kv"
	d, _ := newDNS(t, cfg, nil)
	a, err := d.lookup(context.Background())
	if err != nil || len(a.pods) != 1 || a.pods[0].Endpoint != "http://10.0.3.1:5557" {
		t.Fatalf("service kv: %+v, %v", a.pods, err)
	}
	cfg.Service, cfg.Proto = "http", "udp"
	d, _ = newDNS(t, cfg, nil)
	a, err = d.lookup(context.Background())
	if err != nil || !a.notFound || len(a.pods) != 0 {
		t.Fatalf("proto udp: %+v, %v; want not found", a, err)
	}
}

func TestRunOnceAtATime(t *testing.T) {
	srv := discoverytest.Start(t)
	srv.SetService(service(1))
	d, _ := newDNS(t, manual(srv.Addr()), nil)
	r := start(t, d)
	r.waitFor(t, vllm(1))
	if err := d.Run(context.Background(), func([]Pod) {}); !errors.Is(err, ErrRunning) {
		t.Fatalf("a second Run returned %v, want ErrRunning", err)
	}
	if err := d.Run(context.Background(), nil); err == nil {
		t.Fatal("Run without an update function returned no error")
	}
	// Refresh without a Run waits for ctx.
	idle, _ := newDNS(t, manual(srv.Addr()), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := idle.Refresh(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Refresh of a source not running returned %v", err)
	}
}

// unusedUDPAddr returns a loopback address where nothing listens.
func unusedUDPAddr(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	return addr
}

func TestDedupeIsOrderFree(t *testing.T) {
	a := Pod{Name: "x", Endpoint: "http://10.0.0.2:8000"}
	b := Pod{Name: "x", Endpoint: "http://10.0.0.1:8000"}
	c := Pod{Name: "w", Endpoint: "http://10.0.0.3:8000"}
	byEndpoint := func(p, q Pod) int { return strings.Compare(p.Endpoint, q.Endpoint) }
	got1 := dedupe([]Pod{a, b, c}, byEndpoint)
	got2 := dedupe([]Pod{b, c, a}, byEndpoint)
	if !slices.Equal(got1, got2) || len(got1) != 2 || got1[1] != b {
		t.Fatalf("dedupe: %v and %v, want [w, x@10.0.0.1] both", got1, got2)
	}
}
