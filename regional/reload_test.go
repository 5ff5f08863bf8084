package regional

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
)

// reloadFixture is a controller without Raft, configured as in production
// (TLS, API keys, a policy file, an audit log, a static pod) from a YAML
// file that names its other files by relative paths, on an in-process
// Kafka-protocol broker.
type reloadFixture struct {
	t                *testing.T
	dir              string
	cfgFile          string
	pki              identity.PKIResult
	ctl              *Controller
	hc               *http.Client
	key1, key2       string // API keys of tenants acme and globex
	digest1, digest2 string
	brokers          string
	pod              string // the static pod's endpoint
	extraPod         string // another pod's endpoint
	watch            time.Duration
}

// The shipped default policy, and one that denies tenant acme everywhere.
const (
	reloadPolicyA = `version: 1
revision: stay-home
regions: [us-east-1, eu-west-1]
zones: {us: [us-east-1], eu: [eu-west-1]}
default: {allow: [origin]}
`
	reloadPolicyB = `version: 1
revision: acme-on-hold
regions: [us-east-1, eu-west-1]
zones: {us: [us-east-1], eu: [eu-west-1]}
rules:
  - name: acme-on-hold
    match: {tenant: acme}
    deny: [all]
default: {allow: [origin]}
`
)

func newReloadFixture(t *testing.T, watch time.Duration) *reloadFixture {
	t.Helper()
	f := &reloadFixture{t: t, dir: t.TempDir(), watch: watch}
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	f.brokers = broker.ListenAddrs()[0]
	if f.pki, err = identity.InitDevPKI(filepath.Join(f.dir, "tls"), []string{"us-east-1"}, identity.PKIOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(pod.Close)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(other.Close)
	f.pod, f.extraPod = pod.URL, other.URL
	f.key1, f.digest1, _ = auth.GenerateKey()
	f.key2, f.digest2, _ = auth.GenerateKey()
	f.write("keys.yaml", "version: 1\nkeys:\n  - {name: acme, tenant: acme, sha256: "+f.digest1+"}\n")
	f.write("policy.yaml", reloadPolicyA)
	f.cfgFile = filepath.Join(f.dir, "controller.yaml")
	f.writeConfig("")

	cfg, err := LoadConfig(f.cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if f.ctl, err = Open(ctx, cfg, Deps{Logger: slog.New(slog.DiscardHandler), ConfigFile: f.cfgFile}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = f.ctl.Close(ctx)
	})
	ca, err := os.ReadFile(f.pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	// No connection reuse: each request is a new handshake, so a rotated
	// certificate shows.
	f.hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}, DisableKeepAlives: true},
		Timeout: 10 * time.Second}
	return f
}

func (f *reloadFixture) write(name, text string) {
	f.t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p+".tmp", []byte(text), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		f.t.Fatal(err)
	}
}

// writeConfig writes the configuration file; extra is YAML appended to
// it (keys not otherwise set).
func (f *reloadFixture) writeConfig(extra string, pods ...string) {
	f.t.Helper()
	if len(pods) == 0 {
		pods = []string{"{name: pod-a, endpoint: " + f.pod + ", model: m}"}
	}
	f.write("controller.yaml", fmt.Sprintf(`region: us-east-1
controller_id: %s
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
kafka: {brokers: [%s]}
tls: {cert: tls/%s, key: tls/%s, client_ca: tls/ca.pem}
auth: {mode: api_keys, api_keys: {file: keys.yaml}}
policy_file: policy.yaml
audit: {dir: audit, hmac_key: %s}
models: [{name: m}]
pods:
  static: [%s]
reload: {watch_interval: %s}
`, f.pki.Controllers[0].Identity.ControllerID, f.brokers, filepath.Base(f.pki.Controllers[0].Cert), filepath.Base(f.pki.Controllers[0].Key),
		strings.Repeat("h", 32), strings.Join(pods, ", "), f.watch)+extra)
}

// route asks POST /v1/route with an API key: the status, the chosen pod
// or the refusal's rule, and the TLS serial the controller served.
func (f *reloadFixture) route(key string) (status int, podOrRule, serial string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.ctl.URL()+"/v1/route", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := f.hc.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	serial = resp.TLS.PeerCertificates[0].SerialNumber.String()
	if resp.StatusCode == http.StatusOK {
		var rr struct {
			Pod string `json:"pod"`
		}
		_ = json.Unmarshal(b, &rr)
		return resp.StatusCode, rr.Pod, serial
	}
	var e apiError
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Rule + e.Error.Code, serial
}

func (f *reloadFixture) reloads(result string) float64 {
	return testutil.ToFloat64(f.ctl.reload.m.reloads.WithLabelValues(result))
}

// adminRecords returns the admin_action records of the controller's audit
// log with one of the actions.
func (f *reloadFixture) adminRecords(actions ...string) []audit.AdminDetail {
	f.t.Helper()
	cur, err := f.ctl.Audit().Query(context.Background(), audit.Query{Kinds: []audit.Kind{audit.KindAdminAction}})
	if err != nil {
		f.t.Fatal(err)
	}
	defer cur.Close()
	var out []audit.AdminDetail
	for {
		r, err := cur.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			f.t.Fatal(err)
		}
		if d, ok := r.Admin(); ok && slices.Contains(actions, d.Action) {
			out = append(out, d)
		}
	}
}

// TestReload: SIGHUP's reload applies a new policy file, API keys file,
// decision section, static pods and TLS certificate together; an invalid
// part refuses the whole reload (the error says why; nothing changes);
// keys that cannot change live are named and wait for a restart; policy
// and key changes are in the audit log, and a change whose record cannot
// be written is not made.
func TestReload(t *testing.T) {
	f := newReloadFixture(t, 0)
	status, pod, serial0 := f.route(f.key1)
	if status != http.StatusOK || pod != "pod-a" {
		t.Fatalf("before any reload: %d %s", status, pod)
	}
	if status, _, _ := f.route(f.key2); status != http.StatusUnauthorized {
		t.Fatalf("a key not yet in the file: %d", status)
	}
	if res, err := f.ctl.Reload(context.Background(), "signal"); err != nil || len(res.Changed) != 0 || len(res.RestartPending) != 0 {
		t.Fatalf("reload of unchanged files: %+v, %v", res, err)
	}

	// Every part changes, but the policy file does not parse: nothing
	// changes.
	f.write("policy.yaml", reloadPolicyB+"rules: [oops\n")
	f.write("keys.yaml", "version: 1\nkeys:\n  - {name: globex, tenant: globex, sha256: "+f.digest2+"}\n")
	f.writeConfig("decision: {policy: round_robin}\n", "{name: pod-a, endpoint: "+f.pod+", model: m}", "{name: pod-b, endpoint: "+f.extraPod+", model: m}")
	ca, err := identity.LoadCA(f.pki.CACert, f.pki.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue(identity.CertRequest{Identity: f.pki.Controllers[0].Identity, Hosts: []string{"127.0.0.1"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	f.write("tls/"+filepath.Base(f.pki.Controllers[0].Key), string(key))
	f.write("tls/"+filepath.Base(f.pki.Controllers[0].Cert), string(cert))
	_, err = f.ctl.Reload(context.Background(), "signal")
	if err == nil || !strings.Contains(err.Error(), "policy_file") || !strings.Contains(err.Error(), "policy.yaml") {
		t.Fatalf("reload with a policy file that does not parse: %v", err)
	}
	if status, pod, serial := f.route(f.key1); status != http.StatusOK || pod != "pod-a" || serial != serial0 {
		t.Fatalf("after a refused reload: %d %s serial %s (was %s): something changed", status, pod, serial, serial0)
	}
	if status, _, _ := f.route(f.key2); status != http.StatusUnauthorized {
		t.Fatalf("after a refused reload the new keys are in use: %d", status)
	}
	if _, ok := f.ctl.Registry.Get("pod-b"); ok || f.ctl.Decider.Config().Policy != "ttft" {
		t.Fatal("after a refused reload the static pods or the decision section changed")
	}
	if f.reloads("error") != 1 || f.reloads("ok") != 1 {
		t.Fatalf("reloads ok %v error %v, want 1 and 1", f.reloads("ok"), f.reloads("error"))
	}
	if n := len(f.adminRecords(ActionPolicyReload, ActionAPIKeysReload)); n != 0 {
		t.Fatalf("%d reload records for a refused reload", n)
	}

	// The policy file fixed: everything changes at once.
	f.write("policy.yaml", reloadPolicyB)
	res, err := f.ctl.Reload(context.Background(), "signal")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(res.Changed)
	if want := []string{"api_keys", "decision", "pods.static", "policy", "tls"}; !slices.Equal(res.Changed, want) || len(res.RestartPending) != 0 {
		t.Fatalf("changed %v (want %v), restart pending %v", res.Changed, want, res.RestartPending)
	}
	status, rule, serial1 := f.route(f.key1)
	if status != http.StatusUnauthorized || serial1 == serial0 {
		t.Fatalf("the old key after the reload: %d %s, serial %s (was %s)", status, rule, serial1, serial0)
	}
	f.write("keys.yaml", "version: 1\nkeys:\n  - {name: acme, tenant: acme, sha256: "+f.digest1+"}\n  - {name: globex, tenant: globex, sha256: "+f.digest2+"}\n")
	if _, err := f.ctl.Reload(context.Background(), "signal"); err != nil {
		t.Fatal(err)
	}
	if status, rule, _ := f.route(f.key1); status != http.StatusUnavailableForLegalReasons || !strings.Contains(rule, "acme-on-hold") {
		t.Fatalf("acme under the new policy: %d %s", status, rule)
	}
	pods := map[string]bool{}
	for range 4 {
		status, pod, _ := f.route(f.key2)
		if status != http.StatusOK {
			t.Fatalf("globex: %d %s", status, pod)
		}
		pods[pod] = true
	}
	if !pods["pod-a"] || !pods["pod-b"] {
		t.Fatalf("round robin over the reloaded static pods visited %v", pods)
	}
	if v := f.ctl.control().View().Version; !strings.HasPrefix(v, "static/") || strings.Contains(v, "stay-home") {
		t.Fatalf("policy version in force %q", v)
	}
	recs := f.adminRecords(ActionPolicyReload, ActionAPIKeysReload)
	var actions []string
	for _, r := range recs {
		actions = append(actions, r.Action+"/"+r.Outcome)
		if r.Auth != audit.AuthInternal || !strings.HasPrefix(r.Actor, "controller:") || r.Args["sha256"] == "" {
			t.Errorf("record %+v", r)
		}
	}
	if want := []string{"policy_reload/applied", "api_keys_reload/applied", "api_keys_reload/applied"}; !slices.Equal(actions, want) {
		t.Fatalf("audit records %v, want %v", actions, want)
	}

	// A key that cannot change live: named, counted, and left for the
	// restart; the static pod removed leaves the registry.
	f.writeConfig("decision: {policy: round_robin}\nshutdown: {grace: 9s}\n")
	res, err = f.ctl.Reload(context.Background(), "signal")
	if err != nil || !slices.Equal(res.RestartPending, []string{"shutdown.grace"}) || !slices.Equal(res.Changed, []string{"pods.static"}) {
		t.Fatalf("restart-only key: %+v, %v", res, err)
	}
	if _, ok := f.ctl.Registry.Get("pod-b"); ok {
		t.Fatal("a static pod removed from the file is still registered")
	}
	if got := testutil.ToFloat64(f.ctl.reload.m.pending); got != 1 {
		t.Fatalf("meridian_config_restart_pending %v, want 1", got)
	}

	// The audit log cannot take the policy change's record: the change is
	// not made.
	if err := f.ctl.Audit().Close(); err == nil {
		t.Log("audit log closed")
	}
	f.write("policy.yaml", reloadPolicyA)
	_, err = f.ctl.Reload(context.Background(), "signal")
	var nr *audit.NotRecordedError
	if !errors.As(err, &nr) {
		t.Fatalf("policy reload with the audit log closed: %v", err)
	}
	if v := f.ctl.control().View().Version; strings.Contains(v, reloadPolicyID(t, reloadPolicyA)) {
		t.Fatalf("an unrecorded policy change was made: %s", v)
	}
}

func reloadPolicyID(t *testing.T, doc string) string {
	t.Helper()
	p, err := (Config{PolicyFile: writeTemp(t, doc)}).LoadPolicy()
	if err != nil {
		t.Fatal(err)
	}
	return p.ID()
}

func writeTemp(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReloadWatch: with reload.watch_interval set, a change of content of
// the configuration file or of a file it names reloads without a signal;
// a change that does not load is refused once and the old configuration
// stays, until the next change.
func TestReloadWatch(t *testing.T) {
	f := newReloadFixture(t, 100*time.Millisecond)
	waitReload := func(what string, done <-chan struct{}) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("no reload after %s", what)
		}
	}
	done := f.ctl.Reloaded()
	f.writeConfig("decision: {policy: least_loaded}\n")
	waitReload("a config change", done)
	if got := f.ctl.Decider.Config().Policy; got != "least_loaded" || f.reloads("ok") != 1 {
		t.Fatalf("after the watch saw the config change: policy %s, ok reloads %v", got, f.reloads("ok"))
	}

	done = f.ctl.Reloaded()
	f.writeConfig("decision: {policy: no-such-policy}\n")
	waitReload("an invalid config", done)
	if got := f.ctl.Decider.Config().Policy; got != "least_loaded" || f.reloads("error") != 1 {
		t.Fatalf("after an invalid config: policy %s, error reloads %v", got, f.reloads("error"))
	}

	done = f.ctl.Reloaded()
	f.writeConfig("decision: {policy: least_loaded}\n")
	waitReload("the config fixed", done)
	done = f.ctl.Reloaded()
	f.write("policy.yaml", reloadPolicyB)
	waitReload("a policy change", done)
	if status, rule, _ := f.route(f.key1); status != http.StatusUnavailableForLegalReasons || !strings.Contains(rule, "acme-on-hold") {
		t.Fatalf("after the watch saw the policy change: %d %s", status, rule)
	}
	if f.reloads("error") != 1 {
		t.Fatalf("the invalid config was reported %v times, want once", f.reloads("error"))
	}
}
