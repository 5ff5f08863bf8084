package gossip

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
)

// TestThreeRegions: every node gets every other region's latest summary
// over the pull path (push/pull is a minute away), and a new generation
// replaces the old everywhere.
func TestThreeRegions(t *testing.T) {
	key := newKey(t)
	regions := []string{"us-east-1", "us-west-2", "eu-west-1"}
	var nodes []*Node
	for i, r := range regions {
		cfg := testConfig(t, fmt.Sprintf("c%d.%s", i, r), r, key)
		if i > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		nodes = append(nodes, open(t, cfg))
	}
	for i, n := range nodes {
		if err := n.Publish(buildSummary(t, regions[i], 1, 5000)); err != nil {
			t.Fatal(err)
		}
	}
	allHold := func(gen map[string]uint64) func() error {
		return func() error {
			for _, n := range nodes {
				for _, r := range regions {
					if r == n.cfg.Region {
						continue
					}
					if err := holds(n, r, gen[r]); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	waitFor(t, 15*time.Second, "every node holds generation 1 of every other region",
		allHold(map[string]uint64{"us-east-1": 1, "us-west-2": 1, "eu-west-1": 1}))

	v := nodes[0].View()
	if _, ok := v.Region("us-east-1"); ok {
		t.Fatal("a node's view lists its own region")
	}
	for _, name := range []string{"us-west-2", "eu-west-1"} {
		r, _ := v.Region(name)
		if !r.Live || r.Alive != 1 || len(r.Controllers) != 1 || r.Via != "pull" {
			t.Fatalf("%s: live %v alive %d controllers %d via %q", name, r.Live, r.Alive, len(r.Controllers), r.Via)
		}
		if c := r.Controllers[0]; c.ForwardAddr != "https://"+c.Name+".example:8443" || c.Digest.Generation != 1 || c.Digest.Pods != 2 {
			t.Fatalf("%s: digest %+v", name, c)
		}
	}

	if err := nodes[1].Publish(buildSummary(t, "us-west-2", 2, 6000)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "generation 2 of us-west-2 replaces generation 1",
		allHold(map[string]uint64{"us-east-1": 1, "us-west-2": 2, "eu-west-1": 1}))

	for _, n := range nodes {
		if a := counter(t, n.m.accepted); a < 2 {
			t.Errorf("%s accepted %v summaries, want >= 2", n.cfg.NodeName, a)
		}
		if s := counter(t, n.m.sentBytes); s == 0 {
			t.Errorf("%s sent no summary bytes", n.cfg.NodeName)
		}
		if r := counter(t, n.m.receivedBytes); r == 0 {
			t.Errorf("%s received no summary bytes", n.cfg.NodeName)
		}
	}
	for _, n := range nodes {
		if err := n.Close(); err != nil {
			t.Errorf("close %s: %v", n.cfg.NodeName, err)
		}
		if err := n.Close(); err != nil {
			t.Errorf("second close %s: %v", n.cfg.NodeName, err)
		}
	}
	if err := nodes[0].Publish(buildSummary(t, "us-east-1", 9, 10)); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
}

// TestFiveNodesLatestWins: five controllers over three regions (two
// regions with two controllers each). A region's summary is the highest
// generation published by any of its controllers, from whichever one.
func TestFiveNodesLatestWins(t *testing.T) {
	key := newKey(t)
	layout := []struct{ name, region string }{
		{"a1", "us-east-1"}, {"a2", "us-east-1"}, {"b1", "us-west-2"}, {"b2", "us-west-2"}, {"c1", "ap-southeast-1"},
	}
	nodes := map[string]*Node{}
	var seed string
	for _, l := range layout {
		cfg := testConfig(t, l.name, l.region, key)
		if seed != "" {
			cfg.Join = []string{seed}
		}
		n := open(t, cfg)
		if seed == "" {
			seed = n.Addr()
		}
		nodes[l.name] = n
	}
	publish := func(name string, gen uint64) {
		t.Helper()
		n := nodes[name]
		if err := n.Publish(buildSummary(t, n.cfg.Region, gen, 2000+int(gen))); err != nil {
			t.Fatal(err)
		}
	}
	publish("a1", 10)
	publish("a2", 20)
	publish("b1", 5)
	publish("c1", 7)
	check := func(want map[string]uint64) func() error {
		return func() error {
			for _, n := range nodes {
				for r, g := range want {
					if r == n.cfg.Region {
						continue
					}
					if err := holds(n, r, g); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	waitFor(t, 20*time.Second, "the newest generation of each region everywhere",
		check(map[string]uint64{"us-east-1": 20, "us-west-2": 5, "ap-southeast-1": 7}))
	publish("a1", 30) // the other controller of us-east-1 overtakes
	publish("b2", 6)  // a controller that had published nothing
	waitFor(t, 20*time.Second, "the overtaking generations everywhere",
		check(map[string]uint64{"us-east-1": 30, "us-west-2": 6, "ap-southeast-1": 7}))

	r, _ := nodes["c1"].View().Region("us-east-1")
	if len(r.Controllers) != 2 || r.Alive != 2 {
		t.Fatalf("c1 sees us-east-1 with %d controllers, %d alive", len(r.Controllers), r.Alive)
	}
}

// TestRestartWithHigherGeneration: a controller that leaves makes its
// region not Live; restarted under the same name on a new port with a
// higher generation, it replaces its old summary everywhere.
func TestRestartWithHigherGeneration(t *testing.T) {
	key := newKey(t)
	a := open(t, testConfig(t, "a", "us-east-1", key))
	cfgB := testConfig(t, "b", "us-west-2", key)
	cfgB.Join = []string{a.Addr()}
	b := open(t, cfgB)
	cfgC := testConfig(t, "c", "eu-west-1", key)
	cfgC.Join = []string{a.Addr()}
	c := open(t, cfgC)
	if err := c.Publish(buildSummary(t, "eu-west-1", 100, 3000)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "a and b hold eu-west-1 gen 100", func() error {
		return errors.Join(holds(a, "eu-west-1", 100), holds(b, "eu-west-1", 100))
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "eu-west-1 is not Live after its only controller left", func() error {
		for _, n := range []*Node{a, b} {
			r, ok := n.View().Region("eu-west-1")
			if !ok || r.Live || r.Controllers[0].State != StateDead {
				return fmt.Errorf("%s: %+v", n.cfg.NodeName, r)
			}
			if r.Summary == nil || r.Summary.Generation != 100 {
				return fmt.Errorf("%s dropped the last summary of a dead region", n.cfg.NodeName)
			}
			if _, ok := r.Candidate(time.Now(), []uint64{1}, 64, nil); ok {
				return fmt.Errorf("%s: a dead region is a candidate", n.cfg.NodeName)
			}
		}
		return nil
	})
	cfgC2 := testConfig(t, "c", "eu-west-1", key)
	cfgC2.Join = []string{a.Addr()}
	c2 := open(t, cfgC2)
	if err := c2.Publish(buildSummary(t, "eu-west-1", 200, 3500)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the restarted controller's generation 200 replaces 100", func() error {
		for _, n := range []*Node{a, b} {
			if err := holds(n, "eu-west-1", 200); err != nil {
				return err
			}
			if r, _ := n.View().Region("eu-west-1"); !r.Live {
				return fmt.Errorf("%s: eu-west-1 not Live again", n.cfg.NodeName)
			}
		}
		return nil
	})
}

// TestJoinBackstop: a controller joining after others published gets their
// summaries in the join's push/pull, before any pull.
func TestJoinBackstop(t *testing.T) {
	key := newKey(t)
	cfgA := testConfig(t, "a", "us-east-1", key)
	a := open(t, cfgA)
	if err := a.Publish(buildSummary(t, "us-east-1", 3, 1000)); err != nil {
		t.Fatal(err)
	}
	cfgB := testConfig(t, "b", "us-west-2", key)
	cfgB.PullRetry = time.Hour // a pull sent before the join's state arrives would not be retried
	b := open(t, cfgB)
	if _, err := b.Join(context.Background(), []string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b holds us-east-1 after joining", func() error { return holds(b, "us-east-1", 3) })
	if r, _ := b.View().Region("us-east-1"); r.Via != "push/pull" {
		t.Fatalf("arrived via %q, want push/pull", r.Via)
	}
}

// TestEncryptionMismatch: a controller with another key (or another label)
// cannot join, and the pool never lists it.
func TestEncryptionMismatch(t *testing.T) {
	key := newKey(t)
	a := open(t, testConfig(t, "a", "us-east-1", key))
	b := open(t, testConfig(t, "b", "us-west-2", key))
	if _, err := b.Join(context.Background(), []string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	intruder := open(t, testConfig(t, "x", "eu-west-1", newKey(t)))
	if _, err := intruder.Join(context.Background(), []string{a.Addr()}); err == nil {
		t.Fatal("a controller with another key joined")
	}
	cfgL := testConfig(t, "y", "eu-west-1", key)
	cfgL.Label = "another-pool"
	labelled := open(t, cfgL)
	if _, err := labelled.Join(context.Background(), []string{a.Addr()}); err == nil {
		t.Fatal("a controller with another label joined")
	}
	if err := intruder.Publish(buildSummary(t, "eu-west-1", 1, 100)); err != nil {
		t.Fatal(err)
	}
	// a and b keep gossiping: each round a publishes a new generation and b
	// receiving it proves an exchange happened, during which the outsiders
	// had their chance to leak in.
	for gen := uint64(1); gen <= 10; gen++ {
		if err := a.Publish(buildSummary(t, "us-east-1", gen, 100)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("b holds us-east-1 generation %d", gen), func() error { return holds(b, "us-east-1", gen) })
		for _, n := range []*Node{a, b} {
			if r, ok := n.View().Region("eu-west-1"); ok {
				t.Fatalf("%s lists the intruding region: %+v", n.cfg.NodeName, r)
			}
		}
		if len(intruder.View().Regions) != 0 || len(labelled.View().Regions) != 0 {
			t.Fatal("an outsider sees the pool")
		}
	}
}

// TestBadBodyOverTheWire: a member of the pool (a raw memberlist holding the
// key) sends garbage, a corrupted body and an oversize body with
// SendReliable; each is rejected and counted, and the node keeps serving.
func TestBadBodyOverTheWire(t *testing.T) {
	key := newKey(t)
	cfgA := testConfig(t, "a", "us-east-1", key)
	cfgA.MaxSummaryBytes = 32 << 10
	a := open(t, cfgA)

	keyBytes, _ := base64.StdEncoding.DecodeString(key)
	mc := memberlist.DefaultLocalConfig()
	mc.Name = "raw"
	mc.BindAddr, mc.BindPort, mc.AdvertisePort = "127.0.0.1", 0, 0
	mc.SecretKey = keyBytes
	mc.Label = cfgA.Label
	mc.LogOutput = io.Discard
	raw, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Shutdown() }()
	if _, err := raw.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	// The target from a's own address: the *Node values raw.Members()
	// returns are memberlist's live records, written by its packet handler
	// while we would read them (a data race under -race).
	host, port, err := net.SplitHostPort(a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	portN, _ := strconv.Atoi(port)
	target := &memberlist.Node{Name: "a", Addr: net.ParseIP(host), Port: uint16(portN)}
	good, _ := buildSummary(t, "us-west-2", 1, 2000).MarshalBinary()
	corrupt := append([]byte(nil), good...)
	corrupt[100] ^= 1
	send := func(body []byte) {
		t.Helper()
		if err := raw.SendReliable(target, encodeSummaryMsg(body)); err != nil {
			t.Fatal(err)
		}
	}
	send([]byte("not a summary at all"))
	send(corrupt)
	send(make([]byte, 40<<10))
	waitFor(t, 10*time.Second, "the three bodies rejected by reason", func() error {
		for _, reason := range []string{"magic", "checksum", "oversize"} {
			if counter(t, a.m.rejected.WithLabelValues(reason)) != 1 {
				return fmt.Errorf("%s not counted", reason)
			}
		}
		return nil
	})
	if counter(t, a.m.digestRejected) == 0 {
		t.Error("the raw member's empty digest was not counted")
	}
	send(good)
	waitFor(t, 10*time.Second, "a good body still accepted", func() error { return holds(a, "us-west-2", 1) })
}

// TestRejoinThroughEveryKnownAddress: a controller cut off long enough for
// both sides to declare each other dead and stop gossiping to the dead is
// isolated from every other region; it says so (Isolated, the metric) and,
// with no seed configured, rejoins once the network heals through the
// addresses of the controllers it had seen. A controller restarted with
// seeds that point only at itself rejoins through the addresses Rejoin
// gives (the controller's: its Raft members', those it remembered).
func TestRejoinThroughEveryKnownAddress(t *testing.T) {
	key := newKey(t)
	part := gossiptest.NewPartition()
	cfg := func(name, region string) Config {
		c := testConfig(t, name, region, key)
		c.GossipToTheDeadTime = 100 * time.Millisecond
		c.WrapTransport = part.Wrap(name)
		return c
	}
	a := open(t, cfg("a", "us-east-1"))
	cfgB := cfg("b", "us-west-2")
	cfgB.Join = []string{a.Addr()}
	b := open(t, cfgB)
	c := open(t, cfg("c", "eu-west-1")) // no seeds
	if _, err := c.Join(context.Background(), []string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	sees := func(n *Node, region string, live bool) error {
		r, ok := n.View().Region(region)
		if !ok || r.Live != live {
			return fmt.Errorf("%s: %s live %v, want %v", n.cfg.NodeName, region, ok && r.Live, live)
		}
		return nil
	}
	waitFor(t, 15*time.Second, "everyone sees everyone", func() error {
		return errors.Join(sees(c, "us-east-1", true), sees(c, "us-west-2", true), sees(a, "eu-west-1", true))
	})
	if c.Isolated() {
		t.Fatal("c isolated while it sees the other regions")
	}

	part.Cut([]string{"c"}, []string{"a", "b"})
	waitFor(t, 20*time.Second, "both sides declare each other dead", func() error {
		for _, n := range []*Node{a, b} {
			if r, ok := n.View().Region("eu-west-1"); !ok || r.Dead != 1 {
				return fmt.Errorf("%s does not see c dead", n.cfg.NodeName)
			}
		}
		if !c.Isolated() {
			return errors.New("c is not isolated")
		}
		return nil
	})
	if got := counter(t, c.m.isolated); got != 1 {
		t.Fatalf("isolated gauge %v, want 1", got)
	}
	part.Heal()
	waitFor(t, 20*time.Second, "c rejoins through the controllers it had seen", func() error {
		return errors.Join(sees(c, "us-east-1", true), sees(c, "us-west-2", true), sees(a, "eu-west-1", true), sees(b, "eu-west-1", true))
	})
	if c.Isolated() || counter(t, c.m.isolated) != 0 || counter(t, c.m.rejoins) == 0 {
		t.Fatalf("after rejoining: isolated %v, gauge %v, rejoins %v", c.Isolated(), counter(t, c.m.isolated), counter(t, c.m.rejoins))
	}

	// A restart whose seeds point only at itself: Rejoin's addresses.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	self := gossiptest.FreeAddr(t)
	cfgC2 := cfg("c", "eu-west-1")
	_, port, _ := net.SplitHostPort(self)
	cfgC2.BindPort, _ = strconv.Atoi(port)
	cfgC2.Join = []string{self}
	cfgC2.Rejoin = func(context.Context) []string { return []string{b.Addr()} }
	c2 := open(t, cfgC2)
	waitFor(t, 20*time.Second, "the restarted controller rejoins through Rejoin's addresses", func() error {
		return errors.Join(sees(c2, "us-east-1", true), sees(c2, "us-west-2", true), sees(a, "eu-west-1", true))
	})
}

// TestOneRegionPoolIsNotIsolated: the replicas of the only region are not
// isolated from other regions (there are none): no rejoin every interval,
// no gauge, no "isolated" in /readyz. Once the controller knows other
// regions exist (OtherRegions: the Raft configuration has some) and sees
// none of their controllers, it is.
func TestOneRegionPoolIsNotIsolated(t *testing.T) {
	key := newKey(t)
	var others atomic.Bool
	cfgA := testConfig(t, "a", "us-east-1", key)
	cfgA.OtherRegions = others.Load
	a := open(t, cfgA)
	if !a.Isolated() {
		t.Fatal("a node that has seen no controller at all is not isolated (its seeds may come up later)")
	}
	cfgB := testConfig(t, "b", "us-east-1", key)
	cfgB.Join = []string{a.Addr()}
	b := open(t, cfgB)
	waitFor(t, 15*time.Second, "the replicas see each other", func() error {
		if len(a.livePeers()) != 1 || len(b.livePeers()) != 1 {
			return fmt.Errorf("live peers: a %d, b %d", len(a.livePeers()), len(b.livePeers()))
		}
		return nil
	})
	waitFor(t, 15*time.Second, "neither replica isolated", func() error {
		if a.Isolated() || b.Isolated() {
			return fmt.Errorf("isolated: a %v, b %v", a.Isolated(), b.Isolated())
		}
		return nil
	})
	others.Store(true)
	if !a.Isolated() {
		t.Fatal("a knows other regions exist and sees none of their controllers, yet it is not isolated")
	}
	if b.Isolated() {
		t.Fatal("b, told of no other region, is isolated")
	}
}
