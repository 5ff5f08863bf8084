package global_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/globaltest"
	"github.com/meridian-llm/meridian/global/identity"
)

// fullDisk is the operating system's file system whose disk can fill up:
// while full, writes fail with ENOSPC, as on a full audit volume.
type fullDisk struct {
	audit.OSFS
	full atomic.Bool
}

func (d *fullDisk) OpenFile(name string, flag int, perm fs.FileMode) (audit.File, error) {
	f, err := d.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &fullDiskFile{File: f, d: d, name: name}, nil
}

type fullDiskFile struct {
	audit.File
	d    *fullDisk
	name string
}

func (f *fullDiskFile) Write(b []byte) (int, error) {
	if f.d.full.Load() {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: syscall.ENOSPC}
	}
	return f.File.Write(b)
}

// raftSink anchors an audit log's checkpoints in the Raft tier, as the
// controller does.
type raftSink struct{ node *global.Node }

func (s *raftSink) PublishCheckpoint(ctx context.Context, cp audit.Checkpoint) error {
	_, err := s.node.AppendCheckpoint(ctx, global.CheckpointFromAudit(cp), global.WriteOptions{Actor: "audit:" + cp.Controller})
	return err
}

// auditedCluster is a test cluster whose nodes record privileged actions
// in real audit logs, one per node under Dir, whose checkpoints go to Raft.
type auditedCluster struct {
	*globaltest.Cluster
	Dir   string
	mu    sync.Mutex
	logs  map[string]*audit.Log
	disks map[string]*fullDisk
	sinks map[string]*raftSink
}

func newAuditedCluster(t *testing.T, n int, configure func(i int, cfg *global.Config)) *auditedCluster {
	t.Helper()
	return newAuditedClusterWith(t, n, globaltest.Options{Configure: configure})
}

// newAuditedClusterWith is newAuditedCluster with the cluster's options
// (opts.Configure runs after the audit log is set).
func newAuditedClusterWith(t *testing.T, n int, opts globaltest.Options) *auditedCluster {
	t.Helper()
	configure := opts.Configure
	ac := &auditedCluster{Dir: t.TempDir(), logs: map[string]*audit.Log{}, disks: map[string]*fullDisk{}, sinks: map[string]*raftSink{}}
	// Registered before the cluster's: runs after it, once no node records.
	t.Cleanup(func() {
		for _, l := range ac.logs {
			_ = l.Close()
		}
	})
	opts.Configure = func(i int, cfg *global.Config) {
		cfg.PolicyValidator = testValidator
		ac.mu.Lock()
		prev := ac.logs[cfg.NodeID]
		ac.mu.Unlock()
		if prev != nil {
			_ = prev.Close() // a node started again: its log is opened again
		}
		acfg := audit.DefaultConfig()
		acfg.Dir, acfg.ControllerID, acfg.HMACKey = ac.Dir, cfg.NodeID, []byte("0123456789abcdef0123456789abcdef")
		disk, sink := &fullDisk{}, &raftSink{}
		ac.mu.Lock()
		if old := ac.sinks[cfg.NodeID]; old != nil {
			sink = old // a node started again (its node pointer is the test's to renew)
		}
		ac.mu.Unlock()
		l, err := audit.Open(acfg, audit.Deps{FS: disk, Sink: sink})
		if err != nil {
			t.Fatal(err)
		}
		ac.mu.Lock()
		ac.logs[cfg.NodeID], ac.disks[cfg.NodeID], ac.sinks[cfg.NodeID] = l, disk, sink
		ac.mu.Unlock()
		cfg.Audit = l
		if configure != nil {
			configure(i, cfg)
		}
	}
	ac.Cluster = globaltest.NewCluster(t, n, opts)
	for _, nd := range ac.Nodes {
		ac.sinks[nd.Name].node = nd.Node
	}
	return ac
}

// records returns the admin_action records in node's log.
func (ac *auditedCluster) records(t *testing.T, node string) []audit.Record {
	t.Helper()
	recs, err := audit.NaiveQuery(filepath.Join(ac.Dir, node), audit.Query{Kinds: []audit.Kind{audit.KindAdminAction}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// where returns every admin record of every node for which keep holds,
// with its node and detail.
type adminRec struct {
	node string
	rec  audit.Record
	d    audit.AdminDetail
}

func (ac *auditedCluster) where(t *testing.T, keep func(audit.Record, audit.AdminDetail) bool) []adminRec {
	t.Helper()
	var out []adminRec
	for _, nd := range ac.Nodes {
		for _, r := range ac.records(t, nd.Name) {
			d, ok := r.Admin()
			if !ok {
				t.Fatalf("%s seq %d: admin record without a detail: %s", nd.Name, r.Seq, r.Cost)
			}
			if keep(r, d) {
				out = append(out, adminRec{nd.Name, r, d})
			}
		}
	}
	return out
}

// byRequest returns the admin records of request id rid on every node.
func (ac *auditedCluster) byRequest(t *testing.T, rid string) []adminRec {
	return ac.where(t, func(r audit.Record, _ audit.AdminDetail) bool { return r.RequestID == rid })
}

func (r adminRec) String() string {
	return fmt.Sprintf("%s#%d request %q %s", r.node, r.rec.Seq, r.rec.RequestID, r.rec.Cost)
}

// one fails unless recs is exactly one record, on node, of action by
// actor (auth) with outcome, and returns it.
func one(t *testing.T, what string, recs []adminRec, node, action, actor, auth, outcome string) adminRec {
	t.Helper()
	if len(recs) != 1 {
		t.Fatalf("%s: %d admin records, want 1: %v", what, len(recs), recs)
	}
	r := recs[0]
	if r.node != node || r.d.Action != action || r.d.Actor != actor || r.d.Auth != auth || r.d.Outcome != outcome {
		t.Fatalf("%s: record on %s %+v, want on %s action %s actor %s (%s) outcome %s", what, r.node, r.d, node, action, actor, auth, outcome)
	}
	return r
}

func sha(doc string) string {
	s := sha256.Sum256([]byte(doc))
	return hex.EncodeToString(s[:])
}

// TestAdminActionsAudited: on a 3-node cluster each privileged write of
// the admin API (policy apply, failover trigger and recover, failover
// targets, member removal) is exactly one admin_action record, on the
// node that accepted it (not again on the leader it was forwarded to),
// with the admin token as its actor, the claimed actor beside it, and the
// arguments; refused writes are one refused record each and change no
// state. The records chain with the checkpoints Raft anchors, and verify.
func TestAdminActionsAudited(t *testing.T) {
	ac := newAuditedCluster(t, 3, nil)
	l, err := ac.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := (l + 1) % 3
	leader, follower := ac.Nodes[l], ac.Nodes[f]
	tok := ac.Token

	// A policy apply through a follower, forwarded to the leader.
	doc := "version: 2026-12\nzones: {}\n"
	body, _ := json.Marshal(global.PolicyRequest{Name: "p.yaml", Document: doc, Actor: "operator:alice", RequestID: "rid-policy"})
	if r := call(t, "POST", follower.URL()+"/v1/global/policy", tok, string(body)); r.status != 200 {
		t.Fatalf("apply: %d %s", r.status, r.raw)
	}
	r := one(t, "policy apply", ac.byRequest(t, "rid-policy"), follower.Name, global.ActionPolicyApply, global.ActorAdminToken, audit.AuthToken, audit.OutcomeApplied)
	if a := r.d.Args; a["sha256"] != sha(doc) || a["declared"] != "2026-12" || a["name"] != "p.yaml" || a["claimed_actor"] != "operator:alice" ||
		r.rec.Origin != follower.Region || r.rec.Controller != follower.Name {
		t.Fatalf("policy apply record %+v %+v", r.rec, r.d)
	}
	pv, _ := follower.Node.State().Policy()
	if pv.RequestID != "rid-policy" {
		t.Fatalf("policy %+v", pv)
	}

	// Failover trigger and recover through the leader, targets through a
	// follower.
	for _, w := range []struct {
		rid, url, method, body, action, region, state string
		node                                          *globaltest.Node
	}{
		{"rid-trigger", "/v1/global/failover/trigger", "POST", `{"region":"region-2","reason":"maintenance","request_id":"rid-trigger"}`, global.ActionFailoverTrigger, "region-2", "failed", leader},
		{"rid-recover", "/v1/global/failover/recover", "POST", `{"region":"region-2","request_id":"rid-recover"}`, global.ActionFailoverRecover, "region-2", "active", leader},
		{"rid-targets", "/v1/global/regions/region-0/targets", "PUT", `{"targets":["region-1"],"request_id":"rid-targets"}`, global.ActionFailoverTargets, "region-0", "", follower},
	} {
		if resp := call(t, w.method, w.node.URL()+w.url, tok, w.body); resp.status != 200 {
			t.Fatalf("%s: %d %s", w.rid, resp.status, resp.raw)
		}
		r := one(t, w.rid, ac.byRequest(t, w.rid), w.node.Name, w.action, global.ActorAdminToken, audit.AuthToken, audit.OutcomeApplied)
		if r.rec.Region != w.region || r.d.Args["state"] != w.state || (w.rid == "rid-trigger" && r.d.Args["reason"] != "maintenance") ||
			(w.rid == "rid-targets" && r.d.Args["targets"] != "region-1") {
			t.Fatalf("%s: record %+v %+v", w.rid, r.rec, r.d)
		}
	}

	// Refused: a policy the validator rejects, a failover of an invalid
	// region name. One refused record each, nothing changed.
	before := follower.Node.State().Index()
	bad, _ := json.Marshal(global.PolicyRequest{Name: "bad.yaml", Document: "zones: {}", RequestID: "rid-bad-policy"})
	if resp := call(t, "POST", follower.URL()+"/v1/global/policy", tok, string(bad)); resp.status != 422 {
		t.Fatalf("invalid policy: %d %s", resp.status, resp.raw)
	}
	r = one(t, "invalid policy", ac.byRequest(t, "rid-bad-policy"), follower.Name, global.ActionPolicyApply, global.ActorAdminToken, audit.AuthToken, audit.OutcomeRefused)
	if !strings.Contains(r.d.Error, "must start with \"version:\"") || r.d.Args["sha256"] != sha("zones: {}") {
		t.Fatalf("refused policy record %+v", r.d)
	}
	if resp := call(t, "POST", leader.URL()+"/v1/global/failover/trigger", tok, `{"region":"Not_A_Region","request_id":"rid-bad-trigger"}`); resp.status != 400 {
		t.Fatalf("invalid region: %d %s", resp.status, resp.raw)
	}
	r = one(t, "invalid region", ac.byRequest(t, "rid-bad-trigger"), leader.Name, global.ActionFailoverTrigger, global.ActorAdminToken, audit.AuthToken, audit.OutcomeRefused)
	if !strings.Contains(r.d.Error, "Not_A_Region") {
		t.Fatalf("refused trigger record %+v", r.d)
	}
	if resp := call(t, "POST", leader.URL()+"/v1/global/failover/trigger", tok, `{"region":`); resp.status != 400 {
		t.Fatalf("truncated body: %d %s", resp.status, resp.raw)
	}
	if got := ac.where(t, func(r audit.Record, d audit.AdminDetail) bool {
		return d.Outcome == audit.OutcomeRefused && strings.Contains(d.Error, "decode JSON body")
	}); len(got) != 1 || got[0].node != leader.Name || got[0].d.Action != global.ActionFailoverTrigger {
		t.Fatalf("truncated body: records %+v", got)
	}
	if idx := follower.Node.State().Index(); idx != before {
		t.Fatalf("refused writes changed the state: index %d -> %d", before, idx)
	}

	// A member removed through a node other than it.
	gone := (l + 2) % 3
	if resp := call(t, "DELETE", follower.URL()+"/v1/global/members/"+ac.Nodes[gone].Name, tok, ""); resp.status != 200 {
		t.Fatalf("remove: %d %s", resp.status, resp.raw)
	}
	rm := ac.where(t, func(_ audit.Record, d audit.AdminDetail) bool { return d.Action == global.ActionMemberRemove })
	r = one(t, "member remove", rm, follower.Name, global.ActionMemberRemove, global.ActorAdminToken, audit.AuthToken, audit.OutcomeApplied)
	if r.d.Args["member"] != ac.Nodes[gone].Name || r.rec.Region != ac.Nodes[gone].Region {
		t.Fatalf("member remove record %+v %+v", r.rec, r.d)
	}

	// Every chain verifies against the checkpoints the logs anchor in Raft
	// as they close, admin records included (the removed node's through a
	// member).
	ac.sinks[ac.Nodes[gone].Name].node = follower.Node
	for _, i := range []int{l, f, gone} {
		if err := ac.logs[ac.Nodes[i].Name].Close(); err != nil {
			t.Fatalf("close the audit log of %s: %v", ac.Nodes[i].Name, err)
		}
	}
	var cps []audit.Checkpoint
	st := leader.Node.State()
	for _, i := range []int{l, f, gone} {
		list := st.Checkpoints(ac.Nodes[i].Name)
		if ac.logs[ac.Nodes[i].Name].Checkpoint().LastSeq == 0 {
			continue // nothing recorded there
		}
		if len(list) == 0 {
			t.Fatalf("no checkpoint of %s in raft", ac.Nodes[i].Name)
		}
		cps = append(cps, list[len(list)-1].AuditCheckpoint())
	}
	rep, err := audit.Verify(ac.Dir, cps)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	if len(cps) < 2 {
		t.Fatalf("checkpoints of %d chains, want the leader's and the follower's at least", len(cps))
	}
	for _, ch := range rep.Chains {
		if ch.Unanchored != 0 {
			t.Fatalf("chain %+v: every record must be anchored", ch)
		}
	}
}

// TestAdminAutomaticActionsAudited: what nodes do on their own is on
// record too, with the node as its actor: the leader's own member record,
// the joins of the other nodes (asked by them with the admin token, at the
// node they asked), their promotion to voters, and an automatic failover.
func TestAdminAutomaticActionsAudited(t *testing.T) {
	ac := newAuditedCluster(t, 3, nil)
	seed := ac.Nodes[0]
	self := "controller:" + seed.Name
	one(t, "leader's own member record", ac.where(t, func(_ audit.Record, d audit.AdminDetail) bool { return d.Action == global.ActionMemberUpdate }),
		seed.Name, global.ActionMemberUpdate, self, audit.AuthInternal, audit.OutcomeApplied)
	for _, nd := range ac.Nodes[1:] {
		joins := ac.where(t, func(_ audit.Record, d audit.AdminDetail) bool {
			return d.Action == global.ActionMemberJoin && d.Args["member"] == nd.Name
		})
		r := one(t, "join of "+nd.Name, joins, seed.Name, global.ActionMemberJoin, global.ActorAdminToken, audit.AuthToken, audit.OutcomeApplied)
		if r.rec.Region != nd.Region || r.d.Args["raft_addr"] != nd.RaftAddr {
			t.Fatalf("join record %+v %+v", r.rec, r.d)
		}
		one(t, "promotion of "+nd.Name, ac.where(t, func(_ audit.Record, d audit.AdminDetail) bool {
			return d.Action == global.ActionMemberPromote && d.Args["member"] == nd.Name
		}), seed.Name, global.ActionMemberPromote, self, audit.AuthInternal, audit.OutcomeApplied)
	}

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
	cfg.Interval, cfg.Grace, cfg.HoldDown = 20*time.Millisecond, 50*time.Millisecond, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, len(ac.Nodes))
	for _, nd := range ac.Nodes {
		go func() { done <- nd.Node.RunAutoFailover(ctx, cfg, observe) }()
	}
	defer func() {
		cancel()
		for range ac.Nodes {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	pods.Store(0)
	ac.WaitFor(10*time.Second, "region-2 failed automatically", func() bool { return !seed.Node.State().Routable("region-2") })
	l, _ := ac.Leader()
	auto := ac.where(t, func(_ audit.Record, d audit.AdminDetail) bool { return d.Action == global.ActionFailoverTrigger })
	r := one(t, "automatic failover", auto, ac.Nodes[l].Name, global.ActionFailoverTrigger, "controller:"+ac.Nodes[l].Name, audit.AuthInternal, audit.OutcomeApplied)
	if r.rec.Region != "region-2" || r.d.Args["automatic"] != "true" || r.d.Args["state"] != "failed" || !strings.Contains(r.d.Args["reason"], "0 healthy pods") {
		t.Fatalf("automatic failover record %+v %+v", r.rec, r.d)
	}
}

// TestAdminActionFailsClosed: with the audit disk full, and with the audit
// log closed, every privileged write is refused with 503
// audit_unavailable saying why, and changes nothing; a write the node
// refuses anyway stays refused (and says it could not be recorded); once
// the disk has room, writes go through again and are recorded.
func TestAdminActionFailsClosed(t *testing.T) {
	ac := newAuditedCluster(t, 1, nil)
	nd := ac.Nodes[0]
	tok := ac.Token
	doc, _ := json.Marshal(global.PolicyRequest{Name: "p.yaml", Document: "version: 1\nzones: {}\n"})
	writes := []struct{ name, method, path, body string }{
		{"policy apply", "POST", "/v1/global/policy", string(doc)},
		{"failover trigger", "POST", "/v1/global/failover/trigger", `{"region":"region-0","force":true}`},
		{"failover targets", "PUT", "/v1/global/regions/region-0/targets", `{"targets":["region-1"]}`},
		{"member join", "POST", "/v1/global/join", `{"member":{"id":"intruder","region":"region-1","raft_addr":"127.0.0.1:1","admin_addr":"http://127.0.0.1:2"}}`},
		{"member remove", "DELETE", "/v1/global/members/" + nd.Name, ""},
	}
	unchanged := func(when string) {
		t.Helper()
		st := nd.Node.State()
		_, hasPolicy := st.Policy()
		if hasPolicy || !st.Routable("region-0") || len(st.Targets("region-0")) != 0 || len(st.Members()) != 1 {
			t.Fatalf("%s: the state changed: policy %v, routable %v, targets %v, members %v", when, hasPolicy, st.Routable("region-0"), st.Targets("region-0"), st.Members())
		}
		if servers, err := nd.Node.Servers(); err != nil || len(servers) != 1 {
			t.Fatalf("%s: raft servers %v %v", when, servers, err)
		}
	}
	recordsBefore := len(ac.records(t, nd.Name))

	ac.disks[nd.Name].full.Store(true)
	for _, w := range writes {
		r := call(t, w.method, nd.URL()+w.path, tok, w.body)
		if r.status != 503 || r.body.Error.Code != global.CodeAuditUnavailable ||
			!strings.Contains(r.body.Error.Message, "its audit record could not be written, so nothing was changed") ||
			!strings.Contains(r.body.Error.Message, "no space left on device") {
			t.Fatalf("%s with the audit disk full: %d %s", w.name, r.status, r.raw)
		}
	}
	// A refusal stays a refusal, and says it is not on record.
	bad, _ := json.Marshal(global.PolicyRequest{Name: "bad.yaml", Document: "zones: {}"})
	if r := call(t, "POST", nd.URL()+"/v1/global/policy", tok, string(bad)); r.status != 422 || !strings.Contains(r.body.Error.Message, "could not be recorded in the audit log") {
		t.Fatalf("invalid policy with the audit disk full: %d %s", r.status, r.raw)
	}
	unchanged("disk full")
	if got := len(ac.records(t, nd.Name)); got != recordsBefore {
		t.Fatalf("%d admin records with the disk full, had %d", got, recordsBefore)
	}

	ac.disks[nd.Name].full.Store(false)
	if _, err := nd.Client.ApplyPolicy(ctxT(t, 10*time.Second), global.PolicyRequest{Name: "p.yaml", Document: "version: 1\nzones: {}\n", RequestID: "rid-after"}); err != nil {
		t.Fatalf("apply once the disk has room: %v", err)
	}
	one(t, "apply once the disk has room", ac.byRequest(t, "rid-after"), nd.Name, global.ActionPolicyApply, global.ActorAdminToken, audit.AuthToken, audit.OutcomeApplied)

	if err := ac.logs[nd.Name].Close(); err != nil {
		t.Fatal(err)
	}
	_, err := nd.Client.Trigger(ctxT(t, 10*time.Second), global.FailoverRequest{Region: "region-0", Force: true})
	if !errors.Is(err, global.ErrAuditUnavailable) || !strings.Contains(err.Error(), "audit log closed") {
		t.Fatalf("trigger with the audit log closed: %v", err)
	}
	if !nd.Node.State().Routable("region-0") {
		t.Fatal("a trigger that was not recorded failed the region")
	}
}

// TestAdminActorFromCertificate: on an admin listener serving TLS, the
// actor of a write is the identity of the caller's client certificate
// (the bearer token is still required); without a certificate it is the
// admin token. A request claiming to be forwarded by a controller is
// refused unless a member controller's certificate comes with it, and the
// refusal is recorded, so an operator cannot skip the record by adding the
// header.
func TestAdminActorFromCertificate(t *testing.T) {
	dir := t.TempDir()
	pki, err := identity.InitDevPKI(filepath.Join(dir, "pki"), []string{"region-0"}, identity.PKIOptions{Operator: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	source := func(c identity.IssuedCert) *identity.Source {
		cfg := identity.DefaultTLSConfig()
		cfg.Cert, cfg.Key, cfg.ClientCA = c.Cert, c.Key, pki.CACert
		s, err := identity.Open(ctxT(t, 5*time.Second), cfg, identity.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	server, operator, other := source(pki.Controllers[0]), source(pki.Operator), source(pki.Controllers[0])
	ac := newAuditedCluster(t, 1, nil)
	nd := ac.Nodes[0]
	srv := httptest.NewUnstartedServer(nd.Node.Handler())
	srv.TLS = server.ServerConfig(false)
	srv.StartTLS()
	defer srv.Close()
	client := func(cfg *tls.Config) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	withCert := client(operator.ClientConfig(""))
	noCert := operator.ClientConfig("")
	noCert.GetClientCertificate = nil
	withoutCert := client(noCert)
	asController := client(other.ClientConfig(""))
	post := func(hc *http.Client, method, path, body string, hdr map[string]string) rawResp {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+ac.Token)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		r := rawResp{status: resp.StatusCode, raw: string(b)}
		_ = json.Unmarshal(b, &r.body)
		return r
	}
	defer withCert.CloseIdleConnections()
	defer withoutCert.CloseIdleConnections()
	defer asController.CloseIdleConnections()

	doc, _ := json.Marshal(global.PolicyRequest{Name: "p.yaml", Document: "version: 7\nzones: {}\n", Actor: "operator:bob", RequestID: "rid-cert"})
	if r := post(withCert, "POST", "/v1/global/policy", string(doc), nil); r.status != 200 {
		t.Fatalf("apply with a certificate: %d %s", r.status, r.raw)
	}
	r := one(t, "apply with a certificate", ac.byRequest(t, "rid-cert"), nd.Name, global.ActionPolicyApply, "spiffe://meridian/client/alice", audit.AuthCertificate, audit.OutcomeApplied)
	if r.d.Args["claimed_actor"] != "operator:bob" {
		t.Fatalf("record %+v", r.d)
	}
	if r := post(withoutCert, "POST", "/v1/global/failover/trigger", `{"region":"region-0","force":true,"request_id":"rid-token"}`, nil); r.status != 200 {
		t.Fatalf("trigger without a certificate: %d %s", r.status, r.raw)
	}
	one(t, "trigger without a certificate", ac.byRequest(t, "rid-token"), nd.Name, global.ActionFailoverTrigger, global.ActorAdminToken, audit.AuthToken, audit.OutcomeApplied)
	if r := post(withCert, "POST", "/v1/global/failover/trigger", `{"region":"region-0"}`, map[string]string{"Authorization": "Bearer wrong"}); r.status != 401 {
		t.Fatalf("a certificate without the token: %d %s", r.status, r.raw)
	}

	// Forged hops: an operator's certificate, a controller's certificate
	// whose controller is not a member (ctl-region-0 is not node-0).
	before := nd.Node.State().Index()
	cmd := fmt.Sprintf(`{"v":1,"op":"region.set","rid":"rid-forged","at":%d,"actor":"x","region":{"region":"region-0","state":"active","force":true}}`, time.Now().UnixNano())
	ctl := "spiffe://meridian/region/region-0/controller/ctl-region-0"
	for _, f := range []struct {
		name  string
		hc    *http.Client
		from  string
		path  string
		body  string
		actor string
		why   string
	}{
		{"operator on /apply", withCert, nd.Name, "/v1/global/apply", cmd, "spiffe://meridian/client/alice", "must come with a controller certificate"},
		{"operator on /join", withCert, nd.Name, "/v1/global/join", `{"member":{"id":"x","region":"region-1","raft_addr":"127.0.0.1:1","admin_addr":"http://127.0.0.1:2"}}`, "spiffe://meridian/client/alice", "must come with a controller certificate"},
		{"operator on DELETE /members", withCert, nd.Name, "/v1/global/members/" + nd.Name, "", "spiffe://meridian/client/alice", "must come with a controller certificate"},
		{"no certificate on /apply", withoutCert, nd.Name, "/v1/global/apply", cmd, global.ActorAdminToken, "must come with a controller certificate"},
		{"another controller's name", asController, nd.Name, "/v1/global/apply", cmd, ctl, "came with the certificate of controller"},
		{"a controller not a member", asController, "ctl-region-0", "/v1/global/apply", cmd, ctl, "is not a member of the cluster"},
	} {
		method := "POST"
		if strings.HasPrefix(f.path, "/v1/global/members/") {
			method = "DELETE"
		}
		r := post(f.hc, method, f.path, f.body, map[string]string{"X-Meridian-Forwarded": f.from})
		if r.status != 403 || r.body.Error.Code != global.CodeForbidden || !strings.Contains(r.raw, f.why) {
			t.Fatalf("%s: %d %s", f.name, r.status, r.raw)
		}
		recs := ac.where(t, func(_ audit.Record, d audit.AdminDetail) bool {
			return d.Action == global.ActionForwardedWrite && d.Actor == f.actor && d.Args["path"] == f.path
		})
		if len(recs) == 0 || recs[len(recs)-1].d.Outcome != audit.OutcomeRefused || !strings.Contains(recs[len(recs)-1].d.Error, f.why) {
			t.Fatalf("%s: records %+v", f.name, recs)
		}
	}
	// /apply is for hops only, whoever calls it.
	if r := post(withCert, "POST", "/v1/global/apply", cmd, nil); r.status != 403 {
		t.Fatalf("/apply without the hop header: %d %s", r.status, r.raw)
	}
	if idx := nd.Node.State().Index(); idx != before || nd.Node.State().Routable("region-0") {
		t.Fatalf("forged hops changed the state (index %d -> %d)", before, idx)
	}
}
