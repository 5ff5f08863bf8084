package demo

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meridian-llm/meridian/global/audit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond every 20 ms for up to d: the conditions are things the
// demo makes happen (a line printed, a record written).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

var statusURLRe = regexp.MustCompile(`status page\s+(http://\S+/)`)

func get(t *testing.T, url string) (int, string, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), b
}

// The acceptance run: traffic, an early failover and its recovery, --json.
func TestRunJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-region system for 18 s")
	}
	cfg := DefaultConfig()
	cfg.Duration, cfg.FailoverAfter, cfg.FailoverFor = 18*time.Second, 5*time.Second, 5*time.Second
	cfg.ReplicaKillAfter, cfg.ReplicaDownFor = 11*time.Second, 3*time.Second
	cfg.Sessions = 12
	cfg.JSON = true
	cfg.StatusAddr = "127.0.0.1:0"
	cfg.Dir = t.TempDir()
	var out, info syncBuffer
	cfg.Info = &info

	type ran struct {
		res Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		res, err := Run(context.Background(), cfg, &out)
		done <- ran{res, err}
	}()
	// The status page's figures move while the demo runs.
	var statusURL string
	waitFor(t, 4*time.Minute, "the status page's URL", func() bool {
		m := statusURLRe.FindStringSubmatch(info.String())
		if m != nil {
			statusURL = m[1]
		}
		return m != nil
	})
	waitFor(t, 2*time.Minute, "traffic on the status page", func() bool {
		_, _, b := get(t, statusURL+"api/status")
		var s Snapshot
		return json.Unmarshal(b, &s) == nil && s.Totals.Requests > 0
	})
	r := <-done
	t.Logf("info output:\n%s", info.String())
	if r.err != nil {
		t.Fatal(r.err)
	}

	// Exactly one JSON object, with exactly the documented fields.
	var obj map[string]any
	dec := json.NewDecoder(strings.NewReader(out.String()))
	if err := dec.Decode(&obj); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value in %q", out.String())
	}
	want := []string{"requests", "errors", "hit_rate", "ttft_p50_ms", "ttft_p95_ms", "cross_region_forwards", "residency_denials",
		"residency_violations", "failover_moved_s", "audit_records", "audit_verified", "replica_kills", "replica_restarts",
		"requests_failed_during_replica_loss", "inflight_lost_on_replica_kill", "hit_rate_before_replica_kill", "hit_rate_after_replica_kill"}
	var got []string
	for k := range obj {
		got = append(got, k)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("JSON fields %v, want %v", got, want)
	}
	t.Logf("result: %s", strings.TrimSpace(out.String()))
	res := r.res
	switch {
	case res.Requests == 0:
		t.Error("no requests")
	case res.Errors != 0:
		t.Errorf("%d errors", res.Errors)
	case res.ResidencyViolations != 0:
		t.Errorf("%d residency violations", res.ResidencyViolations)
	case !res.AuditVerified || res.AuditRecords == 0:
		t.Errorf("audit: %d records, verified %v: %v", res.AuditRecords, res.AuditVerified, res.AuditIssues)
	case res.FailoverMovedS <= 0:
		t.Errorf("failover_moved_s %v", res.FailoverMovedS)
	case res.ReplicaKills != 1 || res.ReplicaRestarts != 1 || res.RequestsFailedDuringReplicaLoss != 0:
		t.Errorf("replica kills %d, restarts %d, requests failed during the loss %d", res.ReplicaKills, res.ReplicaRestarts, res.RequestsFailedDuringReplicaLoss)
	case res.ResidencyDenials == 0:
		t.Error("no residency denial: the embargoed tenants were not refused")
	case res.CrossRegionForwards == 0:
		t.Error("no cross-region forward: EU PHI entering in the US must be forwarded")
	case !(res.HitRate > 0 && res.HitRate < 1) || !(res.TTFTP50Ms > 0 && res.TTFTP95Ms >= res.TTFTP50Ms):
		t.Errorf("hit rate %v, TTFT p50 %v p95 %v", res.HitRate, res.TTFTP50Ms, res.TTFTP95Ms)
	}
	// Every cross-region forward and denial is in the audit log, and more
	// (forwarded_in records, the probes).
	if res.AuditRecords < res.CrossRegionForwards+res.ResidencyDenials {
		t.Errorf("%d audit records for %d forwards and %d denials", res.AuditRecords, res.CrossRegionForwards, res.ResidencyDenials)
	}
	for _, s := range []string{"traffic moved off us-west-2", "EU PHI entering us-west-2 is served in eu-west-1", "us-west-2 active again",
		"replica ctl-us-east-1-2 killed", "replica ctl-us-east-1-2 started again",
		"meridian audit verify --dir " + cfg.Dir} {
		if !strings.Contains(info.String(), s) {
			t.Errorf("the summary or the events lack %q", s)
		}
	}
	// The key file the summary names is the controllers' key: a tenant
	// search with it finds the EU health tenant's records.
	key, err := os.ReadFile(filepath.Join(cfg.Dir, "audit-hmac.key"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := audit.NewHasher(key)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := audit.NaiveQuery(filepath.Join(cfg.Dir, "audit"), audit.Query{Tenant: "eu-health"}, h)
	if err != nil || len(recs) == 0 {
		t.Errorf("audit records of tenant eu-health with the key file: %d, %v", len(recs), err)
	}
}

// noTrafficLine is one line of --no-traffic's output: the CA, a region's
// https URL, a region's Raft address, or a demo tenant's API key.
var noTrafficLine = regexp.MustCompile(`^(?:ca=(/\S+\.pem)|(us-east-1|us-west-2|eu-west-1)=(https://127\.0\.0\.1:[0-9]+)|raft\.(us-east-1|us-west-2|eu-west-1)=(127\.0\.0\.1:[0-9]+)|apikey\.([a-z0-9-]+)=(\S{43,}))$`)

// --no-traffic: the secure system a user talks to: the CA to trust, one
// https URL and one Raft address per region, one API key per demo tenant,
// and nothing else on the output; the controllers serve what the user sends
// with a key (no identity headers), and the status page shows the audit
// log's cross-region decisions.
func TestNoTrafficAndStatusPage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-region system")
	}
	cfg := DefaultConfig()
	cfg.NoTraffic, cfg.Duration = true, 0
	cfg.StatusAddr = "127.0.0.1:0"
	cfg.Dir = t.TempDir()
	var out, info syncBuffer
	cfg.Info = &info
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, cfg, &out)
		done <- err
	}()
	lastKey := fmt.Sprintf("apikey.embargoed-%d=", embargoedTenants)
	waitFor(t, 4*time.Minute, "the no-traffic lines", func() bool { return strings.Contains(out.String(), lastKey) })
	var caFile string
	urls, rafts, keys := map[string]string{}, map[string]string{}, map[string]string{}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	for _, l := range lines {
		m := noTrafficLine.FindStringSubmatch(l)
		switch {
		case m == nil:
			t.Fatalf("output line %q is none of ca=, REGION=URL, raft.REGION=ADDR, apikey.TENANT=KEY", l)
		case m[1] != "":
			caFile = m[1]
		case m[2] != "":
			urls[m[2]] = m[3]
		case m[4] != "":
			rafts[m[4]] = m[5]
		default:
			keys[m[6]] = m[7]
		}
	}
	if caFile == "" || len(urls) != 3 || len(rafts) != 3 || len(keys) != len(demoTenants()) {
		t.Fatalf("ca %q, %d regions, %d raft addresses, %d keys:\n%s", caFile, len(urls), len(rafts), len(keys), out.String())
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	for r, u := range urls {
		resp, err := hc.Get(u + "/healthz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s %s/healthz over https with the printed CA: %v %v", r, u, resp, err)
		}
		resp.Body.Close()
	}
	m := statusURLRe.FindStringSubmatch(info.String())
	if m == nil {
		t.Fatalf("no status page URL in %q", info.String())
	}
	status := m[1]
	code, ctype, page := get(t, status)
	if code != 200 || !strings.HasPrefix(ctype, "text/html") || !bytes.Contains(page, []byte("<title>Meridian demo</title>")) || !bytes.Contains(page, []byte("api/status")) {
		t.Fatalf("status page: %d %s %.200s", code, ctype, page)
	}
	if code, _, _ := get(t, status+"nope"); code != 404 {
		t.Fatalf("unknown path: %d", code)
	}

	// EU PHI sent by hand to us-east-1 is served in eu-west-1, and the
	// decision appears on the status page.
	body := `{"model":"meridian/sim-70b","max_tokens":2,"messages":[{"role":"user","content":"patient note"}]}`
	req, _ := http.NewRequest(http.MethodPost, urls["us-east-1"]+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+keys["eu-health"])
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Meridian-Region") != "eu-west-1" {
		t.Fatalf("EU PHI entering us-east-1: %d served in %q", resp.StatusCode, resp.Header.Get("X-Meridian-Region"))
	}
	var snap Snapshot
	waitFor(t, time.Minute, "the decision on the status page", func() bool {
		code, ctype, b := get(t, status+"api/status")
		if code != 200 || ctype != "application/json" || json.Unmarshal(b, &snap) != nil {
			return false
		}
		for _, d := range snap.Decisions {
			if d.Kind == "cross_region" && d.Origin == "us-east-1" && d.Region == "eu-west-1" && d.DataClass == "phi" && d.PolicyVersion != "" {
				return true
			}
		}
		return false
	})
	if len(snap.Regions) != 3 || len(snap.Regions[0].Pods) != cfg.PodsPerRegion || snap.Regions[1].State != "active" || !strings.HasSuffix(snap.Regions[2].MetricsURL, "/metrics") {
		t.Fatalf("status snapshot regions: %+v", snap.Regions)
	}
	mresp, err := hc.Get(snap.Regions[0].MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if mresp.StatusCode != 200 || !bytes.Contains(mb, []byte("meridian_router_cross_region_total")) {
		t.Fatalf("metrics URL %s: %d", snap.Regions[0].MetricsURL, mresp.StatusCode)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Count(out.String(), "\n") != len(lines) {
		t.Fatalf("more output than the no-traffic lines: %q", out.String())
	}
	if !strings.Contains(info.String(), "audit: ") || !strings.Contains(info.String(), "verified against the checkpoints") {
		t.Fatalf("no verified audit in the summary: %s", info.String())
	}
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/x", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Duration", func(c *Config) { c.Duration = -time.Second }},
		{"FailoverFor", func(c *Config) { c.FailoverFor = 0 }},
		{"FailoverRegion", func(c *Config) { c.FailoverRegion = "mars-1" }},
		{"FailoverAfter", func(c *Config) { c.Duration = 70 * time.Second }},
		{"Sessions", func(c *Config) { c.Sessions = 0 }},
		{"PodsPerRegion", func(c *Config) { c.PodsPerRegion = 0 }},
		{"CacheBlocks", func(c *Config) { c.CacheBlocks = 1 }},
		{"TimeScale", func(c *Config) { c.TimeScale = 0 }},
		{"Refresh", func(c *Config) { c.Refresh = time.Millisecond }},
		{"StatusAddr", func(c *Config) { c.StatusAddr = "7700" }},
		{"Dir", func(c *Config) { c.Dir = dir }},
		{"Dir", func(c *Config) { c.Dir = dir + "/x" }},
		{"Replicas", func(c *Config) { c.Replicas = 0 }},
		{"ReplicaDownFor", func(c *Config) { c.ReplicaDownFor = 0 }},
		{"ReplicaKillRegion", func(c *Config) { c.ReplicaKillRegion = "mars-1" }},
		{"ReplicaKillAfter", func(c *Config) { c.FailoverAfter, c.Duration = -1, 30*time.Second }},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v", tc.field, err)
		}
	}
	// No failover and no replica kill, or until interrupted: fine.
	c := DefaultConfig()
	c.FailoverAfter, c.ReplicaKillAfter, c.Duration = -1, -1, 10*time.Second
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	c = DefaultConfig()
	c.Duration = 0
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}
