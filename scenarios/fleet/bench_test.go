package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/regional"
)

// BenchmarkLeaderReplicaFailover measures how long the Raft tier of a
// fleet of 3 regions x 2 replicas (one voter per region, engine
// simulators, kfake, gossip; no traffic: low load) is without a leader
// after the replica that leads is killed (a crash: no leadership
// transfer), from the kill until
//
//   - elect: every running controller knows the same new leader;
//   - write: a failover write (a region state change, what `meridian
//     failover trigger` commits) submitted at the kill on a controller of
//     another region, and retried as an operator would, is committed.
//
// Per Raft timing: lan (hashicorp/raft's defaults, 1 s heartbeat and
// election timeouts), test (2 s, the fleet tests'), wan (global.WANTiming,
// what raft.wan: true in the deploy manifests runs). Each iteration
// waits for a stable cluster (one voter per region, a write commits),
// kills the leader, measures, and starts it again. It reports the median
// and the worst of each, in seconds.
//
//	go test ./scenarios/fleet -run '^$' -bench LeaderReplicaFailover -benchtime 10x -v
func BenchmarkLeaderReplicaFailover(b *testing.B) {
	for _, tc := range []struct {
		name     string
		election time.Duration // 0: the WAN preset
	}{
		{"timing=lan", time.Second},
		{"timing=test", 2 * time.Second},
		{"timing=wan", 0},
	} {
		b.Run(tc.name, func(b *testing.B) { benchLeaderFailover(b, tc.election) })
	}
}

func benchLeaderFailover(b *testing.B, election time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cfg := Config{Replicas: 2, ElectionTimeout: election, Dir: b.TempDir()}
	if election == 0 {
		cfg.Controller = func(_ string, c *regional.Config) {
			c.Raft.WAN, c.Raft.ElectionTimeout = true, 0
		}
	}
	if p := os.Getenv("FLEET_BENCH_LOG"); p != "" {
		lf, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		defer lf.Close()
		cfg.Logger = slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	f, err := Start(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = f.Close(cctx)
	}()
	var elects, writes []time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		leader := stableLeader(ctx, b, f)
		// The write goes through a controller of another region (its own
		// region's state: active, set active again; a change all the same
		// that commits through Raft, audited as a failover_recover).
		var writer *Replica
		for _, r := range f.Regions {
			for _, rep := range r.Replicas {
				if writer == nil && rep.Region != leader.Region && rep.Controller() != nil {
					writer = rep
				}
			}
		}
		w := writer.Controller()
		wrote := make(chan time.Duration, 1)
		kill := time.Now()
		if err := leader.Kill(); err != nil {
			b.Fatal(err)
		}
		go func() {
			for time.Since(kill) < time.Minute {
				if _, err := w.Global().Recover(ctx, writer.Region, fmt.Sprintf("bench failover %d", i), global.WriteOptions{}); err == nil {
					wrote <- time.Since(kill)
					return
				}
			}
			wrote <- 0
		}()
		elect := waitNewLeader(b, f, leader.ID, kill)
		write := <-wrote
		if write == 0 {
			b.Fatal("no failover write committed within a minute of the kill")
		}
		elects, writes = append(elects, elect), append(writes, write)
		b.Logf("iteration %d: leader %s killed; new leader known to all in %v, failover write committed in %v",
			i, leader.ID, elect.Round(time.Millisecond), write.Round(time.Millisecond))
		if err := leader.Start(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"elect", elects}, {"write", writes}} {
		slices.Sort(m.d)
		b.ReportMetric(m.d[len(m.d)/2].Seconds(), "s-"+m.name+"-median")
		b.ReportMetric(m.d[len(m.d)-1].Seconds(), "s-"+m.name+"-worst")
	}
}

// stableLeader waits until the fleet has one voter per region, a leader
// every running controller agrees on, and a write commits; it returns the
// leader's replica.
func stableLeader(ctx context.Context, b *testing.B, f *Fleet) *Replica {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		if time.Now().After(deadline) {
			b.Fatalf("no stable cluster within 2 minutes: voters %v", f.Voters())
		}
		v := f.Voters()
		ok := len(v) == 3
		for _, ids := range v {
			ok = ok && len(ids) == 1
		}
		leader := leaderReplica(f)
		if !ok || leader == nil || !agreeOnLeader(f, leader.ID) {
			continue
		}
		c := leader.Controller()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.Global().Recover(wctx, leader.Region, "bench: stable", global.WriteOptions{})
		cancel()
		if err == nil && leaderReplica(f) == leader {
			return leader
		}
	}
}

// agreeOnLeader reports whether every running controller knows id as the
// leader.
func agreeOnLeader(f *Fleet, id string) bool {
	for _, c := range f.Controllers() {
		if c.Global().Leader() != id {
			return false
		}
	}
	return true
}

// waitNewLeader waits until every running controller knows the same
// leader other than old, and returns the time since kill.
func waitNewLeader(b *testing.B, f *Fleet, old string, kill time.Time) time.Duration {
	b.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		if l := leaderReplica(f); l != nil && l.ID != old && agreeOnLeader(f, l.ID) {
			return time.Since(kill)
		}
		if time.Since(kill) > time.Minute {
			for _, c := range f.Controllers() {
				h := c.Global().Health()
				b.Logf("%s: leader %q state %s term %d", c.ID(), h.Leader, h.RaftState, h.Term)
			}
			b.Logf("voters %v", f.Voters())
			b.Fatal("no new leader within a minute")
		}
	}
}
