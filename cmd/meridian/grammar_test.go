package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/regional"
)

// commandPaths lists every command of the app (groups too), each as the
// arguments that select it.
func commandPaths() (leaves, groups [][]string) {
	var walk func(prefix []string, cmds []*cli.Command)
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, c := range cmds {
			p := append(slices.Clone(prefix), c.Name)
			if len(c.Subcommands) > 0 {
				groups = append(groups, p)
				walk(p, c.Subcommands)
			} else {
				leaves = append(leaves, p)
			}
		}
	}
	walk(nil, newApp().Commands)
	return leaves, groups
}

// runCode runs the app with args and returns its exit status and what it
// wrote (stdout, then stderr and the error as main prints it).
func runCode(t *testing.T, args ...string) (int, string) {
	t.Helper()
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	app.Reader = strings.NewReader("")
	err := app.RunContext(context.Background(), append([]string{"meridian"}, args...))
	if err != nil {
		errOut.WriteString(err.Error())
	}
	return exitCode(err), out.String() + errOut.String()
}

// clearMeridianEnv keeps the environment of whoever runs the tests
// (MERIDIAN_ADMIN, MERIDIAN_KAFKA, ...) out of the commands.
func clearMeridianEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MERIDIAN_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// usageErrors holds, for every command that does something, a usage error
// of its own (a missing input, a bad value); each must exit 2 before the
// command does anything. A new command needs an entry.
var usageErrors = map[string][]string{
	"version":                  {"extra"},
	"dr check":                 {"--checksums", "maybe", "."},
	"dr manifest init":         {},
	"dr drill":                 {"--admin", "x"},
	"engine-sim":               {"--hardware", "z80"},
	"events decode":            {"a", "b"},
	"events tail":              {"--topic", "t"},
	"policy validate":          {},
	"policy diff":              {"a"},
	"policy apply":             {},
	"policy show":              {"--admin", "http://127.0.0.1:1"},
	"policy diff-active":       {},
	"audit query":              {},
	"audit tail":               {"--poll", "0s"},
	"audit verify":             {},
	"audit hash":               {"--tenant", "t"},
	"audit checkpoints export": {"--admin", "ftp://x", "--token", "t"},
	"controller":               {"--config", "/nonexistent/meridian.yaml"},
	"certs init":               {},
	"auth keygen":              {"--default-data-class", "x"},
	"gossip keys list":         {},
	"gossip keys install":      {"--admin", "http://127.0.0.1:1", "--token", "t"},
	"gossip keys use":          {"--key", "k", "--key-file", "f"},
	"gossip keys remove":       {"--admin", "http://127.0.0.1:1"},
	"kafka-dev":                {"--brokers", "0"},
	"kv-bridge":                {},
	"route":                    {},
	"failover trigger":         {"--admin", "http://127.0.0.1:1", "--token", "t"},
	"failover recover":         {"--admin", "http://127.0.0.1:1", "--token", "t"},
	"failover status":          {"--token", "t"},
	"sim":                      {"--region-count", "0"},
	"demo":                     {"--pods-per-region", "0"},
	"probe":                    {"ftp://x"},
	"help":                     {"no-such-command"},
}

// TestExitCodesUsage runs every command with usage errors: an undefined
// flag, a bad flag value or argument of its own, an unknown subcommand, a
// missing subcommand. Each exits 2 (meridian help exit-codes).
func TestExitCodesUsage(t *testing.T) {
	clearMeridianEnv(t)
	leaves, groups := commandPaths()
	type run struct {
		name string
		args []string
	}
	var runs []run
	for _, p := range leaves {
		path := strings.Join(p, " ")
		own, ok := usageErrors[path]
		if !ok {
			t.Errorf("usageErrors has no entry for %q: add a usage error of its own", path)
			continue
		}
		runs = append(runs,
			run{path + " --no-such-flag", append(slices.Clone(p), "--no-such-flag")},
			run{path + " (its own)", append(slices.Clone(p), own...)})
	}
	for _, p := range groups {
		path := strings.Join(p, " ")
		runs = append(runs,
			run{path + " --no-such-flag", append(slices.Clone(p), "--no-such-flag")},
			run{path + " (no subcommand)", p},
			run{path + " no-such-command", append(slices.Clone(p), "no-such-command")})
	}
	runs = append(runs, run{"(no command)", nil}, run{"no-such-command", []string{"no-such-command"}}, run{"--no-such-flag", []string{"--no-such-flag"}})
	for _, r := range runs {
		if code, out := runCode(t, r.args...); code != exitUsage {
			t.Errorf("meridian %s: exit %d, want %d (usage error)\n%s", r.name, code, exitUsage, out)
		}
	}
	for path := range usageErrors {
		if !slices.ContainsFunc(leaves, func(p []string) bool { return strings.Join(p, " ") == path }) {
			t.Errorf("usageErrors names %q, which is not a command", path)
		}
	}
}

// TestExitCodesNoArguments: a command that declares no arguments refuses
// one (exit 2) before doing anything.
func TestExitCodesNoArguments(t *testing.T) {
	clearMeridianEnv(t)
	app := newApp()
	var walk func(prefix []string, cmds []*cli.Command)
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, c := range cmds {
			p := append(slices.Clone(prefix), c.Name)
			walk(p, c.Subcommands)
			if len(c.Subcommands) > 0 || c.ArgsUsage != "" {
				continue
			}
			code, out := runCode(t, append(p, "stray")...)
			if code != exitUsage || !strings.Contains(out, `unexpected arguments ["stray"]`) {
				t.Errorf("meridian %s stray: exit %d, want %d\n%s", strings.Join(p, " "), code, exitUsage, out)
			}
		}
	}
	walk(nil, app.Commands)
}

// TestExitCodesOther checks the other documented statuses where that is
// cheap: 0, 1 for findings and failed operations, 3 for tampering.
func TestExitCodesOther(t *testing.T) {
	clearMeridianEnv(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badPolicy := write("bad.yaml", "version: 1\nzones: {}\n")
	garbage := write("garbage.bin", "x")
	example := filepath.Join(deployRoot, "policies", "example.yaml")
	def := filepath.Join(deployRoot, "policies", "default.yaml")
	unhealthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer unhealthy.Close()
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer healthy.Close()
	root, _, cps := auditFixture(t)

	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"version"}, 0},
		{[]string{"help", "exit-codes"}, 0},
		{[]string{"help", "audit", "verify"}, 0},
		{[]string{"audit", "verify", "--help"}, 0},
		{[]string{"policy", "validate", example}, 0},
		{[]string{"probe", healthy.URL}, 0},
		{[]string{"audit", "verify", "--dir", root, "--checkpoints", cps}, 0},
		{[]string{"policy", "validate", badPolicy}, exitFailed},
		{[]string{"policy", "diff", "--exit-code", def, example}, exitFailed},
		{[]string{"events", "decode", garbage}, exitFailed},
		{[]string{"dr", "check", t.TempDir()}, exitFailed},
		{[]string{"probe", unhealthy.URL}, exitFailed},
		{[]string{"audit", "verify", "--dir", t.TempDir()}, exitFailed},
	} {
		if code, out := runCode(t, tc.args...); code != tc.code {
			t.Errorf("meridian %s: exit %d, want %d\n%s", strings.Join(tc.args, " "), code, tc.code, out)
		}
	}
	// Tampering: drop one record from the middle of a chain.
	seg := filepath.Join(root, "us-east-1-a", audit.SegmentName(1))
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if err := os.WriteFile(seg, []byte(strings.Join(slices.Delete(lines, 4, 5), "")), 0o640); err != nil {
		t.Fatal(err)
	}
	if code, out := runCode(t, "audit", "verify", "--dir", root, "--checkpoints", cps); code != exitVerification {
		t.Errorf("audit verify of a log with a deleted record: exit %d, want %d\n%s", code, exitVerification, out)
	}
}

// TestHelpExitCodes: the topic documents each status the binary uses.
func TestHelpExitCodes(t *testing.T) {
	code, out := runCode(t, "help", "exit-codes")
	if code != 0 {
		t.Fatalf("help exit-codes: exit %d\n%s", code, out)
	}
	for _, c := range []int{0, exitFailed, exitUsage, exitVerification} {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^  %d  \S`, c)).MatchString(out) {
			t.Errorf("help exit-codes does not document exit status %d:\n%s", c, out)
		}
	}
	if !strings.Contains(out, "tampering") || !strings.Contains(out, "Usage or configuration error") {
		t.Errorf("help exit-codes:\n%s", out)
	}
}

// flagUse is one flag of one command.
type flagUse struct {
	cmd, name, kind, usage string
	env                    []string
}

func flagKind(f cli.Flag) string {
	switch f.(type) {
	case *cli.StringFlag, *cli.StringSliceFlag, *cli.GenericFlag, *cli.PathFlag:
		return "string"
	case *cli.BoolFlag:
		return "bool"
	case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag, *cli.Uint64Flag, *cli.IntSliceFlag:
		return "integer"
	case *cli.DurationFlag:
		return "duration"
	case *cli.Float64Flag:
		return "float"
	}
	return fmt.Sprintf("%T", f)
}

// allFlags maps every flag name (aliases too) to its uses across the tree.
func allFlags(t *testing.T) map[string][]flagUse {
	uses := map[string][]flagUse{}
	var walk func(prefix string, cmds []*cli.Command)
	walk = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			path := strings.TrimSpace(prefix + " " + c.Name)
			for _, f := range c.Flags {
				if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() {
					t.Errorf("%s --%s is Required: urfave/cli exits 1 for a missing one; check it in the action with usageError", path, f.Names()[0])
				}
				u := flagUse{cmd: path, name: f.Names()[0], kind: flagKind(f)}
				if d, ok := f.(cli.DocGenerationFlag); ok {
					u.usage, u.env = d.GetUsage(), d.GetEnvVars()
				}
				for _, n := range f.Names() {
					uses[n] = append(uses[n], u)
				}
			}
			walk(path, c.Subcommands)
		}
	}
	walk("", newApp().Commands)
	return uses
}

// TestFlagGrammar: a flag name means one thing across the command tree.
// Every name that two commands use is in sharedFlags; each use has the
// entry's kind of value, its environment variable or none, and says what
// the entry says; an environment variable belongs to one flag name.
func TestFlagGrammar(t *testing.T) {
	uses := allFlags(t)
	shared := map[string]sharedFlag{}
	for _, f := range sharedFlags() {
		shared[f.name] = f
	}
	envOwner := map[string]string{}
	for name, us := range uses {
		cmds := map[string]bool{}
		for _, u := range us {
			cmds[u.cmd] = true
			for _, e := range u.env {
				if o, ok := envOwner[e]; ok && o != u.name {
					t.Errorf("$%s belongs to --%s and --%s (%s)", e, o, u.name, u.cmd)
				}
				envOwner[e] = u.name
			}
		}
		for _, u := range us {
			if u.name != us[0].name {
				t.Errorf("--%s stands for --%s in %s but for --%s in %s", name, u.name, u.cmd, us[0].name, us[0].cmd)
			}
		}
		if us[0].name != name {
			continue // an alias: its flag is checked under its name
		}
		entry, ok := shared[name]
		if !ok {
			if len(cmds) > 1 {
				t.Errorf("--%s is used by %d commands (%v) but is not in sharedFlags: give it one meaning there", name, len(cmds), slices.Sorted(maps.Keys(cmds)))
			}
			continue
		}
		if len(cmds) < 2 && name != "help" {
			t.Errorf("sharedFlags lists --%s, which only %v uses", name, slices.Sorted(maps.Keys(cmds)))
		}
		says := regexp.MustCompile(`(?i)` + regexp.QuoteMeta(entry.says))
		for _, u := range us {
			if u.kind != us[0].kind {
				t.Errorf("--%s takes a %s in %s but a %s in %s", name, u.kind, u.cmd, us[0].kind, us[0].cmd)
			}
			for _, e := range u.env {
				if !slices.Contains(strings.Fields(entry.env), e) {
					t.Errorf("%s --%s reads $%s; the flag's variables are %q", u.cmd, name, e, entry.env)
				}
			}
			if !says.MatchString(u.usage) {
				t.Errorf("%s --%s: usage %q does not say %q (--%s means: %s)", u.cmd, name, u.usage, entry.says, name, entry.meaning)
			}
		}
	}
	for _, f := range sharedFlags() {
		if _, ok := uses[f.name]; !ok {
			t.Errorf("sharedFlags lists --%s, which no command has", f.name)
		}
	}
	// The two URLs an operator gives: --admin is an admin API, --controller
	// a controller's own API; neither names the other.
	for _, u := range uses["admin"] {
		if !strings.Contains(u.usage, "URL") || !strings.Contains(u.usage, "admin API") {
			t.Errorf("%s --admin: %q is not an admin API URL", u.cmd, u.usage)
		}
	}
	for _, u := range uses["controller"] {
		if !strings.Contains(u.usage, "URL") || strings.Contains(u.usage, "admin") {
			t.Errorf("%s --controller: %q is not the URL of a controller's API", u.cmd, u.usage)
		}
	}
}

// TestEnvNamesMatchController: a secret the CLI and the controller both
// take from the environment has one variable name.
func TestEnvNamesMatchController(t *testing.T) {
	read := map[string]bool{}
	var cfg regional.Config
	cfg.ApplyEnv(func(k string) string { read[k] = true; return "" })
	uses := allFlags(t)
	for flag, env := range map[string]string{"token": "MERIDIAN_ADMIN_TOKEN"} {
		if !read[env] {
			t.Errorf("the controller does not read $%s", env)
		}
		for _, u := range uses[flag] {
			if !slices.Equal(u.env, []string{env}) {
				t.Errorf("%s --%s reads %v, the controller $%s", u.cmd, flag, u.env, env)
			}
		}
	}
	if !read[auditKeyEnv] {
		t.Errorf("the controller does not read $%s, the audit key the CLI reads", auditKeyEnv)
	}
	// The controller's own flags read the variables the CLI's do.
	env := map[string]string{}
	for _, f := range sharedFlags() {
		env[f.name] = f.env
	}
	for _, name := range []string{"kafka", "controller-id", "log-level", "log-format"} {
		for _, u := range uses[name] {
			if u.cmd == "controller" && !slices.Equal(u.env, []string{env[name]}) {
				t.Errorf("controller --%s reads %v, want $%s", name, u.env, env[name])
			}
		}
	}
	// The CLI takes the audit key from $MERIDIAN_AUDIT_KEY in the forms the
	// controller does (the bytes, or base64: and their base64).
	clearMeridianEnv(t)
	_, keyFile, _ := auditFixture(t)
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	key = bytes.TrimSpace(key)
	code, byFile := runCode(t, "audit", "hash", "--hmac-key-file", keyFile, "--tenant", "tenant-1")
	if code != 0 {
		t.Fatalf("audit hash --hmac-key-file: exit %d\n%s", code, byFile)
	}
	for _, v := range []string{string(key), "base64:" + base64.StdEncoding.EncodeToString(key)} {
		t.Setenv(auditKeyEnv, v)
		if code, byEnv := runCode(t, "audit", "hash", "--tenant", "tenant-1"); code != 0 || byEnv != byFile {
			t.Errorf("audit hash with $%s=%.12s...: exit %d %q; with --hmac-key-file %q", auditKeyEnv, v, code, byEnv, byFile)
		}
	}
}
