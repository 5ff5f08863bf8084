package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// exitOutcome says how the tests show one command exiting with one status:
// a run made by TestExitCodesEveryCommand (args, with the placeholders of
// outcomeEnv; interrupted runs the command with its context already
// cancelled, as SIGTERM would stop it), a test of this package that runs
// it to that status (test), or why the command never exits so (never).
type exitOutcome struct {
	args        []string
	interrupted bool
	test        string
	never       string
}

// exitOutcomes gives, for every command, how it exits 0 (success) and 1
// (findings or a failed operation); exit 2 is TestExitCodesUsage's, and 3
// (verification failure) belongs to audit verify and the demo only.
// A new command needs an entry.
var exitOutcomes = map[string]map[int]exitOutcome{
	"version":          {0: {args: []string{"version"}}, 1: {never: "it prints its version"}},
	"help":             {0: {args: []string{"help", "policy", "diff"}}, 1: {never: "it prints help"}},
	"dr check":         {0: {test: "TestDRCheckHealthyAndBroken"}, 1: {args: []string{"dr", "check", "{emptydir}"}}},
	"dr manifest init": {0: {test: "TestDRManifestInitAndCheck"}, 1: {args: []string{"dr", "manifest", "init", "{missing}"}}},
	"dr drill": {0: {test: "TestDRDrillCLI"}, 1: {args: []string{"dr", "drill", "--admin", "{dead}", "--token", "t",
		"--controller", "us-east-1={dead}", "--region", "us-east-1", "--admin-timeout", "5s"}}},
	"engine-sim":    {0: {args: []string{"engine-sim", "--addr", "127.0.0.1:0"}, interrupted: true}, 1: {args: []string{"engine-sim", "--addr", "{busy}"}}},
	"events decode": {0: {test: "TestEventsDecodeBinary"}, 1: {args: []string{"events", "decode", "{garbage}"}}},
	"events tail": {0: {test: "TestEventsTail"}, 1: {args: []string{"events", "tail", "--kafka", "{deadaddr}", "--topic", "t",
		"--kafka-tls", "--kafka-server-name", "x"}}},
	"policy validate":    {0: {args: []string{"policy", "validate", "{example}"}}, 1: {args: []string{"policy", "validate", "{badpolicy}"}}},
	"policy diff":        {0: {args: []string{"policy", "diff", "{default}", "{example}"}}, 1: {args: []string{"policy", "diff", "--exit-code", "{default}", "{example}"}}},
	"policy apply":       {0: {test: "TestPolicyApplyIdempotentAndDryRun"}, 1: {args: []string{"policy", "apply", "--admin", "{dead}", "--token", "t", "{example}"}}},
	"policy show":        {0: {test: "TestPolicyClusterCLI"}, 1: {args: []string{"policy", "show", "--admin", "{dead}", "--token", "t"}}},
	"policy diff-active": {0: {test: "TestPolicyClusterCLI"}, 1: {args: []string{"policy", "diff-active", "--admin", "{dead}", "--token", "t", "{example}"}}},
	"audit query":        {0: {args: []string{"audit", "query", "--dir", "{auditdir}"}}, 1: {args: []string{"audit", "query", "--admin", "{dead}", "--token", "t"}}},
	"audit tail":         {0: {test: "TestAuditTailCLI"}, 1: {args: []string{"audit", "tail", "--admin", "{dead}", "--token", "t"}}},
	"audit verify": {0: {args: []string{"audit", "verify", "--dir", "{auditdir}", "--checkpoints", "{checkpoints}"}},
		1: {args: []string{"audit", "verify", "--dir", "{emptydir}"}}, 3: {test: "TestExitCodesOther"}},
	"audit hash":               {0: {args: []string{"audit", "hash", "--hmac-key-file", "{auditkey}", "--tenant", "t"}}, 1: {never: "it hashes its arguments, checked first"}},
	"audit checkpoints export": {0: {test: "TestAgainstFleet"}, 1: {args: []string{"audit", "checkpoints", "export", "--admin", "{dead}", "--token", "t"}}},
	"controller":               {0: {test: "TestControllerReloadsOnSIGHUP"}, 1: {args: []string{"controller", "--config", "{busyconfig}"}}},
	"certs init":               {0: {test: "TestCertsInitCLI"}, 1: {args: []string{"certs", "init", "--regions", "us-east-1", "--dir", "{underfile}"}}},
	"auth keygen":              {0: {args: []string{"auth", "keygen", "--name", "n", "--tenant", "t"}}, 1: {never: "it draws a random key and prints it"}},
	"gossip keys list":         {0: {test: "TestGossipKeysCLI"}, 1: {args: []string{"gossip", "keys", "list", "--admin", "{dead}", "--token", "t"}}},
	"gossip keys install":      {0: {test: "TestGossipKeysCLI"}, 1: {args: []string{"gossip", "keys", "install", "--admin", "{dead}", "--token", "t", "--key", "{gossipkey}"}}},
	"gossip keys use":          {0: {test: "TestGossipKeysCLI"}, 1: {args: []string{"gossip", "keys", "use", "--admin", "{dead}", "--token", "t", "--key", "{gossipkey}"}}},
	"gossip keys remove":       {0: {test: "TestGossipKeysCLI"}, 1: {args: []string{"gossip", "keys", "remove", "--admin", "{dead}", "--token", "t", "--key", "{gossipkey}"}}},
	"kafka-dev":                {0: {test: "TestKafkaDev"}, 1: {args: []string{"kafka-dev", "--addr", "{busy}"}}},
	"kv-bridge": {0: {test: "TestKVBridgeRuns"}, 1: {args: []string{"kv-bridge", "--kafka", "127.0.0.1:9", "--region", "us-east-1",
		"--pod", "a=tcp://127.0.0.1:9", "--metrics-addr", "{busy}"}}},
	"route":            {0: {test: "TestAgainstFleet"}, 1: {args: []string{"route", "--controller", "{dead}", "--api-key", "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk", "hello"}}},
	"failover trigger": {0: {test: "TestFailoverCLI"}, 1: {args: []string{"failover", "trigger", "--admin", "{dead}", "--token", "t", "--region", "r"}}},
	"failover recover": {0: {test: "TestFailoverCLI"}, 1: {args: []string{"failover", "recover", "--admin", "{dead}", "--token", "t", "--region", "r"}}},
	"failover status":  {0: {test: "TestFailoverCLI"}, 1: {args: []string{"failover", "status", "--admin", "{dead}", "--token", "t"}}},
	"sim":              {0: {test: "TestSimCommandWorkloadsAndErrors"}, 1: {never: "a simulation runs to its end; what it cannot run is a usage error"}},
	"demo":             {0: {test: "TestDemoOutcome"}, 1: {test: "TestDemoOutcome"}, 3: {test: "TestDemoOutcome"}},
	"probe":            {0: {test: "TestExitCodesOther"}, 1: {args: []string{"probe", "{dead}/healthz"}}},
}

// outcomeEnv builds the placeholders of exitOutcomes: {dead} is an https
// URL whose server closes every connection, {busy} an address already
// listened on, and files for the commands to read.
func outcomeEnv(t *testing.T) map[string]string {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Close() })
	go func() {
		for {
			c, err := dead.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	root, keyFile, cps := auditFixture(t)
	file := write("file", "x")
	return map[string]string{
		"{dead}":        "https://" + dead.Addr().String(),
		"{deadaddr}":    dead.Addr().String(),
		"{busy}":        busy.Addr().String(),
		"{emptydir}":    t.TempDir(),
		"{missing}":     filepath.Join(dir, "missing"),
		"{underfile}":   filepath.Join(file, "pki"),
		"{garbage}":     write("garbage.bin", "x"),
		"{example}":     filepath.Join(deployRoot, "policies", "example.yaml"),
		"{default}":     filepath.Join(deployRoot, "policies", "default.yaml"),
		"{badpolicy}":   write("bad.yaml", "version: 1\nzones: {}\n"),
		"{auditdir}":    root,
		"{auditkey}":    keyFile,
		"{checkpoints}": cps,
		"{gossipkey}":   "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleSE=",
		"{busyconfig}": write("busy.yaml", "region: us-east-1\nlisten: "+busy.Addr().String()+
			"\nadmin_listen: 127.0.0.1:0\nkafka: {brokers: [127.0.0.1:9]}\nreload: {watch_interval: 0s}\n"),
	}
}

// TestExitCodesEveryCommand: every command's success (0) and failure (1)
// is shown by a test, made here when it is cheap; exitOutcomes names, for
// the others, the test that shows it, or why the command cannot end so.
func TestExitCodesEveryCommand(t *testing.T) {
	clearMeridianEnv(t)
	leaves, _ := commandPaths()
	var tests bytes.Buffer
	files, _ := filepath.Glob("*_test.go")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		tests.Write(b)
	}
	env := outcomeEnv(t)
	for _, p := range leaves {
		path := strings.Join(p, " ")
		outcomes, ok := exitOutcomes[path]
		if !ok {
			t.Errorf("exitOutcomes has no entry for %q: say how it exits 0 and 1", path)
			continue
		}
		for _, code := range []int{0, exitFailed} {
			if _, ok := outcomes[code]; !ok {
				t.Errorf("%s: exitOutcomes does not say how it exits %d", path, code)
			}
		}
		for code, o := range outcomes {
			switch {
			case o.never != "":
			case o.test != "":
				if !regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(o.test) + `\(`).Match(tests.Bytes()) {
					t.Errorf("%s exit %d: no test %s in this package", path, code, o.test)
				}
			case len(o.args) > 0:
				args := slices.Clone(o.args)
				for i, a := range args {
					for k, v := range env {
						args[i] = strings.ReplaceAll(args[i], k, v)
					}
					if strings.Contains(args[i], "{") && strings.Contains(args[i], "}") && !strings.Contains(a, "=") {
						t.Fatalf("%s: unknown placeholder in %q", path, a)
					}
				}
				ctx := context.Background()
				if o.interrupted {
					c, cancel := context.WithCancel(ctx)
					cancel()
					ctx = c
				}
				if got, out := runCodeCtx(t, ctx, args...); got != code {
					t.Errorf("meridian %s: exit %d, want %d\n%s", strings.Join(args, " "), got, code, out)
				}
			default:
				t.Errorf("%s exit %d: an outcome needs args, a test or a reason", path, code)
			}
		}
	}
	for path := range exitOutcomes {
		if !slices.ContainsFunc(leaves, func(p []string) bool { return strings.Join(p, " ") == path }) {
			t.Errorf("exitOutcomes names %q, which is not a command", path)
		}
	}
}

// runCodeCtx is runCode with a context.
func runCodeCtx(t *testing.T, ctx context.Context, args ...string) (int, string) {
	t.Helper()
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	app.Reader = strings.NewReader("")
	err := app.RunContext(ctx, append([]string{"meridian"}, args...))
	if err != nil {
		errOut.WriteString(err.Error())
	}
	return exitCode(err), out.String() + errOut.String()
}
