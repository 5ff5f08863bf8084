package global_test

import (
	"errors"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

// TestRestartedNodeIsNotCurrentUntilTheLeaderSaysSo: a follower restarted
// while cut off from the cluster holds its last snapshot, not what was
// committed while it was down. It does not call itself caught up then
// (controllers gate readiness on it); it still knows every server of the
// Raft configuration from its log; once it hears from the leader it
// catches up, and CaughtUp becomes true only with the missed write
// applied.
func TestRestartedNodeIsNotCurrentUntilTheLeaderSaysSo(t *testing.T) {
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3})
	leader, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	writes := []acked{applyVia(t, c.Nodes[leader], "zones: {} # before")}
	f := (leader + 1) % 3
	c.WaitFor(10*time.Second, "the follower to take the write", func() bool {
		_, ok := c.Nodes[f].Node.State().PolicyVersion(writes[0].version)
		return ok
	})
	if !c.Nodes[f].Node.CaughtUp() {
		t.Fatal("a follower that holds every write does not say it is caught up")
	}

	c.Stop(f)
	writes = append(writes, applyVia(t, c.Nodes[leader], "zones: {} # while it was down"))
	c.Net.Isolate(c.Nodes[f].Name)
	if err := c.Start(f); err != nil {
		t.Fatal(err)
	}
	n := c.Nodes[f].Node
	if n.CaughtUp() {
		t.Fatalf("a restarted node cut off from its leader says it is caught up (health %+v)", n.Health())
	}
	if _, ok := n.State().PolicyVersion(writes[1].version); ok {
		t.Fatal("the isolated node has a write committed while it was down")
	}
	for _, nd := range c.Nodes {
		if !n.InConfiguration(nd.Name) {
			t.Errorf("the restarted node does not know %s is in the configuration", nd.Name)
		}
	}
	if n.InConfiguration("ctl-nobody") {
		t.Error("an unknown id is in the configuration")
	}

	c.Net.Reconnect(c.Nodes[f].Name)
	c.WaitFor(20*time.Second, "the restarted node to catch up", n.CaughtUp)
	checkAcked(t, n, writes)
}

// TestWriteWithoutQuorumEndsNoLeader: a write whose caller's deadline ends
// before any leader commits it (the quorum is gone: the leader waits for
// followers that are down, and a follower's forward waits for the leader)
// ends with ErrNoLeader, whichever step the deadline caught, so that a
// caller tells "the cluster could not take it" from a refusal. A
// controller's close relies on it to tell a cluster going away from a
// failure.
func TestWriteWithoutQuorumEndsNoLeader(t *testing.T) {
	c := globaltest.NewCluster(t, 5, globaltest.Options{Voters: 5})
	leader, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	follower := (leader + 1) % 5
	for i := range c.Nodes {
		if i != leader && i != follower {
			c.Kill(i)
		}
	}
	for _, at := range []int{follower, leader} {
		for _, d := range []time.Duration{50 * time.Millisecond, 2 * time.Second} {
			_, err := c.Nodes[at].Node.ApplyPolicy(ctxT(t, d), "p.yaml", []byte("zones: {} # no quorum"), "", global.WriteOptions{})
			if !errors.Is(err, global.ErrNoLeader) {
				t.Fatalf("a write without quorum through %s, deadline %v: %v, want ErrNoLeader", c.Nodes[at].Name, d, err)
			}
		}
	}
}
