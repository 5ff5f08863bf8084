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
)

const examplePolicyPath = "../../deploy/policies/example.yaml"
const defaultPolicyPath = "../../deploy/policies/default.yaml"

// runMeridian runs the app with args and returns stdout, stderr and the exit
// status main would use.
func runPolicyCLI(t *testing.T, app *cli.App, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	err := app.Run(append([]string{"meridian"}, args...))
	return out.String(), errOut.String(), exitCode(err)
}

func writePolicyTestFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPolicyValidateOK(t *testing.T) {
	out, _, code := runPolicyCLI(t, newApp(), "policy", "validate", examplePolicyPath, defaultPolicyPath)
	if code != 0 {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	for _, want := range []string{
		examplePolicyPath + ": ok (policy example-2026-01@sha256:",
		"3 regions, 2 zones, 6 rules)",
		defaultPolicyPath + ": ok (policy shipped-default@sha256:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPolicyValidateProblems(t *testing.T) {
	bad := writePolicyTestFile(t, "bad.yaml", "version: 2\nregions: [a, a]\nzones:\n  z: []\ndefault: {allow: [mars]}\n")
	out, _, code := runPolicyCLI(t, newApp(), "policy", "validate", bad, defaultPolicyPath)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	want := []string{
		bad + ":1:10: unsupported version 2: this format is version 1",
		bad + `:2:14: duplicate region "a" (first declared at line 2)`,
		bad + `:4:6: zone "z" is empty: a zone needs at least one region`,
		bad + `:5:19: unknown zone or region "mars" in default (zones: z; regions: a; or origin, all)`,
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(want)+1 {
		t.Fatalf("output:\n%s", out)
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("line %d = %q, want %q", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[len(want)], defaultPolicyPath+": ok") {
		t.Errorf("valid file not reported ok: %q", lines[len(want)])
	}
}

func TestPolicyValidateJSON(t *testing.T) {
	bad := writePolicyTestFile(t, "bad.yaml", "version: 1\nregions: [a]\ndefault: {allow: [b]}\n")
	out, _, code := runPolicyCLI(t, newApp(), "policy", "validate", "--json", bad, examplePolicyPath)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	var res struct {
		Files []struct {
			File     string `json:"file"`
			OK       bool   `json:"ok"`
			Rules    int    `json:"rules"`
			Problems []struct {
				Line, Column   int
				Value, Message string
			} `json:"problems"`
		} `json:"files"`
		Problems int `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if res.Problems != 1 || len(res.Files) != 2 || res.Files[0].OK || !res.Files[1].OK || res.Files[1].Rules != 6 {
		t.Fatalf("result %+v", res)
	}
	if p := res.Files[0].Problems[0]; p.Line != 3 || p.Column != 19 || p.Value != "b" {
		t.Fatalf("problem %+v", p)
	}
}

func TestPolicyValidateUsageAndUnreadable(t *testing.T) {
	if _, _, code := runPolicyCLI(t, newApp(), "policy", "validate"); code != 2 {
		t.Fatalf("no files: exit %d, want 2", code)
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	out, _, code := runPolicyCLI(t, newApp(), "policy", "validate", missing)
	if code != 1 || !strings.HasPrefix(out, missing+":1:1: cannot read:") {
		t.Fatalf("missing file: exit %d, output %q", code, out)
	}
	app := newApp()
	app.Reader = strings.NewReader("version: 1\nregions: [a]\ndefault: {allow: [origin]}\n")
	if out, _, code := runPolicyCLI(t, app, "policy", "validate", "-"); code != 0 || !strings.HasPrefix(out, "-: ok") {
		t.Fatalf("stdin: exit %d, output %q", code, out)
	}
}

func TestPolicyDiff(t *testing.T) {
	attrs := writePolicyTestFile(t, "attrs.jsonl", `{"tenant":"eu-health","data_class":"phi","origin_region":"us-east-1"}
# comment
{"tenant":"acme","data_class":"public","origin_region":"eu-west-1"}

{"tenant":"acme","data_class":"public","origin_region":"us-east-1","session":"eval-1","labels":{"priority":"batch"}}
`)
	out, _, code := runPolicyCLI(t, newApp(), "policy", "diff", "--attrs", attrs, defaultPolicyPath, examplePolicyPath)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"--- " + defaultPolicyPath + " (policy shipped-default@sha256:",
		`~ revision: "shipped-default" -> "example-2026-01"`,
		"+ rule eu-health-phi: tenant=[eu-health] data_class=[phi] -> allow [eu]",
		attrs + `:1: tenant=eu-health data_class=phi origin_region=us-east-1: [us-east-1 us-west-2] by the default -> [eu-west-1] by rule "eu-health-phi"`,
		attrs + `:3: tenant=acme data_class=public origin_region=eu-west-1: [eu-west-1] by the default -> [us-east-1 us-west-2 eu-west-1] by rule "public-from-eu"`,
		attrs + `:5: tenant=acme data_class=public origin_region=us-east-1 session=eval-1 labels.priority=batch: [us-east-1 us-west-2] by the default -> [us-east-1 us-west-2 eu-west-1] by rule "us-batch-eval"`,
		"3 of 3 requests decided differently",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, _, code := runPolicyCLI(t, newApp(), "policy", "diff", "--exit-code", examplePolicyPath, examplePolicyPath); code != 0 {
		t.Fatalf("identical policies with --exit-code: exit %d", code)
	}
	if _, _, code := runPolicyCLI(t, newApp(), "policy", "diff", "--exit-code", defaultPolicyPath, examplePolicyPath); code != 1 {
		t.Fatalf("different policies with --exit-code: exit %d, want 1", code)
	}
}

func TestPolicyDiffJSON(t *testing.T) {
	attrs := writePolicyTestFile(t, "attrs.jsonl", `{"tenant":"eu-health","data_class":"phi","origin_region":"us-east-1"}`+"\n")
	out, _, code := runPolicyCLI(t, newApp(), "policy", "diff", "--json", "--attrs", attrs, defaultPolicyPath, examplePolicyPath)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var res struct {
		Changes     []struct{ Kind, Object, Name string }
		Requests    int
		Differences []struct {
			Line int
			Old  struct{ Regions []string }
			New  struct {
				Regions []string
				Rule    struct{ Name string }
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if res.Requests != 1 || len(res.Differences) != 1 || res.Differences[0].Line != 1 ||
		res.Differences[0].New.Rule.Name != "eu-health-phi" || strings.Join(res.Differences[0].New.Regions, " ") != "eu-west-1" {
		t.Fatalf("result %+v", res)
	}
	if len(res.Changes) == 0 {
		t.Fatal("no structural changes in JSON")
	}
}

func TestPolicyDiffErrors(t *testing.T) {
	bad := writePolicyTestFile(t, "bad.yaml", "version: 1\nregions: [a]\n")
	out, _, code := runPolicyCLI(t, newApp(), "policy", "diff", bad, examplePolicyPath)
	if code != 1 || !strings.HasPrefix(out, bad+":1:1: missing default") {
		t.Fatalf("invalid policy: exit %d, output %q", code, out)
	}
	if _, _, code := runPolicyCLI(t, newApp(), "policy", "diff", examplePolicyPath); code != 2 {
		t.Fatalf("one argument: exit %d, want 2", code)
	}
	attrs := writePolicyTestFile(t, "attrs.jsonl", `{"tenant":"a"}`+"\n"+`{"tennant":"a"}`+"\n")
	_, _, code = runPolicyCLI(t, newApp(), "policy", "diff", "--attrs", attrs, examplePolicyPath, examplePolicyPath)
	if code != exitUsage {
		t.Fatalf("bad attrs: exit %d, want %d", code, exitUsage)
	}
	err := newApp().Run([]string{"meridian", "policy", "diff", "--attrs", attrs, examplePolicyPath, examplePolicyPath})
	if err == nil || !strings.Contains(err.Error(), attrs+":2: bad attributes") {
		t.Fatalf("bad attrs error %v", err)
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		t.Fatalf("error %T is not an exitError", err)
	}
}

func TestPolicyCommandTakesExtraSubcommands(t *testing.T) {
	called := false
	app := newApp()
	for i, c := range app.Commands {
		if c.Name == "policy" {
			app.Commands[i] = policyCommand(&cli.Command{Name: "show", Action: func(*cli.Context) error { called = true; return nil }})
		}
	}
	if _, _, code := runPolicyCLI(t, app, "policy", "show"); code != 0 || !called {
		t.Fatalf("extra subcommand not run (exit %d)", code)
	}
}
