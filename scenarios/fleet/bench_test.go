package fleet

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"
)

// BenchmarkLeaderReplicaFailover measures how long a fleet of 3 regions x
// 2 replicas takes to elect a new Raft leader after the replica that leads
// is killed (a crash: no leadership transfer), from the kill until every
// running controller knows the same new leader, with hashicorp/raft's LAN
// timing (1 s heartbeat and election timeouts; the tests' fleets use 2 s).
// Each iteration kills the leader and starts it again.
//
//	go test ./scenarios/fleet -run '^$' -bench LeaderReplicaFailover -benchtime 5x
func BenchmarkLeaderReplicaFailover(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg := Config{Replicas: 2, ElectionTimeout: time.Second, Dir: b.TempDir()}
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
	var total, worst time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		leader := leaderReplica(f)
		if leader == nil {
			b.Fatal("no leader")
		}
		kill := time.Now()
		if err := leader.Kill(); err != nil {
			b.Fatal(err)
		}
		var took time.Duration
		for took == 0 {
			agreed, id := true, ""
			for _, c := range f.Controllers() {
				l := c.Global().Leader()
				if l == "" || l == leader.ID || (id != "" && l != id) {
					agreed = false
					break
				}
				id = l
			}
			if agreed {
				took = time.Since(kill)
			} else if time.Since(kill) > time.Minute {
				for _, c := range f.Controllers() {
					h := c.Global().Health()
					b.Logf("%s: leader %q state %s term %d", c.ID(), h.Leader, h.RaftState, h.Term)
				}
				b.Logf("voters %v", f.Voters())
				b.Fatal("no new leader within a minute")
			} else {
				time.Sleep(5 * time.Millisecond)
			}
		}
		total += took
		worst = max(worst, took)
		if err := leader.Start(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/failover")
	b.ReportMetric(worst.Seconds(), "worst-s")
}
