package fleet

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
)

// Issue acceptance (issue 16, gossip rejoin): eu-west-1's controller
// restarts with gossip seeds that point only at itself and no peers
// remembered: it is isolated from every other region, says so in /readyz
// (not ready for cross-region work) and rejoins through the members of
// the Raft configuration (their admin APIs give their gossip addresses);
// EU PHI entering us-east-1 is then forwarded to it again.
func TestRestartedControllerRejoinsThroughRaftMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	part := gossiptest.NewPartition()
	f := startFleet(t, Config{Deps: func(region string, d *regional.Deps) { d.WrapGossipTransport = part.Wrap("ctl-" + region) }})
	self := gossiptest.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := f.Restart(ctx, "eu-west-1", func(c *regional.Config) {
		c.Gossip.Bind, c.Gossip.Join = self, []string{self}
		// Forget the peers seen before the restart (keep the epoch).
		file := filepath.Join(c.Raft.DataDir, "gossip-state.json")
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var st map[string]any
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		delete(st, "peers")
		b, _ = json.Marshal(st)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	eu, east := f.Region("eu-west-1").Controller, f.Region("us-east-1").Controller
	readyz := func() map[string]any {
		resp, err := f.HTTP.Get(eu.URL() + "/readyz")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return m
	}
	eventually(t, "the restarted controller rejoins and says it is ready for cross-region work", func() bool {
		m := readyz()
		rv, ok := east.Gossip().View().Region("eu-west-1")
		return m != nil && m["cross_region_ready"] == true && m["gossip_isolated"] == nil && ok && rv.Live && !eu.Gossip().Isolated()
	})
	if n := counter(t, eu, "meridian_gossip_rejoins_total", nil); n < 1 {
		t.Fatalf("rejoined without a rejoin attempt (%v): the seeds pointed at itself", n)
	}
	phi := map[string]string{regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi"}
	eventually(t, "EU PHI entering us-east-1 forwarded to the restarted eu-west-1", func() bool {
		a := ask(t, f.HTTP, east.URL(), "/v1/chat/completions", phi, "after the restart")
		return a.status == 200 && a.region == "eu-west-1"
	})

	// Cut off from every other region, it says so: still ready for its
	// own traffic, not for cross-region work; healed, it is again.
	part.Cut([]string{"ctl-eu-west-1"}, []string{"ctl-us-east-1", "ctl-us-west-2"})
	eventually(t, "/readyz reports eu-west-1 isolated", func() bool {
		m := readyz()
		return m != nil && m["gossip_isolated"] == true && m["cross_region_ready"] == false && m["ready"] == true &&
			counter(t, eu, "meridian_gossip_isolated", nil) == 1
	})
	part.Heal()
	eventually(t, "/readyz reports eu-west-1 back", func() bool {
		m := readyz()
		return m != nil && m["cross_region_ready"] == true && counter(t, eu, "meridian_gossip_isolated", nil) == 0
	})
}
