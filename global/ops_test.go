package global_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

func TestConfigValidate(t *testing.T) {
	good := func() global.Config {
		c := global.DefaultConfig()
		c.NodeID, c.Region, c.DataDir = "ctrl-a", "eu-west-1", t.TempDir()
		c.AdminAddr, c.AdminToken = "http://127.0.0.1:8081", "secret"
		return c
	}
	base := good()
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*global.Config){
		"NodeID":                        func(c *global.Config) { c.NodeID = "" },
		"Region":                        func(c *global.Config) { c.Region = "EU" },
		"DataDir":                       func(c *global.Config) { c.DataDir = "" },
		"RaftBind":                      func(c *global.Config) { c.RaftBind = "" },
		`AdminAddr "10.0.0.1:8081"`:     func(c *global.Config) { c.AdminAddr = "10.0.0.1:8081" },
		"AdminToken":                    func(c *global.Config) { c.AdminToken = "" },
		`Join[0] "ctrl-b"`:              func(c *global.Config) { c.Join = []string{"ctrl-b"} },
		"Bootstrap and Join":            func(c *global.Config) { c.Bootstrap, c.Join = true, []string{"http://x:1"} },
		"Voters = 4":                    func(c *global.Config) { c.Voters = 4 },
		"VotersPerRegion = 0":           func(c *global.Config) { c.VotersPerRegion = 0 },
		"VoterDownAfter":                func(c *global.Config) { c.VoterDownAfter = 0 },
		"RemoveDownAfter":               func(c *global.Config) { c.RemoveDownAfter = time.Second },
		"Timing.HeartbeatTimeout":       func(c *global.Config) { c.Timing.HeartbeatTimeout = time.Millisecond },
		"Timing.ElectionTimeout":        func(c *global.Config) { c.Timing.ElectionTimeout = time.Millisecond * 500 },
		"Timing.LeaderLeaseTimeout":     func(c *global.Config) { c.Timing.LeaderLeaseTimeout = 2 * time.Second },
		"Timing.CommitTimeout":          func(c *global.Config) { c.Timing.CommitTimeout = 0 },
		"Timing.SnapshotInterval":       func(c *global.Config) { c.Timing.SnapshotInterval = 0 },
		"Timing.SnapshotThreshold":      func(c *global.Config) { c.Timing.SnapshotThreshold = 0 },
		"HoldTimeout":                   func(c *global.Config) { c.HoldTimeout = 0 },
		"MaxStale":                      func(c *global.Config) { c.MaxStale = -1 },
		"ReconcileInterval":             func(c *global.Config) { c.ReconcileInterval = 0 },
		"SnapshotRetain":                func(c *global.Config) { c.SnapshotRetain = 0 },
		"WALSegmentSize":                func(c *global.Config) { c.WALSegmentSize = 1 },
		"Timing.HeartbeatTimeout = 1ms": func(c *global.Config) { c.Timing = global.Timing{HeartbeatTimeout: time.Millisecond} },
		`RaftBind "0.0.0.0:7400" is not a loopback address and TLS is not set`:  func(c *global.Config) { c.RaftBind = "0.0.0.0:7400" },
		`RaftBind ":7400" is not a loopback address`:                            func(c *global.Config) { c.RaftBind = ":7400" },
		`RaftBind "7400": want host:port`:                                       func(c *global.Config) { c.RaftBind = "7400" },
		`AdminAddr "http://10.0.0.5:8081" is plain http to a non-loopback host`: func(c *global.Config) { c.AdminAddr = "http://10.0.0.5:8081" },
		`Join[0] "http://ctl-b:8081" is plain http`:                             func(c *global.Config) { c.Join = []string{"http://ctl-b:8081"} },
		"https admin URLs need AdminTLS":                                        func(c *global.Config) { c.AdminAddr = "https://10.0.0.5:8081" },
		"TLS has no ClientCAs": func(c *global.Config) {
			c.TLS = &tls.Config{Certificates: []tls.Certificate{{}}, RootCAs: x509.NewCertPool()}
		},
		"TLS has no certificate": func(c *global.Config) {
			c.TLS = &tls.Config{ClientCAs: x509.NewCertPool(), RootCAs: x509.NewCertPool()}
		},
		"TLS presents no client certificate": func(c *global.Config) {
			c.TLS = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, nil }, ClientCAs: x509.NewCertPool(), RootCAs: x509.NewCertPool()}
		},
		"TLSClient has no RootCAs": func(c *global.Config) {
			c.TLS = &tls.Config{Certificates: []tls.Certificate{{}}, ClientCAs: x509.NewCertPool()}
			c.TLSClient = &tls.Config{Certificates: []tls.Certificate{{}}}
		},
		"TLSClient skips server verification": func(c *global.Config) {
			c.TLS = &tls.Config{Certificates: []tls.Certificate{{}}, ClientCAs: x509.NewCertPool()}
			c.TLSClient = &tls.Config{Certificates: []tls.Certificate{{}}, InsecureSkipVerify: true}
		},
		"TLSClient is set but TLS is not": func(c *global.Config) { c.TLSClient = &tls.Config{} },
	}
	for want, mut := range cases {
		c := good()
		mut(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
	w := global.WANTiming()
	if w.HeartbeatTimeout != 1500*time.Millisecond || w.ElectionTimeout != 1500*time.Millisecond || w.LeaderLeaseTimeout != 1500*time.Millisecond {
		t.Fatalf("WAN preset %+v", w)
	}
	c := good()
	c.Timing = w
	if err := c.Validate(); err != nil {
		t.Fatalf("WAN preset invalid: %v", err)
	}
	// Insecure allows plain Raft and http admin URLs off loopback; TLS
	// allows the Raft bind; "localhost" is loopback.
	for name, mut := range map[string]func(*global.Config){
		"insecure": func(c *global.Config) {
			c.Insecure, c.RaftBind, c.AdminAddr, c.Join = true, "0.0.0.0:7400", "http://10.0.0.5:8081", []string{"http://ctl-b:8081"}
		},
		"tls": func(c *global.Config) {
			c.RaftBind = "10.0.0.5:7400"
			c.TLS = &tls.Config{Certificates: []tls.Certificate{{}}, ClientCAs: x509.NewCertPool(), RootCAs: x509.NewCertPool()}
		},
		"localhost": func(c *global.Config) { c.RaftBind, c.AdminAddr = "localhost:7400", "http://localhost:8081" },
		"ipv6":      func(c *global.Config) { c.RaftBind, c.AdminAddr = "[::1]:7400", "http://[::1]:8081" },
		"https":     func(c *global.Config) { c.AdminAddr, c.AdminTLS = "https://10.0.0.5:8081", &tls.Config{} },
		"StreamLayer": func(c *global.Config) {
			ln := mustListen(t)
			t.Cleanup(func() { ln.Close() })
			c.RaftBind, c.StreamLayer = "0.0.0.0:7400", globaltest.NewNetwork().StreamLayer("x", ln)
		},
	} {
		c := good()
		mut(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := global.Open(context.Background(), global.Config{}); err == nil {
		t.Fatal("Open accepted an empty config")
	}
}

// TestRecoverLostQuorum: two of three voters are lost for good; the survivor
// keeps serving its last state but cannot commit; after a peers.json
// recovery it leads alone with every committed write, and commits again.
func TestRecoverLostQuorum(t *testing.T) {
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3})
	var writes []acked
	for i := 0; i < 3; i++ {
		writes = append(writes, applyVia(t, c.Nodes[i], "zones: {} # before the loss "+string(rune('a'+i))))
	}
	if _, err := c.Nodes[1].Client.Trigger(ctxT(t, 10*time.Second), global.FailoverRequest{Region: "region-2"}); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(5*time.Second, "node-0 caught up", func() bool { return c.Converged() })
	c.Kill(1)
	c.Kill(2)

	survivor := c.Nodes[0]
	_, err := survivor.Node.ApplyPolicy(ctxT(t, 10*time.Second), "p.yaml", []byte("lost"), "", global.WriteOptions{})
	if !errors.Is(err, global.ErrNoLeader) {
		t.Fatalf("write without quorum: %v", err)
	}
	// The error points at the lost quorum, naming what is unreachable, and
	// the admin API says so once instead of being asked again until the
	// client gives up (which read as "cannot reach the admin API").
	for _, want := range []string{"1 of 3 voters reachable", c.Nodes[1].Name, c.Nodes[2].Name, "quorum is lost"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("write without quorum: %q lacks %q", err, want)
		}
	}
	_, err = survivor.Client.Trigger(ctxT(t, 30*time.Second), global.FailoverRequest{Region: "region-1"})
	var api *global.APIError
	if !errors.As(err, &api) || api.Code != global.CodeNoLeader || !strings.Contains(api.Message, "1 of 3 voters reachable") {
		t.Fatalf("trigger without quorum through the admin API: %v", err)
	}
	c.WaitFor(5*time.Second, "the survivor to report stale", func() bool { return survivor.Node.Health().Stale })
	checkAcked(t, survivor.Node, writes)
	if survivor.Node.State().Routable("region-2") {
		t.Fatal("the survivor lost its region state")
	}

	c.Stop(0)
	if err := global.WritePeersFile(survivor.Dir, []global.Peer{{ID: survivor.Name, Address: survivor.RaftAddr}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(10*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	checkAcked(t, survivor.Node, writes)
	writes = append(writes, applyVia(t, survivor, "zones: {} # after recovery"))
	if _, err := os.Stat(filepath.Join(survivor.Dir, "raft", "peers.json.applied")); err != nil {
		t.Fatalf("peers.json was not marked applied: %v", err)
	}
	servers, err := survivor.Node.Servers()
	if err != nil || len(servers) != 1 || servers[0].ID != survivor.Name {
		t.Fatalf("configuration after recovery: %+v %v", servers, err)
	}
	// RecoverCluster commits whatever was in the survivor's log, so the write
	// that failed without quorum may have become committed (documented): the
	// history holds the acknowledged writes plus at most that one.
	got := survivor.Node.State().PolicyHistory()
	lost := sha256.Sum256([]byte("lost"))
	if len(got) != len(writes) && !(len(got) == len(writes)+1 && mustVersion(t, survivor.Node, 4).SHA256 == hex.EncodeToString(lost[:])) {
		t.Fatalf("%d versions after recovery, want %d (or %d with the in-flight write as version 4)", len(got), len(writes), len(writes)+1)
	}
	for i, p := range got {
		if p.Version != uint64(i+1) {
			t.Fatalf("versions are not contiguous: %+v", got)
		}
	}
}

func TestWritePeersFileRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	for name, peers := range map[string][]global.Peer{
		"no peers":     nil,
		"no address":   {{ID: "a"}},
		"bad id":       {{ID: "a b", Address: "127.0.0.1:1"}},
		"twice":        {{ID: "a", Address: "127.0.0.1:1"}, {ID: "a", Address: "127.0.0.1:2"}},
		"no voter":     {{ID: "a", Address: "127.0.0.1:1", NonVoter: true}},
		"empty string": {{ID: "", Address: "127.0.0.1:1"}},
	} {
		if err := global.WritePeersFile(dir, peers); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "raft", "peers.json")); !os.IsNotExist(err) {
		t.Fatal("a refused peers file was written")
	}
}

// TestNonVoters: with Voters 3, a fourth controller stays a non-voter; it
// replicates the state and its writes are forwarded to the leader. A node
// restarted after snapshots and log truncation catches up by snapshot.
func TestNonVoters(t *testing.T) {
	c := globaltest.NewCluster(t, 4, globaltest.Options{Voters: 3, Configure: func(i int, cfg *global.Config) {
		cfg.Timing.SnapshotThreshold = 8
		cfg.Timing.SnapshotInterval = 50 * time.Millisecond
		cfg.Timing.TrailingLogs = 4
	}})
	l, _ := c.Leader()
	servers, err := c.Nodes[l].Node.Servers()
	if err != nil {
		t.Fatal(err)
	}
	voters := 0
	for _, s := range servers {
		if s.Suffrage == "voter" {
			voters++
		}
	}
	if len(servers) != 4 || voters != 3 {
		t.Fatalf("servers %+v", servers)
	}
	var nonvoter int
	for i, nd := range c.Nodes {
		for _, s := range servers {
			if s.ID == nd.Name && s.Suffrage == "nonvoter" {
				nonvoter = i
			}
		}
	}
	c.Stop((nonvoter + 1) % 4)
	if (nonvoter+1)%4 == l {
		if _, err := c.WaitLeader(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var writes []acked
	for i := 0; i < 30; i++ {
		writes = append(writes, applyVia(t, c.Nodes[nonvoter], "v"+string(rune('a'+i%26))))
	}
	c.WaitFor(5*time.Second, "the non-voter to apply its own writes", func() bool { return c.Converged() })
	checkAcked(t, c.Nodes[nonvoter].Node, writes)
	// The stopped node missed 30 writes, more than the trailing logs kept
	// after a snapshot: it catches up by installing one.
	c.WaitFor(5*time.Second, "a snapshot on the leader", func() bool {
		l, err := c.Leader()
		if err != nil {
			return false
		}
		snaps, _ := filepath.Glob(filepath.Join(c.Nodes[l].Dir, "raft", "snapshots", "*", "state.bin"))
		return len(snaps) > 0
	})
	if err := c.Start((nonvoter + 1) % 4); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(10*time.Second, "the restarted node to catch up", func() bool { return c.Converged() })
	checkAcked(t, c.Nodes[(nonvoter+1)%4].Node, writes)
}

// TestAutoFailoverRunner runs the automatic failover on every node, as the
// controllers do: only the leader commits, the failed region comes back
// through recovering after the hold-down.
func TestAutoFailoverRunner(t *testing.T) {
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3})
	var pods atomic.Int64
	pods.Store(3)
	observe := func(context.Context) global.Observations {
		return global.Observations{
			"region-0": {Controllers: 1, HealthyPods: 3},
			"region-1": {Controllers: 1, HealthyPods: 3},
			"region-2": {Controllers: 1, HealthyPods: int(pods.Load())},
		}
	}
	cfg := global.DefaultAutoFailoverConfig()
	cfg.Interval, cfg.Grace, cfg.HoldDown = 20*time.Millisecond, 50*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, len(c.Nodes))
	for _, nd := range c.Nodes {
		go func() { done <- nd.Node.RunAutoFailover(ctx, cfg, observe) }()
	}
	defer func() {
		cancel()
		for range c.Nodes {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	pods.Store(0)
	c.WaitFor(10*time.Second, "region-2 failed automatically everywhere", func() bool {
		for _, nd := range c.Nodes {
			if nd.Node.State().RegionState("region-2") != global.RegionFailed {
				return false
			}
		}
		return true
	})
	rs, _ := c.Nodes[0].Node.State().RegionStatus("region-2")
	l, _ := c.Leader()
	if !rs.Automatic || rs.Actor != "auto:"+c.Nodes[l].Name || !strings.Contains(rs.Reason, "0 healthy pods") {
		t.Fatalf("automatic failure record %+v (leader %s)", rs, c.Nodes[l].Name)
	}
	pods.Store(3)
	c.WaitFor(10*time.Second, "region-2 active again", func() bool {
		rs, _ := c.Nodes[0].Node.State().RegionStatus("region-2")
		return rs.State == global.RegionActive && rs.Automatic && strings.Contains(rs.Reason, "hold-down")
	})
	bad := global.DefaultAutoFailoverConfig()
	bad.Interval = 0
	if err := c.Nodes[0].Node.RunAutoFailover(context.Background(), bad, nil); err == nil {
		t.Fatal("RunAutoFailover accepted an invalid config")
	}
}

// testPKI makes a CA and a certificate for 127.0.0.1 signed by it.
func testPKI(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meridian test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "controller"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		RootCAs:      pool, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}, pool
}

// TestTLSTransport runs a cluster whose Raft traffic is mutual TLS; a peer
// without a certificate from the cluster CA cannot talk to it.
func TestTLSTransport(t *testing.T) {
	tlsCfg, _ := testPKI(t)
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3, OwnTransport: true, Configure: func(i int, cfg *global.Config) {
		cfg.TLS = tlsCfg
	}})
	w := applyVia(t, c.Nodes[2], "zones: {} # over tls")
	c.WaitFor(5*time.Second, "convergence over TLS", func() bool { return c.Converged() })
	for _, nd := range c.Nodes {
		checkAcked(t, nd.Node, []acked{w})
	}
	// A client with a certificate from another CA is refused.
	other, _ := testPKI(t)
	other.ClientAuth = tls.NoClientCert
	d := tls.Dialer{Config: &tls.Config{Certificates: other.Certificates, RootCAs: other.RootCAs, MinVersion: tls.VersionTLS13}}
	conn, err := d.DialContext(ctxT(t, 5*time.Second), "tcp", c.Nodes[0].RaftAddr)
	if err == nil {
		conn.Close()
		t.Fatal("a peer with a foreign certificate completed a handshake")
	}
	// Plain TCP gets nothing Raft would answer: the server waits for a TLS
	// ClientHello and drops garbage.
	raw, err := net.Dial("tcp", c.Nodes[0].RaftAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_, _ = raw.Write([]byte{0, 1, 2, 3, 4, 5, 6, 7})
	_ = raw.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, _ := raw.Read(buf)
	if n > 0 && buf[0] != 0x15 { // 0x15: a TLS alert record
		t.Fatalf("plain TCP got a non-TLS answer %x", buf[:n])
	}
}

func mustVersion(t *testing.T, n *global.Node, v uint64) global.PolicyVersion {
	t.Helper()
	p, ok := n.State().PolicyVersion(v)
	if !ok {
		t.Fatalf("%s has no policy version %d", n.ID(), v)
	}
	return p
}

// TestMetricsAndStaleness: the gauges say who leads and when a node serves a
// stale state; the counters count applied commands by outcome.
func TestMetricsAndStaleness(t *testing.T) {
	regs := make([]*prometheus.Registry, 3)
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3, Configure: func(i int, cfg *global.Config) {
		regs[i] = prometheus.NewRegistry()
		cfg.Registerer = regs[i]
	}})
	l, _ := c.Leader()
	applyVia(t, c.Nodes[l], "zones: {}")
	if _, err := c.Nodes[l].Node.Trigger(ctxT(t, 10*time.Second), "region-9", "", global.WriteOptions{}); !errors.Is(err, global.ErrUnknownRegion) {
		t.Fatalf("unknown region: %v", err)
	}
	f := (l + 1) % 3
	gauge := func(i int, name string) float64 {
		mfs, err := regs[i].Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	c.WaitFor(5*time.Second, "leader and policy gauges", func() bool {
		return gauge(l, "meridian_global_is_leader") == 1 && gauge(f, "meridian_global_is_leader") == 0 &&
			gauge(f, "meridian_global_policy_version") == 1 && gauge(f, "meridian_global_stale") == 0
	})
	if got := counterValue(t, regs[f], "meridian_global_commands_total", "policy.apply", "changed"); got != 1 {
		t.Fatalf("policy.apply changed = %v on a follower", got)
	}
	// The unknown region is refused by the state machine, on every replica.
	c.WaitFor(5*time.Second, "the rejection counted on the follower", func() bool {
		return counterValue(t, regs[f], "meridian_global_commands_total", "region.set", "rejected") == 1
	})
	// A region state change sets one state gauge of the region, on every replica.
	if _, err := c.Nodes[l].Node.Drain(ctxT(t, 10*time.Second), "region-1", "", global.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(5*time.Second, "the follower's region state gauges", func() bool {
		for _, s := range []string{"active", "draining", "failed", "recovering"} {
			want := b2f(s == "draining")
			if regionGauge(t, regs[f], "region-1", s) != want || regionGauge(t, regs[l], "region-1", s) != want {
				return false
			}
		}
		return true
	})
	// An isolated follower keeps its state and says it is stale.
	c.Net.Isolate(c.Nodes[f].Name)
	c.WaitFor(10*time.Second, "the isolated follower to report stale", func() bool {
		return gauge(f, "meridian_global_stale") == 1 && c.Nodes[f].Node.Health().Stale
	})
	if p, ok := c.Nodes[f].Node.State().Policy(); !ok || p.Version != 1 {
		t.Fatal("the isolated follower lost its policy")
	}
	c.Net.Reconnect(c.Nodes[f].Name)
	c.WaitFor(10*time.Second, "the follower to be fresh again", func() bool { return gauge(f, "meridian_global_stale") == 0 })
}

// regionGauge reads meridian_global_region_state{region, state} (-1 when
// absent).
func regionGauge(t *testing.T, reg *prometheus.Registry, region, state string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meridian_global_region_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["region"] == region && labels["state"] == state {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// counterValue reads the child of a counter vector with the given op and
// outcome labels from the registry (0 when absent).
func counterValue(t *testing.T, reg *prometheus.Registry, name, op, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["op"] == op && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestRestartWithNewAddresses: a controller that comes back on other ports
// (a rescheduled pod) joins again; the leader updates its member record and
// its Raft address, it keeps its vote and catches up.
func TestRestartWithNewAddresses(t *testing.T) {
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3})
	nd := c.Nodes[2]
	oldRaft, oldAdmin := nd.RaftAddr, nd.AdminAddr
	c.Stop(2)
	w := applyVia(t, c.Nodes[0], "zones: {} # while node-2 is away")
	nd.RaftAddr, nd.AdminAddr = "", ""
	if err := c.Start(2); err != nil {
		t.Fatal(err)
	}
	if nd.RaftAddr == oldRaft || nd.AdminAddr == oldAdmin {
		t.Fatal("the restarted node kept its addresses")
	}
	c.WaitFor(15*time.Second, "the new addresses in the member list and the raft configuration", func() bool {
		l, err := c.Leader()
		if err != nil {
			return false
		}
		m, ok := c.Nodes[l].Node.State().Member(nd.Name)
		servers, err := c.Nodes[l].Node.Servers()
		if !ok || m.AdminAddr != nd.URL() || m.RaftAddr != nd.RaftAddr || err != nil {
			return false
		}
		for _, s := range servers {
			if s.ID == nd.Name {
				return s.Address == nd.RaftAddr && s.Suffrage == "voter"
			}
		}
		return false
	})
	c.WaitFor(10*time.Second, "the restarted node to catch up", func() bool { return c.Converged() })
	checkAcked(t, nd.Node, []acked{w})
}

// TestOddVoters: with a target of 5 voters and 4 controllers the leader
// keeps 3 voters: 4 would need a larger quorum and tolerate no more
// failures.
func TestOddVoters(t *testing.T) {
	c := globaltest.NewCluster(t, 4, globaltest.Options{Voters: 5, WantVoters: 3})
	count := func() (voters, nonvoters int) {
		l, err := c.Leader()
		if err != nil {
			return -1, -1
		}
		servers, _ := c.Nodes[l].Node.Servers()
		for _, s := range servers {
			if s.Suffrage == "voter" {
				voters++
			} else {
				nonvoters++
			}
		}
		return voters, nonvoters
	}
	// The fourth, caught up, stays a non-voter through several reconcile
	// rounds (every 50 ms).
	for end := time.Now().Add(400 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if v, nv := count(); v >= 0 && (v != 3 || nv != 1) { // v < 0: no leader at the moment
			t.Fatalf("4 controllers: %d voters, %d non-voters", v, nv)
		}
	}
}
