package global_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

// readPathCluster is a single node with a policy, five regions with states
// and targets: what the router reads.
func readPathCluster(t testing.TB) *global.Node {
	c := globaltest.NewCluster(t, 1, globaltest.Options{})
	n := c.Nodes[0].Node
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.ApplyPolicy(ctx, "p.yaml", []byte("zones: {}"), "", global.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, s := range []global.RegionState{global.RegionActive, global.RegionFailed, global.RegionDraining, global.RegionRecovering, global.RegionFailed} {
		r := fmt.Sprintf("region-%d", i)
		if _, err := n.SetRegionState(ctx, global.RegionChange{Region: r, State: s, Force: true}, global.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

var (
	sinkBool  bool
	sinkState global.RegionState
	sinkPtr   *global.State
)

// TestReadPathAllocs: the request path's reads allocate nothing.
func TestReadPathAllocs(t *testing.T) {
	n := readPathCluster(t)
	allocs := testing.AllocsPerRun(1000, func() {
		st := n.State()
		sinkBool = st.Routable("region-1")
		sinkState = st.RegionState("region-3")
		sinkBool = sinkBool || st.Routable("unknown-region")
	})
	if allocs != 0 {
		t.Fatalf("read path allocates %.1f times per call", allocs)
	}
	st := n.State()
	if st.Routable("region-1") || !st.Routable("region-0") || st.RegionState("region-3") != global.RegionRecovering || !st.Routable("unknown-region") {
		t.Fatal("read path answers are wrong")
	}
}

// BenchmarkReadPath measures the request path's cost of reading the global
// state: the atomic load, and region queries on the loaded snapshot.
func BenchmarkReadPath(b *testing.B) {
	n := readPathCluster(b)
	b.Run("State", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkPtr = n.State()
		}
	})
	b.Run("Routable", func(b *testing.B) {
		st := n.State()
		b.ReportAllocs()
		for b.Loop() {
			sinkBool = st.Routable("region-1")
		}
	})
	b.Run("StateRoutableRegionState", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			st := n.State()
			sinkBool = st.Routable("region-1")
			sinkState = st.RegionState("region-3")
		}
	})
	b.Run("Parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				st := n.State()
				if st.Routable("region-1") {
					sinkBool = true
				}
			}
		})
	})
}

// BenchmarkPolicyApply measures the latency of a policy apply on a 3-node
// loopback cluster (raft-wal with fsync): on the leader, on a follower
// (forwarded to the leader over HTTP) and through the admin client.
func BenchmarkPolicyApply(b *testing.B) {
	c := globaltest.NewCluster(b, 3, globaltest.Options{Voters: 3})
	l, err := c.Leader()
	if err != nil {
		b.Fatal(err)
	}
	f := (l + 1) % 3
	// Each apply carries a new document: one identical to the active
	// policy would add no version.
	n := 0
	next := func() []byte {
		n++
		return fmt.Appendf(nil, "version: bench\nzones:\n  eu: [eu-west-1, eu-central-1]\n  us: [us-east-1, us-west-2]\n# %d\n", n)
	}
	ctx := context.Background()
	b.Run("leader", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Nodes[l].Node.ApplyPolicy(ctx, "bench.yaml", next(), "", global.WriteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("follower-forwarded", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Nodes[f].Node.ApplyPolicy(ctx, "bench.yaml", next(), "", global.WriteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("admin-client-to-follower", func(b *testing.B) {
		cl := c.Nodes[f].Client
		b.ReportAllocs()
		for b.Loop() {
			if _, err := cl.ApplyPolicy(ctx, global.PolicyRequest{Name: "bench.yaml", Document: string(next())}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkFailoverPropagation measures, on a 3-node loopback cluster, the
// time from `failover trigger` returning (through a follower's admin API) to
// every controller's local state saying the region is not routable. It
// reports it as propagation-ns/op; ns/op also includes the trigger itself
// and the recover between iterations.
func BenchmarkFailoverPropagation(b *testing.B) {
	c := globaltest.NewCluster(b, 3, globaltest.Options{Voters: 3})
	l, err := c.Leader()
	if err != nil {
		b.Fatal(err)
	}
	cl := c.Nodes[(l+1)%3].Client
	ctx := context.Background()
	var total, worst time.Duration
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cl.Trigger(ctx, global.FailoverRequest{Region: "region-2", Reason: "bench"}); err != nil {
			b.Fatal(err)
		}
		returned := time.Now()
		for _, nd := range c.Nodes {
			waitState(nd.Node, func(st *global.State) bool { return !st.Routable("region-2") })
		}
		d := time.Since(returned)
		total += d
		worst = max(worst, d)
		if _, err := cl.Recover(ctx, global.FailoverRequest{Region: "region-2"}); err != nil {
			b.Fatal(err)
		}
		for _, nd := range c.Nodes {
			waitState(nd.Node, func(st *global.State) bool { return st.Routable("region-2") })
		}
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "propagation-ns/op")
	b.ReportMetric(float64(worst.Nanoseconds()), "worst-propagation-ns")
}

// waitState blocks until cond holds on n's local state, woken by state
// changes (no polling).
func waitState(n *global.Node, cond func(*global.State) bool) {
	for {
		ch := n.StateChanged()
		if cond(n.State()) {
			return
		}
		<-ch
	}
}
