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
	"github.com/meridian-llm/meridian/regional"
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

// TestPolicyApplyIdempotentAndDryRun: on a cluster that validates and
// compiles residency policies as controllers do, applying the active
// policy's file again prints "unchanged", exits 0 and adds no version;
// --dry-run changes nothing and shows the structural changes and the
// sample requests decided differently; bad input exits 1 (a policy the
// cluster would refuse) or 2 (usage, a bad --attrs file) and changes
// nothing; diff-active prints unified hunks, not the whole file.
func TestPolicyApplyIdempotentAndDryRun(t *testing.T) {
	c := globaltest.NewCluster(t, 1, globaltest.Options{Configure: func(i int, cfg *global.Config) {
		cfg.PolicyValidator, cfg.PolicyCompiler = regional.PolicyValidator, regional.PolicyCompiler
	}})
	admin := []string{"--admin", c.Nodes[0].URL(), "--token", c.Token}
	run := func(args ...string) (string, int, error) {
		t.Helper()
		return runCLI(t, newApp(), append(append([]string{"policy"}, args[:1]...), append(admin, args[1:]...)...)...)
	}
	versions := func() int {
		return len(c.Nodes[0].Node.State().PolicyHistory())
	}
	dir := t.TempDir()
	attrs := filepath.Join(dir, "attrs.jsonl")
	os.WriteFile(attrs, []byte("# sample traffic\n{\"tenant\":\"eu-health\",\"data_class\":\"phi\",\"origin_region\":\"us-east-1\"}\n{\"tenant\":\"acme\",\"data_class\":\"public\",\"origin_region\":\"us-east-1\"}\n"), 0o644)

	if out, code, err := run("apply", defaultPolicyPath); code != 0 || !strings.Contains(out, "applied default.yaml as policy v1@") {
		t.Fatalf("first apply: %d %v %q", code, err, out)
	}
	for range 2 {
		out, code, err := run("apply", "--reason", "sync loop", defaultPolicyPath)
		if code != 0 || !strings.HasPrefix(out, "unchanged: default.yaml is the active policy v1@") {
			t.Fatalf("apply of the active file: %d %v %q", code, err, out)
		}
	}
	if n := versions(); n != 1 {
		t.Fatalf("%d versions after applying one file three times, want 1", n)
	}

	out, code, err := run("apply", "--dry-run", "--attrs", attrs, examplePolicyPath)
	if code != 0 {
		t.Fatalf("dry run: %d %v %q", code, err, out)
	}
	for _, want := range []string{
		"dry run: nothing applied; example.yaml would become policy v2",
		"--- active policy v1@",
		"+ rule eu-health-phi: tenant=[eu-health] data_class=[phi] -> allow [eu]",
		attrs + `:2: tenant=eu-health data_class=phi origin_region=us-east-1: [us-east-1 us-west-2] by the default -> [eu-west-1] by rule "eu-health-phi"`,
		"1 of 2 requests decided differently",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	out, code, _ = run("apply", "--dry-run", defaultPolicyPath)
	if code != 0 || !strings.Contains(out, "unchanged: default.yaml is the active policy v1@") || !strings.Contains(out, "would add no version") {
		t.Fatalf("dry run of the active file: %d %q", code, out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\nregions: [a]\ndefault: {allow: [mars]}\n"), 0o644)
	out, code, _ = run("apply", "--dry-run", bad)
	if code != exitFailed || !strings.Contains(out, `unknown zone or region "mars"`) {
		t.Fatalf("dry run of an invalid policy: %d %q", code, out)
	}
	badAttrs := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(badAttrs, []byte("{\"tennant\":\"a\"}\n"), 0o644)
	for _, args := range [][]string{
		{"apply", "--attrs", attrs, examplePolicyPath},                 // --attrs without --dry-run
		{"apply", "--dry-run", "--attrs", badAttrs, examplePolicyPath}, // a bad line
		{"apply", "--dry-run", "--attrs", filepath.Join(dir, "missing.jsonl"), examplePolicyPath},
	} {
		if _, code, err := run(args...); code != exitUsage {
			t.Errorf("%v: exit %d (%v), want %d", args, code, err, exitUsage)
		}
	}
	if n := versions(); n != 1 {
		t.Fatalf("%d versions after dry runs, want 1", n)
	}

	// diff-active: a unified diff with three lines of context, not the
	// whole file.
	if _, code, err := run("apply", examplePolicyPath); code != 0 {
		t.Fatal(err)
	}
	src, err := os.ReadFile(examplePolicyPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := filepath.Join(dir, "edited.yaml")
	os.WriteFile(edited, bytes.Replace(src, []byte("allow: [eu, us]"), []byte("allow: [eu]"), 1), 0o644)
	out, code, _ = run("diff-active", "--exit-code", edited)
	if code != exitFailed || !strings.Contains(out, "--- active policy v2@") || !strings.Contains(out, "+++ edited.yaml") {
		t.Fatalf("diff-active: %d %q", code, out)
	}
	var minus, plus, context, headers int
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n")[2:] {
		switch {
		case strings.HasPrefix(l, "@@ "):
			headers++
		case strings.HasPrefix(l, "-"):
			minus++
		case strings.HasPrefix(l, "+"):
			plus++
		case strings.HasPrefix(l, " "):
			context++
		}
	}
	if headers != 1 || minus != 1 || plus != 1 || context != 6 {
		t.Fatalf("diff-active printed %d hunks, -%d +%d, %d context lines; want 1, -1 +1, 6:\n%s", headers, minus, plus, context, out)
	}
	out, code, _ = run("diff-active", "--context", "0", edited)
	if code != 0 || strings.Count(out, "\n ") != 0 {
		t.Fatalf("diff-active --context 0: %d %q", code, out)
	}
}
