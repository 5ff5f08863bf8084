package fleet

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
)

// fastClock is every controller's wall clock: real time plus an offset a
// test moves forward, so minutes of a partition pass in seconds.
type fastClock struct{ off atomic.Int64 }

func (c *fastClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *fastClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// blackhole is a TCP proxy in front of a controller's API. While cut it
// forwards nothing, either way, on new or open connections, and answers
// nothing: what a peer sees of a region whose packets are dropped (its
// TCP handshake still completes here; a TLS one does not).
type blackhole struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target, conns: map[net.Conn]bool{}}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

// refuse closes the listener and every connection through it: from then on
// connections to its address are refused and those open are gone, as with
// a process that died (a peer's kept-alive connections to it end too).
func (b *blackhole) refuse() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
}

func (b *blackhole) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		c.Close()
		return false
	}
	b.conns[c] = true
	return true
}

func (b *blackhole) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		if !b.track(c) {
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if b.cut.Load() {
				_, _ = io.Copy(io.Discard, c) // held, never answered
				return
			}
			up, err := net.Dial("tcp", b.target)
			if err != nil || !b.track(up) {
				c.Close()
				return
			}
			b.wg.Add(1)
			go func() { defer b.wg.Done(); b.pipe(c, up) }()
			b.pipe(up, c)
		}()
	}
}

// pipe copies src to dst until src fails, dropping what arrives while cut.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.cut.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (b *blackhole) close() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}

// counter reads a counter from a controller's registry (0 if absent).
func counter(t *testing.T, c *regional.Controller, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := c.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.Metric {
			for _, lp := range m.Label {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			sum += value(m)
		}
	}
	return sum
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return 0
}

// Issue acceptance (faults, partition is not failure): eu-west-1's
// controller is cut off from the other regions' controllers (gossip
// dropped, its API blackholed) for three minutes of the controllers'
// clock, with automatic failover on, while its pods keep serving. EU PHI
// entering eu-west-1, which only eu-west-1 may serve, is never refused:
// not during the partition, not after the heal; no region changes state.
// EU PHI entering us-east-1 during the partition cannot reach eu-west-1:
// its forward gives up after a few RTTs (not the 120 s first-byte timeout)
// and says so; after the heal it is forwarded again.
func TestPartitionIsNotFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	clk := &fastClock{}
	part := gossiptest.NewPartition()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	euAPI := ln.Addr().String()
	ln.Close()
	hole := newBlackhole(t, euAPI)
	f := startFleet(t, Config{
		Controller: func(region string, c *regional.Config) {
			// Evaluated every 200 ms (default 1 s): the test waits for
			// evaluations after each step of the clock.
			c.AutoFailover = regional.AutoFailoverConfig{Enabled: true, Interval: 200 * time.Millisecond, MinHealthyPods: 1,
				Grace: 2 * time.Second, HoldDown: 5 * time.Second, ReportMaxAge: 10 * time.Second}
			if region == "eu-west-1" {
				c.Listen, c.PublicURL = euAPI, "https://"+hole.addr()
			}
		},
		Deps: func(region string, d *regional.Deps) {
			d.Clock, d.WrapGossipTransport = clk.Now, part.Wrap("ctl-"+region)
		},
	})
	eu, east := f.Region("eu-west-1").Controller, f.Region("us-east-1").Controller
	phi := map[string]string{regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi"}
	hc := *f.HTTP
	hc.Timeout = 20 * time.Second
	if a := ask(t, &hc, east.URL(), "/v1/chat/completions", phi, "before the partition"); a.status != 200 || a.region != "eu-west-1" {
		t.Fatalf("EU PHI entering us-east-1 before the partition: %+v", a)
	}

	// EU PHI keeps entering eu-west-1 throughout.
	var mu sync.Mutex
	statuses := map[int]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			status := 0
			req, _ := http.NewRequest(http.MethodPost, eu.URL()+"/v1/chat/completions",
				stringsReader(`{"model":"meridian/sim-70b","max_tokens":2,"messages":[{"role":"user","content":"entering eu-west-1 `+strconv.Itoa(i)+`"}]}`))
			for k, v := range phi {
				req.Header.Set(k, v)
			}
			if resp, err := hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			mu.Lock()
			statuses[status]++
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	// The leader's automatic failover must have looked at the region
	// after each step of the clock.
	evaluations := func() float64 {
		n := 0.0
		for _, r := range f.Regions {
			n += counter(t, r.Controller, "meridian_global_auto_failover_evaluations_total", nil)
		}
		return n
	}
	evaluated := func(what string) {
		t.Helper()
		from := evaluations()
		eventually(t, what, func() bool { return evaluations() >= from+2 })
	}
	deadIn := func(view *gossip.RegionsView) bool {
		rv, ok := view.Region("eu-west-1")
		return ok && !rv.Live && rv.Dead == len(rv.Controllers)
	}

	part.Cut([]string{"ctl-eu-west-1"}, []string{"ctl-us-east-1", "ctl-us-west-2"})
	hole.cut.Store(true)
	eventually(t, "the other regions declare eu-west-1's controller dead", func() bool {
		return deadIn(east.Gossip().View()) && deadIn(f.Region("us-west-2").Controller.Gossip().View())
	})
	before := counter(t, east, "meridian_router_upstream_errors_total", map[string]string{"kind": "connect_timeout"}) +
		counter(t, east, "meridian_router_upstream_errors_total", map[string]string{"kind": "first_byte_timeout"})
	start := time.Now()
	a := ask(t, &hc, east.URL(), "/v1/chat/completions", phi, "during the partition")
	gaveUp := time.Since(start) // logged, not asserted: the client's own timeout bounds it
	if a.status == 200 {
		t.Fatalf("EU PHI entering us-east-1 was served during the partition: %+v", a)
	}
	after := counter(t, east, "meridian_router_upstream_errors_total", map[string]string{"kind": "connect_timeout"}) +
		counter(t, east, "meridian_router_upstream_errors_total", map[string]string{"kind": "first_byte_timeout"})
	if after <= before {
		t.Fatalf("the forward into the partition did not time out (answer %d %s)", a.status, a.body)
	}
	// Three minutes, in steps the failover sees, each shorter than the
	// pods' 30 s TTL: a step of 30 s would leave every pod unheard from
	// for its whole TTL at once (no scrape can happen inside a step), and
	// it lapses until the next scrape, which the partition has nothing to
	// do with. Each step also waits until every controller has heard from
	// each of its pods since (a scrape on the moved clock), so that no
	// pod lapses because steps came faster than scrapes on a loaded
	// machine.
	for range 18 {
		clk.Advance(10 * time.Second)
		f.waitContacted(t, clk.Now())
		evaluated("the automatic failover to evaluate the partitioned region")
	}
	for _, r := range f.Regions {
		for _, reg := range []string{"us-east-1", "us-west-2", "eu-west-1"} {
			if s := r.Controller.Global().State().RegionState(reg).String(); s != "active" {
				t.Fatalf("%s sees %s %s after a three-minute partition", r.Name, reg, s)
			}
		}
	}

	part.Heal()
	hole.cut.Store(false)
	eventually(t, "the other regions see eu-west-1 alive again", func() bool {
		for _, r := range []string{"us-east-1", "us-west-2"} {
			if rv, ok := f.Region(r).Controller.Gossip().View().Region("eu-west-1"); !ok || !rv.Live {
				return false
			}
		}
		return true
	})
	clk.Advance(10 * time.Second)
	f.waitContacted(t, clk.Now())
	evaluated("the automatic failover to evaluate the healed region")
	eventually(t, "EU PHI entering us-east-1 forwarded again", func() bool {
		a := ask(t, &hc, east.URL(), "/v1/chat/completions", phi, "after the heal")
		return a.status == 200 && a.region == "eu-west-1"
	})
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(statuses) != 1 || statuses[200] == 0 {
		t.Fatalf("EU PHI entering eu-west-1, by status: %v; want only 200", statuses)
	}
	for _, r := range f.Regions {
		if s := r.Controller.Global().State().RegionState("eu-west-1").String(); s != "active" {
			t.Fatalf("%s sees eu-west-1 %s after the heal", r.Name, s)
		}
	}
	t.Logf("EU PHI entering eu-west-1: %v; forward into the partition: %d after %v", statuses, a.status, gaveUp.Round(time.Millisecond))
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// waitContacted waits until every running controller has heard from each
// of its region's pods (a scrape or an answer) at or after since, by its
// own clock.
func (f *Fleet) waitContacted(t *testing.T, since time.Time) {
	t.Helper()
	eventually(t, "every controller to hear from its pods on the moved clock", func() bool {
		for _, c := range f.Controllers() {
			for _, p := range c.Registry.Pods() {
				if p.LastContact().Before(since) {
					return false
				}
			}
		}
		return true
	})
}
