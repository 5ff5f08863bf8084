package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

// runCLI runs the app with args and returns stdout and the exit status.
func runCLI(t *testing.T, app *cli.App, args ...string) (string, int, error) {
	t.Helper()
	var out bytes.Buffer
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(append([]string{"meridian"}, args...))
	return out.String(), exitCode(err), err
}

func TestFailoverCLI(t *testing.T) {
	c := globaltest.NewCluster(t, 1, globaltest.Options{})
	admin := []string{"--admin", c.Nodes[0].URL(), "--token", c.Token}
	node := c.Nodes[0].Node

	out, code, err := runCLI(t, newApp(), append(append([]string{"failover", "trigger"}, admin...), "--region", "region-0", "--reason", "drill", "--actor", "operator:alice")...)
	if code != 0 || !strings.Contains(out, "region region-0 is now failed (by operator:alice: drill; raft index") {
		t.Fatalf("trigger: %d %v %q", code, err, out)
	}
	if node.State().Routable("region-0") {
		t.Fatal("trigger did not fail the region")
	}
	out, code, _ = runCLI(t, newApp(), append(append([]string{"failover", "trigger"}, admin...), "--region", "region-0")...)
	if code != 0 || !strings.Contains(out, "was already failed") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("trigger twice: %d %q", code, out)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"failover", "status"}, admin...)...)
	if code != 0 || !strings.Contains(out, "REGION") || !regexpLine(out, "region-0", "failed", "no", "operator:alice", "node-0", "drill") ||
		!strings.Contains(out, "answered by node-0 (region-0, leader); leader node-0") {
		t.Fatalf("status: %d %q", code, out)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"failover", "status", "--json", "--consistent"}, admin...)...)
	var st global.FailoverStatus
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Regions) != 1 || st.Regions[0].State != global.RegionFailed {
		t.Fatalf("status --json: %d %q", code, out)
	}
	out, code, _ = runCLI(t, newApp(), append(append([]string{"failover", "recover"}, admin...), "--region", "region-0", "--json")...)
	var res global.Result
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !res.Changed || res.Region.State != global.RegionActive || !node.State().Routable("region-0") {
		t.Fatalf("recover --json: %d %q", code, out)
	}
	out, code, _ = runCLI(t, newApp(), append(append([]string{"failover", "trigger"}, admin...), "--region", "region-0", "--drain")...)
	if code != 0 || !strings.Contains(out, "is now draining") {
		t.Fatalf("drain: %d %q", code, out)
	}

	// Errors name what was wrong and exit non-zero.
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"failover", "trigger", "--admin", c.Nodes[0].URL(), "--token", c.Token}, 2, "failover trigger: --region is required"},
		{[]string{"failover", "trigger", "--token", c.Token, "--region", "region-0"}, 2, "--admin (or MERIDIAN_ADMIN) is required"},
		{[]string{"failover", "trigger", "--admin", "localhost:1", "--token", c.Token, "--region", "r"}, 2, `--admin "localhost:1" must be an http:// or https:// URL`},
		{[]string{"failover", "status", "--admin", c.Nodes[0].URL()}, 2, "--token (or MERIDIAN_ADMIN_TOKEN) is required"},
		{append(append([]string{"failover", "trigger"}, admin...), "--region", "mars-1"), 1, `failover trigger: set region mars-1 to failed: region "mars-1" is not known to the cluster (known: region-0) (unknown_region)`},
		{append(append([]string{"failover", "recover"}, admin...), "--region", "Mars"), 1, `region name "Mars"`},
		{[]string{"failover", "status", "--admin", c.Nodes[0].URL(), "--token", "wrong"}, 1, "missing or invalid bearer token (unauthorized)"},
		{[]string{"failover", "status", "--admin", "http://127.0.0.1:1", "--token", "x", "--timeout", "2s"}, 1, "cannot reach the admin API at http://127.0.0.1:1"},
		{append(append([]string{"failover", "trigger"}, admin...), "region-0"), 2, "unexpected arguments"},
	}
	for _, tc := range cases {
		_, code, err := runCLI(t, newApp(), tc.args...)
		if code != tc.code || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: exit %d, %v; want exit %d and %q", tc.args, code, err, tc.code, tc.want)
		}
	}
	// The environment variables work.
	t.Setenv("MERIDIAN_ADMIN", c.Nodes[0].URL())
	t.Setenv("MERIDIAN_ADMIN_TOKEN", c.Token)
	if _, code, err := runCLI(t, newApp(), "failover", "status"); code != 0 {
		t.Fatalf("status from the environment: %v", err)
	}
}

func regexpLine(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		ok := true
		for _, f := range fields {
			if !strings.Contains(line, f) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func TestPolicyClusterCLI(t *testing.T) {
	c := globaltest.NewCluster(t, 1, globaltest.Options{Configure: func(i int, cfg *global.Config) {
		cfg.PolicyValidator = func(name string, doc []byte) (string, error) {
			if bytes.Contains(doc, []byte("bad")) {
				return "", errors.New(name + ":2:3: zone \"bad\" is not defined")
			}
			return "2026-12", nil
		}
	}})
	admin := []string{"--admin", c.Nodes[0].URL(), "--token", c.Token}
	dir := t.TempDir()
	p1 := filepath.Join(dir, "p1.yaml")
	p2 := filepath.Join(dir, "p2.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(p1, []byte("version: 1\nzones:\n  eu: [eu-west-1]\n"), 0o644)
	os.WriteFile(p2, []byte("version: 1\nzones:\n  eu: [eu-west-1, eu-central-1]\n"), 0o644)
	os.WriteFile(bad, []byte("version: 1\n  bad\n"), 0o644)

	out, code, err := runCLI(t, newApp(), append(append([]string{"policy", "apply"}, admin...), "--reason", "first", p1)...)
	if code != 0 || !strings.Contains(out, "applied p1.yaml as policy v1@") || !strings.Contains(out, "declared version 2026-12") {
		t.Fatalf("apply: %d %v %q", code, err, out)
	}
	if _, code, _ = runCLI(t, newApp(), append(append([]string{"policy", "apply"}, admin...), p2)...); code != 0 {
		t.Fatal("apply p2")
	}
	_, code, err = runCLI(t, newApp(), append(append([]string{"policy", "apply"}, admin...), bad)...)
	if code != 1 || !strings.Contains(err.Error(), `bad.yaml:2:3: zone "bad" is not defined`) || !strings.Contains(err.Error(), "invalid_policy") {
		t.Fatalf("apply invalid: %d %v", code, err)
	}
	_, code, err = runCLI(t, newApp(), append(append([]string{"policy", "apply"}, admin...), filepath.Join(dir, "missing.yaml"))...)
	if code != 1 || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("apply missing file: %d %v", code, err)
	}
	if _, code, _ = runCLI(t, newApp(), append([]string{"policy", "apply"}, admin...)...); code != 2 {
		t.Fatal("apply without a file must be a usage error")
	}

	out, code, _ = runCLI(t, newApp(), append([]string{"policy", "show"}, admin...)...)
	if code != 0 || !strings.HasPrefix(out, "# policy v2@") || !strings.HasSuffix(out, "eu: [eu-west-1, eu-central-1]\n") {
		t.Fatalf("show: %d %q", code, out)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"policy", "show", "--version", "1"}, admin...)...)
	if code != 0 || !strings.HasSuffix(out, "eu: [eu-west-1]\n") {
		t.Fatalf("show --version 1: %d %q", code, out)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"policy", "show", "--history"}, admin...)...)
	if code != 0 || !regexpLine(out, "v2@", "(active)", "p2.yaml", "2026-12") || !regexpLine(out, "v1@", "p1.yaml", "first") {
		t.Fatalf("show --history: %d %q", code, out)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"policy", "show", "--history", "--json"}, admin...)...)
	var h global.PolicyHistory
	if code != 0 || json.Unmarshal([]byte(out), &h) != nil || len(h.Versions) != 2 {
		t.Fatalf("show --history --json: %d %q", code, out)
	}
	if _, code, err = runCLI(t, newApp(), append([]string{"policy", "show", "--version", "7"}, admin...)...); code != 1 || !strings.Contains(err.Error(), "policy version 7 is not kept") {
		t.Fatalf("show unknown version: %d %v", code, err)
	}

	out, code, _ = runCLI(t, newApp(), append([]string{"policy", "diff-active"}, append(admin, p1)...)...)
	if code != 0 || !strings.Contains(out, "--- active policy v2@") || !strings.Contains(out, "\n@@ -1,3 +1,3 @@\n version: 1\n zones:\n-  eu: [eu-west-1, eu-central-1]\n+  eu: [eu-west-1]\n") {
		t.Fatalf("diff-active: %d %q", code, out)
	}
	if _, code, _ = runCLI(t, newApp(), append([]string{"policy", "diff-active", "--exit-code"}, append(admin, p1)...)...); code != 1 {
		t.Fatalf("diff-active --exit-code on a difference: exit %d", code)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"policy", "diff-active", "--exit-code"}, append(admin, p2)...)...)
	if code != 0 || !strings.Contains(out, "p2.yaml is identical to the active policy v2@") {
		t.Fatalf("diff-active same: %d %q", code, out)
	}
	// "-" reads the file from standard input.
	stdin := newApp()
	stdin.Reader = strings.NewReader("version: 1\nzones:\n  eu: [eu-west-1, eu-central-1]\n")
	out, code, _ = runCLI(t, stdin, append([]string{"policy", "diff-active", "--exit-code"}, append(admin, "-")...)...)
	if code != 0 || !strings.Contains(out, "stdin is identical to the active policy v2@") {
		t.Fatalf("diff-active from standard input: %d %q", code, out)
	}
}
