package gossip

import (
	"fmt"
	"testing"
	"time"
)

// TestRTTConvergesToInjectedLatency: three regions on loopback whose
// packets are delayed to give RTTs of 65 ms (us-east-1 - us-west-2), 75 ms
// (us-east-1 - eu-west-1) and 220 ms (us-west-2 - eu-west-1); every node's
// direct RTT to each other region converges near the injected value. (This
// matrix breaks the triangle inequality, 65 + 75 < 220, as real WAN paths
// do; Vivaldi cannot embed it, which is why direct samples come first.)
func TestRTTConvergesToInjectedLatency(t *testing.T) {
	injected := map[[2]string]time.Duration{
		pairKey("us-east-1", "us-west-2"): 65 * time.Millisecond,
		pairKey("us-east-1", "eu-west-1"): 75 * time.Millisecond,
		pairKey("us-west-2", "eu-west-1"): 220 * time.Millisecond,
	}
	rtt := func(a, b string) time.Duration { return injected[pairKey(a, b)] }
	regionOf := map[string]string{"a": "us-east-1", "b": "us-west-2", "c": "eu-west-1"}
	key := newKey(t)
	var nodes []*Node
	for _, name := range []string{"a", "b", "c"} {
		cfg := testConfig(t, name, regionOf[name], key)
		cfg.ProbeInterval = 300 * time.Millisecond
		cfg.ProbeTimeout = 270 * time.Millisecond
		cfg.WrapTransport = latencyWrap(cfg.Region, regionOf, rtt)
		if len(nodes) > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		nodes = append(nodes, open(t, cfg))
	}
	within := func(got, want time.Duration) bool {
		return got >= want*97/100 && got <= want*115/100+5*time.Millisecond
	}
	waitFor(t, 30*time.Second, "direct RTTs near the injected ones", func() error {
		for _, n := range nodes {
			for _, r := range n.View().Regions {
				want := rtt(n.cfg.Region, r.Region)
				if r.RTTSource != RTTDirect || !within(r.RTT, want) {
					return fmt.Errorf("%s -> %s: RTT %v (%s), injected %v", n.cfg.NodeName, r.Region, r.RTT, r.RTTSource, want)
				}
			}
			if len(n.View().Regions) != 2 {
				return fmt.Errorf("%s sees %d regions", n.cfg.NodeName, len(n.View().Regions))
			}
		}
		return nil
	})
	for _, n := range nodes {
		v := n.View()
		for i, r := range v.Regions {
			t.Logf("%s -> %s: RTT %v (direct %v, vivaldi %v, %d samples)", n.cfg.NodeName, r.Region, r.RTT, r.DirectRTT, r.VivaldiRTT, r.Controllers[0].Samples)
			if i > 0 && v.Regions[i-1].RTT > r.RTT {
				t.Errorf("%s: regions not sorted nearest first", n.cfg.NodeName)
			}
			if got := counter(t, n.m.rtt.WithLabelValues(r.Region)); got <= 0 {
				t.Errorf("%s: rtt metric for %s is %v", n.cfg.NodeName, r.Region, got)
			}
		}
	}
}

// TestVivaldiConverges: four regions with a latency matrix that Vivaldi can
// embed (it obeys the triangle inequality); every node's Vivaldi distance
// to each other region converges near the injected RTT.
func TestVivaldiConverges(t *testing.T) {
	injected := map[[2]string]time.Duration{
		pairKey("us-east-1", "us-west-2"):      65 * time.Millisecond,
		pairKey("us-east-1", "eu-west-1"):      75 * time.Millisecond,
		pairKey("us-east-1", "ap-southeast-1"): 220 * time.Millisecond,
		pairKey("us-west-2", "eu-west-1"):      130 * time.Millisecond,
		pairKey("us-west-2", "ap-southeast-1"): 170 * time.Millisecond,
		pairKey("eu-west-1", "ap-southeast-1"): 250 * time.Millisecond,
	}
	rtt := func(a, b string) time.Duration { return injected[pairKey(a, b)] }
	regionOf := map[string]string{"e": "us-east-1", "w": "us-west-2", "u": "eu-west-1", "p": "ap-southeast-1"}
	key := newKey(t)
	var nodes []*Node
	for _, name := range []string{"e", "w", "u", "p"} {
		cfg := testConfig(t, name, regionOf[name], key)
		cfg.ProbeInterval = 300 * time.Millisecond
		cfg.ProbeTimeout = 280 * time.Millisecond
		cfg.WrapTransport = latencyWrap(cfg.Region, regionOf, rtt)
		if len(nodes) > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		nodes = append(nodes, open(t, cfg))
	}
	waitFor(t, 40*time.Second, "Vivaldi distances within 35% of the injected RTTs", func() error {
		for _, n := range nodes {
			v := n.View()
			if len(v.Regions) != 3 {
				return fmt.Errorf("%s sees %d regions", n.cfg.NodeName, len(v.Regions))
			}
			for _, r := range v.Regions {
				want := rtt(n.cfg.Region, r.Region)
				if r.VivaldiRTT < want*65/100 || r.VivaldiRTT > want*135/100 {
					return fmt.Errorf("%s -> %s: Vivaldi %v, injected %v", n.cfg.NodeName, r.Region, r.VivaldiRTT, want)
				}
			}
		}
		return nil
	})
	for _, n := range nodes {
		for _, r := range n.View().Regions {
			t.Logf("%s -> %s: injected %v, direct %v, Vivaldi %v", n.cfg.NodeName, r.Region, rtt(n.cfg.Region, r.Region), r.DirectRTT, r.VivaldiRTT)
		}
	}
}
