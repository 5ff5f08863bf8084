package main

// The Helm chart half of the deploy checks: deploy/helm/meridian is rendered
// with the Helm SDK for every example region, and what it renders goes
// through the same checks as the kustomize manifests (the binary's CLI
// parses every invocation, the controller runs --check on the configuration
// the pod would read, probes and ports match the configuration, every
// MERIDIAN_* variable is read), plus the chart's own: ports, Services,
// ServiceMonitor and PrometheusRule against the binary and deploy/k8s.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

var helmChart = filepath.Join(deployRoot, "helm", "meridian")

// helmRegions are the example regions, each with values-<region>.yaml.
var helmRegions = []string{"us-east-1", "us-west-2", "eu-west-1"}

// renderChart renders the chart as `helm install meridian -n meridian` would
// with the values files (later ones win) and extra values, and returns the
// objects of every manifest.
func renderChart(t *testing.T, extra map[string]any, files ...string) ([]map[string]any, error) {
	t.Helper()
	ch, err := loader.Load(helmChart)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	for _, f := range files {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			t.Fatal(err)
		}
		vals = chartutil.CoalesceTables(v.AsMap(), vals)
	}
	vals = chartutil.CoalesceTables(extra, vals)
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "meridian", Namespace: "meridian", IsInstall: true, Revision: 1},
		chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Engine{Strict: true}.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	var objs []map[string]any
	for _, name := range slices.Sorted(maps.Keys(out)) {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, _helpers.tpl
		}
		dec := yaml.NewDecoder(strings.NewReader(out[name]))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", name, err, out[name])
			}
			if doc == nil {
				continue
			}
			if doc["apiVersion"] == nil || doc["kind"] == nil || asMap(doc["metadata"])["name"] == nil {
				return nil, fmt.Errorf("%s: a document without apiVersion, kind and metadata.name", name)
			}
			objs = append(objs, doc)
		}
	}
	return objs, nil
}

func findObject(objs []map[string]any, kind, name string) map[string]any {
	for _, o := range objs {
		if o["kind"] == kind && (name == "" || asMap(o["metadata"])["name"] == name) {
			return o
		}
	}
	return nil
}

// helmSecrets stand for the Secrets the chart reads and does not make.
func helmSecrets() map[string]map[string]map[string]string {
	return map[string]map[string]map[string]string{"helm/meridian": {
		"meridian-secrets": {
			"admin-token":    "helm-test-admin-token-of-32-bytes!",
			"gossip-key":     "aGVsbS10ZXN0LWdvc3NpcC1rZXktb2YtMzItYnl0ZXM=",
			"audit-hmac-key": "helm-test-audit-hmac-key-of-32-bytes",
		},
		"meridian-api-keys":       {"api-keys.yaml": "keys: []\n"},
		"meridian-controller-tls": {"tls.crt": "", "tls.key": "", "ca.crt": ""},
		"meridian-kafka-client":   {"ca.crt": "", "password": "helm-test-kafka-password"},
	}}
}

// renderedConfigMaps writes the rendered ConfigMaps' data to files, as
// renderKustomization does for kustomize's.
func renderedConfigMaps(t *testing.T, objs []map[string]any) map[string]map[string]string {
	cms := map[string]map[string]string{}
	for _, o := range objs {
		if o["kind"] != "ConfigMap" {
			continue
		}
		dir := t.TempDir()
		files := map[string]string{}
		for key, v := range asMap(o["data"]) {
			p := filepath.Join(dir, key)
			if err := os.WriteFile(p, []byte(fmt.Sprint(v)), 0o600); err != nil {
				t.Fatal(err)
			}
			files[key] = p
		}
		cms[fmt.Sprint(asMap(o["metadata"])["name"])] = files
	}
	return cms
}

// checkedConfig is what the chart's tests read of controller --check.
type checkedConfig struct {
	Region      string `yaml:"region"`
	Listen      string `yaml:"listen"`
	AdminListen string `yaml:"admin_listen"`
	Insecure    bool   `yaml:"insecure"`
	TLS         *struct {
		Cert, Key string
	} `yaml:"tls"`
	Auth struct {
		Mode string `yaml:"mode"`
	} `yaml:"auth"`
	Raft struct {
		Bind      string `yaml:"bind"`
		Bootstrap bool   `yaml:"bootstrap"`
	} `yaml:"raft"`
	Gossip struct {
		Bind string `yaml:"bind"`
	} `yaml:"gossip"`
}

func portOf(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("address %q: %v", addr, err)
	}
	return p
}

// TestHelmChartRegions renders the chart for each example region and runs
// the deploy checks on it: the controller invocation parses with this
// binary's CLI, --check accepts the configuration the pod mounts with the
// environment it gets, the probes reach /healthz and /readyz on the listen
// port over https, every container port and Service port is the port the
// configuration listens on, the controller is secure (TLS, API keys, not
// insecure), exactly one region bootstraps the Raft cluster, and the
// controller and the kv-bridge (kv-bridge --check on what it mounts)
// follow the engines' headless Service alike.
func TestHelmChartRegions(t *testing.T) {
	bootstraps := 0
	for _, region := range helmRegions {
		t.Run(region, func(t *testing.T) {
			objs, err := renderChart(t, nil, filepath.Join(helmChart, "values-"+region+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			tree := &k8sTree{base: deployRoot, assets: map[string]deployAsset{}, secrets: helmSecrets()}
			invs := tree.invocations(t, "helm "+region, "helm/meridian", objs, renderedConfigMaps(t, objs))
			if len(invs) != 2 {
				t.Fatalf("%d meridian containers rendered, want the controller and the kv-bridge", len(invs))
			}
			var inv invocation
			var res, bridge invocationResult
			for _, i := range invs {
				r := checkInvocation(t, i)
				for _, p := range r.problems {
					t.Error(p)
				}
				switch r.command {
				case "controller":
					inv, res = i, r
				case "kv-bridge":
					bridge = r
				}
			}
			if res.command != "controller" || res.configFile == "" || bridge.bridge == nil {
				t.Fatalf("the chart runs %q with config %q, and a kv-bridge with %+v", res.command, res.configFile, bridge.bridge)
			}
			// Both follow the engines' headless Service (as deploy/k8s
			// describes it) alike, and the bridge writes this region's topic.
			for _, p := range checkDiscovery("helm "+region, res.effective.Pods.Discovery.DNS, &bridge.bridge.Discovery.DNS,
				k8sServices(loadDeployAssets(t, deployRoot))) {
				t.Error(p)
			}
			if bridge.bridge.Region != region {
				t.Errorf("the kv-bridge's region is %q, want %q", bridge.bridge.Region, region)
			}
			// The effective configuration, as the controller sees it.
			app, out := quietApp()
			cfgFile, err := rewriteConfigPaths(t, res.configFile, inv.mounts)
			if err != nil {
				t.Fatal(err)
			}
			if err := app.Run(append(append([]string{"meridian"}, rewriteArgs(inv.mounts, inv.argv)...), "--config", cfgFile, "--check")); err != nil {
				t.Fatalf("controller --check: %v", err)
			}
			var cfg checkedConfig
			if err := yaml.Unmarshal(out.Bytes(), &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.Region != region {
				t.Errorf("region %q, want %q", cfg.Region, region)
			}
			if cfg.Raft.Bootstrap {
				bootstraps++
			}
			// Secure by default.
			if cfg.Insecure || cfg.TLS == nil || cfg.TLS.Cert == "" || cfg.Auth.Mode != "api_keys" {
				t.Errorf("not secure by default: insecure %v, tls %+v, auth mode %q", cfg.Insecure, cfg.TLS, cfg.Auth.Mode)
			}
			sts := findObject(objs, "StatefulSet", "")
			ps, _ := podSpec(sts)
			c := asMap(asList(ps["containers"])[0])
			for _, probe := range []string{"readinessProbe", "livenessProbe"} {
				if s := asMap(asMap(c[probe])["httpGet"])["scheme"]; s != "HTTPS" {
					t.Errorf("%s scheme %v, want HTTPS", probe, s)
				}
			}
			// Container ports are the ports the configuration listens on.
			wantPorts := map[string]string{"http": portOf(t, cfg.Listen), "admin": portOf(t, cfg.AdminListen),
				"raft": portOf(t, cfg.Raft.Bind), "gossip-tcp": portOf(t, cfg.Gossip.Bind), "gossip-udp": portOf(t, cfg.Gossip.Bind)}
			container := map[string]string{}
			for _, p := range asList(c["ports"]) {
				pm := asMap(p)
				container[fmt.Sprint(pm["name"])] = fmt.Sprint(pm["containerPort"])
			}
			if !reflect.DeepEqual(container, wantPorts) {
				t.Errorf("container ports %v, want %v (from the configuration)", container, wantPorts)
			}
			// Every Service's targetPort is a container port of that number.
			for _, o := range objs {
				if o["kind"] != "Service" {
					continue
				}
				for _, p := range asList(asMap(o["spec"])["ports"]) {
					pm := asMap(p)
					tp := fmt.Sprint(pm["targetPort"])
					if container[tp] != fmt.Sprint(pm["port"]) {
						t.Errorf("Service %v port %v -> %s: the container's %s is %q", asMap(o["metadata"])["name"], pm["port"], tp, tp, container[tp])
					}
				}
			}
			checkHelmMonitoring(t, objs, container)
			checkHelmPlacement(t, objs, region)
		})
	}
	if bootstraps != 1 {
		t.Errorf("%d example regions bootstrap the Raft cluster, want exactly one", bootstraps)
	}
}

// checkHelmMonitoring: the ServiceMonitor scrapes /metrics over https on
// the Service port that reaches the controller's listen port, as the job
// the alert rules select; the PrometheusRule is deploy/prometheus's rules,
// whose metrics the components register.
func checkHelmMonitoring(t *testing.T, objs []map[string]any, container map[string]string) {
	t.Helper()
	sm := findObject(objs, "ServiceMonitor", "")
	if sm == nil {
		t.Error("no ServiceMonitor")
		return
	}
	ep := asMap(asList(asMap(sm["spec"])["endpoints"])[0])
	if ep["path"] != "/metrics" || ep["scheme"] != "https" {
		t.Errorf("ServiceMonitor scrapes %v %v, want https /metrics", ep["scheme"], ep["path"])
	}
	svc := findObject(objs, "Service", "meridian-controller")
	found := false
	for _, p := range asList(asMap(svc["spec"])["ports"]) {
		if pm := asMap(p); pm["name"] == ep["port"] && container[fmt.Sprint(pm["targetPort"])] != "" {
			found = fmt.Sprint(pm["targetPort"]) == "http"
		}
	}
	if !found {
		t.Errorf("ServiceMonitor port %v is not the client Service's port to the controller's http port", ep["port"])
	}
	job := ""
	for _, r := range asList(ep["relabelings"]) {
		if rm := asMap(r); rm["targetLabel"] == "job" {
			job = fmt.Sprint(rm["replacement"])
		}
	}
	alerts, err := os.ReadFile(filepath.Join(deployRoot, "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(alerts), fmt.Sprintf(`job="%s"`, job)) {
		t.Errorf("ServiceMonitor labels the job %q, which the alert rules do not select", job)
	}
}

// checkHelmPlacement: the PDB and the anti-affinity select the
// controller's pods, which carry the region's label.
func checkHelmPlacement(t *testing.T, objs []map[string]any, region string) {
	t.Helper()
	sts := findObject(objs, "StatefulSet", "")
	tmplLabels := asMap(asMap(asMap(asMap(sts["spec"])["template"])["metadata"])["labels"])
	if tmplLabels["meridian.io/region"] != region {
		t.Errorf("pod label meridian.io/region = %v, want %s", tmplLabels["meridian.io/region"], region)
	}
	selects := func(sel map[string]any) bool {
		for k, v := range sel {
			if tmplLabels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	pdb := findObject(objs, "PodDisruptionBudget", "")
	if pdb == nil || !selects(asMap(asMap(asMap(pdb["spec"])["selector"])["matchLabels"])) {
		t.Errorf("the PodDisruptionBudget does not select the controller's pods: %v", pdb)
	}
	ps, _ := podSpec(sts)
	terms := asList(asMap(asMap(ps["affinity"])["podAntiAffinity"])["preferredDuringSchedulingIgnoredDuringExecution"])
	if len(terms) != 1 || !selects(asMap(asMap(asMap(asMap(terms[0])["podAffinityTerm"])["labelSelector"])["matchLabels"])) {
		t.Errorf("no soft anti-affinity over the controller's pods: %v", ps["affinity"])
	}
	if c := findObject(objs, "Certificate", ""); c == nil ||
		!slices.Contains(stringList(asMap(c["spec"])["uris"]), "spiffe://meridian/region/"+region+"/controller/"+region+"-0") {
		t.Errorf("no cert-manager Certificate with the controller's identity: %v", c)
	}
}

// TestHelmChartPrometheusRule: the PrometheusRule holds deploy/prometheus's
// rules (files/alerts.yaml is a copy kept equal, as Helm reads no file
// outside the chart), and every metric they select is registered by the
// components.
func TestHelmChartPrometheusRule(t *testing.T) {
	for copyPath, orig := range map[string]string{
		"files/alerts.yaml":           filepath.Join(deployRoot, "prometheus", "alerts.yaml"),
		"files/residency-policy.yaml": filepath.Join(deployRoot, "policies", "default.yaml"),
	} {
		a, err1 := os.ReadFile(filepath.Join(helmChart, copyPath))
		b, err2 := os.ReadFile(orig)
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("%s is not a copy of %s (%v %v): cp %s %s", copyPath, orig, err1, err2, orig, filepath.Join(helmChart, copyPath))
		}
	}
	objs, err := renderChart(t, nil, filepath.Join(helmChart, "values-us-east-1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pr := findObject(objs, "PrometheusRule", "")
	if pr == nil {
		t.Fatal("no PrometheusRule rendered for us-east-1")
	}
	uses, recorded, problems := ruleMetricUses("helm PrometheusRule", asMap(pr["spec"]))
	for _, p := range problems {
		t.Error(p)
	}
	if len(uses) < 30 {
		t.Fatalf("only %d metric uses in the PrometheusRule", len(uses))
	}
	for _, p := range checkMetricUses(openComponentMetrics(t), recorded, uses) {
		t.Error(p)
	}
	policy := findObject(objs, "ConfigMap", "meridian-controller-policy")
	def, _ := os.ReadFile(filepath.Join(deployRoot, "policies", "default.yaml"))
	if got := fmt.Sprint(asMap(policy["data"])["residency-policy.yaml"]); strings.TrimSpace(got) != strings.TrimSpace(string(def)) {
		t.Errorf("the default policy ConfigMap is not deploy/policies/default.yaml:\n%s", got)
	}
}

// TestHelmChartMirrorsKustomize: the chart's controller pod is the
// kustomize base's: same ports, probes, security contexts and mounts.
func TestHelmChartMirrorsKustomize(t *testing.T) {
	assets := loadDeployAssets(t, deployRoot)
	tree := &k8sTree{base: deployRoot, assets: map[string]deployAsset{}}
	for _, a := range assets {
		tree.assets[a.path] = a
	}
	base, _ := tree.renderKustomization(t, filepath.Join(deployRoot, "k8s", "base"))
	chart, err := renderChart(t, nil, filepath.Join(helmChart, "values-us-east-1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bps, _ := podSpec(findObject(base, "StatefulSet", ""))
	cps, _ := podSpec(findObject(chart, "StatefulSet", ""))
	bc, cc := asMap(asList(bps["containers"])[0]), asMap(asList(cps["containers"])[0])
	bc["volumeMounts"] = oneTLSMount(asList(bc["volumeMounts"]))
	for _, key := range []string{"ports", "readinessProbe", "livenessProbe", "securityContext", "volumeMounts", "resources"} {
		if !reflect.DeepEqual(bc[key], cc[key]) {
			t.Errorf("container %s differs from deploy/k8s/base:\n base  %v\n chart %v", key, bc[key], cc[key])
		}
	}
	for _, key := range []string{"securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken"} {
		if !reflect.DeepEqual(bps[key], cps[key]) {
			t.Errorf("pod %s differs from deploy/k8s/base:\n base  %v\n chart %v", key, bps[key], cps[key])
		}
	}
	// The Services expose the same ports under the same names.
	var bNames, cNames []string
	for _, objs := range []struct {
		objs []map[string]any
		into *[]string
	}{{base, &bNames}, {chart, &cNames}} {
		for _, o := range objs.objs {
			if o["kind"] != "Service" {
				continue
			}
			for _, p := range asList(asMap(o["spec"])["ports"]) {
				pm := asMap(p)
				*objs.into = append(*objs.into, fmt.Sprintf("%v/%v/%v", pm["name"], pm["port"], pm["protocol"]))
			}
		}
	}
	sort.Strings(bNames)
	sort.Strings(cNames)
	if !slices.Equal(bNames, cNames) {
		t.Errorf("Service ports differ from deploy/k8s/base:\n base  %v\n chart %v", bNames, cNames)
	}
}

// oneTLSMount turns the base's per-replica certificate mounts (tls-<n> at
// /etc/meridian/tls/<n>: its three replicas share one pod template) into
// the one mount of the chart's single controller, where the first was.
func oneTLSMount(mounts []any) []any {
	perReplica := regexp.MustCompile(`^tls-[0-9]+$`)
	var out []any
	seen := false
	for _, m := range mounts {
		if !perReplica.MatchString(fmt.Sprint(asMap(m)["name"])) {
			out = append(out, m)
			continue
		}
		if !seen {
			out = append(out, map[string]any{"name": "tls", "mountPath": "/etc/meridian/tls", "readOnly": true})
			seen = true
		}
	}
	return out
}

// TestHelmChartRefuses: a values file without what the controller needs
// (its engines' Service among it), or with more than one controller per
// region, fails to render and says why.
func TestHelmChartRefuses(t *testing.T) {
	east := filepath.Join(helmChart, "values-us-east-1.yaml")
	for _, tc := range []struct {
		extra map[string]any
		files []string
		want  string
	}{
		{nil, nil, "region is required"},
		{map[string]any{"replicas": 2}, []string{east}, "one controller per region"},
		{map[string]any{"region": "us-east-1"}, nil, "advertise.host is required"},
		{map[string]any{"region": "us-east-1", "advertise": map[string]any{"host": "h", "gossipAddress": "192.0.2.1:7947"},
			"discovery": map[string]any{"dns": map[string]any{"name": "vllm.inference.svc.cluster.local."}}}, nil, "kafka.brokers is required"},
		{map[string]any{"discovery": map[string]any{"dns": map[string]any{"name": ""}}}, []string{east}, "discovery.dns.name is required"},
	} {
		if _, err := renderChart(t, tc.extra, tc.files...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v %v: render error %v, want %q", tc.files, tc.extra, err, tc.want)
		}
	}
}
