package global_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
	"github.com/meridian-llm/meridian/global/identity"
)

// forgedPolicy is the policy an attacker tries to slip into a follower's
// log: one entry after the follower's last, in a term far above the
// cluster's, committed at once.
const forgedPolicy = "zones: {} # forged: eu phi may go anywhere"

func forgedAppendEntries(h global.Health, prevTerm uint64) *raft.AppendEntriesRequest {
	term := h.Term + 100
	cmd := fmt.Sprintf(`{"v":1,"op":"policy.apply","rid":"forged-%d","at":%d,"actor":"attacker","policy":{"name":"forged.yaml","document":%q}}`,
		prevTerm, time.Now().UnixNano(), base64.StdEncoding.EncodeToString([]byte(forgedPolicy)))
	return &raft.AppendEntriesRequest{
		RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("attacker"), Addr: []byte("127.0.0.1:1")},
		Term:              term,
		PrevLogEntry:      h.LastIndex,
		PrevLogTerm:       prevTerm,
		Entries:           []*raft.Log{{Index: h.LastIndex + 1, Term: term, Type: raft.LogCommand, Data: []byte(cmd)}},
		LeaderCommitIndex: h.LastIndex + 1,
	}
}

func hasForged(n *global.Node) bool {
	for _, p := range n.State().PolicyHistory() {
		if p.Name == "forged.yaml" || p.Actor == "attacker" {
			return true
		}
	}
	return false
}

// follower returns the index of a running node that does not lead.
func follower(t *testing.T, c *globaltest.Cluster) int {
	t.Helper()
	l, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return (l + 1) % len(c.Nodes)
}

// TestForgedAppendEntriesPlaintext is the attack of issue 12 against a
// plain-TCP cluster (allowed on loopback): hashicorp/raft's own TCP
// transport, no credentials, one AppendEntries, and the follower applies a
// policy nobody proposed. TestRaftMutualTLS shows mutual TLS stops it.
func TestForgedAppendEntriesPlaintext(t *testing.T) {
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3, OwnTransport: true})
	applyVia(t, c.Nodes[0], "zones: {} # honest")
	c.WaitFor(10*time.Second, "convergence", func() bool { return c.Converged() })
	f := c.Nodes[follower(t, c)]
	attacker, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer attacker.Close()
	h := f.Node.Health()
	accepted := false
	for prev := h.Term; prev >= 1 && !accepted; prev-- {
		var resp raft.AppendEntriesResponse
		if err := attacker.AppendEntries(raft.ServerID(f.Name), raft.ServerAddress(f.RaftAddr), forgedAppendEntries(h, prev), &resp); err != nil {
			t.Fatalf("plain AppendEntries: %v", err)
		}
		accepted = resp.Success
	}
	if !accepted {
		t.Fatal("the follower refused the forged entries (the attack did not line up with its log)")
	}
	c.WaitFor(10*time.Second, "the follower to apply the forged policy", func() bool { return hasForged(f.Node) })
}

// TestRaftMutualTLS runs three nodes whose Raft transport is mutual TLS with
// certificates from InitDevPKI: the cluster forms and applies; a forged
// AppendEntries sent by hashicorp/raft's plain TCP transport, by a TLS
// client with a certificate of another CA, by one with no certificate, and
// by one with the operator's (client-only) certificate of the cluster CA, is
// refused at the handshake and changes nothing on the follower.
func TestRaftMutualTLS(t *testing.T) {
	dir := t.TempDir()
	regions := []string{"region-0", "region-1", "region-2"}
	pki, err := identity.InitDevPKI(filepath.Join(dir, "pki"), regions, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srcs := make([]*identity.Source, len(regions))
	for i, ic := range pki.Controllers {
		cfg := identity.DefaultTLSConfig()
		cfg.Cert, cfg.Key, cfg.ClientCA = ic.Cert, ic.Key, pki.CACert
		s, err := identity.Open(ctxT(t, 5*time.Second), cfg, identity.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(ctxT(t, 5*time.Second)) })
		srcs[i] = s
	}
	regs := make([]*prometheus.Registry, len(regions))
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3, OwnTransport: true, Configure: func(i int, cfg *global.Config) {
		cfg.TLS = identity.RequireControllers(srcs[i].ServerConfig(true))
		cfg.TLSClient = srcs[i].ClientConfig("")
		regs[i] = prometheus.NewRegistry()
		cfg.Registerer = regs[i]
	}})
	w := applyVia(t, c.Nodes[2], "zones: {} # over mutual tls")
	c.WaitFor(10*time.Second, "convergence over mutual TLS", func() bool { return c.Converged() })
	for _, nd := range c.Nodes {
		checkAcked(t, nd.Node, []acked{w})
	}

	fi := follower(t, c)
	f := c.Nodes[fi]
	l, _ := c.Leader()
	c.WaitFor(10*time.Second, "a quiet cluster (the follower applied all the leader has)", func() bool {
		fh, lh := f.Node.Health(), c.Nodes[l].Node.Health()
		return fh.AppliedIndex == lh.LastIndex && fh.LastIndex == lh.LastIndex
	})
	before := f.Node.Health()
	leaderBefore := c.Nodes[l].Node.Health()
	beforePolicy, _ := f.Node.State().Policy()
	forged := forgedAppendEntries(before, before.Term)
	addr := raft.ServerAddress(f.RaftAddr)

	// 1. hashicorp/raft's own TCP transport, no TLS.
	plain, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	var resp raft.AppendEntriesResponse
	if err := plain.AppendEntries(raft.ServerID(f.Name), addr, forged, &resp); err == nil {
		t.Fatalf("plain TCP AppendEntries to a mutual-TLS follower answered %+v", resp)
	}

	// 2. TLS with a certificate of another CA (the attacker trusts any
	// server, so only the follower's check can refuse it).
	other, err := identity.InitDevPKI(filepath.Join(dir, "other"), []string{"region-0"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.LoadX509KeyPair(other.Controllers[0].Cert, other.Controllers[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	sendTLS(t, "a certificate of another CA", &tls.Config{Certificates: []tls.Certificate{foreign}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}, addr, f.Name, forged)

	// 3. TLS with no certificate, trusting the cluster CA.
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)
	sendTLS(t, "no client certificate", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}, addr, f.Name, forged)

	// 4. TLS with the operator's certificate of the cluster CA: a client
	// identity, not a controller's.
	op, err := tls.LoadX509KeyPair(pki.Operator.Cert, pki.Operator.Key)
	if err != nil {
		t.Fatal(err)
	}
	sendTLS(t, "an operator certificate", &tls.Config{Certificates: []tls.Certificate{op}, RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}, addr, f.Name, forged)

	after := f.Node.Health()
	if after.Term >= forged.Term || hasForged(f.Node) {
		t.Fatalf("the follower took the forged term or entry: term %d (forged %d), history %+v", after.Term, forged.Term, f.Node.State().PolicyHistory())
	}
	if p, _ := f.Node.State().Policy(); p.Version != beforePolicy.Version || p.SHA256 != beforePolicy.SHA256 {
		t.Fatalf("the follower's policy changed: %+v, was %+v", p, beforePolicy)
	}
	leaderNow := c.Nodes[l].Node.Health()
	if after.LastIndex > leaderNow.LastIndex || after.AppliedIndex > leaderNow.LastIndex {
		t.Fatalf("the follower holds entries the leader does not: last %d, applied %d, leader's last %d", after.LastIndex, after.AppliedIndex, leaderNow.LastIndex)
	}
	if leaderNow.LastIndex == leaderBefore.LastIndex && after.AppliedIndex != before.AppliedIndex {
		t.Fatalf("the follower's applied index moved from %d to %d while the cluster wrote nothing", before.AppliedIndex, after.AppliedIndex)
	}
	// The follower counts a refusal when its side of the handshake ends,
	// which may be after the attacker has seen the refusal and gone on.
	c.WaitFor(10*time.Second, "the follower to count 4 refused handshakes", func() bool {
		return metricValue(t, regs[fi], "meridian_global_raft_tls_rejected_total") >= 4
	})

	// The cluster still works, and the follower follows the real leader.
	w2 := applyVia(t, c.Nodes[l], "zones: {} # after the attack")
	c.WaitFor(10*time.Second, "convergence after the attack", func() bool { return c.Converged() })
	checkAcked(t, f.Node, []acked{w, w2})
	if hasForged(f.Node) {
		t.Fatal("the forged policy reached the follower")
	}
}

// sendTLS sends req to addr with hashicorp/raft's network transport over a
// TLS dialer using cfg, and fails the test unless it is refused.
func sendTLS(t *testing.T, what string, cfg *tls.Config, addr raft.ServerAddress, id string, req *raft.AppendEntriesRequest) {
	t.Helper()
	trans := raft.NewNetworkTransport(&tlsStream{Listener: mustListen(t), cfg: cfg}, 1, 2*time.Second, io.Discard)
	defer trans.Close()
	var resp raft.AppendEntriesResponse
	err := trans.AppendEntries(raft.ServerID(id), addr, req, &resp)
	if err == nil {
		t.Fatalf("%s: AppendEntries over TLS answered %+v", what, resp)
	}
}

// tlsStream is a raft.StreamLayer that dials with TLS (an attacker's).
type tlsStream struct {
	net.Listener
	cfg *tls.Config
}

func (s *tlsStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: s.cfg}
	return d.Dial("tcp", string(addr))
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestAdminOverMutualTLS: a node whose only HTTP client is the one built
// from AdminTLS joins through, and forwards writes to, a leader whose admin
// API is served over mutual TLS.
func TestAdminOverMutualTLS(t *testing.T) {
	pki, err := identity.InitDevPKI(filepath.Join(t.TempDir(), "pki"), []string{"region-0", "region-1"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*global.Node
	var servers []*http.Server
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Close()
		}
		for i := len(nodes) - 1; i >= 0; i-- {
			if err := nodes[i].Close(ctxT(t, 20*time.Second)); err != nil {
				t.Error(err)
			}
		}
	})
	var urls []string
	start := func(i int, join string) *global.Node {
		ic := pki.Controllers[i]
		tcfg := identity.DefaultTLSConfig()
		tcfg.Cert, tcfg.Key, tcfg.ClientCA = ic.Cert, ic.Key, pki.CACert
		src, err := identity.Open(ctxT(t, 5*time.Second), tcfg, identity.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close(ctxT(t, 5*time.Second)) })
		ln := mustListen(t)
		cfg := global.DefaultConfig()
		cfg.NodeID, cfg.Region, cfg.DataDir = ic.Identity.ControllerID, ic.Identity.Region, t.TempDir()
		cfg.RaftBind = "127.0.0.1:0"
		cfg.TLS, cfg.TLSClient = identity.RequireControllers(src.ServerConfig(true)), src.ClientConfig("")
		cfg.AdminAddr, cfg.AdminToken = "https://"+ln.Addr().String(), "test-token-of-at-least-32-bytes!"
		cfg.AdminTLS = src.ClientConfig("")
		cfg.Timing = globaltest.TestTiming()
		cfg.ReconcileInterval = 50 * time.Millisecond
		cfg.WALSegmentSize = 1 << 20
		cfg.Voters = 1
		cfg.Logger = globaltest.Logger(t, cfg.NodeID)
		if join == "" {
			cfg.Bootstrap = true
		} else {
			cfg.Join = []string{join}
		}
		n, err := global.Open(ctxT(t, 10*time.Second), cfg)
		if err != nil {
			ln.Close()
			t.Fatal(err)
		}
		nodes, urls = append(nodes, n), append(urls, cfg.AdminAddr)
		srv := &http.Server{Handler: n.Handler(), TLSConfig: src.ServerConfig(true), ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, srv)
		go func() { _ = srv.ServeTLS(ln, "", "") }()
		return n
	}
	a := start(0, "")
	waitUntil(t, 10*time.Second, "a leader", a.IsLeader)
	b := start(1, urls[0])
	waitUntil(t, 15*time.Second, "the joiner in the raft configuration", func() bool {
		servers, err := a.Servers()
		return err == nil && len(servers) == 2
	})
	pv, err := b.ApplyPolicy(ctxT(t, 10*time.Second), "p.yaml", []byte("zones: {} # via https"), "", global.WriteOptions{Actor: "test"})
	if err != nil {
		t.Fatalf("write forwarded over mutual TLS: %v", err)
	}
	waitUntil(t, 10*time.Second, "the leader to hold the forwarded write", func() bool {
		p, ok := a.State().Policy()
		return ok && p.Version == pv.Version
	})
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not within %v", what, within)
		}
		<-tick.C
	}
}
