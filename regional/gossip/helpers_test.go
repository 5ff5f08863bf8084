package gossip

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
	"github.com/meridian-llm/meridian/regional/summary"
)

func newKey(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("GOSSIP_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testConfig is a fast LAN-speed pool on loopback with ephemeral ports.
func testConfig(t testing.TB, name, region, key string) Config {
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Region = name, region
	cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
	cfg.Keys = []string{key}
	cfg.ForwardAddr = "https://" + name + ".example:8443"
	cfg.ProbeInterval = 200 * time.Millisecond
	cfg.ProbeTimeout = 150 * time.Millisecond
	cfg.GossipInterval = 20 * time.Millisecond
	cfg.PushPullInterval = time.Minute // the pull path must do the work
	cfg.TCPTimeout = 2 * time.Second
	cfg.SuspicionMult = 6 // >= 1.2s of suspicion: a loaded CI machine must not kill nodes
	cfg.GossipToTheDeadTime = 10 * time.Second
	cfg.DeadNodeReclaimTime = 50 * time.Millisecond
	cfg.SyncInterval = 25 * time.Millisecond
	cfg.PullRetry = 300 * time.Millisecond
	cfg.UpdateTimeout = 200 * time.Millisecond
	cfg.LeaveTimeout = 200 * time.Millisecond
	cfg.RetryJoinInterval = 200 * time.Millisecond
	cfg.SuspectAfterProbes = 10
	cfg.Logger = testLogger(t)
	cfg.Registerer = prometheus.NewRegistry()
	return cfg
}

func open(t testing.TB, cfg Config) *Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", cfg.NodeName, err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func hashesFor(region string, n int) []uint64 {
	hs := make([]uint64, n)
	seed := uint64(len(region)) * 0x9e3779b97f4a7c15
	for _, c := range region {
		seed = seed*31 + uint64(c)
	}
	for i := range hs {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		hs[i] = seed | 1
	}
	return hs
}

func buildSummary(t testing.TB, region string, gen uint64, blocks int) *summary.Summary {
	t.Helper()
	return buildSummaryModels(t, region, gen, blocks)
}

func buildSummaryModels(t testing.TB, region string, gen uint64, blocks int, models ...string) *summary.Summary {
	t.Helper()
	s, err := summary.Build(summary.Input{
		Region: region, Generation: gen, BuiltAt: time.Now(), BlockSize: 64, Models: models,
		Load: []summary.ProfileLoad{{Profile: "h100", Pods: 2, PendingPrefillTokens: 4000, Running: 3, Slots: 512, FreeKVBlocks: 1000}},
	}, hashesFor(region, blocks), summary.BuildConfig{MaxBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitFor polls cond until it holds or the deadline passes (memberlist runs
// on real time; this is a bounded wait on a condition, not a sleep).
func waitFor(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, %s: %v", within, what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holds checks that n's view has region's summary at generation gen.
func holds(n *Node, region string, gen uint64) error {
	r, ok := n.View().Region(region)
	switch {
	case !ok:
		return fmt.Errorf("%s does not know region %s (knows %v)", n.cfg.NodeName, region, n.View().names())
	case r.Summary == nil:
		return fmt.Errorf("%s has no summary of %s", n.cfg.NodeName, region)
	case r.Summary.Generation != gen:
		return fmt.Errorf("%s holds %s at generation %d, want %d", n.cfg.NodeName, region, r.Summary.Generation, gen)
	}
	return nil
}

func counter(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// latencyWrap returns the WrapTransport of a node in region self, delaying
// each packet to a peer by half the RTT between their regions.
func latencyWrap(self string, regionOf map[string]string, rtt func(a, b string) time.Duration) func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
	return func(inner memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		return gossiptest.NewDelayTransport(inner, func(to memberlist.Address) time.Duration {
			r, ok := regionOf[to.Name]
			if !ok {
				return 0
			}
			return rtt(self, r) / 2
		})
	}
}

// names returns the sorted names of the remote regions in the view.
func (v *RegionsView) names() []string {
	out := make([]string, 0, len(v.Regions))
	for _, r := range v.Regions {
		out = append(out, r.Region)
	}
	slices.Sort(out)
	return out
}
