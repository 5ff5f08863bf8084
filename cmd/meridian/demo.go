package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/scenarios/demo"
)

// Exit status of "demo" when the run broke an invariant (a request served
// outside its allowed regions, or an audit log that does not verify).
const demoInvariantBroken = exitVerification

// demoCommand is `meridian demo`: a whole multi-region system on loopback,
// with traffic, a failover and a live table.
func demoCommand() *cli.Command {
	d := demo.DefaultConfig()
	return &cli.Command{
		Name:  "demo",
		Usage: "run 3 regions on loopback (broker, simulated pods, Raft, gossip, audit) with live traffic and a failover",
		Description: "Starts us-east-1, us-west-2 and eu-west-1 in this process, each with --replicas controllers behind\n" +
			"a load balancer, sends multi-turn sessions from every region (an EU health tenant's PHI entering in\n" +
			"the US, public EU traffic, embargoed tenants), shows a live table and a status page, kills one\n" +
			"controller replica and starts it again, fails a region over and recovers it, then verifies the\n" +
			"audit logs of every replica against the Raft checkpoints and prints where to look next. State is\n" +
			"kept in --dir.\n" +
			"Exit status: 0; 1 on error or when a request failed unexpectedly; 2 on a usage error; 3 when a\n" +
			"request was served outside the regions the residency policy allows or the audit logs do not verify.",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "duration", Value: d.Duration, Usage: "how long to run; 0 = until interrupted (default 0 with --no-traffic)"},
			&cli.DurationFlag{Name: "failover-after", Value: d.FailoverAfter, Usage: "fail a region over this long after start; negative = no failover (default: fits in --duration)"},
			&cli.DurationFlag{Name: "failover-for", Value: d.FailoverFor, Usage: "recover the region this long after the failover"},
			&cli.StringFlag{Name: "failover-region", Value: d.FailoverRegion, Usage: "the region to fail over: us-east-1, us-west-2 or eu-west-1"},
			&cli.BoolFlag{Name: "no-traffic", Usage: "start the system, print one region=URL line per controller and wait: send your own traffic"},
			&cli.BoolFlag{Name: "json", Usage: "print only one JSON object at the end (the live table goes to stderr)"},
			&cli.StringFlag{Name: "status-addr", Value: d.StatusAddr, Usage: "status page address (another port if taken; empty = none)"},
			&cli.IntFlag{Name: "sessions", Value: d.Sessions, Usage: "concurrent client sessions"},
			&cli.IntFlag{Name: "pods-per-region", Value: d.PodsPerRegion, Usage: "simulated pods per region"},
			&cli.IntFlag{Name: "replicas", Value: d.Replicas, Usage: "controllers per region (replicas), behind the traffic's load balancer"},
			&cli.DurationFlag{Name: "replica-kill-after", Value: d.ReplicaKillAfter, Usage: "kill one replica abruptly this long after start; negative = none (default: before the failover, fitted into --duration)"},
			&cli.DurationFlag{Name: "replica-down-for", Value: d.ReplicaDownFor, Usage: "start the killed replica again this long after the kill"},
			&cli.IntFlag{Name: "cache-blocks", Value: d.CacheBlocks, Usage: "KV-cache capacity of each pod in 16-token blocks"},
			&cli.Float64Flag{Name: "time-scale", Value: d.TimeScale, Usage: "multiply the pods' modelled prefill and decode times"},
			&cli.DurationFlag{Name: "refresh", Value: d.Refresh, Usage: "live table refresh period on a terminal"},
			&cli.StringFlag{Name: "dir", Usage: "empty or new directory for Raft data, audit logs and logs (default: a new temporary directory, kept)"},
			&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seed of the traffic"},
		},
		Action: runDemo,
	}
}

func runDemo(c *cli.Context) error {
	cfg := demo.DefaultConfig()
	cfg.Duration = c.Duration("duration")
	cfg.FailoverAfter = c.Duration("failover-after")
	cfg.FailoverFor = c.Duration("failover-for")
	cfg.FailoverRegion = c.String("failover-region")
	cfg.NoTraffic = c.Bool("no-traffic")
	cfg.JSON = c.Bool("json")
	cfg.StatusAddr = c.String("status-addr")
	cfg.Sessions = c.Int("sessions")
	cfg.PodsPerRegion = c.Int("pods-per-region")
	cfg.Replicas = c.Int("replicas")
	cfg.ReplicaKillAfter = c.Duration("replica-kill-after")
	cfg.ReplicaDownFor = c.Duration("replica-down-for")
	cfg.CacheBlocks = c.Int("cache-blocks")
	cfg.TimeScale = c.Float64("time-scale")
	cfg.Refresh = c.Duration("refresh")
	cfg.Dir = c.String("dir")
	cfg.Seed = c.Uint64("seed")
	if cfg.NoTraffic && !c.IsSet("duration") {
		cfg.Duration = 0
	}
	fitFailover(&cfg, c.IsSet("failover-after"), c.IsSet("failover-for"))
	fitReplicaKill(&cfg, c.IsSet("replica-kill-after"), c.IsSet("replica-down-for"))
	if err := cfg.Validate(); err != nil {
		return usageError("demo: %w", err)
	}
	out, errw := c.App.Writer, c.App.ErrWriter
	cfg.Info = errw
	table := out
	if cfg.JSON {
		table = errw
	}
	cfg.Terminal = isTerminal(table)

	res, err := demo.Run(c.Context, cfg, out)
	if err != nil {
		return err
	}
	return demoOutcome(res)
}

// demoOutcome is the exit status of a finished run: 3 for a broken
// invariant, 1 when a request failed unexpectedly, else 0.
func demoOutcome(res demo.Result) error {
	if res.ResidencyViolations > 0 || !res.AuditVerified {
		return &exitError{code: demoInvariantBroken, err: fmt.Errorf("demo: %d residency violations, audit verified %v", res.ResidencyViolations, res.AuditVerified)}
	}
	if res.Errors > 0 {
		// The summary names each one; a run that reported an unexpected
		// error is not a clean run.
		return fmt.Errorf("demo: %d requests failed unexpectedly (see the summary)", res.Errors)
	}
	return nil
}

// fitFailover moves a default failover into a shorter --duration: the
// failover then starts near the middle and the recovery ends before the run.
func fitFailover(cfg *demo.Config, afterSet, forSet bool) {
	d := cfg.Duration
	if d <= 0 || afterSet || cfg.FailoverAfter < 0 || cfg.FailoverAfter+cfg.FailoverFor < d {
		return
	}
	if !forSet {
		cfg.FailoverFor = min(cfg.FailoverFor, d/4)
	}
	cfg.FailoverAfter = max(0, (d-cfg.FailoverFor)/2).Truncate(100 * time.Millisecond)
}

// fitReplicaKill moves a default replica kill into a shorter --duration:
// unless it ends (with 5 s to spare) before the failover and the end of the
// run, the kill comes after a fifth of the run and the replica is started
// again at most a sixth of it later.
func fitReplicaKill(cfg *demo.Config, afterSet, forSet bool) {
	d := cfg.Duration
	limit := d
	if cfg.FailoverAfter >= 0 {
		limit = min(limit, cfg.FailoverAfter)
	}
	if d <= 0 || afterSet || cfg.ReplicaKillAfter < 0 || cfg.ReplicaKillAfter+cfg.ReplicaDownFor+5*time.Second <= limit {
		return
	}
	if !forSet {
		cfg.ReplicaDownFor = min(cfg.ReplicaDownFor, d/6).Truncate(100 * time.Millisecond)
	}
	cfg.ReplicaKillAfter = (d / 5).Truncate(100 * time.Millisecond)
}

// isTerminal reports whether w is a terminal that understands ANSI escapes.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
