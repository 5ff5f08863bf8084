package main

// The tests in this file keep deploy/ honest without a cluster: every asset
// parses; every meridian invocation in the compose file and the Kubernetes
// manifests is parsed by this binary's own CLI (newApp) with its mounts and
// environment, and a controller or kv-bridge invocation is run with --check
// against the configuration file it would really read; every controller
// configuration loads with regional.LoadConfig (unknown keys are errors) and
// validates, every kv-bridge one with kvbridge.LoadConfig; every Kubernetes
// region follows its engines through a headless Service the manifests
// describe, its controllers and kv-bridge alike (checkDiscovery);
// every metric named by the alert rules, their promtool tests and the Grafana
// dashboard is registered by the real components (a controller on an
// in-process Kafka-protocol broker, a Raft node, an audit log, a gossip node
// and an engine simulator). The checks derive everything from the code at
// the time they run: a flag, config key or metric that exists only in an
// asset fails them, one the code adds later passes without touching this file.

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/auth"
	"github.com/meridian-llm/meridian/regional/kvbridge"
)

// deployRoot is deploy/ seen from this package's directory.
const deployRoot = "../../deploy"

// ---------------------------------------------------------------------------
// Asset inventory: every YAML file parses and is of a kind these tests check.

type assetKind string

const (
	kindCompose        assetKind = "compose file"
	kindK8s            assetKind = "kubernetes manifest"
	kindKustomization  assetKind = "kustomization"
	kindPromConfig     assetKind = "prometheus scrape config"
	kindPromRules      assetKind = "prometheus rules"
	kindPromRuleTests  assetKind = "promtool rule tests"
	kindGrafanaProv    assetKind = "grafana provisioning"
	kindControllerConf assetKind = "controller config"
	kindBridgeConf     assetKind = "kv-bridge config"
	kindPolicy         assetKind = "residency policy"
	kindAPIKeys        assetKind = "api keys file"
)

// yamlDocs decodes every document of a (multi-document) YAML file; empty
// documents are skipped, and each other one must be a mapping.
func yamlDocs(path string) ([]map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []map[string]any
	for i := 0; ; i++ {
		var v any
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return docs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if v == nil {
			continue
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: document %d is a %T, want a mapping", path, i, v)
		}
		docs = append(docs, m)
	}
}

// classify names the kind of one YAML document by its content, so that a new
// file is checked as what it is, and one of no known kind fails the test.
func classify(doc map[string]any) (assetKind, bool) {
	has := func(k string) bool { _, ok := doc[k]; return ok }
	apiVersion, _ := doc["apiVersion"].(string)
	switch {
	case has("services"):
		return kindCompose, true
	case strings.HasPrefix(apiVersion, "kustomize.config.k8s.io/"):
		return kindKustomization, true
	case apiVersion != "" && has("kind"):
		return kindK8s, true
	case has("apiVersion") && (has("datasources") || has("providers")):
		return kindGrafanaProv, true
	case has("scrape_configs"):
		return kindPromConfig, true
	case has("rule_files") && has("tests"):
		return kindPromRuleTests, true
	case has("groups"):
		return kindPromRules, true
	case has("zones") || (has("version") && has("regions")):
		return kindPolicy, true
	case has("brokers"):
		return kindBridgeConf, true // kvbridge.Config; a controller's brokers are under kafka
	case has("region") || has("kafka"):
		return kindControllerConf, true
	case has("keys") && len(doc) == 1:
		return kindAPIKeys, true
	}
	return "", false
}

// deployAssets maps every YAML file under deploy/ (relative, slash paths) to
// its documents and kind.
type deployAsset struct {
	path string // relative to deploy/
	docs []map[string]any
	kind assetKind
}

// readDeployAssets reads every YAML and JSON file under root and returns the
// YAML assets and the problems: a file that does not parse, or of no kind
// these tests check.
func readDeployAssets(root string) ([]deployAsset, []string, error) {
	var out []deployAsset
	var problems []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "helm" {
				return fs.SkipDir // templates, YAML once rendered: deploy_helm_test.go renders and checks them
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".json":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !json.Valid(b) {
				problems = append(problems, rel+": not valid JSON")
			}
		case ".yaml", ".yml":
			docs, err := yamlDocs(path)
			if err != nil {
				problems = append(problems, err.Error())
				return nil
			}
			if len(docs) == 0 {
				problems = append(problems, rel+": no YAML document")
				return nil
			}
			kind, ok := classify(docs[0])
			if !ok {
				problems = append(problems, rel+": not a kind of asset these tests check (teach classify about it)")
				return nil
			}
			for i, doc := range docs[1:] {
				if k, _ := classify(doc); k != kind {
					problems = append(problems, fmt.Sprintf("%s: document %d is a %s, document 0 a %s", rel, i+1, k, kind))
				}
			}
			out = append(out, deployAsset{path: rel, docs: docs, kind: kind})
		}
		return nil
	})
	return out, problems, err
}

func loadDeployAssets(t *testing.T, root string) []deployAsset {
	t.Helper()
	assets, problems, err := readDeployAssets(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	return assets
}

func TestDeployAssetsParse(t *testing.T) {
	assets := loadDeployAssets(t, deployRoot)
	seen := map[assetKind]int{}
	for _, a := range assets {
		seen[a.kind]++
	}
	// The issue asks for each of these; losing one is a regression.
	for _, k := range []assetKind{kindCompose, kindK8s, kindKustomization, kindPromConfig, kindPromRules,
		kindControllerConf, kindPolicy} {
		if seen[k] == 0 {
			t.Errorf("no %s under deploy/", k)
		}
	}
	t.Logf("assets: %v", seen)
}

// ---------------------------------------------------------------------------
// Dockerfile: builds the one binary the way the Makefile does.

func TestDeployDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/meridian", `ENTRYPOINT ["/meridian"]`, "USER 65532:65532",
		"gcr.io/distroless/static-debian12:nonroot"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// The final stage is the default build target: it must be the runtime image.
	froms := regexp.MustCompile(`(?m)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?`).FindAllStringSubmatch(df, -1)
	if len(froms) == 0 || !strings.Contains(froms[len(froms)-1][1], ":nonroot") {
		t.Errorf("last stage %v is not the distroless nonroot image", froms[len(froms)-1:])
	}
	// Every -X main.name=... names a package-level string variable of this
	// package (the linker ignores unknown ones silently).
	vars := mainStringVars(t)
	xs := regexp.MustCompile(`-X main\.(\w+)=`).FindAllStringSubmatch(df, -1)
	if len(xs) == 0 {
		t.Error("Dockerfile stamps no version (-X main.version=...)")
	}
	for _, x := range xs {
		if !vars[x[1]] {
			t.Errorf("Dockerfile sets -X main.%s, but package main has no string variable %s", x[1], x[1])
		}
	}
	// The builder's Go is at least go.mod's.
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(gomod))
	got := regexp.MustCompile(`golang:(\d+)\.(\d+)`).FindStringSubmatch(df)
	if want == nil || got == nil {
		t.Fatalf("go version: go.mod %v, Dockerfile %v", want, got)
	}
	if atoi(got[1])*1000+atoi(got[2]) < atoi(want[1])*1000+atoi(want[2]) {
		t.Errorf("Dockerfile builds with golang:%s.%s, go.mod wants go %s.%s", got[1], got[2], want[1], want[2])
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// mainStringVars lists the package-level string variables of package main.
func mainStringVars(t *testing.T) map[string]bool {
	t.Helper()
	pkg, err := build.ImportDir(".", 0) // the files a build of main compiles
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					isString := false
					if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "string" {
						isString = true
					} else if vs.Type == nil && i < len(vs.Values) {
						lit, ok := vs.Values[i].(*ast.BasicLit)
						isString = ok && lit.Kind == token.STRING
					}
					if isString {
						vars[n.Name] = true
					}
				}
			}
		}
	}
	return vars
}

// ---------------------------------------------------------------------------
// Invocations: meridian as the compose file and the manifests run it.

// invocation is one way an asset runs the binary.
type invocation struct {
	where  string            // asset and service/container
	argv   []string          // after the program name
	env    map[string]string // the container's environment
	mounts map[string]string // container path -> local file or directory
	// probes are the HTTP paths and ports the asset checks the process
	// with ("healthcheck" or "readiness"/"liveness" -> "port path").
	probes map[string]string
	// group is the deployment the invocation belongs to (a compose file,
	// or all Kubernetes regions): exactly one controller of a group
	// bootstraps the Raft cluster.
	group string
	// services are the compose file's service names, the hosts its
	// controllers may dial; nil outside compose.
	services map[string]bool
	// unit is the Kubernetes deployment of one region the invocation is
	// part of (a kustomize root, or the chart for one region): its
	// controllers and kv-bridge follow the same engines.
	unit string
}

// cliEnvVars lists the environment variables some flag of the CLI reads.
func cliEnvVars(app *cli.App) map[string]bool {
	out := map[string]bool{}
	var walk func(flags []cli.Flag, cmds []*cli.Command)
	walk = func(flags []cli.Flag, cmds []*cli.Command) {
		for _, f := range flags {
			if e, ok := f.(interface{ GetEnvVars() []string }); ok {
				for _, v := range e.GetEnvVars() {
					out[v] = true
				}
			}
		}
		for _, c := range cmds {
			walk(c.Flags, c.Subcommands)
		}
	}
	walk(app.Flags, app.Commands)
	return out
}

// stubActions replaces every command's Action with a recorder, so that Run
// only parses (flags, values, environment) and reports what it resolved.
func stubActions(cmds []*cli.Command, prefix string, record func(path string, c *cli.Context) error) {
	for _, c := range cmds {
		path := strings.TrimSpace(prefix + " " + c.Name)
		if c.Action != nil && len(c.Subcommands) == 0 { // a group's action is a usage error
			c.Action = func(ctx *cli.Context) error { return record(path, ctx) }
		}
		c.Before, c.After = nil, nil
		stubActions(c.Subcommands, path, record)
	}
}

// rewritePath maps a container path to the local file it is mounted from.
func rewritePath(mounts map[string]string, p string) string {
	best := ""
	for dst := range mounts {
		if (p == dst || strings.HasPrefix(p, strings.TrimSuffix(dst, "/")+"/")) && len(dst) > len(best) {
			best = dst
		}
	}
	if best == "" {
		return p
	}
	return filepath.Join(mounts[best], strings.TrimPrefix(p, best))
}

func rewriteArgs(mounts map[string]string, argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "-") {
			out[i] = name + "=" + rewritePath(mounts, val)
		} else {
			out[i] = rewritePath(mounts, a)
		}
	}
	return out
}

// setInvocationEnv gives the process the container's variables (the
// binary's flags read the MERIDIAN_* ones; a controller's configuration
// file may name any, as ${VAR}) and none of the test's own MERIDIAN_*.
func setInvocationEnv(t *testing.T, inv invocation) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MERIDIAN_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	for k, v := range inv.env {
		t.Setenv(k, rewritePath(inv.mounts, v))
	}
}

func quietApp() (*cli.App, *bytes.Buffer) {
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	app.ExitErrHandler = func(*cli.Context, error) {}
	return app, &out
}

// effectiveConfig is the part of `controller --check`'s output that the
// cross-asset checks read.
type effectiveConfig struct {
	Listen    string                     `yaml:"listen"`
	PublicURL string                     `yaml:"public_url"`
	AdminURL  string                     `yaml:"admin_url"`
	Kafka     struct{ Brokers []string } `yaml:"kafka"`
	Raft      struct {
		DataDir   string   `yaml:"data_dir"`
		Advertise string   `yaml:"advertise"`
		Bootstrap bool     `yaml:"bootstrap"`
		Join      []string `yaml:"join"`
	} `yaml:"raft"`
	Gossip struct {
		Advertise string   `yaml:"advertise"`
		Join      []string `yaml:"join"`
	} `yaml:"gossip"`
	Pods struct {
		Discovery struct {
			DNS dnsDiscovery `yaml:"dns"`
		} `yaml:"discovery"`
	} `yaml:"pods"`
}

// dnsDiscovery is the part of a discovery section (regional/discovery's
// DNSConfig, a controller's pods.discovery.dns and the bridge's
// discovery.dns) the cross-asset checks read.
type dnsDiscovery struct {
	Name         string `yaml:"name"`
	Lookup       string `yaml:"lookup"`
	Service      string `yaml:"service"`
	Proto        string `yaml:"proto"`
	Port         int    `yaml:"port"`
	Network      string `yaml:"network"`
	Scheme       string `yaml:"scheme"`
	NameFrom     string `yaml:"name_from"`
	NamePrefix   string `yaml:"name_prefix"`
	Model        string `yaml:"model"`
	Profile      string `yaml:"profile"`
	KVEventsPort int    `yaml:"kv_events_port"`
	ReplayPort   int    `yaml:"replay_port"`
}

// bridgeEffective is the part of `kv-bridge --check`'s output that the
// cross-asset checks read.
type bridgeEffective struct {
	Region      string `yaml:"region"`
	MetricsAddr string `yaml:"metrics_addr"`
	Discovery   struct {
		DNS dnsDiscovery `yaml:"dns"`
	} `yaml:"discovery"`
}

// invocationResult is what checkInvocation found.
type invocationResult struct {
	problems   []string
	command    string           // the resolved command path, e.g. "policy validate"
	configFile string           // the controller's or kv-bridge's --config, as a local path
	effective  *effectiveConfig // the controller's configuration after --check
	bridge     *bridgeEffective // the kv-bridge's configuration after --check
}

// rewriteConfigPaths copies a configuration file with every absolute path
// in it (policy_file, data directories, model directories) mapped to what
// the container mounts there, and returns the copy's path.
func rewriteConfigPaths(t *testing.T, path string, mounts map[string]string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return "", err
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.HasPrefix(n.Value, "/") {
			// Absolute: the copy is elsewhere, and relative paths in a
			// configuration are relative to its own directory.
			if abs, err := filepath.Abs(rewritePath(mounts, n.Value)); err == nil {
				n.Value = abs
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return "", err
	}
	p := filepath.Join(t.TempDir(), filepath.Base(path))
	return p, os.WriteFile(p, out, 0o600)
}

// checkInvocation returns what is wrong with one invocation: an unknown
// command or flag, a bad flag value, a flag after a positional argument
// (not parsed as a flag), an environment variable the binary does not read,
// a controller configuration that --check rejects (paths inside it are
// mapped through the mounts too), an engine-sim configuration that does not
// validate, or a probe that does not reach the controller's HTTP server.
func checkInvocation(t *testing.T, inv invocation) invocationResult {
	var res invocationResult
	bad := func(format string, args ...any) {
		res.problems = append(res.problems, inv.where+": "+fmt.Sprintf(format, args...))
	}
	if len(inv.argv) == 0 {
		bad("runs meridian with no command (it would print the help and exit)")
		return res
	}
	setInvocationEnv(t, inv)
	argv := rewriteArgs(inv.mounts, inv.argv)

	// 1. Parse with the CLI's own definitions.
	app, out := quietApp()
	stubActions(app.Commands, "", func(path string, c *cli.Context) error {
		res.command = path
		for _, a := range c.Args().Slice() {
			if strings.HasPrefix(a, "-") && a != "-" {
				return fmt.Errorf("%q comes after a positional argument, so it is not parsed as a flag", a)
			}
		}
		switch path {
		case "engine-sim":
			cfg, err := engineSimConfig(c)
			if err != nil {
				return err
			}
			return cfg.Validate()
		case "controller", "kv-bridge":
			res.configFile = c.String("config")
		}
		return nil
	})
	if err := app.Run(append([]string{"meridian"}, argv...)); err != nil {
		bad("meridian %s: %v", strings.Join(inv.argv, " "), err)
		return res
	}
	if res.command == "" {
		bad("meridian %s names no command with an action (output: %.200s)", strings.Join(inv.argv, " "), out.String())
		return res
	}

	// 2. Every MERIDIAN_* variable is read: by a flag, or (for the
	// controller) by the configuration, which then differs without it.
	flagEnv := cliEnvVars(newApp())
	var unread []string
	for k := range inv.env {
		if strings.HasPrefix(k, "MERIDIAN_") && !flagEnv[k] {
			unread = append(unread, k)
		}
	}
	sort.Strings(unread)
	if len(unread) > 0 && res.command != "controller" {
		bad("environment variables %v are read by no flag of %q", unread, res.command)
	}

	// 3. Run what can run here for real.
	switch res.command {
	case "controller":
		checkArgs := append([]string{"meridian"}, argv...)
		if res.configFile != "" {
			cfg, err := rewriteConfigPaths(t, res.configFile, inv.mounts)
			if err != nil {
				bad("config %s: %v", res.configFile, err)
				return res
			}
			checkArgs = append(checkArgs, "--config", cfg) // the last --config wins
		}
		checkArgs = append(checkArgs, "--check")
		check := func() (string, error) {
			app, out := quietApp()
			err := app.Run(checkArgs)
			return out.String(), err
		}
		full, err := check()
		if err != nil {
			bad("meridian %s --check: %v", strings.Join(inv.argv, " "), err)
			return res
		}
		for _, k := range unread {
			v := os.Getenv(k)
			os.Unsetenv(k)
			without, err := check()
			os.Setenv(k, v)
			if err == nil && without == full {
				bad("environment variable %s is read by no flag and changes nothing in the controller's configuration", k)
			}
		}
		res.effective = &effectiveConfig{}
		if err := yaml.Unmarshal([]byte(full), res.effective); err != nil {
			bad("effective configuration: %v", err)
			return res
		}
		_, port, err := net.SplitHostPort(res.effective.Listen)
		if err != nil {
			bad("listen %q: %v", res.effective.Listen, err)
		}
		// Probes are wired to the controller's HTTP server: liveness and
		// compose healthchecks to /healthz, readiness to /readyz.
		wantPath := map[string]string{"healthcheck": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}
		for _, kind := range []string{"healthcheck", "liveness", "readiness"} {
			if got, ok := inv.probes[kind]; ok && got != port+" "+wantPath[kind] {
				bad("%s probe is %q, want %q (the controller listens on %s)", kind, got, port+" "+wantPath[kind], res.effective.Listen)
			}
		}
		_, hc := inv.probes["healthcheck"]
		_, ready := inv.probes["readiness"]
		_, live := inv.probes["liveness"]
		if !hc && !(ready && live) {
			bad("controller without a healthcheck, or without readiness and liveness probes")
		}
	case "kv-bridge":
		checkArgs := append([]string{"meridian"}, argv...)
		if res.configFile != "" {
			cfg, err := rewriteConfigPaths(t, res.configFile, inv.mounts)
			if err != nil {
				bad("config %s: %v", res.configFile, err)
				return res
			}
			checkArgs = append(checkArgs, "--config", cfg)
		}
		app, out := quietApp()
		if err := app.Run(append(checkArgs, "--check")); err != nil {
			bad("meridian %s --check: %v", strings.Join(inv.argv, " "), err)
			return res
		}
		res.bridge = &bridgeEffective{}
		if err := yaml.Unmarshal(out.Bytes(), res.bridge); err != nil {
			bad("effective kv-bridge configuration: %v", err)
			return res
		}
		// Probes reach the bridge's /healthz and /readyz on its metrics
		// address (without one, it serves none).
		_, port, err := net.SplitHostPort(res.bridge.MetricsAddr)
		if len(inv.probes) > 0 && err != nil {
			bad("probes %v, but metrics_addr %q serves none", inv.probes, res.bridge.MetricsAddr)
		}
		wantPath := map[string]string{"healthcheck": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}
		for kind, got := range inv.probes {
			if err == nil && got != port+" "+wantPath[kind] {
				bad("%s probe is %q, want %q (the bridge serves on %s)", kind, got, port+" "+wantPath[kind], res.bridge.MetricsAddr)
			}
		}
	case "policy validate":
		app, out := quietApp()
		if err := app.Run(append([]string{"meridian"}, argv...)); err != nil {
			bad("meridian %s: %v\n%s", strings.Join(inv.argv, " "), err, out)
		}
	}
	return res
}

// hostOf returns the host of "http://host:port/..." or "host:port".
func hostOf(addr string) string {
	addr = strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://")
	addr, _, _ = strings.Cut(addr, "/")
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// peerHosts lists every host a controller configuration dials or
// advertises.
func (e *effectiveConfig) peerHosts() []string {
	var addrs []string
	addrs = append(addrs, e.Kafka.Brokers...)
	addrs = append(addrs, e.PublicURL, e.AdminURL, e.Raft.Advertise, e.Gossip.Advertise)
	addrs = append(addrs, e.Raft.Join...)
	addrs = append(addrs, e.Gossip.Join...)
	var hosts []string
	for _, a := range addrs {
		if h := hostOf(a); h != "" && net.ParseIP(h) == nil {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// --- compose ---

func composeInvocations(t *testing.T, path string, doc map[string]any) []invocation {
	t.Helper()
	dir := filepath.Dir(path)
	secrets := map[string]string{}
	if s, ok := doc["secrets"].(map[string]any); ok {
		for name, v := range s {
			if m, ok := v.(map[string]any); ok {
				if f, ok := m["file"].(string); ok {
					secrets[name] = filepath.Join(dir, f)
				}
			}
		}
	}
	services, _ := doc["services"].(map[string]any)
	names := make([]string, 0, len(services))
	serviceSet := map[string]bool{}
	for n, v := range services {
		names = append(names, n)
		serviceSet[n] = true
		// A network alias is a name the service is reached by too (a
		// region's address over its replicas).
		for _, net := range asMap(asMap(v)["networks"]) {
			for _, a := range stringList(asMap(net)["aliases"]) {
				serviceSet[a] = true
			}
		}
	}
	sort.Strings(names)
	var out []invocation
	for _, name := range names {
		svc, _ := services[name].(map[string]any)
		for _, v := range asList(svc["volumes"]) {
			src, _, _ := strings.Cut(fmt.Sprint(v), ":")
			if m, ok := v.(map[string]any); ok {
				src = fmt.Sprint(m["source"])
			}
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
					// Docker would create an empty directory in its place.
					t.Errorf("%s: service %s: bind mount source %s: %v", path, name, src, err)
				}
			}
		}
		image, _ := svc["image"].(string)
		if !isMeridianImage(image) {
			continue
		}
		inv := invocation{where: fmt.Sprintf("%s: service %s", path, name), env: map[string]string{},
			mounts: map[string]string{}, probes: map[string]string{}, group: path, services: serviceSet}
		if ep := stringList(svc["entrypoint"]); len(ep) == 2 && filepath.Base(ep[0]) == "sh" && ep[1] == "-c" {
			// A shell script (the debug image's busybox): check the
			// meridian command it runs.
			argv, ok := meridianInScript(strings.Join(stringList(svc["command"]), "\n"))
			if !ok {
				t.Errorf("%s: shell entrypoint whose script runs no /meridian command", inv.where)
				continue
			}
			inv.argv = argv
		} else if len(ep) > 0 {
			if filepath.Base(ep[0]) != "meridian" {
				t.Errorf("%s: entrypoint %v does not run meridian", inv.where, ep)
				continue
			}
			inv.argv = append(inv.argv, ep[1:]...)
		}
		if len(inv.argv) == 0 || len(stringList(svc["entrypoint"])) != 2 {
			inv.argv = append(inv.argv, stringList(svc["command"])...)
		}
		for _, f := range stringList(svc["env_file"]) {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Errorf("%s: env_file: %v", inv.where, err)
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
					k, v, _ := strings.Cut(line, "=")
					inv.env[k] = v
				}
			}
		}
		switch env := svc["environment"].(type) {
		case map[string]any:
			for k, v := range env {
				inv.env[k] = fmt.Sprint(v)
			}
		case []any:
			for _, kv := range env {
				k, v, _ := strings.Cut(fmt.Sprint(kv), "=")
				inv.env[k] = v
			}
		}
		for _, v := range asList(svc["volumes"]) {
			var src, dst string
			switch v := v.(type) {
			case string:
				parts := strings.Split(v, ":")
				if len(parts) < 2 {
					continue
				}
				src, dst = parts[0], parts[1]
			case map[string]any:
				src, _ = v["source"].(string)
				dst, _ = v["target"].(string)
			}
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				inv.mounts[dst] = filepath.Join(dir, src)
			} else {
				inv.mounts[dst] = t.TempDir() // a named volume
			}
		}
		for _, s := range asList(svc["secrets"]) {
			name, target := "", ""
			switch s := s.(type) {
			case string:
				name, target = s, s
			case map[string]any:
				name, _ = s["source"].(string)
				target, _ = s["target"].(string)
				if target == "" {
					target = name
				}
			}
			file, ok := secrets[name]
			if !ok {
				t.Errorf("%s: secret %q is not declared at the top level", inv.where, name)
				continue
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: secret %s: %v", inv.where, name, err)
			}
			inv.mounts["/run/secrets/"+target] = file
		}
		if hc, ok := svc["healthcheck"].(map[string]any); ok && hc["disable"] != true {
			test := stringList(hc["test"])
			if u := urlIn(test); u != "" {
				inv.probes["healthcheck"] = u
			}
			if len(test) > 1 && test[0] == "CMD" && filepath.Base(test[1]) == "meridian" {
				out = append(out, invocation{where: inv.where + " healthcheck", argv: test[2:], env: inv.env, mounts: inv.mounts})
			}
		}
		out = append(out, inv)
	}
	return out
}

func isMeridianImage(image string) bool {
	name := image
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	name, _, _ = strings.Cut(name, ":")
	name, _, _ = strings.Cut(name, "@")
	return name == "meridian"
}

// meridianInScript returns the arguments of the first /meridian command of
// a shell script (continuation lines joined, up to the end of the line or a
// shell operator).
func meridianInScript(script string) ([]string, bool) {
	script = strings.ReplaceAll(script, "\\\n", " ")
	_, rest, ok := strings.Cut(script, "/meridian ")
	if !ok {
		return nil, false
	}
	rest, _, _ = strings.Cut(rest, "\n")
	for _, op := range []string{"&&", "||", ";", "|"} {
		rest, _, _ = strings.Cut(rest, op)
	}
	return strings.Fields(rest), true
}

// urlIn returns "port path" of the first http(s)://host:port/path argument.
func urlIn(args []string) string {
	for _, a := range args {
		rest, ok := strings.CutPrefix(a, "http://")
		if !ok {
			rest, ok = strings.CutPrefix(a, "https://")
		}
		if ok {
			hostport, path, _ := strings.Cut(rest, "/")
			_, port, err := net.SplitHostPort(hostport)
			if err == nil {
				return port + " /" + path
			}
		}
	}
	return ""
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// stringList reads a YAML list of scalars, or a string split on spaces.
func stringList(v any) []string {
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		out := make([]string, len(v))
		for i, e := range v {
			out[i] = fmt.Sprint(e)
		}
		return out
	}
	return nil
}

// --- kubernetes and kustomize ---

// k8sTree is what the Kubernetes assets define: objects by kustomize root
// and the Secrets anywhere under the tree (the example Secret is not
// applied by kustomize but stands for the real one).
type k8sTree struct {
	base   string
	assets map[string]deployAsset // by path relative to deploy/
	// secrets: directory (relative to deploy/) -> name -> key -> value.
	secrets map[string]map[string]map[string]string
}

// secret finds Secret name for the workloads of directory dir: the one
// described in dir itself (each region's example), else the only one
// anywhere under the tree.
func (k *k8sTree) secret(dir, name string) (map[string]string, bool) {
	if s, ok := k.secrets[dir][name]; ok {
		return s, true
	}
	var found []map[string]string
	for _, byName := range k.secrets {
		if s, ok := byName[name]; ok {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		return nil, false
	}
	return found[0], true
}

// renderKustomization returns the objects and ConfigMaps (name -> key ->
// local file) that kustomize would build from dir. It supports what the
// assets use (resources, configMapGenerator with create/merge/replace,
// labels, images, namespace) and rejects the rest: a field it does not
// render would make the checks below check something else than what runs.
func (k *k8sTree) renderKustomization(t *testing.T, dir string) (objs []map[string]any, cms map[string]map[string]string) {
	t.Helper()
	rel := func(p string) string { r, _ := filepath.Rel(k.base, p); return filepath.ToSlash(r) }
	a, ok := k.assets[rel(filepath.Join(dir, "kustomization.yaml"))]
	if !ok {
		t.Fatalf("%s: no kustomization.yaml", rel(dir))
	}
	kz := a.docs[0]
	for key := range kz {
		switch key {
		case "apiVersion", "kind", "namespace", "resources", "labels", "configMapGenerator", "images":
		default:
			t.Errorf("%s: the deploy tests do not render %q; extend renderKustomization", a.path, key)
		}
	}
	cms = map[string]map[string]string{}
	for _, r := range stringList(kz["resources"]) {
		p := filepath.Join(dir, r)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			o, c := k.renderKustomization(t, p)
			objs = append(objs, o...)
			for name, files := range c {
				cms[name] = files
			}
			continue
		}
		ra, ok := k.assets[rel(p)]
		if !ok {
			t.Errorf("%s: resource %s is not a YAML asset", a.path, r)
			continue
		}
		objs = append(objs, ra.docs...)
	}
	for _, g := range asList(kz["configMapGenerator"]) {
		gm, _ := g.(map[string]any)
		name, _ := gm["name"].(string)
		files := map[string]string{}
		for _, f := range stringList(gm["files"]) {
			key, path, ok := strings.Cut(f, "=")
			if !ok {
				key, path = filepath.Base(f), f
			}
			files[key] = filepath.Join(dir, path)
		}
		switch behavior, _ := gm["behavior"].(string); behavior {
		case "", "create":
			if _, dup := cms[name]; dup {
				t.Errorf("%s: configMapGenerator %s created twice", a.path, name)
			}
			cms[name] = files
		case "merge":
			if _, ok := cms[name]; !ok {
				t.Errorf("%s: configMapGenerator %s merges into nothing", a.path, name)
			}
			merged := map[string]string{}
			for key, f := range cms[name] {
				merged[key] = f
			}
			for key, f := range files {
				merged[key] = f
			}
			cms[name] = merged
		case "replace":
			cms[name] = files
		default:
			t.Errorf("%s: configMapGenerator behavior %q", a.path, behavior)
		}
	}
	for _, o := range objs {
		if o["kind"] == "ConfigMap" {
			meta, _ := o["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			data, _ := o["data"].(map[string]any)
			files := map[string]string{}
			tmp := t.TempDir()
			for key, v := range data {
				p := filepath.Join(tmp, key)
				if err := os.WriteFile(p, []byte(fmt.Sprint(v)), 0o600); err != nil {
					t.Fatal(err)
				}
				files[key] = p
			}
			cms[name] = files
		}
	}
	return objs, cms
}

// podSpec returns the pod template spec of a workload.
func podSpec(o map[string]any) (map[string]any, bool) {
	spec, _ := o["spec"].(map[string]any)
	switch o["kind"] {
	case "Pod":
		return spec, spec != nil
	case "CronJob":
		jt, _ := spec["jobTemplate"].(map[string]any)
		spec, _ = jt["spec"].(map[string]any)
		fallthrough
	case "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job":
		tmpl, _ := spec["template"].(map[string]any)
		ps, _ := tmpl["spec"].(map[string]any)
		return ps, ps != nil
	}
	return nil, false
}

// Sample values for the downward API, as the kubelet would fill them in.
var downwardSamples = map[string]string{
	"metadata.name": "meridian-controller-0",
	"metadata.labels['apps.kubernetes.io/pod-index']": "0",
	"metadata.namespace":                              "meridian",
	"status.podIP":                                    "10.0.0.10",
	"spec.nodeName":                                   "node-a",
}

var k8sVarRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func (k *k8sTree) invocations(t *testing.T, where, dir string, objs []map[string]any, cms map[string]map[string]string) []invocation {
	t.Helper()
	var out []invocation
	for _, o := range objs {
		ps, ok := podSpec(o)
		if !ok {
			continue
		}
		meta, _ := o["metadata"].(map[string]any)
		oname, _ := meta["name"].(string)
		volumes := map[string]string{} // volume name -> local directory
		for _, v := range asList(ps["volumes"]) {
			vm, _ := v.(map[string]any)
			name, _ := vm["name"].(string)
			local := t.TempDir()
			if cm, ok := vm["configMap"].(map[string]any); ok {
				cmName, _ := cm["name"].(string)
				files, ok := cms[cmName]
				if !ok {
					t.Errorf("%s: %s mounts ConfigMap %s, which the kustomization does not make", where, oname, cmName)
				}
				for key, f := range files {
					copyFile(t, f, filepath.Join(local, key))
				}
			}
			if s, ok := vm["secret"].(map[string]any); ok {
				sName, _ := s["secretName"].(string)
				data, ok := k.secret(dir, sName)
				if !ok {
					t.Errorf("%s: %s mounts Secret %s, which no manifest in %s (or only one elsewhere) describes", where, oname, sName, dir)
				}
				for key, v := range data {
					if err := os.WriteFile(filepath.Join(local, key), []byte(v), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			volumes[name] = local // configMap, secret, emptyDir or a claim
		}
		if sp, _ := o["spec"].(map[string]any); sp != nil {
			for _, c := range asList(sp["volumeClaimTemplates"]) {
				cm, _ := c.(map[string]any)
				m, _ := cm["metadata"].(map[string]any)
				name, _ := m["name"].(string)
				volumes[name] = t.TempDir()
			}
		}
		containers := append(asList(ps["initContainers"]), asList(ps["containers"])...)
		for _, c := range containers {
			cm, _ := c.(map[string]any)
			image, _ := cm["image"].(string)
			if !isMeridianImage(image) {
				continue
			}
			cname, _ := cm["name"].(string)
			inv := invocation{where: fmt.Sprintf("%s: %s %s container %s", where, o["kind"], oname, cname),
				env: map[string]string{}, mounts: map[string]string{}, probes: map[string]string{}, group: "kubernetes", unit: where}
			for _, e := range asList(cm["env"]) {
				em, _ := e.(map[string]any)
				name, _ := em["name"].(string)
				inv.env[name] = k.envValue(t, inv.where, dir, em, cms)
			}
			cmd := stringList(cm["command"])
			if len(cmd) > 0 {
				if filepath.Base(cmd[0]) != "meridian" {
					t.Errorf("%s: command %v does not run meridian", inv.where, cmd)
					continue
				}
				cmd = cmd[1:]
			}
			for _, a := range append(cmd, stringList(cm["args"])...) {
				inv.argv = append(inv.argv, k8sVarRef.ReplaceAllStringFunc(a, func(ref string) string {
					name := k8sVarRef.FindStringSubmatch(ref)[1]
					if v, ok := inv.env[name]; ok {
						return v
					}
					return ref // the kubelet leaves unknown references as they are
				}))
			}
			for _, m := range asList(cm["volumeMounts"]) {
				mm, _ := m.(map[string]any)
				name, _ := mm["name"].(string)
				path, _ := mm["mountPath"].(string)
				dir, ok := volumes[name]
				if !ok {
					t.Errorf("%s: volumeMount %s names no volume", inv.where, name)
					continue
				}
				if sub, _ := mm["subPath"].(string); sub != "" {
					dir = filepath.Join(dir, sub)
				}
				inv.mounts[path] = dir
			}
			ports := map[string]string{}
			for _, p := range asList(cm["ports"]) {
				pm, _ := p.(map[string]any)
				if name, ok := pm["name"].(string); ok {
					ports[name] = fmt.Sprint(pm["containerPort"])
				}
			}
			for kind, key := range map[string]string{"readiness": "readinessProbe", "liveness": "livenessProbe"} {
				pr, _ := cm[key].(map[string]any)
				hg, _ := pr["httpGet"].(map[string]any)
				if hg == nil {
					continue
				}
				port := fmt.Sprint(hg["port"])
				if named, ok := ports[port]; ok {
					port = named
				}
				inv.probes[kind] = port + " " + fmt.Sprint(hg["path"])
			}
			out = append(out, inv)
		}
	}
	return out
}

func (k *k8sTree) envValue(t *testing.T, where, dir string, em map[string]any, cms map[string]map[string]string) string {
	if v, ok := em["value"]; ok {
		return fmt.Sprint(v)
	}
	vf, _ := em["valueFrom"].(map[string]any)
	if f, ok := vf["fieldRef"].(map[string]any); ok {
		path := fmt.Sprint(f["fieldPath"])
		v, ok := downwardSamples[path]
		if !ok {
			t.Errorf("%s: no sample value for fieldRef %s (add one to downwardSamples)", where, path)
		}
		return v
	}
	if _, ok := vf["resourceFieldRef"]; ok {
		return "4294967296"
	}
	if s, ok := vf["secretKeyRef"].(map[string]any); ok {
		name, key := fmt.Sprint(s["name"]), fmt.Sprint(s["key"])
		data, _ := k.secret(dir, name)
		v, ok := data[key]
		if !ok {
			t.Errorf("%s: Secret %s key %s is described by no manifest under deploy/k8s", where, name, key)
		}
		return v
	}
	if c, ok := vf["configMapKeyRef"].(map[string]any); ok {
		f, ok := cms[fmt.Sprint(c["name"])][fmt.Sprint(c["key"])]
		if !ok {
			t.Errorf("%s: ConfigMap key %v is not generated", where, c)
			return ""
		}
		b, _ := os.ReadFile(f)
		return string(b)
	}
	t.Errorf("%s: env %v: unsupported valueFrom", where, em["name"])
	return ""
}

func copyFile(t *testing.T, from, to string) {
	b, err := os.ReadFile(from)
	if err != nil {
		t.Error(err)
		return
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// allInvocations finds every meridian invocation under root: the compose
// files' services, and the workloads of every kustomize root (base and
// overlays, each rendered as kustomize would) and of manifests that no
// kustomization includes.
func allInvocations(t *testing.T, root string, assets []deployAsset) []invocation {
	t.Helper()
	var out []invocation
	tree := &k8sTree{base: root, assets: map[string]deployAsset{}, secrets: map[string]map[string]map[string]string{}}
	var roots []string
	for _, a := range assets {
		tree.assets[a.path] = a
		switch a.kind {
		case kindCompose:
			out = append(out, composeInvocations(t, filepath.Join(root, a.path), a.docs[0])...)
		case kindKustomization:
			roots = append(roots, filepath.Dir(filepath.Join(root, a.path)))
		case kindK8s:
			for _, d := range a.docs {
				if d["kind"] == "Certificate" {
					// cert-manager writes the Secret a Certificate names.
					sn, _ := asMap(d["spec"])["secretName"].(string)
					dir := filepath.ToSlash(filepath.Dir(a.path))
					if tree.secrets[dir] == nil {
						tree.secrets[dir] = map[string]map[string]string{}
					}
					tree.secrets[dir][sn] = map[string]string{"tls.crt": "", "tls.key": "", "ca.crt": ""}
					continue
				}
				if d["kind"] != "Secret" {
					continue
				}
				meta, _ := d["metadata"].(map[string]any)
				data := map[string]string{}
				for k, v := range asMap(d["stringData"]) {
					data[k] = fmt.Sprint(v)
				}
				for k, v := range asMap(d["data"]) {
					b, err := base64.StdEncoding.DecodeString(fmt.Sprint(v))
					if err != nil {
						t.Errorf("%s: Secret data %s: %v", a.path, k, err)
					}
					data[k] = string(b)
				}
				dir := filepath.ToSlash(filepath.Dir(a.path))
				if tree.secrets[dir] == nil {
					tree.secrets[dir] = map[string]map[string]string{}
				}
				tree.secrets[dir][fmt.Sprint(meta["name"])] = data
			}
		}
	}
	included := map[string]bool{}
	for _, r := range roots {
		objs, cms := tree.renderKustomization(t, r)
		rel, _ := filepath.Rel(root, r)
		out = append(out, tree.invocations(t, filepath.ToSlash(rel), filepath.ToSlash(rel), objs, cms)...)
		for _, res := range stringList(tree.assets[filepath.ToSlash(filepath.Join(rel, "kustomization.yaml"))].docs[0]["resources"]) {
			p, _ := filepath.Rel(root, filepath.Join(r, res))
			included[filepath.ToSlash(p)] = true
		}
	}
	for _, a := range assets {
		if a.kind == kindK8s && !included[a.path] {
			out = append(out, tree.invocations(t, a.path, filepath.ToSlash(filepath.Dir(a.path)), a.docs, nil)...)
		}
	}
	return out
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// checkDeployment checks every invocation under root and what they say
// together: each compose controller dials only services of its compose
// file, exactly one controller of each deployment bootstraps the Raft
// cluster, and every controller configuration file is one an invocation
// runs with. It returns the problems and the invocations' commands.
func checkDeployment(t *testing.T, root string) (problems []string, commands map[string]int) {
	t.Helper()
	assets := loadDeployAssets(t, root)
	commands = map[string]int{}
	used := map[string]bool{}
	usedContent := map[string]bool{} // a file a kustomize ConfigMap carries is mounted as a copy
	bootstraps := map[string][]string{}
	type unit struct {
		controllers []dnsDiscovery
		bridges     []dnsDiscovery
	}
	units := map[string]*unit{}
	for _, inv := range allInvocations(t, root, assets) {
		var res invocationResult
		t.Run(inv.where, func(t *testing.T) { res = checkInvocation(t, inv) })
		problems = append(problems, res.problems...)
		commands[res.command]++
		if inv.unit != "" && (res.effective != nil || res.bridge != nil) {
			u := units[inv.unit]
			if u == nil {
				u = &unit{}
				units[inv.unit] = u
			}
			if res.effective != nil {
				u.controllers = append(u.controllers, res.effective.Pods.Discovery.DNS)
			}
			if res.bridge != nil {
				u.bridges = append(u.bridges, res.bridge.Discovery.DNS)
			}
		}
		if res.configFile != "" {
			if abs, err := filepath.Abs(res.configFile); err == nil {
				used[abs] = true
			}
			if b, err := os.ReadFile(res.configFile); err == nil {
				usedContent[string(b)] = true
			}
		}
		if e := res.effective; e != nil {
			if inv.services != nil {
				for _, h := range e.peerHosts() {
					if !inv.services[h] && h != "localhost" {
						problems = append(problems, fmt.Sprintf("%s: the configuration names host %q, which is no service of the compose file", inv.where, h))
					}
				}
			}
			if e.Raft.DataDir != "" {
				if _, ok := bootstraps[inv.group]; !ok {
					bootstraps[inv.group] = nil
				}
				if e.Raft.Bootstrap {
					bootstraps[inv.group] = append(bootstraps[inv.group], inv.where)
				}
			}
		}
	}
	for group, who := range bootstraps {
		if len(who) != 1 {
			problems = append(problems, fmt.Sprintf("%s: %d controllers bootstrap the Raft cluster (%v); want exactly one", group, len(who), who))
		}
	}
	for _, a := range assets {
		if a.kind != kindControllerConf && a.kind != kindBridgeConf {
			continue
		}
		abs, _ := filepath.Abs(filepath.Join(root, a.path))
		content, _ := os.ReadFile(abs)
		if !used[abs] && !(a.kind == kindBridgeConf && usedContent[string(content)]) {
			problems = append(problems, a.path+": no compose service or manifest runs a "+string(a.kind)+"'s command with this configuration")
		}
	}
	services := k8sServices(assets)
	for _, name := range slices.Sorted(maps.Keys(units)) {
		u := units[name]
		for _, c := range u.controllers {
			var b *dnsDiscovery
			for i := range u.bridges {
				b = &u.bridges[i]
				problems = append(problems, checkDiscovery(name, c, b, services)...)
			}
			if b == nil {
				problems = append(problems, checkDiscovery(name, c, nil, services)...)
			}
		}
		if len(u.controllers) == 0 {
			problems = append(problems, name+": a kv-bridge without a controller of its region")
		}
	}
	return problems, commands
}

// k8sServices are the Service objects of the Kubernetes assets (the
// example ones, not applied by kustomize, included).
func k8sServices(assets []deployAsset) []map[string]any {
	var out []map[string]any
	for _, a := range assets {
		if a.kind != kindK8s {
			continue
		}
		for _, d := range a.docs {
			if d["kind"] == "Service" {
				out = append(out, d)
			}
		}
	}
	return out
}

// checkDiscovery checks how a Kubernetes region finds its engines: the
// controller follows a headless Service through DNS
// (<service>.<namespace>.svc.<cluster domain>.), the manifests describe
// that Service (headless, with the named port its SRV records need, and
// the bridge's ZMQ ports), and the region's kv-bridge follows the same
// Service with the same settings, so that both name each pod alike (the
// controllers believe the bridge's announcements only for pods they name
// so).
func checkDiscovery(where string, ctl dnsDiscovery, bridge *dnsDiscovery, services []map[string]any) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, where+": "+fmt.Sprintf(format, args...)) }
	if ctl.Name == "" {
		bad("the controller has no pods.discovery.dns.name: Kubernetes engines are followed through their headless Service")
		return problems
	}
	labels := strings.Split(strings.TrimSuffix(ctl.Name, "."), ".")
	if !strings.HasSuffix(ctl.Name, ".") || len(labels) < 4 || labels[2] != "svc" {
		bad("pods.discovery.dns.name %q is not a Service's fully qualified name <service>.<namespace>.svc.<cluster domain>. (with the trailing dot that skips the search list)", ctl.Name)
		return problems
	}
	var svc map[string]any
	for _, o := range services {
		m := asMap(o["metadata"])
		if m["name"] == labels[0] && (m["namespace"] == nil || m["namespace"] == labels[1]) {
			svc = o
		}
	}
	if svc == nil {
		bad("no manifest describes the Service %s in namespace %s that pods.discovery.dns.name %q names", labels[0], labels[1], ctl.Name)
		return problems
	}
	spec := asMap(svc["spec"])
	if spec["clusterIP"] != "None" {
		bad("Service %s is not headless (clusterIP %v): DNS would answer with its virtual IP, not the pods", labels[0], spec["clusterIP"])
	}
	ports := map[string]string{} // name -> protocol
	numbers := map[string]bool{}
	for _, p := range asList(spec["ports"]) {
		pm := asMap(p)
		ports[fmt.Sprint(pm["name"])] = fmt.Sprint(pm["protocol"])
		numbers[fmt.Sprint(pm["port"])] = true
	}
	if lookup := cmp.Or(ctl.Lookup, "srv"); lookup == "srv" {
		service, proto := cmp.Or(ctl.Service, "http"), cmp.Or(ctl.Proto, "tcp")
		if got, ok := ports[service]; !ok || !strings.EqualFold(got, proto) {
			bad("Service %s has no %s port named %q, so no SRV record _%s._%s.%s (ports %v)", labels[0], strings.ToUpper(proto), service, service, proto, ctl.Name, ports)
		}
	} else if !numbers[fmt.Sprint(ctl.Port)] {
		bad("Service %s has no port %d (pods.discovery.dns.port)", labels[0], ctl.Port)
	}
	if bridge == nil {
		return problems
	}
	c, b := ctl, *bridge
	c.KVEventsPort, c.ReplayPort = b.KVEventsPort, b.ReplayPort
	if c != b {
		bad("the kv-bridge's discovery.dns %+v differs from the controller's pods.discovery.dns %+v: they must follow the same Service and name its pods alike", b, ctl)
	}
	if b.KVEventsPort == 0 {
		bad("the kv-bridge's discovery.dns has no kv_events_port: it would subscribe to no engine")
	}
	for _, p := range []int{b.KVEventsPort, b.ReplayPort} {
		if p != 0 && !numbers[fmt.Sprint(p)] {
			bad("Service %s does not name the engines' ZMQ port %d the kv-bridge dials", labels[0], p)
		}
	}
	return problems
}

func TestDeployInvocationsUseTheCLI(t *testing.T) {
	problems, commands := checkDeployment(t, deployRoot)
	for _, p := range problems {
		t.Error(p)
	}
	// The compose file runs three controllers and six engine simulators; the
	// manifests (base and two overlays) a controller each.
	if commands["controller"] < 6 || commands["engine-sim"] < 6 {
		t.Errorf("commands run: %v; want >= 6 controller (3 compose, 3 Kubernetes regions) and >= 6 engine-sim", commands)
	}
	t.Logf("commands run: %v", commands)
}

// TestDeployConfigsLoad: every controller configuration file loads with
// regional.LoadConfig (unknown keys are errors; TestDeployInvocationsUseTheCLI
// runs --check on each as it is mounted), and every residency policy
// validates; a copy of one must equal the file in deploy/policies it copies.
func TestDeployConfigsLoad(t *testing.T) {
	policies := map[string][]byte{}
	dir := filepath.Join(deployRoot, "policies")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		policies[e.Name()] = b
	}
	for _, a := range loadDeployAssets(t, deployRoot) {
		path := filepath.Join(deployRoot, a.path)
		switch a.kind {
		case kindControllerConf:
			if _, err := regional.LoadConfig(path); err != nil {
				t.Errorf("%s: %v", a.path, err)
			}
		case kindBridgeConf:
			if _, err := kvbridge.LoadConfig(path); err != nil {
				t.Errorf("%s: %v", a.path, err)
			}
		case kindAPIKeys:
			b, _ := os.ReadFile(path)
			if _, err := auth.ParseKeys(b); err != nil {
				t.Errorf("%s: %v", a.path, err)
			}
		case kindPolicy:
			app, out := quietApp()
			if err := app.Run([]string{"meridian", "policy", "validate", path}); err != nil {
				t.Errorf("%s: policy validate: %v\n%s", a.path, err, out)
			}
			if !strings.HasPrefix(a.path, "policies/") {
				b, _ := os.ReadFile(path)
				same := false
				for _, p := range policies {
					same = same || bytes.Equal(b, p)
				}
				if !same {
					t.Errorf("%s is not a copy of any file in deploy/policies (copy it again)", a.path)
				}
			}
		}
	}
}

// writeFixture writes files (path -> content) under a new directory.
func writeFixture(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const fixtureConfig = "region: us-east-1\nlisten: \":8080\"\nkafka:\n  brokers: [\"kafka:9092\"]\n  tls: {ca: /etc/meridian/kafka-ca.pem}\n"

func fixtureCompose(command, config string) map[string]string {
	return map[string]string{
		"compose/docker-compose.yaml": `services:
  ctl:
    image: meridian:debug
    command: ` + command + `
    volumes:
      - ./ctl.yaml:/etc/meridian/controller.yaml:ro
    healthcheck:
      test: ["CMD", "/busybox/wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/healthz"]
  kafka:
    image: apache/kafka:3.9.1
`,
		"compose/ctl.yaml": config,
	}
}

// TestDeployChecksRejectMadeUpThings runs the same checks on small fixture
// trees, each with one thing the binary does not have.
func TestDeployChecksRejectMadeUpThings(t *testing.T) {
	invocationProblems := func(t *testing.T, files map[string]string) []string {
		problems, _ := checkDeployment(t, writeFixture(t, files))
		return problems
	}
	raftConfig := func(bootstrap bool) string {
		return fixtureConfig + "insecure: true\nadmin_token: fixture-admin-token-of-thirty-two-bytes\npolicy_file: /etc/meridian/policies/p.yaml\n" +
			fmt.Sprintf("raft: {data_dir: /var/lib/meridian/raft, bind: \"0.0.0.0:7400\", bootstrap: %v}\n", bootstrap) +
			"audit: {dir: /var/lib/meridian/audit, hmac_key: fixture-audit-hmac-key-of-32-bytes}\n"
	}
	policy, err := os.ReadFile(filepath.Join(deployRoot, "policies", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	twoControllers := func(cfgA, cfgB string) map[string]string {
		svc := func(name string) string {
			return "  " + name + ":\n    image: meridian\n    command: [controller, --config, /etc/meridian/controller.yaml]\n" +
				"    volumes: [\"./" + name + ".yaml:/etc/meridian/controller.yaml\", \"./policies:/etc/meridian/policies\"]\n" +
				"    healthcheck: {test: [CMD, /busybox/wget, \"http://127.0.0.1:8080/healthz\"]}\n"
		}
		return map[string]string{
			"compose/docker-compose.yaml": "services:\n" + svc("a") + svc("b") + "  kafka:\n    image: apache/kafka\n",
			"compose/a.yaml":              cfgA,
			"compose/b.yaml":              cfgB,
			"compose/policies/p.yaml":     string(policy),
		}
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string // in some problem; "" = no problem
	}{
		{"good", fixtureCompose(`[controller, --config, /etc/meridian/controller.yaml]`, fixtureConfig), ""},
		{"made-up flag", fixtureCompose(`[controller, --config, /etc/meridian/controller.yaml, --made-up-flag, x]`, fixtureConfig),
			"flag provided but not defined: -made-up-flag"},
		{"made-up command", fixtureCompose(`[made-up-command, --config, /etc/meridian/controller.yaml]`, fixtureConfig),
			`no command "made-up-command"`},
		{"command group without its command", fixtureCompose(`[policy]`, fixtureConfig), "policy: name a command"},
		{"flag after argument", fixtureCompose(`[policy, validate, /etc/meridian/controller.yaml, --json]`, fixtureConfig),
			"not parsed as a flag"},
		{"made-up config key", fixtureCompose(`[controller, --config, /etc/meridian/controller.yaml]`, fixtureConfig+"made_up_key: 1\n"),
			"made_up_key"},
		{"config file not mounted", fixtureCompose(`[controller, --config, /etc/meridian/other.yaml]`, fixtureConfig),
			"other.yaml"},
		{"probe on the wrong port", fixtureCompose(`[controller, --config, /etc/meridian/controller.yaml]`,
			strings.Replace(fixtureConfig, ":8080", ":9090", 1)), "healthcheck probe"},
		{"made-up environment variable", map[string]string{
			"compose/docker-compose.yaml": "services:\n  e:\n    image: meridian\n    command: [version]\n    environment:\n      MERIDIAN_MADE_UP: x\n"},
			"[MERIDIAN_MADE_UP] are read by no flag"},
		{"made-up environment variable on a controller", map[string]string{
			"compose/docker-compose.yaml": "services:\n  c:\n    image: meridian\n    command: [controller, --config, /c.yaml]\n" +
				"    volumes: [\"./c.yaml:/c.yaml\"]\n    environment: {MERIDIAN_MADE_UP: x}\n" +
				"    healthcheck: {test: [CMD, /busybox/wget, \"http://127.0.0.1:8080/healthz\"]}\n  kafka: {image: apache/kafka}\n",
			"compose/c.yaml": fixtureConfig}, "MERIDIAN_MADE_UP is read by no flag and changes nothing"},
		{"good pair of Raft controllers", twoControllers(raftConfig(true), raftConfig(false)), ""},
		{"two controllers bootstrap", twoControllers(raftConfig(true), raftConfig(true)), "2 controllers bootstrap"},
		{"a dialled host that is no service", twoControllers(raftConfig(true),
			strings.Replace(raftConfig(false), "kafka:9092", "kafak:9092", 1)), `names host "kafak"`},
		{"policy_file not mounted", twoControllers(raftConfig(true),
			strings.Replace(raftConfig(false), "/etc/meridian/policies/p.yaml", "/etc/meridian/elsewhere/p.yaml", 1)), "policy_file"},
		{"a controller configuration nothing runs", map[string]string{
			"compose/docker-compose.yaml": "services:\n  e:\n    image: meridian\n    command: [version]\n",
			"compose/orphan.yaml":         fixtureConfig}, "orphan.yaml: no compose service or manifest runs"},
		{"bad engine-sim value", map[string]string{
			"compose/docker-compose.yaml": "services:\n  e:\n    image: meridian\n    command: [engine-sim, --hardware, made-up-gpu]\n"},
			"made-up-gpu"},
		{"kubernetes: made-up flag, resolved through kustomize", map[string]string{
			"k8s/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [sts.yaml]\n" +
				"configMapGenerator:\n  - name: cfg\n    files: [controller.yaml]\n",
			"k8s/controller.yaml": fixtureConfig,
			"k8s/sts.yaml": `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: c}
spec:
  template:
    spec:
      containers:
        - name: c
          image: registry.example.com/meridian:dev
          args: [controller, --config=/etc/m/controller.yaml, --controller-id=$(POD_NAME), --made-up-flag]
          env:
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {httpGet: {path: /readyz, port: http}}
          livenessProbe: {httpGet: {path: /healthz, port: http}}
          volumeMounts: [{name: config, mountPath: /etc/m}]
      volumes: [{name: config, configMap: {name: cfg}}]
`}, "flag provided but not defined: -made-up-flag"},
		{"kubernetes: readiness on /healthz", map[string]string{
			"k8s/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [sts.yaml]\n" +
				"configMapGenerator:\n  - name: cfg\n    files: [controller.yaml]\n",
			"k8s/controller.yaml": fixtureConfig,
			"k8s/sts.yaml": `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: c}
spec:
  template:
    spec:
      containers:
        - name: c
          image: meridian
          args: [controller, --config=/etc/m/controller.yaml]
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {httpGet: {path: /healthz, port: http}}
          livenessProbe: {httpGet: {path: /healthz, port: 8080}}
          volumeMounts: [{name: config, mountPath: /etc/m}]
      volumes: [{name: config, configMap: {name: cfg}}]
`}, "readiness probe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problems := invocationProblems(t, tc.files)
			if tc.want == "" {
				if len(problems) > 0 {
					t.Fatalf("problems in a good fixture: %v", problems)
				}
				return
			}
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Fatalf("no problem mentions %q; got %v", tc.want, problems)
		})
	}

	t.Run("unparsable and unclassified assets", func(t *testing.T) {
		root := writeFixture(t, map[string]string{
			"x.yaml":   "something: else\n",
			"y.yaml":   "a: [unclosed\n",
			"z.json":   "{",
			"ok.yaml":  "---\n# empty document first\n---\nregion: r\n",
			"two.yaml": "region: r\n---\ngroups: []\n",
		})
		_, problems, err := readDeployAssets(root)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(problems, "\n")
		for _, want := range []string{"x.yaml: not a kind", "y.yaml", "z.json: not valid JSON", "two.yaml: document 1 is a prometheus rules"} {
			if !strings.Contains(got, want) {
				t.Errorf("problems %q lack %q", got, want)
			}
		}
		if strings.Contains(got, "ok.yaml") {
			t.Errorf("a good multi-document file was reported: %s", got)
		}
	})
}

// TestCheckDiscoveryRejects: the discovery checks catch a controller that
// follows no Service, a name that is no Service's, a Service that is not
// headless or lacks the SRV port, and a kv-bridge that names pods
// otherwise than the controllers.
func TestCheckDiscoveryRejects(t *testing.T) {
	svc := func(clusterIP string, ports ...string) map[string]any {
		var ps []any
		for _, p := range ports {
			name, num, _ := strings.Cut(p, "=")
			ps = append(ps, map[string]any{"name": name, "port": atoi(num), "protocol": "TCP"})
		}
		return map[string]any{"kind": "Service", "metadata": map[string]any{"name": "vllm", "namespace": "inference"},
			"spec": map[string]any{"clusterIP": clusterIP, "ports": ps}}
	}
	good := svc("None", "http=8000", "kv-events=5557")
	ctl := dnsDiscovery{Name: "vllm.inference.svc.cluster.local.", Lookup: "srv", Service: "http"}
	bridge := ctl
	bridge.KVEventsPort = 5557
	renamed := bridge
	renamed.NameFrom = "target"
	noPort := ctl
	noPort.KVEventsPort = 0
	for _, tc := range []struct {
		name   string
		ctl    dnsDiscovery
		bridge *dnsDiscovery
		svc    map[string]any
		want   string
	}{
		{"good", ctl, &bridge, good, ""},
		{"no discovery", dnsDiscovery{}, nil, good, "no pods.discovery.dns.name"},
		{"not a service name", dnsDiscovery{Name: "vllm.example.com."}, nil, good, "not a Service's fully qualified name"},
		{"no trailing dot", dnsDiscovery{Name: "vllm.inference.svc.cluster.local"}, nil, good, "trailing dot"},
		{"other namespace", dnsDiscovery{Name: "vllm.other.svc.cluster.local."}, nil, good, "no manifest describes the Service vllm in namespace other"},
		{"not headless", ctl, nil, svc("10.0.0.1", "http=8000"), "not headless"},
		{"no srv port", ctl, nil, svc("None", "web=8000"), `no TCP port named "http"`},
		{"bridge names pods otherwise", ctl, &renamed, good, "must follow the same Service and name its pods alike"},
		{"bridge dials nothing", ctl, &noPort, good, "no kv_events_port"},
		{"bridge port not on the service", ctl, &bridge, svc("None", "http=8000"), "ZMQ port 5557"},
	} {
		got := strings.Join(checkDiscovery("k8s/x", tc.ctl, tc.bridge, []map[string]any{tc.svc}), "\n")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: problems %q, want one containing %q", tc.name, got, tc.want)
		}
	}
}
