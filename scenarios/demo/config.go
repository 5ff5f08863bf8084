package demo

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"time"

	"github.com/meridian-llm/meridian/scenarios/sim"
)

// regionNames are the demo's regions, in display order.
var regionNames = sim.DefaultRegions()

// Config configures a demo run. Zero values are not defaults: start from
// DefaultConfig.
type Config struct {
	// Duration of the run; 0 runs until ctx is done. Default 90s: the
	// failover and the recovery fit in it.
	Duration time.Duration
	// FailoverAfter is when the failover is triggered, from the moment the
	// system is ready; negative: no failover. Default 60s.
	FailoverAfter time.Duration
	// FailoverFor is how long the region stays failed before it is
	// recovered. Default 15s.
	FailoverFor time.Duration
	// FailoverRegion is the region failed over; default "us-west-2".
	FailoverRegion string
	// NoTraffic starts the system, writes one "region=URL" line per
	// controller to the output and waits (for Duration, or until ctx is
	// done) while the user sends traffic.
	NoTraffic bool
	// JSON writes one JSON object (Result) to the output at the end, and
	// nothing else; the live table then goes to Info.
	JSON bool
	// StatusAddr is the status page's listen address; default
	// "127.0.0.1:7700"; if that address is taken an ephemeral port is used.
	// Empty: no status page.
	StatusAddr string
	// Sessions is the number of concurrent client sessions; default 32.
	Sessions int
	// PodsPerRegion is the number of engine simulators per region;
	// default 3.
	PodsPerRegion int
	// Replicas is the number of controllers per region, behind the
	// traffic generator's load balancer; default 2.
	Replicas int
	// ReplicaKillAfter is when one controller (the last replica of
	// ReplicaKillRegion) is killed abruptly, from the moment the system is
	// ready; negative: none (also with one replica). Default 40s: the
	// caches are warm, and the replica is back before the failover.
	ReplicaKillAfter time.Duration
	// ReplicaDownFor is how long the killed replica stays down before it is
	// started again (it is ready once its index caught up). Default 10s.
	ReplicaDownFor time.Duration
	// ReplicaKillRegion is the region whose replica is killed; default
	// "us-east-1".
	ReplicaKillRegion string
	// CacheBlocks is each pod's KV-cache capacity in 16-token blocks;
	// default 6144 (98,304 tokens): small enough that LRU eviction happens
	// in a long run.
	CacheBlocks int
	// TimeScale multiplies the engines' modelled durations (prefill, decode);
	// default 0.25: a 2,000-token miss costs ~200 ms instead of ~800 ms, and
	// the controllers' calibrated prefill rate (0.09 ms/token on H100) stays
	// inside gorgo's calibration band (0.25x to 4x of the profile's rate).
	TimeScale float64
	// Refresh is the live table's period on a terminal; plain output is
	// written at most every 5 s. Default 1s.
	Refresh time.Duration
	// Terminal redraws the table in place with ANSI escapes (the command
	// sets it when the table's writer is a terminal).
	Terminal bool
	// Dir holds the Raft data, the audit logs, the checkpoints exported at
	// the end and the log; it is kept after the run. Default: a new
	// directory under os.TempDir().
	Dir string
	// Seed makes the traffic (texts, tenants, think times) reproducible;
	// default 1.
	Seed uint64
	// Info receives what a person needs but a program reading the output
	// does not: the table in JSON mode, the admin URLs and token in
	// no-traffic mode. Nil discards it.
	Info io.Writer
	// Logger receives the controllers' and engines' logs; nil writes them
	// to Dir/demo.log.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Duration:          90 * time.Second,
		FailoverAfter:     60 * time.Second,
		FailoverFor:       15 * time.Second,
		FailoverRegion:    "us-west-2",
		StatusAddr:        "127.0.0.1:7700",
		Sessions:          32,
		PodsPerRegion:     3,
		Replicas:          2,
		ReplicaKillAfter:  40 * time.Second,
		ReplicaDownFor:    10 * time.Second,
		ReplicaKillRegion: "us-east-1",
		CacheBlocks:       6144,
		TimeScale:         0.25,
		Refresh:           time.Second,
		Seed:              1,
	}
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Duration < 0:
		return fmt.Errorf("demo config: Duration %v: want >= 0 (0 runs until interrupted)", c.Duration)
	case c.FailoverAfter >= 0 && c.FailoverFor <= 0:
		return fmt.Errorf("demo config: FailoverFor %v: want > 0", c.FailoverFor)
	case c.FailoverAfter >= 0 && !slices.Contains(regionNames, c.FailoverRegion):
		return fmt.Errorf("demo config: FailoverRegion %q: want one of %v", c.FailoverRegion, regionNames)
	case c.Duration > 0 && c.FailoverAfter >= 0 && !c.NoTraffic && c.FailoverAfter+c.FailoverFor >= c.Duration:
		return fmt.Errorf("demo config: FailoverAfter %v + FailoverFor %v: the failover and its recovery must end before Duration %v",
			c.FailoverAfter, c.FailoverFor, c.Duration)
	case c.Sessions < 1 || c.Sessions > 1000:
		return fmt.Errorf("demo config: Sessions %d: want 1..1000", c.Sessions)
	case c.PodsPerRegion < 1 || c.PodsPerRegion > 16:
		return fmt.Errorf("demo config: PodsPerRegion %d: want 1..16", c.PodsPerRegion)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("demo config: Replicas %d: want 1..5", c.Replicas)
	case c.killsReplica() && c.ReplicaDownFor <= 0:
		return fmt.Errorf("demo config: ReplicaDownFor %v: want > 0", c.ReplicaDownFor)
	case c.killsReplica() && !slices.Contains(regionNames, c.ReplicaKillRegion):
		return fmt.Errorf("demo config: ReplicaKillRegion %q: want one of %v", c.ReplicaKillRegion, regionNames)
	case c.killsReplica() && c.Duration > 0 && !c.NoTraffic && c.ReplicaKillAfter+c.ReplicaDownFor >= c.Duration:
		return fmt.Errorf("demo config: ReplicaKillAfter %v + ReplicaDownFor %v: the replica must be started again before Duration %v",
			c.ReplicaKillAfter, c.ReplicaDownFor, c.Duration)
	case c.CacheBlocks < 64:
		return fmt.Errorf("demo config: CacheBlocks %d: want >= 64", c.CacheBlocks)
	case c.TimeScale <= 0 || c.TimeScale > 10:
		return fmt.Errorf("demo config: TimeScale %v: want > 0 and <= 10", c.TimeScale)
	case c.Refresh < 50*time.Millisecond:
		return fmt.Errorf("demo config: Refresh %v: want >= 50ms", c.Refresh)
	}
	if c.StatusAddr != "" {
		if _, _, err := net.SplitHostPort(c.StatusAddr); err != nil {
			return fmt.Errorf("demo config: StatusAddr %q: %w", c.StatusAddr, err)
		}
	}
	if c.Dir != "" {
		if st, err := os.Stat(c.Dir); err == nil && !st.IsDir() {
			return fmt.Errorf("demo config: Dir %q: not a directory", c.Dir)
		}
		if ents, err := os.ReadDir(c.Dir); err == nil && len(ents) > 0 {
			return fmt.Errorf("demo config: Dir %q: not empty (a run needs fresh Raft and audit directories)", c.Dir)
		}
	}
	return nil
}

// killsReplica reports whether the run kills (and restarts) a replica.
func (c Config) killsReplica() bool { return c.ReplicaKillAfter >= 0 && c.Replicas > 1 && !c.NoTraffic }
