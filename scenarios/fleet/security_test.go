package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// The security regression suite: each attack of issue 12, tried against a
// real 3-controller fleet on loopback (mutual TLS between controllers, API
// keys for clients), fails. The Raft attack (a forged AppendEntries) is
// TestSecurityAttacks/raft_plaintext here, and in package global, where
// the transport is, TestRaftMutualTLS and its plaintext "before"
// (TestForgedAppendEntriesPlaintext).

// secureFleet is a fleet whose clients authenticate with API keys.
func secureFleet(t *testing.T) *Fleet {
	return startFleet(t, Config{Tenants: []Tenant{
		{Name: "acme", DataClasses: []string{"public", "internal"}, DefaultDataClass: "internal"},
		{Name: "eu-health", DataClasses: []string{"phi", "public"}, DefaultDataClass: "phi"},
		{Name: "mixed", DataClasses: nil}, // may send no data class: the strictest treatment
	}})
}

// post sends a chat request with the given headers through hc and returns
// the status, the serving region and the body.
func post(t *testing.T, hc *http.Client, url string, hdr map[string]string) (int, string, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "meridian/sim-70b", "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": "a question about a patient"}}})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Meridian-Region"), string(b)
}

func bearer(key string) string { return "Bearer " + key }

// TestSecurityAttacks tries the attacks that, refused, leave the fleet as
// it was, one subtest each, on one secureFleet: starting a fleet is most
// of what each would cost on its own. The attacks that change the fleet
// (a flood, closing an audit log) have fleets of their own below.
func TestSecurityAttacks(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	f := secureFleet(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *Fleet)
	}{
		{"client identity", testSecurityClientIdentity},
		{"forged hop", testSecurityForgedHop},
		{"forged pod up", testSecurityForgedPodUp},
		{"raft plaintext", testSecurityRaftPlaintext},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, f) })
	}
}

// Client identity comes from authentication: no key is 401, a spoofed
// X-Tenant-Id is 403 (never believed), a data class outside the key's is
// 403, a stock OpenAI client with only its key works (its tenant and
// default data class from the key), and an identity without a default
// class gets the policy's strictest treatment, not a 451 naming an
// unrelated rule.
func testSecurityClientIdentity(t *testing.T, f *Fleet) {
	us := f.Region("us-east-1").Controller.URL()
	for _, tc := range []struct {
		name   string
		hdr    map[string]string
		status int
		want   string // in the body; or the serving region for 200
	}{
		{"no credential", map[string]string{regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi"}, 401, "missing_credentials"},
		{"a wrong key", map[string]string{"Authorization": bearer(strings.Repeat("x", 43))}, 401, "invalid_credentials"},
		{"a spoofed tenant", map[string]string{"Authorization": bearer(f.APIKeys["acme"]), regional.HeaderTenant: "eu-health"}, 403, "tenant_mismatch"},
		{"a class outside the key's", map[string]string{"Authorization": bearer(f.APIKeys["acme"]), regional.HeaderDataClass: "phi"}, 403, "data_class_not_allowed"},
		{"a stock OpenAI client: EU PHI by its key's default class", map[string]string{"Authorization": bearer(f.APIKeys["eu-health"])}, 200, "eu-west-1"},
		{"the tenant sent as the key says, in any case", map[string]string{"Authorization": bearer(f.APIKeys["eu-health"]), regional.HeaderTenant: "EU-Health"}, 200, "eu-west-1"},
		{"narrowing to an allowed class", map[string]string{"Authorization": bearer(f.APIKeys["acme"]), regional.HeaderDataClass: "public"}, 200, "us-"},
		{"no data class at all: the origin zone only", map[string]string{"Authorization": bearer(f.APIKeys["mixed"])}, 200, "us-"},
	} {
		status, region, body := post(t, f.HTTP, us, tc.hdr)
		switch {
		case status != tc.status:
			t.Errorf("%s: %d %s, want %d", tc.name, status, body, tc.status)
		case status == 200 && !strings.HasPrefix(region, tc.want):
			t.Errorf("%s: served in %s, want %s", tc.name, region, tc.want)
		case status != 200 && !strings.Contains(body, tc.want):
			t.Errorf("%s: %s, want %s", tc.name, body, tc.want)
		}
	}
}

// A forwarded request is believed only from a member controller's
// certificate whose region is the origin it names: a hop without a
// certificate, with an operator's, with a rogue controller's (same CA, not
// a member) or with a member's claiming another region is refused. The
// cluster's admin token is not a credential for hops.
func testSecurityForgedHop(t *testing.T, f *Fleet) {
	eu := f.Region("eu-west-1").Controller.URL()
	ca, err := identity.LoadCA(f.PKI.CACert, f.PKI.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(id identity.Identity) tls.Certificate {
		certPEM, keyPEM, err := ca.Issue(identity.CertRequest{Identity: id, Hosts: []string{"127.0.0.1"},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		kp, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	clientWith := func(certs ...tls.Certificate) *http.Client {
		tc := f.HTTP.Transport.(*http.Transport).TLSClientConfig.Clone()
		tc.Certificates = certs
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	}
	operator, err := tls.LoadX509KeyPair(f.PKI.Operator.Cert, f.PKI.Operator.Key)
	if err != nil {
		t.Fatal(err)
	}
	var member tls.Certificate
	for _, c := range f.PKI.Controllers {
		if c.Identity.ControllerID == "ctl-us-east-1" {
			if member, err = tls.LoadX509KeyPair(c.Cert, c.Key); err != nil {
				t.Fatal(err)
			}
		}
	}
	hop := map[string]string{regional.HeaderHop: "us-east-1", regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi",
		regional.HeaderHopAuth: f.AdminToken}
	for _, tc := range []struct {
		name   string
		hc     *http.Client
		origin string
		status int
		want   string
	}{
		{"no certificate, the admin token", f.HTTP, "us-east-1", 401, "controller's certificate"},
		{"an operator's certificate", clientWith(operator), "us-east-1", 401, "controller's certificate"},
		{"a rogue controller of the CA", clientWith(issue(identity.Controller("ctl-rogue", "us-east-1"))), "us-east-1", 403, "not a member"},
		{"a member claiming another region", clientWith(member), "us-west-2", 403, "may not forward as region us-west-2"},
		{"a member, as itself", clientWith(member), "us-east-1", 200, ""},
	} {
		hop[regional.HeaderHop] = tc.origin
		status, _, body := post(t, tc.hc, eu, hop)
		if status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d %q", tc.name, status, body, tc.status, tc.want)
		}
	}
}

// A forged PodUp on the region's topic (another pod's key, or a pod name
// with an endpoint on a host that is not allowed) is refused: the pod keeps
// its endpoint and no request reaches the forger's.
func testSecurityForgedPodUp(t *testing.T, f *Fleet) {
	var stolen atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stolen.Add(1)
		w.WriteHeader(500)
	}))
	defer evil.Close()
	// The forger's endpoint is on loopback (allowed by default in this
	// fleet): what stops it is the key and the pod name, and, for the
	// script endpoint, its scheme.
	region := f.Region("us-east-1")
	victim := region.Engines[0]
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(f.Broker.ListenAddrs()...), Topic: kvevents.TopicFor("us-east-1"), Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, Transport: tr}
	defer w.Close()
	enc := kvevents.Encoding{}
	forge := func(key, pod, endpoint string) kafka.Message {
		b, err := enc.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{&kvevents.PodUp{Pod: pod, Endpoint: endpoint,
			Model: "meridian/sim-70b", Hardware: "h100", Region: "us-east-1", Epoch: victim.Epoch() + 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return kafka.Message{Key: []byte(key), Value: b}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx,
		forge(victim.Name(), "impostor", evil.URL),                 // another pod's key
		forge(victim.Name(), victim.Name(), "javascript:alert(1)"), // not an http(s) URL
	); err != nil {
		t.Fatal(err)
	}
	ctl := region.Controller
	eventually(t, "both forgeries counted", func() bool {
		n := 0.0
		for _, reason := range []string{"key_mismatch", "bad_endpoint"} {
			n += counterValue(t, f.HTTP, ctl.URL(), "meridian_ingest_podup_rejected_total", reason)
		}
		return n >= 2
	})
	if p, ok := ctl.Registry.Get(victim.Name()); !ok || p.Info().Endpoint != victim.URL() {
		t.Fatalf("the victim's endpoint changed: %+v", p.Info())
	}
	if _, ok := ctl.Registry.Get("impostor"); ok {
		t.Fatal("the impostor was registered")
	}
	for range 10 {
		if status, _, body := post(t, f.HTTP, ctl.URL(), map[string]string{"Authorization": bearer(f.APIKeys["acme"])}); status != 200 {
			t.Fatalf("after the forgeries: %d %s", status, body)
		}
	}
	if n := stolen.Load(); n != 0 {
		t.Fatalf("%d requests reached the forger's endpoint", n)
	}
}

// counterValue reads one labelled counter from a controller's /metrics.
func counterValue(t *testing.T, hc *http.Client, url, name, label string) float64 {
	t.Helper()
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+"{") && strings.Contains(l, `"`+label+`"`) {
			var v float64
			if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
				return v
			}
		}
	}
	return 0
}

// 5,000 connections (500 under the race detector) that send a request's headers and then trickle its
// body hold the API listener (at most its max_connections; the rest are
// closed as they arrive) until the read deadline closes them; the admin
// listener's /readyz keeps answering meanwhile.
func TestSecuritySlowBodyFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	// The race detector makes each TLS handshake ~8x dearer: under it the
	// flood is 500 connections, and make test runs the full 5,000 in a
	// second, race-free step.
	conns, readTimeout := 5000, 3*time.Second
	if raceEnabled {
		conns = 500
	}
	f := startFleet(t, Config{Controller: func(region string, c *regional.Config) {
		if region == "us-east-1" {
			c.Server.Limits.ReadTimeout, c.Server.Limits.ReadHeaderTimeout = readTimeout, time.Second
			c.Server.Limits.MaxConnections = 2000
		}
	}})
	ctl := f.Region("us-east-1").Controller
	addr := ctl.Addr()
	tc := f.HTTP.Transport.(*http.Transport).TLSClientConfig.Clone()
	tc.ServerName = "127.0.0.1"
	// Resumed handshakes (a session ticket from the first) keep the flood
	// cheap for the test's own CPU; the server's work per connection is
	// what it is for any client.
	tc.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	var (
		mu   sync.Mutex
		open []net.Conn
		wg   sync.WaitGroup
	)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	start := time.Now()
	const dialers = 8
	for d := range dialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := d; i < conns; i += dialers {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					continue // the listen backlog is full: the flood is working
				}
				// Slow clients must get through TLS first (a plaintext
				// request fails the handshake at once): do the handshake,
				// send the headers of a large body, then nothing.
				tl := tls.Client(c, tc)
				_ = tl.SetDeadline(time.Now().Add(5 * time.Second))
				if tl.Handshake() != nil {
					c.Close()
					continue
				}
				_, _ = io.WriteString(tl, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
				mu.Lock()
				open = append(open, tl)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d slow connections established in %v", len(open), conns, time.Since(start).Round(time.Millisecond))
	// The admin listener answers /readyz while they are held.
	rc := &http.Client{Transport: f.HTTP.Transport, Timeout: 10 * time.Second}
	t0 := time.Now()
	resp, err := rc.Get(ctl.AdminURL() + "/readyz")
	if err != nil {
		t.Fatalf("/readyz on the admin listener during the flood: %v", err)
	}
	resp.Body.Close()
	t.Logf("/readyz answered %d in %v during the flood", resp.StatusCode, time.Since(t0).Round(time.Millisecond))
	// The server ends every slow connection at its read deadline (bounded
	// wait: the read returns once the server answers or hangs up; only our
	// own deadline expiring means the connection was still held).
	// One deadline for all: a server that holds them fails the test once,
	// not once per connection.
	closed := 0
	deadline := time.Now().Add(readTimeout + 30*time.Second)
	for _, c := range open {
		_ = c.SetReadDeadline(deadline)
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if !(errors.As(err, &ne) && ne.Timeout()) {
			closed++
		}
	}
	t.Logf("%d of %d slow connections closed by the server, %v after the first was opened", closed, len(open), time.Since(start).Round(time.Millisecond))
	if closed != len(open) {
		t.Fatalf("%d of %d slow connections were still open past the read deadline", len(open)-closed, len(open))
	}
	if status, _, body := post(t, f.HTTP, ctl.URL(), map[string]string{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"}); status != 200 {
		t.Fatalf("after the flood: %d %s", status, body)
	}
}

// adminRecords returns the admin_action records of every controller of
// the fleet for which keep holds, with the controller's region.
func adminRecords(t *testing.T, f *Fleet, keep func(audit.Record, audit.AdminDetail) bool) (recs []audit.Record, regions []string) {
	t.Helper()
	for _, r := range f.Regions {
		got, err := audit.NaiveQuery(r.Controller.Audit().Dir(), audit.Query{Kinds: []audit.Kind{audit.KindAdminAction}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range got {
			d, ok := rec.Admin()
			if !ok {
				t.Fatalf("%s seq %d: an admin record without its detail: %s", rec.Controller, rec.Seq, rec.Cost)
			}
			if keep(rec, d) {
				recs, regions = append(recs, rec), append(regions, r.Name)
			}
		}
	}
	return recs, regions
}

// Every privileged action is on record (issue 12 item 7). On a fleet with
// mutual TLS, an operator (with the operator certificate of the fleet's
// CA and the admin token) triggers and recovers a failover and rotates a
// gossip key through a controller that does not lead: each is exactly one
// admin_action record on that controller's chain, naming the operator's
// certificate identity; a failover that would strand traffic and a use of
// a key nobody holds are one refused record each. The joins of the other
// controllers are on the seed's chain under their own certificates. With
// that controller's audit log closed, a failover and a key install through
// it are refused (503 audit_unavailable) and change nothing. Its chain,
// admin records included, verifies against the checkpoint Raft holds.
func TestSecurityAdminActionsAudited(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	f := startFleet(t, Config{})
	var via *Region
	for _, r := range f.Regions {
		if !r.Controller.Global().IsLeader() {
			via = r
			break
		}
	}
	operator, err := tls.LoadX509KeyPair(f.PKI.Operator.Cert, f.PKI.Operator.Key)
	if err != nil {
		t.Fatal(err)
	}
	tc := f.HTTP.Transport.(*http.Transport).TLSClientConfig.Clone()
	tc.Certificates = []tls.Certificate{operator}
	opHC := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	defer opHC.CloseIdleConnections()
	adm := global.NewClient(via.Controller.AdminURL(), f.AdminToken, opHC)
	keys := &gossip.KeysClient{BaseURL: via.Controller.AdminURL(), Token: f.AdminToken, HTTP: opHC}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const opID = "spiffe://meridian/client/operator"

	// one checks that exactly one admin record matches, on via's chain, by
	// the operator, with outcome.
	one := func(what string, outcome string, keep func(audit.Record, audit.AdminDetail) bool) audit.AdminDetail {
		t.Helper()
		recs, regions := adminRecords(t, f, keep)
		if len(recs) != 1 {
			t.Fatalf("%s: %d admin records, want 1: %+v", what, len(recs), recs)
		}
		d, _ := recs[0].Admin()
		if regions[0] != via.Name || d.Actor != opID || d.Auth != audit.AuthCertificate || d.Outcome != outcome {
			t.Fatalf("%s: record on %s %+v, want on %s by %s, %s", what, regions[0], d, via.Name, opID, outcome)
		}
		return d
	}
	byRequest := func(rid string) func(audit.Record, audit.AdminDetail) bool {
		return func(r audit.Record, _ audit.AdminDetail) bool { return r.RequestID == rid }
	}

	_, err = adm.Trigger(ctx, global.FailoverRequest{Region: "eu-west-1", RequestID: "rid-strand"})
	if !errors.Is(err, global.ErrStrandsTraffic) {
		t.Fatalf("a failover that strands EU PHI: %v", err)
	}
	if d := one("stranding failover", audit.OutcomeRefused, byRequest("rid-strand")); !strings.Contains(d.Error, "eu-health-phi") {
		t.Fatalf("the refusal's record does not say why: %+v", d)
	}
	if _, err := adm.Trigger(ctx, global.FailoverRequest{Region: "eu-west-1", Reason: "drill", Force: true, RequestID: "rid-trigger"}); err != nil {
		t.Fatal(err)
	}
	if d := one("failover", audit.OutcomeApplied, byRequest("rid-trigger")); d.Action != global.ActionFailoverTrigger || d.Args["force"] != "true" {
		t.Fatalf("failover record %+v", d)
	}
	if _, err := adm.Recover(ctx, global.FailoverRequest{Region: "eu-west-1", RequestID: "rid-recover"}); err != nil {
		t.Fatal(err)
	}
	one("recover", audit.OutcomeApplied, byRequest("rid-recover"))

	newKey := func() string { return base64.StdEncoding.EncodeToString([]byte(randomHex(16))) }
	k2, stranger := newKey(), newKey()
	fingerprint := func(k string) string {
		fp, err := gossip.KeyFingerprint(k)
		if err != nil {
			t.Fatal(err)
		}
		return fp
	}
	if _, err := keys.Install(ctx, k2); err != nil {
		t.Fatalf("install: %v", err)
	}
	keyOp := func(action, key string) func(audit.Record, audit.AdminDetail) bool {
		return func(_ audit.Record, d audit.AdminDetail) bool {
			return d.Action == action && d.Args["fingerprint"] == fingerprint(key)
		}
	}
	one("key install", audit.OutcomeApplied, keyOp("gossip_key_install", k2))
	var api *gossip.KeysAPIError
	if _, err := keys.Use(ctx, stranger); !errors.As(err, &api) || api.Status != 409 {
		t.Fatalf("use of a key nobody holds: %v", err)
	}
	one("use of an unknown key", audit.OutcomeRefused, keyOp("gossip_key_use", stranger))
	segs, _ := filepath.Glob(filepath.Join(via.Controller.Audit().Dir(), "*.jsonl"))
	for _, seg := range segs {
		raw, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), k2) || strings.Contains(string(raw), stranger) || strings.Contains(string(raw), f.AdminToken) {
			t.Fatalf("%s holds a key or the admin token", seg)
		}
	}
	if len(segs) == 0 {
		t.Fatal("no segment")
	}

	// The other controllers joined through the seed, each under its own
	// certificate.
	seed := f.Regions[0]
	for _, r := range f.Regions[1:] {
		id := r.Controller.Global().ID()
		recs, regions := adminRecords(t, f, func(_ audit.Record, d audit.AdminDetail) bool {
			return d.Action == global.ActionMemberJoin && d.Args["member"] == id
		})
		if len(recs) == 0 {
			t.Fatalf("no record of the join of %s", id)
		}
		last, _ := recs[len(recs)-1].Admin()
		if regions[len(regions)-1] != seed.Name || last.Outcome != audit.OutcomeApplied || last.Auth != audit.AuthCertificate ||
			last.Actor != identity.Controller(id, r.Name).String() {
			t.Fatalf("join of %s recorded on %s as %+v", id, regions[len(regions)-1], last)
		}
	}

	// Fail closed: with via's audit log closed, nothing goes through it.
	before := via.Controller.Gossip().ListKeys()
	if err := via.Controller.Audit().Close(); err != nil {
		t.Fatalf("close the audit log of %s: %v", via.Name, err)
	}
	if _, err := adm.Trigger(ctx, global.FailoverRequest{Region: "us-west-2", Force: true}); !errors.Is(err, global.ErrAuditUnavailable) {
		t.Fatalf("failover with the audit log closed: %v", err)
	}
	if _, err := keys.Install(ctx, newKey()); !errors.As(err, &api) || api.Status != 503 || api.Code != "audit_unavailable" {
		t.Fatalf("key install with the audit log closed: %v", err)
	}
	for _, r := range f.Regions {
		if !r.Controller.Global().State().Routable("us-west-2") {
			t.Fatalf("%s sees us-west-2 failed by an unrecorded failover", r.Name)
		}
	}
	if got := via.Controller.Gossip().ListKeys(); !slices.Equal(got, before) {
		t.Fatalf("keyring %v after an unrecorded install, was %v", got, before)
	}

	// The closed log published its last checkpoint to Raft; the chain,
	// admin records included, verifies against it.
	var cps []audit.Checkpoint
	for _, cp := range seed.Controller.Global().State().Checkpoints(via.Controller.Global().ID()) {
		cps = append(cps, cp.AuditCheckpoint())
	}
	rep, err := audit.Verify(via.Controller.Audit().Dir(), cps)
	if err != nil || !rep.OK() || len(rep.Chains) != 1 || rep.Chains[0].Unanchored != 0 || rep.Chains[0].Records == 0 {
		t.Fatalf("verify %s: %v %+v", via.Name, err, rep)
	}
}

// An unauthenticated Raft client cannot reach the state: a forged
// AppendEntries (a policy nobody proposed, at a term far ahead) sent to a
// follower controller by hashicorp/raft's own plain TCP transport, and by
// a TLS client whose certificate is of another CA, fails at the handshake,
// and the follower neither takes the forged term nor the policy.
// (global.TestForgedAppendEntriesPlaintext shows the same request taking
// over a plaintext cluster.)
func testSecurityRaftPlaintext(t *testing.T, f *Fleet) {
	var node *global.Node
	for _, r := range f.Regions {
		if n := r.Controller.Global(); n.Health().RaftState == "Follower" {
			node = n
			break
		}
	}
	if node == nil {
		t.Fatal("no follower controller")
	}
	before := node.Health()
	policies := len(node.State().PolicyHistory())
	cmd := fmt.Sprintf(`{"v":1,"op":"policy.apply","rid":"forged","at":%d,"actor":"attacker","policy":{"name":"forged.yaml","document":"em9uZXM6IHt9"}}`, time.Now().UnixNano())
	forged := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("attacker"), Addr: []byte("127.0.0.1:1")},
		Term:      before.Term + 100, PrevLogEntry: before.LastIndex, PrevLogTerm: before.Term,
		Entries:           []*raft.Log{{Index: before.LastIndex + 1, Term: before.Term + 100, Type: raft.LogCommand, Data: []byte(cmd)}},
		LeaderCommitIndex: before.LastIndex + 1,
	}
	plain, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	var resp raft.AppendEntriesResponse
	if err := plain.AppendEntries(raft.ServerID(before.NodeID), raft.ServerAddress(node.RaftAddr()), forged, &resp); err == nil {
		t.Fatalf("plain AppendEntries to a mutual-TLS Raft port succeeded: %+v", resp)
	} else {
		t.Logf("plain TCP: %v", err)
	}
	other, err := identity.InitDevPKI(t.TempDir(), []string{"us-east-1"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.LoadX509KeyPair(other.Controllers[0].Cert, other.Controllers[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	// The rogue client skips verifying the server: only the server's
	// check of the client stands between it and the log.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", node.RaftAddr(),
		&tls.Config{Certificates: []tls.Certificate{kp}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err == nil {
		// TLS 1.3 reports the server's refusal of the client certificate
		// at the first read.
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = conn.Write([]byte{0}) // raft's rpcAppendEntries type byte
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil {
		t.Fatal("a client certificate of another CA was answered on the Raft port")
	}
	t.Logf("certificate of another CA: %v", err)
	after := node.Health()
	// (An election of its own may move the term on a loaded machine; the
	// forged term is 100 ahead.)
	if after.Term >= forged.Term || len(node.State().PolicyHistory()) != policies {
		t.Fatalf("the follower changed: term %d -> %d, last index %d -> %d, policies %d -> %d",
			before.Term, after.Term, before.LastIndex, after.LastIndex, policies, len(node.State().PolicyHistory()))
	}
	for _, p := range node.State().PolicyHistory() {
		if p.Actor == "attacker" {
			t.Fatal("the forged policy was applied")
		}
	}
}
