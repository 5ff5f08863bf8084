package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/auth"
)

// freshController opens one region's controller configured as in
// production (TLS, API keys, Raft, gossip, audit, a policy file) on an
// in-process Kafka-protocol broker, and returns it with an https client
// that trusts it. Nothing has been asked of it yet.
func freshController(t *testing.T) (*regional.Controller, *http.Client) {
	t.Helper()
	dir := t.TempDir()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	pki, err := identity.InitDevPKI(filepath.Join(dir, "pki"), []string{"us-east-1"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	policy, err := os.ReadFile(filepath.Join(deployRoot, "policies", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(dir, "policy.yaml")
	keysFile := filepath.Join(dir, "api-keys.yaml")
	_, digest, err := auth.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string]string{policyFile: string(policy),
		keysFile: "version: 1\nkeys:\n  - name: acme\n    sha256: " + digest + "\n    tenant: acme\n"} {
		if err := os.WriteFile(f, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	cfg := regional.DefaultConfig()
	cfg.Region, cfg.ControllerID = "us-east-1", pki.Controllers[0].Identity.ControllerID
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Kafka.Brokers = broker.ListenAddrs()
	cfg.PolicyFile = policyFile
	cfg.AdminToken = strings.Repeat("a", 32)
	cfg.TLS = &identity.TLSConfig{Cert: pki.Controllers[0].Cert, Key: pki.Controllers[0].Key, ClientCA: pki.CACert}
	ac := auth.DefaultConfig()
	ac.Mode, ac.APIKeys.File = auth.ModeAPIKeys, keysFile
	cfg.Auth = regional.AuthConfig{Config: ac}
	cfg.Raft = regional.RaftConfig{DataDir: filepath.Join(dir, "raft"), Bind: "127.0.0.1:0", Bootstrap: true}
	cfg.Gossip = regional.GossipConfig{Bind: "127.0.0.1:0", Keys: []string{base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))}, Fast: true}
	cfg.Audit = regional.AuditConfig{Dir: filepath.Join(dir, "audit"), HMACKey: strings.Repeat("h", 32)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctl, err := regional.Open(ctx, cfg, regional.Deps{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := ctl.Close(ctx); err != nil {
			t.Errorf("controller close: %v", err)
		}
	})
	ca, err := os.ReadFile(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	t.Cleanup(hc.CloseIdleConnections)
	return ctl, hc
}

// scrape GETs url's /metrics and parses the text exposition.
func scrape(t *testing.T, hc *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s/metrics: %v", url, err)
	}
	return mfs
}

// notAtStart are the controller metrics whose label values cannot be known
// before something happens, so a fresh controller has no series of them.
var notAtStart = map[string]string{
	"meridian_router_pod_inflight_requests":      "one series per pod, from its first announcement",
	"meridian_router_pod_pending_prefill_tokens": "one series per pod, from its first announcement",
	"meridian_router_pod_kv_utilization_ratio":   "one series per pod, from its first announcement",
	"meridian_router_pod_ejected":                "one series per pod, from its first announcement",
	"meridian_router_pod_routed_total":           "one series per pod, from its first announcement",
	"meridian_router_ttft_seconds":               "one series per pod, from its first answer",
	"meridian_ingest_last_event_age_seconds":     "one series per pod, from its first event",
	"meridian_gossip_region_live":                "one series per remote region, from when gossip first hears of it",
	"meridian_gossip_rtt_seconds":                "one series per remote region, from when gossip first hears of it",
	"meridian_gossip_summary_age_seconds":        "one series per remote region, from its first summary",
	"meridian_router_decisions_total":            "one series per (policy, reason), reasons named by the decision core as it decides",
}

// Labels Prometheus adds to every series of a target, or that a dashboard
// fills from a variable: a selector on them says nothing about the
// controller's own series.
var targetLabels = setOf("region", "instance", "job", "pod", "namespace", "__name__")

var (
	selectorRe = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
)

// selectorMatches reports whether one of mf's series satisfies the matchers
// (target labels ignored).
func selectorMatches(mf *dto.MetricFamily, matchers string) (bool, error) {
	type matcher struct {
		label, op string
		re        *regexp.Regexp
		value     string
	}
	var ms []matcher
	for _, m := range matcherRe.FindAllStringSubmatch(matchers, -1) {
		if targetLabels[m[1]] {
			continue
		}
		mt := matcher{label: m[1], op: m[2], value: m[3]}
		if mt.op == "=~" || mt.op == "!~" {
			re, err := regexp.Compile("^(?:" + mt.value + ")$")
			if err != nil {
				return false, err
			}
			mt.re = re
		}
		ms = append(ms, mt)
	}
	for _, series := range mf.Metric {
		labels := map[string]string{}
		for _, lp := range series.Label {
			labels[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for _, m := range ms {
			v := labels[m.label]
			switch m.op {
			case "=":
				ok = v == m.value
			case "!=":
				ok = v != m.value
			case "=~":
				ok = m.re.MatchString(v)
			case "!~":
				ok = !m.re.MatchString(v)
			}
			if !ok {
				break
			}
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// TestDeployMetricsExportedAtStart scrapes a controller that has served
// nothing: every controller metric an alert rule, a promtool test or the
// dashboard selects has a series already, and so has every label value a
// selector names (code=~"5..", result="error", state="failed"), so a
// counter's first increment is a rate Prometheus sees (an alert on it can
// fire) and no panel shows "No data" on a healthy cluster. notAtStart
// lists the metrics whose labels only events can tell.
func TestDeployMetricsExportedAtStart(t *testing.T) {
	uses, recorded, _, _, problems := metricAssets(t, deployRoot)
	for _, p := range problems {
		t.Error(p)
	}
	ctl, hc := freshController(t)
	mfs := scrape(t, hc, ctl.URL())
	family := func(name string) (*dto.MetricFamily, string) {
		if mf, ok := mfs[name]; ok {
			return mf, name
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok {
				if mf, ok := mfs[base]; ok && mf.GetType() == dto.MetricType_HISTOGRAM {
					return mf, base
				}
			}
		}
		base, _ := strings.CutSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_sum"), "_count"), "_bucket")
		return nil, base
	}
	problemsAt := map[string][]string{}
	seenExempt := map[string]bool{}
	for _, u := range uses {
		if prometheusSynthetic[u.name] || slices.Contains(recorded, u.name) || !strings.HasPrefix(u.name, "meridian_") ||
			strings.HasPrefix(u.name, "meridian_kvbridge_") {
			continue // Prometheus's own, recorded, the engines' (vllm:) or the bridge's
		}
		mf, base := family(u.name)
		if _, ok := notAtStart[base]; ok {
			seenExempt[base] = true
			continue
		}
		if mf == nil || len(mf.Metric) == 0 {
			problemsAt[u.name+" has no series"] = append(problemsAt[u.name+" has no series"], u.where)
			continue
		}
		for _, sel := range selectorRe.FindAllStringSubmatch(u.expr, -1) {
			if sel[1] != u.name {
				continue
			}
			ok, err := selectorMatches(mf, sel[2])
			if err != nil {
				t.Errorf("%s: %s{%s}: %v", u.where, sel[1], sel[2], err)
			}
			if !ok {
				key := fmt.Sprintf("no series of %s matches {%s}", u.name, sel[2])
				problemsAt[key] = append(problemsAt[key], u.where)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(problemsAt)) {
		t.Errorf("first scrape of a fresh controller: %s (used by %s)", k, strings.Join(problemsAt[k], "; "))
	}
	for name := range notAtStart {
		if !seenExempt[name] {
			t.Errorf("notAtStart lists %s, which no alert or panel uses: drop it", name)
		}
	}
	t.Logf("%d families on the first scrape", len(mfs))
}
