package main

// The Helm chart half of the deploy checks: deploy/helm/meridian is rendered
// with the Helm SDK for every example region, and what it renders goes
// through the same checks as the kustomize manifests (the binary's CLI
// parses every invocation, the controller runs --check on the configuration
// the pod would read, probes and ports match the configuration, every
// MERIDIAN_* variable is read), for every replica's ordinal and pod IP,
// plus the chart's own: each replica's identity, certificate and advertised
// addresses, one Raft bootstrap, the PodDisruptionBudget and anti-affinity
// for any number of replicas, the shutdown budget, ports, Services,
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
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"

	"github.com/meridian-llm/meridian/global"
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

// helmSecrets stand for the Secrets the chart reads and does not make,
// and for those cert-manager writes for the Certificates it renders (a
// replica mounting a Secret no Certificate names finds nothing there).
func helmSecrets(objs []map[string]any) map[string]map[string]map[string]string {
	s := map[string]map[string]string{
		"meridian-secrets": {
			"admin-token":    "helm-test-admin-token-of-32-bytes!",
			"gossip-key":     "aGVsbS10ZXN0LWdvc3NpcC1rZXktb2YtMzItYnl0ZXM=",
			"audit-hmac-key": "helm-test-audit-hmac-key-of-32-bytes",
		},
		"meridian-api-keys":     {"api-keys.yaml": "keys: []\n"},
		"meridian-kafka-client": {"ca.crt": "", "password": "helm-test-kafka-password"},
	}
	for _, o := range objs {
		if o["kind"] == "Certificate" {
			s[fmt.Sprint(asMap(o["spec"])["secretName"])] = map[string]string{"tls.crt": "", "tls.key": "", "ca.crt": ""}
		}
	}
	return map[string]map[string]map[string]string{"helm/meridian": s}
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

// replicaConfig is what the chart's tests read of one replica's
// controller --check.
type replicaConfig struct {
	Region       string `yaml:"region"`
	ControllerID string `yaml:"controller_id"`
	Listen       string `yaml:"listen"`
	AdminListen  string `yaml:"admin_listen"`
	PublicURL    string `yaml:"public_url"`
	AdminURL     string `yaml:"admin_url"`
	Insecure     bool   `yaml:"insecure"`
	TLS          *struct {
		Cert     string `yaml:"cert"`
		Key      string `yaml:"key"`
		ClientCA string `yaml:"client_ca"`
	} `yaml:"tls"`
	Auth struct {
		Mode string `yaml:"mode"`
	} `yaml:"auth"`
	Raft struct {
		Bind            string   `yaml:"bind"`
		Advertise       string   `yaml:"advertise"`
		Bootstrap       bool     `yaml:"bootstrap"`
		Join            []string `yaml:"join"`
		Voters          int      `yaml:"voters"`
		VotersPerRegion int      `yaml:"voters_per_region"`
		WAN             bool     `yaml:"wan"`
	} `yaml:"raft"`
	Gossip struct {
		Bind      string `yaml:"bind"`
		Advertise string `yaml:"advertise"`
	} `yaml:"gossip"`
	Shutdown struct {
		DrainDelay time.Duration `yaml:"drain_delay"`
		Grace      time.Duration `yaml:"grace"`
	} `yaml:"shutdown"`
}

func portOf(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("address %q: %v", addr, err)
	}
	return p
}

// urlHostPort is the host:port of an http(s) URL.
func urlHostPort(u string) string {
	u = strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")
	hp, _, _ := strings.Cut(u, "/")
	return hp
}

// helmPodIP is the pod IP the tests give replica i.
func helmPodIP(i int) string { return fmt.Sprintf("10.0.0.%d", 10+i) }

// helmReplicas runs the chart's one controller invocation as each of the
// StatefulSet's replicas would (its ordinal in POD_INDEX, its own pod IP):
// the binary's CLI parses it, every MERIDIAN_* variable is read, --check
// accepts the configuration the pod mounts, the probes reach the listen
// port; and every other variable the container gets (but GOMEMLIMIT, the Go
// runtime's) changes the configuration. It returns each replica's
// effective configuration.
func helmReplicas(t *testing.T, where string, objs []map[string]any) []replicaConfig {
	t.Helper()
	tree := &k8sTree{base: deployRoot, assets: map[string]deployAsset{}, secrets: helmSecrets(objs)}
	invs := slices.DeleteFunc(tree.invocations(t, where, "helm/meridian", objs, renderedConfigMaps(t, objs)),
		func(inv invocation) bool { return subcommand(inv) != "controller" })
	if len(invs) != 1 {
		t.Fatalf("%d meridian controller containers rendered, want one", len(invs))
	}
	ps, _ := podSpec(findObject(objs, "StatefulSet", ""))
	n := atoi(fmt.Sprint(asMap(findObject(objs, "StatefulSet", "")["spec"])["replicas"]))
	if n < 1 {
		t.Fatalf("StatefulSet replicas %v", asMap(findObject(objs, "StatefulSet", "")["spec"])["replicas"])
	}
	var cfgs []replicaConfig
	for i := range n {
		inv := invs[0]
		inv.where = fmt.Sprintf("%s replica %d", inv.where, i)
		inv.env = maps.Clone(inv.env)
		if _, ok := inv.env["POD_INDEX"]; !ok {
			t.Fatalf("%s: the container has no POD_INDEX: the replicas would share one identity", inv.where)
		}
		inv.env["POD_INDEX"] = strconv.Itoa(i)
		if _, ok := inv.env["POD_IP"]; ok {
			inv.env["POD_IP"] = helmPodIP(i)
		}
		res := checkInvocation(t, inv)
		for _, p := range res.problems {
			t.Error(p)
		}
		if res.command != "controller" || res.configFile == "" {
			t.Fatalf("the chart runs %q with config %q", res.command, res.configFile)
		}
		// The effective configuration, as the controller sees it.
		cfgFile, err := rewriteConfigPaths(t, res.configFile, inv.mounts)
		if err != nil {
			t.Fatal(err)
		}
		check := func() (string, error) {
			app, out := quietApp()
			err := app.Run(append(append([]string{"meridian"}, rewriteArgs(inv.mounts, inv.argv)...), "--config", cfgFile, "--check"))
			return out.String(), err
		}
		full, err := check()
		if err != nil {
			t.Fatalf("%s: controller --check: %v", inv.where, err)
		}
		var cfg replicaConfig
		if err := yaml.Unmarshal([]byte(full), &cfg); err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, cfg)
		if i > 0 {
			continue
		}
		c := asMap(asList(ps["containers"])[0])
		for _, e := range asList(c["env"]) {
			name := fmt.Sprint(asMap(e)["name"])
			if strings.HasPrefix(name, "MERIDIAN_") || name == "GOMEMLIMIT" {
				continue // checkInvocation checks the first; the runtime reads the second
			}
			v := os.Getenv(name)
			os.Setenv(name, v+"9")
			changed, err := check()
			os.Setenv(name, v)
			if err == nil && changed == full {
				t.Errorf("%s: environment variable %s changes nothing in the controller's configuration", inv.where, name)
			}
		}
	}
	return cfgs
}

// subcommand is the meridian command an invocation runs (its first
// argument that is not a flag).
func subcommand(inv invocation) string {
	for _, a := range inv.argv {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}

// checkHelmBridge checks the chart's kv-bridge: its invocation parses and
// --check accepts what it mounts, it writes the region's topic, and it
// follows the engines' headless Service (as deploy/k8s describes it) as
// the controller (replica 0) does.
func checkHelmBridge(t *testing.T, where, region string, objs []map[string]any) {
	t.Helper()
	tree := &k8sTree{base: deployRoot, assets: map[string]deployAsset{}, secrets: helmSecrets(objs)}
	var ctl, bridge invocationResult
	for _, inv := range tree.invocations(t, where, "helm/meridian", objs, renderedConfigMaps(t, objs)) {
		if _, ok := inv.env["POD_INDEX"]; ok {
			inv.env = maps.Clone(inv.env)
			inv.env["POD_INDEX"] = "0"
			if _, ok := inv.env["POD_IP"]; ok {
				inv.env["POD_IP"] = helmPodIP(0)
			}
		}
		r := checkInvocation(t, inv)
		for _, p := range r.problems {
			t.Error(p)
		}
		switch r.command {
		case "controller":
			ctl = r
		case "kv-bridge":
			bridge = r
		}
	}
	if ctl.effective == nil || bridge.bridge == nil {
		t.Fatalf("%s: want a controller and a kv-bridge, got %q with %v and a kv-bridge with %+v", where, ctl.command, ctl.effective != nil, bridge.bridge)
	}
	for _, p := range checkDiscovery(where, ctl.effective.Pods.Discovery.DNS, &bridge.bridge.Discovery.DNS,
		k8sServices(loadDeployAssets(t, deployRoot))) {
		t.Error(p)
	}
	if bridge.bridge.Region != region {
		t.Errorf("%s: the kv-bridge's region is %q, want %q", where, bridge.bridge.Region, region)
	}
}

// helmAddressing is where the chart says the other regions reach this
// region and each replica.
type helmAddressing struct {
	region, host string
	// self returns the address replica i advertises for Raft and its
	// admin API, gossip the one for gossip.
	self, gossip func(i int) string
	bootstraps   bool // the region bootstraps the Raft cluster
}

// checkHelmReplicas checks each replica's effective configuration against
// what the chart renders: a controller id of its own (<region>-<ordinal>)
// matching the identity of the certificate its Secret holds; https and the
// ports the container and the Services expose; its own advertised
// addresses; one voter per region of three, over the WAN timing; Raft
// bootstrapped by replica 0 of the bootstrapping region only, every other
// replica joining through its own region's address first; secure by
// default; and a shutdown (preStop, drain delay, grace and a margin for
// the gossip leave and the Raft leadership transfer) within the pod's
// termination grace period. It returns the controller ids.
func checkHelmReplicas(t *testing.T, objs []map[string]any, cfgs []replicaConfig, a helmAddressing) (ids []string) {
	t.Helper()
	sts := findObject(objs, "StatefulSet", "")
	ps, _ := podSpec(sts)
	c := asMap(asList(ps["containers"])[0])
	container := map[string]string{}
	for _, p := range asList(c["ports"]) {
		pm := asMap(p)
		container[fmt.Sprint(pm["name"])] = fmt.Sprint(pm["containerPort"])
	}
	mountSecret := map[string]string{} // mount path -> Secret
	volSecret := map[string]string{}
	for _, v := range asList(ps["volumes"]) {
		if s := asMap(asMap(v)["secret"]); s != nil {
			volSecret[fmt.Sprint(asMap(v)["name"])] = fmt.Sprint(s["secretName"])
		}
	}
	for _, m := range asList(c["volumeMounts"]) {
		mm := asMap(m)
		if s, ok := volSecret[fmt.Sprint(mm["name"])]; ok {
			mountSecret[fmt.Sprint(mm["mountPath"])] = s
		}
	}
	identity := map[string][]string{} // Secret -> URI SANs of the Certificate writing it
	for _, o := range objs {
		if o["kind"] == "Certificate" {
			sp := asMap(o["spec"])
			identity[fmt.Sprint(sp["secretName"])] = stringList(sp["uris"])
		}
	}
	shutdown := atoi(fmt.Sprint(asMap(asMap(asMap(c["lifecycle"])["preStop"])["sleep"])["seconds"]))
	tgps := atoi(fmt.Sprint(ps["terminationGracePeriodSeconds"]))
	regionAdmin := "https://" + net.JoinHostPort(a.host, container["admin"])
	for i, cfg := range cfgs {
		who := fmt.Sprintf("%s replica %d", a.region, i)
		ids = append(ids, cfg.ControllerID)
		if want := fmt.Sprintf("%s-%d", a.region, i); cfg.ControllerID != want || cfg.Region != a.region {
			t.Errorf("%s: controller %q of region %q, want %q of %q", who, cfg.ControllerID, cfg.Region, want, a.region)
		}
		// Secure by default.
		if cfg.Insecure || cfg.TLS == nil || cfg.Auth.Mode != "api_keys" {
			t.Errorf("%s: not secure by default: insecure %v, tls %+v, auth mode %q", who, cfg.Insecure, cfg.TLS, cfg.Auth.Mode)
			continue
		}
		// Its certificate: the Secret mounted where its tls section
		// points, issued for its own identity.
		dir := fmt.Sprintf("/etc/meridian/tls/%d", i)
		for _, f := range []string{cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.ClientCA} {
			if filepath.Dir(f) != dir {
				t.Errorf("%s: tls file %s is not in %s, its own certificate's mount", who, f, dir)
			}
		}
		secret, ok := mountSecret[dir]
		wantURI := "spiffe://meridian/region/" + a.region + "/controller/" + cfg.ControllerID
		if !ok || !slices.Contains(identity[secret], wantURI) {
			t.Errorf("%s: %s mounts Secret %q (%v), whose Certificate names %v, want %s", who, dir, secret, ok, identity[secret], wantURI)
		}
		// Addresses: the region's for forwarding, its own for the rest.
		want := map[string]string{
			"public_url":       net.JoinHostPort(a.host, container["http"]),
			"admin_url":        net.JoinHostPort(a.self(i), container["admin"]),
			"raft.advertise":   net.JoinHostPort(a.self(i), container["raft"]),
			"gossip.advertise": a.gossip(i),
		}
		got := map[string]string{"public_url": urlHostPort(cfg.PublicURL), "admin_url": urlHostPort(cfg.AdminURL),
			"raft.advertise": cfg.Raft.Advertise, "gossip.advertise": cfg.Gossip.Advertise}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: advertises %v, want %v", who, got, want)
		}
		for _, u := range []string{cfg.PublicURL, cfg.AdminURL} {
			if !strings.HasPrefix(u, "https://") {
				t.Errorf("%s: %s is not https", who, u)
			}
		}
		// Raft: one voter per region of three, WAN timing; replica 0 of
		// the bootstrapping region bootstraps, the others join through
		// the region's own address first.
		vpr := cfg.Raft.VotersPerRegion
		if vpr == 0 {
			vpr = global.DefaultConfig().VotersPerRegion
		}
		if cfg.Raft.Voters != 3 || vpr != 1 || !cfg.Raft.WAN {
			t.Errorf("%s: raft voters %d, %d per region, wan %v; want 3, 1 per region, wan", who, cfg.Raft.Voters, vpr, cfg.Raft.WAN)
		}
		if wantBoot := a.bootstraps && i == 0; cfg.Raft.Bootstrap != wantBoot {
			t.Errorf("%s: raft bootstrap %v, want %v", who, cfg.Raft.Bootstrap, wantBoot)
		}
		if !cfg.Raft.Bootstrap && (len(cfg.Raft.Join) == 0 || cfg.Raft.Join[0] != regionAdmin) {
			t.Errorf("%s: raft join %v: want the region's own admin address %s first", who, cfg.Raft.Join, regionAdmin)
		}
		// The whole stop fits in the termination grace period.
		const margin = 5 * time.Second // gossip leave, Raft leadership transfer, audit seal
		if need := time.Duration(shutdown)*time.Second + cfg.Shutdown.DrainDelay + cfg.Shutdown.Grace + margin; time.Duration(tgps)*time.Second < need {
			t.Errorf("%s: terminationGracePeriodSeconds %d < preStop %ds + drain_delay %v + grace %v + %v",
				who, tgps, shutdown, cfg.Shutdown.DrainDelay, cfg.Shutdown.Grace, margin)
		}
	}
	return ids
}

// TestHelmChartRegions renders the chart for each example region and runs
// the deploy checks on every replica of it: the controller invocation
// parses with this binary's CLI, --check accepts the configuration the pod
// mounts with the environment it gets (its ordinal and pod IP), the probes
// reach /healthz and /readyz on the listen port over https, every container
// port and Service port is the port the configuration listens on, each
// replica has its own identity, certificate and addresses, the controllers
// are secure (TLS, API keys, not insecure), their ids are unique across the
// regions, exactly one controller of all bootstraps the Raft cluster, and
// the controller and the kv-bridge (kv-bridge --check on what it mounts)
// follow the engines' headless Service alike.
func TestHelmChartRegions(t *testing.T) {
	bootstraps, ids := 0, map[string]bool{}
	for _, region := range helmRegions {
		t.Run(region, func(t *testing.T) {
			values := filepath.Join(helmChart, "values-"+region+".yaml")
			objs, err := renderChart(t, nil, values)
			if err != nil {
				t.Fatal(err)
			}
			vals, err := chartutil.ReadValuesFile(values)
			if err != nil {
				t.Fatal(err)
			}
			cfgs := helmReplicas(t, "helm "+region, objs)
			checkHelmBridge(t, "helm "+region, region, objs)
			if len(cfgs) != 3 {
				t.Errorf("%d replicas, want 3 (as deploy/k8s)", len(cfgs))
			}
			host := fmt.Sprint(asMap(vals["advertise"])["host"])
			boot, _ := asMap(vals["raft"])["bootstrap"].(bool)
			self := func(i int) string { return helmPodIP(i) }
			for _, id := range checkHelmReplicas(t, objs, cfgs, helmAddressing{region: region, host: host, self: self,
				gossip: func(i int) string { return net.JoinHostPort(self(i), portOf(t, cfgs[0].Gossip.Bind)) }, bootstraps: boot}) {
				if ids[id] {
					t.Errorf("controller id %s twice", id)
				}
				ids[id] = true
			}
			for _, cfg := range cfgs {
				if cfg.Raft.Bootstrap {
					bootstraps++
				}
			}
			cfg := cfgs[0]
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
			checkHelmPlacement(t, objs, region, len(cfgs))
		})
	}
	if bootstraps != 1 {
		t.Errorf("%d controllers of the example regions bootstrap the Raft cluster, want exactly one", bootstraps)
	}
}

// TestHelmChartReplicas renders us-east-1 with 1, 2, 3 and 5 replicas and
// checks every replica as TestHelmChartRegions does, the
// PodDisruptionBudget (one replica at a time, never all) and the
// placement for each; and one replica advertised at the WAN Service
// instead of its pod IP.
func TestHelmChartReplicas(t *testing.T) {
	east := filepath.Join(helmChart, "values-us-east-1.yaml")
	const host = "meridian-us-east-1.example.internal"
	for _, tc := range []struct {
		name  string
		extra map[string]any
		n     int
		self  func(i int) string
	}{
		{"1", map[string]any{"replicas": 1}, 1, helmPodIP},
		{"2", map[string]any{"replicas": 2}, 2, helmPodIP},
		{"3", nil, 3, helmPodIP},
		{"5", map[string]any{"replicas": 5}, 5, helmPodIP},
		{"1 at the WAN Service", map[string]any{"replicas": 1,
			"advertise": map[string]any{"replicaAddress": "wanService", "gossipAddress": "192.0.2.11:7947"}}, 1,
			func(int) string { return host }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := renderChart(t, tc.extra, east)
			if err != nil {
				t.Fatal(err)
			}
			cfgs := helmReplicas(t, "helm us-east-1 x"+tc.name, objs)
			if len(cfgs) != tc.n {
				t.Fatalf("%d replicas, want %d", len(cfgs), tc.n)
			}
			gossip := func(i int) string { return net.JoinHostPort(tc.self(i), "7947") }
			if tc.self(0) == host {
				gossip = func(int) string { return "192.0.2.11:7947" }
			}
			checkHelmReplicas(t, objs, cfgs, helmAddressing{region: "us-east-1", host: host, self: tc.self, gossip: gossip, bootstraps: true})
			checkHelmPlacement(t, objs, "us-east-1", tc.n)
			if n := len(slices.DeleteFunc(slices.Clone(objs), func(o map[string]any) bool { return o["kind"] != "Certificate" })); n != tc.n {
				t.Errorf("%d Certificates for %d replicas", n, tc.n)
			}
		})
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

// checkHelmPlacement: the PodDisruptionBudget keeps all replicas but one
// up through voluntary disruptions (minAvailable n-1: 2 of 3 as
// deploy/k8s; one replica: maxUnavailable 1, as minAvailable 1 would block
// node drains for good), one replica per node (required anti-affinity)
// spread over the zones, rolled one at a time; each selects the
// controller's pods, which carry the region's label.
func checkHelmPlacement(t *testing.T, objs []map[string]any, region string, n int) {
	t.Helper()
	sts := findObject(objs, "StatefulSet", "")
	spec := asMap(sts["spec"])
	tmplLabels := asMap(asMap(asMap(spec["template"])["metadata"])["labels"])
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
	if atoi(fmt.Sprint(spec["replicas"])) != n || spec["podManagementPolicy"] != "OrderedReady" ||
		asMap(spec["updateStrategy"])["type"] != "RollingUpdate" {
		t.Errorf("StatefulSet replicas %v, podManagementPolicy %v, updateStrategy %v: want %d, OrderedReady, RollingUpdate",
			spec["replicas"], spec["podManagementPolicy"], spec["updateStrategy"], n)
	}
	pdb := findObject(objs, "PodDisruptionBudget", "")
	ps := asMap(pdb["spec"])
	if pdb == nil || !selects(asMap(asMap(ps["selector"])["matchLabels"])) {
		t.Errorf("the PodDisruptionBudget does not select the controller's pods: %v", pdb)
	}
	want := map[string]any{"minAvailable": n - 1}
	if n == 1 {
		want = map[string]any{"maxUnavailable": 1}
	}
	got := map[string]any{}
	for _, k := range []string{"minAvailable", "maxUnavailable"} {
		if v, ok := ps[k]; ok {
			got[k] = atoi(fmt.Sprint(v))
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PodDisruptionBudget %v with %d replicas, want %v", got, n, want)
	}
	pod, _ := podSpec(sts)
	terms := asList(asMap(asMap(pod["affinity"])["podAntiAffinity"])["requiredDuringSchedulingIgnoredDuringExecution"])
	if len(terms) != 1 || asMap(terms[0])["topologyKey"] != "kubernetes.io/hostname" || !selects(asMap(asMap(asMap(terms[0])["labelSelector"])["matchLabels"])) {
		t.Errorf("no required anti-affinity of the controller's pods per node: %v", pod["affinity"])
	}
	spread := asList(pod["topologySpreadConstraints"])
	if len(spread) != 1 || asMap(spread[0])["topologyKey"] != "topology.kubernetes.io/zone" || !selects(asMap(asMap(asMap(spread[0])["labelSelector"])["matchLabels"])) {
		t.Errorf("the controller's pods are not spread over the zones: %v", spread)
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

// withoutSelectors is v with every labelSelector replaced by a placeholder:
// the chart's select its release's pods, the base's every controller pod.
func withoutSelectors(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if k == "labelSelector" || k == "selector" {
				out[k] = "<the controller's pods>"
				continue
			}
			out[k] = withoutSelectors(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = withoutSelectors(e)
		}
		return out
	}
	return v
}

// TestHelmChartMirrorsKustomize: the chart's controllers are the kustomize
// base's: as many replicas, rolled and kept up alike, placed alike (one per
// node, over the zones), with the same ports, probes, preStop hook,
// security contexts, mounts (a certificate per replica) and downward-API
// variables.
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
	for _, key := range []string{"ports", "readinessProbe", "livenessProbe", "lifecycle", "securityContext", "volumeMounts", "resources"} {
		if !reflect.DeepEqual(bc[key], cc[key]) {
			t.Errorf("container %s differs from deploy/k8s/base:\n base  %v\n chart %v", key, bc[key], cc[key])
		}
	}
	env := func(c map[string]any) map[string]any {
		out := map[string]any{}
		for _, e := range asList(c["env"]) {
			if name := fmt.Sprint(asMap(e)["name"]); name == "POD_INDEX" || name == "POD_IP" || name == "GOMEMLIMIT" || name == "MERIDIAN_CA_CERT" {
				out[name] = e
			}
		}
		return out
	}
	if be, ce := env(bc), env(cc); len(be) != 4 || !reflect.DeepEqual(be, ce) {
		t.Errorf("container env differs from deploy/k8s/base:\n base  %v\n chart %v", be, ce)
	}
	for _, key := range []string{"securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken", "affinity", "topologySpreadConstraints"} {
		if b, c := withoutSelectors(bps[key]), withoutSelectors(cps[key]); !reflect.DeepEqual(b, c) {
			t.Errorf("pod %s differs from deploy/k8s/base:\n base  %v\n chart %v", key, b, c)
		}
	}
	bs, cs := asMap(findObject(base, "StatefulSet", "")["spec"]), asMap(findObject(chart, "StatefulSet", "")["spec"])
	for _, key := range []string{"replicas", "podManagementPolicy", "updateStrategy", "persistentVolumeClaimRetentionPolicy"} {
		if !reflect.DeepEqual(bs[key], cs[key]) {
			t.Errorf("StatefulSet %s differs from deploy/k8s/base:\n base  %v\n chart %v", key, bs[key], cs[key])
		}
	}
	if b, c := withoutSelectors(findObject(base, "PodDisruptionBudget", "")["spec"]), withoutSelectors(findObject(chart, "PodDisruptionBudget", "")["spec"]); !reflect.DeepEqual(b, c) {
		t.Errorf("PodDisruptionBudget differs from deploy/k8s/base:\n base  %v\n chart %v", b, c)
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

// TestHelmChartRefuses: values without what the controller needs, or that
// would run it wrong (no replica, replicas sharing one advertised address,
// a PodDisruptionBudget that blocks every drain), fail to render and say
// why.
func TestHelmChartRefuses(t *testing.T) {
	east := filepath.Join(helmChart, "values-us-east-1.yaml")
	for _, tc := range []struct {
		extra map[string]any
		files []string
		want  string
	}{
		{nil, nil, "region is required"},
		{map[string]any{"replicas": 0}, []string{east}, "replicas: 0: want at least 1"},
		{map[string]any{"replicas": 2, "advertise": map[string]any{"replicaAddress": "wanService", "gossipAddress": "192.0.2.1:7947"}},
			[]string{east}, "each replica needs an address of its own"},
		{map[string]any{"replicas": 1, "advertise": map[string]any{"replicaAddress": "wanService"}}, []string{east}, "advertise.gossipAddress is required"},
		{map[string]any{"advertise": map[string]any{"replicaAddress": "nodeIP"}}, []string{east}, `advertise.replicaAddress: "nodeIP"`},
		{map[string]any{"podDisruptionBudget": map[string]any{"minAvailable": 3}}, []string{east}, "minAvailable: 3 with 3 replicas: want 1..2"},
		{map[string]any{"podAntiAffinity": "always"}, []string{east}, `podAntiAffinity: "always"`},
		{map[string]any{"region": "us-east-1"}, nil, "advertise.host is required"},
		{map[string]any{"region": "us-east-1", "advertise": map[string]any{"host": "h"},
			"discovery": map[string]any{"dns": map[string]any{"name": "vllm.inference.svc.cluster.local."}}}, nil, "kafka.brokers is required"},
		{map[string]any{"discovery": map[string]any{"dns": map[string]any{"name": ""}}}, []string{east}, "discovery.dns.name is required"},
	} {
		if _, err := renderChart(t, tc.extra, tc.files...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v %v: render error %v, want %q", tc.files, tc.extra, err, tc.want)
		}
	}
}
