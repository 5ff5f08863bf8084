package global_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSingleNode(t *testing.T) {
	c := globaltest.NewCluster(t, 1, globaltest.Options{})
	n := c.Nodes[0]
	ctx := ctxT(t, 10*time.Second)
	pv, err := n.Node.ApplyPolicy(ctx, "p.yaml", []byte("zones: {}"), "first", global.WriteOptions{Actor: "test"})
	if err != nil || pv.Version != 1 {
		t.Fatalf("apply: %+v %v", pv, err)
	}
	if _, err := n.Node.Trigger(ctx, "region-0", "drill", global.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if n.Node.State().Routable("region-0") {
		t.Fatal("failed region routable")
	}
	h := n.Node.Health()
	if h.Stale || h.RaftState != "Leader" || h.Leader != n.Name || h.PolicyVersion != 1 {
		t.Fatalf("health %+v", h)
	}
}

// acked is a write the cluster acknowledged; it must survive anything.
type acked struct {
	version uint64
	doc     string
}

func applyVia(t *testing.T, nd *globaltest.Node, doc string) acked {
	t.Helper()
	pv, err := nd.Client.ApplyPolicy(ctxT(t, 15*time.Second), global.PolicyRequest{Name: "p.yaml", Document: doc, Actor: "test"})
	if err != nil {
		t.Fatalf("apply %q via %s: %v", doc, nd.Name, err)
	}
	return acked{version: pv.Version, doc: doc}
}

func checkAcked(t *testing.T, n *global.Node, writes []acked) {
	t.Helper()
	st := n.State()
	for _, w := range writes {
		p, ok := st.PolicyVersion(w.version)
		sum := sha256.Sum256([]byte(w.doc))
		if !ok || p.SHA256 != hex.EncodeToString(sum[:]) { // documents of old versions are pruned; hashes stay
			t.Fatalf("%s lost acknowledged policy v%d %q (has %+v)", n.ID(), w.version, w.doc, p)
		}
	}
}

// TestClusterAcceptance runs the acceptance scenario on 3 and 5 voters over
// the real Raft TCP transport on loopback: writes through any node, leader
// killed (a new one within 5 s, no acknowledged write lost), a minority
// partitioned (it keeps serving its last state, reports stale, cannot
// commit), healed, converged.
func TestClusterAcceptance(t *testing.T) {
	for _, size := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d-voters", size), func(t *testing.T) {
			c := globaltest.NewCluster(t, size, globaltest.Options{Voters: size})
			var writes []acked
			for i, nd := range c.Nodes {
				writes = append(writes, applyVia(t, nd, fmt.Sprintf("zones: {} # %d", i)))
			}
			if _, err := c.Nodes[size-1].Client.Trigger(ctxT(t, 10*time.Second), global.FailoverRequest{Region: "region-1", Reason: "drill"}); err != nil {
				t.Fatal(err)
			}
			c.WaitFor(5*time.Second, "every node to see region-1 failed", func() bool {
				for _, nd := range c.Nodes {
					if nd.Node.State().Routable("region-1") {
						return false
					}
				}
				return true
			})

			// Kill the leader.
			old, err := c.Leader()
			if err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			c.Kill(old)
			rest := c.Running()
			nl, err := c.WaitLeader(5*time.Second, rest...)
			if err != nil {
				t.Fatalf("no new leader within 5 s of killing %s: %v", c.Nodes[old].Name, err)
			}
			t.Logf("new leader %s %v after killing %s", c.Nodes[nl].Name, time.Since(killed), c.Nodes[old].Name)
			checkAcked(t, c.Nodes[nl].Node, writes)
			writes = append(writes, applyVia(t, c.Nodes[rest[0]], "zones: {} # after kill"))

			// Bring the old leader back; it catches up.
			if err := c.Start(old); err != nil {
				t.Fatal(err)
			}
			c.WaitFor(10*time.Second, "the restarted node to catch up", func() bool { return c.Converged() })
			checkAcked(t, c.Nodes[old].Node, writes)

			// Partition a minority that holds the current leader.
			leader, err := c.WaitLeader(10 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			minority := []int{leader}
			for i := 0; len(minority) < (size-1)/2; i++ {
				if i != leader {
					minority = append(minority, i)
				}
			}
			var majority []int
			for i := range c.Nodes {
				if !slices.Contains(minority, i) {
					majority = append(majority, i)
				}
			}
			before := c.Nodes[minority[0]].Node.State()
			c.Net.Partition(c.Names(minority...), c.Names(majority...))
			_, err = c.WaitLeader(10*time.Second, majority...)
			if err != nil {
				t.Fatalf("majority %v elected no leader: %v", majority, err)
			}
			writes = append(writes, applyVia(t, c.Nodes[majority[0]], "zones: {} # majority"))
			// The minority cannot commit: its write fails after the hold timeout.
			_, err = c.Nodes[minority[0]].Node.ApplyPolicy(ctxT(t, 10*time.Second), "p.yaml", []byte("zones: {} # minority"), "", global.WriteOptions{})
			if !errors.Is(err, global.ErrNoLeader) {
				t.Fatalf("minority write: %v, want ErrNoLeader", err)
			}
			for _, i := range minority {
				n := c.Nodes[i].Node
				if n.State() != before && n.State().Index() != before.Index() {
					t.Fatalf("minority node %s state moved while partitioned", n.ID())
				}
				if n.State().Routable("region-1") {
					t.Fatal("minority lost its committed region state")
				}
				if h := n.Health(); !h.Stale {
					t.Fatalf("minority node %s does not report stale: %+v", n.ID(), h)
				}
			}
			c.WaitFor(10*time.Second, "a majority leader that is not stale", func() bool {
				l, err := c.WaitLeader(time.Second, majority...)
				return err == nil && !c.Nodes[l].Node.Health().Stale
			})

			// Heal and converge.
			c.Net.Heal()
			c.WaitFor(10*time.Second, "convergence after heal", func() bool { return c.Converged() })
			for _, i := range c.Running() {
				n := c.Nodes[i].Node
				checkAcked(t, n, writes)
				for _, p := range n.State().PolicyHistory() {
					if p.Name == "p.yaml" && p.Version > uint64(len(writes)) {
						t.Fatalf("%s has an unacknowledged version %d", n.ID(), p.Version)
					}
				}
				if got := len(n.State().PolicyHistory()); got != len(writes) {
					t.Fatalf("%s has %d policy versions, want %d (the minority write must not commit)", n.ID(), got, len(writes))
				}
			}
			c.WaitFor(5*time.Second, "minority no longer stale", func() bool {
				for _, i := range minority {
					if c.Nodes[i].Node.Health().Stale {
						return false
					}
				}
				return true
			})
		})
	}
}

// TestFollowerReadsItsWrites: a write through a follower returns once that
// follower's State holds it, even when its state machine applies slowly
// (Raft's own applied index moves when a batch is queued to the state
// machine, before it is applied).
func TestFollowerReadsItsWrites(t *testing.T) {
	var slow atomic.Bool
	c := globaltest.NewCluster(t, 3, globaltest.Options{Configure: func(i int, cfg *global.Config) {
		cfg.PolicyCompiler = func(doc []byte) (any, error) {
			if slow.Load() {
				time.Sleep(150 * time.Millisecond)
			}
			return string(doc), nil
		}
	}})
	slow.Store(true)
	for i := range 3 {
		l, err := c.WaitLeader(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		f := c.Nodes[(l+1)%len(c.Nodes)].Node
		doc := fmt.Sprintf("zones: {} # %d", i)
		pv, err := f.ApplyPolicy(ctxT(t, 10*time.Second), "p.yaml", []byte(doc), "", global.WriteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := f.State().Policy(); !ok || p.Version != pv.Version || string(p.Document) != doc {
			t.Fatalf("write %d through %s returned v%d, but its state has %+v", i, f.ID(), pv.Version, p)
		}
	}
}

// TestApplyPolicyIdempotent: on a three-node cluster, applying the active
// policy's document again adds no version, through the leader, a follower
// (forwarded) or the admin API; concurrent applies of one new document
// from every node make exactly one version, and every answer names it.
func TestApplyPolicyIdempotent(t *testing.T) {
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3})
	first, err := c.Nodes[0].Client.ApplyPolicy(ctxT(t, 15*time.Second), global.PolicyRequest{Name: "p.yaml", Document: "zones: {} # a"})
	if err != nil || first.Unchanged || first.Version != 1 {
		t.Fatalf("first apply: %+v %v", first, err)
	}
	for _, nd := range c.Nodes {
		again, err := nd.Client.ApplyPolicy(ctxT(t, 15*time.Second), global.PolicyRequest{Name: "renamed.yaml", Document: "zones: {} # a", Reason: "sync"})
		if err != nil || !again.Unchanged || again.Version != 1 || again.Index != first.Index || again.SHA256 != first.SHA256 {
			t.Fatalf("same document via %s: %+v %v, want v1 unchanged", nd.Name, again, err)
		}
		pv, err := nd.Node.ApplyPolicy(ctxT(t, 15*time.Second), "p.yaml", []byte("zones: {} # a"), "", global.WriteOptions{})
		if err != nil || !pv.Unchanged || pv.Version != 1 {
			t.Fatalf("same document on %s in process: %+v %v", nd.Name, pv, err)
		}
	}

	// Every node applies the same new document at once.
	type answer struct {
		pv  global.PolicyApplied
		err error
	}
	answers := make(chan answer, 3*len(c.Nodes))
	for _, nd := range c.Nodes {
		for range 3 {
			go func() {
				pv, err := nd.Client.ApplyPolicy(ctxT(t, 30*time.Second), global.PolicyRequest{Name: "p.yaml", Document: "zones: {} # b"})
				answers <- answer{pv, err}
			}()
		}
	}
	changed := 0
	for range 3 * len(c.Nodes) {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.pv.Version != 2 {
			t.Fatalf("a concurrent apply of one document answered %+v, want version 2", a.pv)
		}
		if !a.pv.Unchanged {
			changed++
		}
	}
	if changed != 1 {
		t.Fatalf("%d of the concurrent applies made the version, want exactly 1", changed)
	}
	for _, nd := range c.Nodes {
		c.WaitFor(10*time.Second, nd.Name+" applies version 2", func() bool {
			p, ok := nd.Node.State().Policy()
			return ok && p.Version == 2
		})
		if h := nd.Node.State().PolicyHistory(); len(h) != 2 {
			t.Fatalf("%s holds %d versions, want 2", nd.Name, len(h))
		}
	}
}
