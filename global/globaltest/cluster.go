package globaltest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
)

// TestTiming is Raft timing for loopback tests: a lost leader is replaced in
// about a second, yet elections settle on a loaded 2-core machine under the
// race detector.
func TestTiming() global.Timing {
	t := global.LANTiming()
	t.HeartbeatTimeout = 500 * time.Millisecond
	t.ElectionTimeout = 500 * time.Millisecond
	t.LeaderLeaseTimeout = 250 * time.Millisecond
	t.CommitTimeout = 10 * time.Millisecond
	return t
}

// Options configure a test cluster.
type Options struct {
	// Voters is Config.Voters (default: 3, or 1 for a single node).
	Voters int
	// WantVoters is the number of voters NewCluster waits for (default:
	// min(Voters, n)). The leader keeps an odd number of voters: a cluster
	// where that is fewer states it here.
	WantVoters int
	// VotersPerRegion is Config.VotersPerRegion (default: Voters, so that
	// the default regions, region-<i mod 3>, hold as many voters as the
	// cluster wants).
	VotersPerRegion int
	// Region names node i's region (default: "region-<i mod 3>").
	Region func(i int) string
	// Configure, if set, adjusts each node's Config before it opens.
	Configure func(i int, cfg *global.Config)
	// Token is the admin token (default "test-token").
	Token string
	// OwnTransport makes the nodes use their own Raft TCP (or TLS, see
	// Configure) transport instead of the partitionable Network; partitions
	// then apply to the admin API only.
	OwnTransport bool
}

// Cluster is a set of global nodes on loopback in this process.
type Cluster struct {
	T     testing.TB
	Net   *Network
	Token string
	Nodes []*Node
	opts  Options
}

// Node is one member of a test cluster; Node is nil while it is stopped.
type Node struct {
	Index     int
	Name      string
	Region    string
	Dir       string
	RaftAddr  string
	AdminAddr string // host:port of the admin API
	Node      *global.Node
	// Client talks to this node's admin API directly (not through Network,
	// so partitions do not affect the test's own calls).
	Client *global.Client

	mu     sync.Mutex
	srv    *http.Server
	srvErr chan error
	httpc  *http.Client
}

// URL is the node's admin base URL.
func (n *Node) URL() string { return "http://" + n.AdminAddr }

// NewCluster starts n nodes: node 0 bootstraps, the others join through it.
// It waits until every node is in the Raft configuration and the voter
// target is met. Cleanup closes everything.
func NewCluster(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if opts.Token == "" {
		opts.Token = "test-token"
	}
	if opts.Voters == 0 {
		opts.Voters = 3
		if n == 1 {
			opts.Voters = 1
		}
	}
	if opts.Region == nil {
		opts.Region = func(i int) string { return fmt.Sprintf("region-%d", i%3) }
	}
	c := &Cluster{T: t, Net: NewNetwork(), Token: opts.Token, opts: opts}
	base := t.TempDir() // before Cleanup(c.Close): cleanups run last-in first-out
	t.Cleanup(c.Close)
	for i := 0; i < n; i++ {
		c.Nodes = append(c.Nodes, &Node{
			Index:  i,
			Name:   fmt.Sprintf("node-%d", i),
			Region: opts.Region(i),
			Dir:    filepath.Join(base, fmt.Sprintf("node-%d", i)),
		})
	}
	for i := range c.Nodes {
		if err := c.Start(i); err != nil {
			t.Fatalf("start node %d: %v", i, err)
		}
		if i == 0 {
			if _, err := c.WaitLeader(10 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := opts.WantVoters
	if want == 0 {
		want = min(opts.Voters, n)
	}
	c.WaitFor(20*time.Second, fmt.Sprintf("every node in the raft configuration with %d voters", want), func() bool {
		return c.configured(n, want)
	})
	c.WaitFor(10*time.Second, "every node to know every member", func() bool {
		for _, nd := range c.Nodes {
			if len(nd.Node.State().Members()) != n {
				return false
			}
		}
		return true
	})
	return c
}

func (c *Cluster) configured(n, want int) bool {
	l, err := c.Leader()
	if err != nil {
		return false
	}
	servers, err := c.Nodes[l].Node.Servers()
	if err != nil || len(servers) != n {
		return false
	}
	v := 0
	for _, s := range servers {
		if s.Suffrage == "voter" {
			v++
		}
	}
	return v == want
}

// Logger returns the logger for test nodes: discarded unless
// MERIDIAN_TEST_LOG is set.
func Logger(t testing.TB, name string) *slog.Logger {
	if os.Getenv("MERIDIAN_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name(), "n", name)
}

// Config returns the Config node i opens with.
func (c *Cluster) Config(i int) global.Config {
	nd := c.Nodes[i]
	cfg := global.DefaultConfig()
	cfg.NodeID = nd.Name
	cfg.Region = nd.Region
	cfg.DataDir = nd.Dir
	cfg.AdminAddr = nd.URL()
	cfg.AdminToken = c.Token
	cfg.Voters = c.opts.Voters
	cfg.VotersPerRegion = c.opts.VotersPerRegion
	if cfg.VotersPerRegion == 0 {
		cfg.VotersPerRegion = c.opts.Voters
	}
	cfg.Timing = TestTiming()
	cfg.HoldTimeout = 3 * time.Second
	cfg.MaxStale = 1200 * time.Millisecond
	cfg.ReconcileInterval = 50 * time.Millisecond
	cfg.WALSegmentSize = 1 << 20
	cfg.Logger = Logger(c.T, nd.Name)
	if i == 0 {
		cfg.Bootstrap = true
	} else {
		cfg.Join = []string{c.Nodes[0].URL()}
	}
	if c.opts.Configure != nil {
		c.opts.Configure(i, &cfg)
	}
	return cfg
}

// Start opens node i (again, on the same data directory and ports, after a
// Stop) and serves its admin API.
func (c *Cluster) Start(i int) error {
	nd := c.Nodes[i]
	raftAddr, adminAddr := nd.RaftAddr, nd.AdminAddr
	if raftAddr == "" {
		raftAddr = "127.0.0.1:0"
	}
	if adminAddr == "" {
		adminAddr = "127.0.0.1:0"
	}
	adminLn, err := c.Net.Listen(nd.Name, adminAddr)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	nd.AdminAddr = adminLn.Addr().String()
	nd.httpc = c.Net.HTTPClient(nd.Name)
	cfg := c.Config(i)
	cfg.HTTPClient = nd.httpc
	var raftLn net.Listener
	if c.opts.OwnTransport {
		cfg.RaftBind = raftAddr
	} else {
		raftLn, err = c.Net.Listen(nd.Name, raftAddr)
		if err != nil {
			adminLn.Close()
			return fmt.Errorf("raft listener: %w", err)
		}
		cfg.StreamLayer = c.Net.StreamLayer(nd.Name, raftLn)
	}
	n, err := global.Open(context.Background(), cfg)
	if err != nil {
		if raftLn != nil {
			raftLn.Close()
		}
		adminLn.Close()
		return err
	}
	nd.RaftAddr = n.RaftAddr()
	srv := &http.Server{Handler: n.Handler(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(adminLn) }()
	nd.mu.Lock()
	nd.Node, nd.srv, nd.srvErr = n, srv, done
	nd.mu.Unlock()
	nd.Client = global.NewClient(nd.URL(), c.Token, nil)
	return nil
}

// Kill crashes node i as far as the others can tell: it vanishes from the
// network first (no goodbye, no leadership transfer), then closes. Start
// brings it back.
func (c *Cluster) Kill(i int) {
	c.Net.Isolate(c.Nodes[i].Name)
	c.Stop(i)
	c.Net.Reconnect(c.Nodes[i].Name)
}

// Stop closes node i gracefully (a leader hands leadership over first) and
// its admin server.
func (c *Cluster) Stop(i int) {
	nd := c.Nodes[i]
	nd.mu.Lock()
	n, srv, done := nd.Node, nd.srv, nd.srvErr
	nd.Node, nd.srv = nil, nil
	nd.mu.Unlock()
	if n == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
	<-done
	if err := n.Close(ctx); err != nil {
		var dump strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&dump, 2)
		c.T.Errorf("close %s: %v\ngoroutines:\n%s", nd.Name, err, dump.String())
	}
	nd.httpc.CloseIdleConnections()
}

// Close stops every node.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Add(1)
		go func() { defer wg.Done(); c.Stop(i) }()
	}
	wg.Wait()
	http.DefaultClient.CloseIdleConnections()
}

// Running returns the indexes of the running nodes.
func (c *Cluster) Running() []int {
	var out []int
	for i, nd := range c.Nodes {
		nd.mu.Lock()
		if nd.Node != nil {
			out = append(out, i)
		}
		nd.mu.Unlock()
	}
	return out
}

// Leader returns the index of the running node that leads, if exactly one
// does.
func (c *Cluster) Leader() (int, error) {
	leader := -1
	for _, i := range c.Running() {
		if c.Nodes[i].Node.IsLeader() {
			if leader >= 0 {
				return -1, fmt.Errorf("two leaders: %s and %s", c.Nodes[leader].Name, c.Nodes[i].Name)
			}
			leader = i
		}
	}
	if leader < 0 {
		return -1, errors.New("no leader")
	}
	return leader, nil
}

// WaitLeader waits until exactly one running node leads among nodes (all
// running nodes if none are given) and every one of them agrees on it.
func (c *Cluster) WaitLeader(timeout time.Duration, among ...int) (int, error) {
	if len(among) == 0 {
		among = c.Running()
	}
	deadline := time.Now().Add(timeout)
	for {
		if l, ok := c.agreedLeader(among); ok {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("no agreed leader among %v within %v", among, timeout)
		}
		c.waitChange(among, 50*time.Millisecond)
	}
}

func (c *Cluster) agreedLeader(among []int) (int, bool) {
	leader := -1
	for _, i := range among {
		n := c.Nodes[i].Node
		if n == nil {
			return -1, false
		}
		if n.IsLeader() {
			if leader >= 0 {
				return -1, false
			}
			leader = i
		}
	}
	if leader < 0 {
		return -1, false
	}
	for _, i := range among {
		if c.Nodes[i].Node.Leader() != c.Nodes[leader].Name {
			return -1, false
		}
	}
	return leader, true
}

// waitChange blocks until a leader change on one of the nodes or at most d.
func (c *Cluster) waitChange(among []int, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	cases := make([]<-chan struct{}, 0, len(among))
	for _, i := range among {
		if n := c.Nodes[i].Node; n != nil {
			cases = append(cases, n.LeaderChanged())
		}
	}
	merged := make(chan struct{})
	stop := make(chan struct{})
	defer close(stop)
	for _, ch := range cases {
		go func() {
			select {
			case <-ch:
				select {
				case merged <- struct{}{}:
				case <-stop:
				}
			case <-stop:
			}
		}()
	}
	select {
	case <-merged:
	case <-t.C:
	}
}

// WaitFor polls cond (every 10ms, a bounded loop) until it holds, failing the
// test after timeout.
func (c *Cluster) WaitFor(timeout time.Duration, what string, cond func() bool) {
	c.T.Helper()
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			c.T.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-t.C
	}
}

// Names returns the names of the nodes with the given indexes.
func (c *Cluster) Names(idx ...int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = c.Nodes[i].Name
	}
	return out
}

// Converged reports whether every running node (or those given) has the same
// state index as the first.
func (c *Cluster) Converged(among ...int) bool {
	if len(among) == 0 {
		among = c.Running()
	}
	var idx uint64
	for k, i := range among {
		n := c.Nodes[i].Node
		if n == nil {
			return false
		}
		if k == 0 {
			idx = n.State().Index()
		} else if n.State().Index() != idx {
			return false
		}
	}
	return true
}
