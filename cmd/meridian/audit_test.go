package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global/audit"
)

var auditTestKey = []byte("cli-test-key-0123456789abcdef")

// auditFixture writes two controllers' logs (ten records each) and a
// checkpoint file; it returns the root, the key file and the checkpoint file.
func auditFixture(t *testing.T) (root, keyFile, cpFile string) {
	t.Helper()
	root = t.TempDir()
	keyFile = filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, append(auditTestKey, '\n'), 0o600)
	cpFile = filepath.Join(t.TempDir(), "checkpoints.jsonl")
	sink := &audit.FileSink{Path: cpFile}
	for c, id := range []string{"us-east-1-a", "eu-west-1-a"} {
		cfg := audit.DefaultConfig()
		cfg.Dir, cfg.ControllerID, cfg.HMACKey = root, id, auditTestKey
		l, err := audit.Open(cfg, audit.Deps{Sink: sink})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			kind := audit.KindCrossRegion
			if i%3 == 0 {
				kind = audit.KindResidencyDenied
			}
			err := l.Append(context.Background(), audit.Entry{
				Kind: kind, DecisionID: fmt.Sprintf("d-%d-%d", c, i), Tenant: fmt.Sprintf("tenant-%d", i%2),
				Origin: []string{"us-east-1", "eu-west-1"}[c], Region: "us-west-2", Pod: "pod-1",
				Rule: "eu-phi-stays", PolicyVersion: "12", Cost: json.RawMessage(`{"winner":"us-west-2","saving_ms":120.5}`),
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil { // publishes the final checkpoint
			t.Fatal(err)
		}
	}
	return root, keyFile, cpFile
}

func runAudit(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	err := app.RunContext(context.Background(), append([]string{"meridian", "audit"}, args...))
	if err != nil {
		errOut.WriteString(err.Error())
	}
	return out.String(), errOut.String(), exitCode(err)
}

func TestAuditVerifyCLI(t *testing.T) {
	root, _, cps := auditFixture(t)
	out, _, code := runAudit(t, "verify", "--dir", root, "--checkpoints", cps)
	if code != 0 || !strings.Contains(out, "controller us-east-1-a: 1 segments, 10 records") || !strings.Contains(out, "0 problems") {
		t.Fatalf("verify of an intact log: code %d\n%s", code, out)
	}
	// Edit one record: exit 3, and the report names the file and line.
	seg := filepath.Join(root, "eu-west-1-a", audit.SegmentName(1))
	b, _ := os.ReadFile(seg)
	os.WriteFile(seg, bytes.Replace(b, []byte(`"pod":"pod-1"`), []byte(`"pod":"pod-2"`), 1), 0o640)
	out, errOut, code := runAudit(t, "verify", "--dir", root, "--checkpoints", cps)
	if code != exitVerification || !strings.Contains(out, "PROBLEM edited: eu-west-1-a/"+audit.SegmentName(1)+" line 1 (seq 1)") ||
		!strings.Contains(errOut, "1 problems") {
		t.Fatalf("verify of an edited log: code %d\n%s\n%s", code, out, errOut)
	}
	out, _, code = runAudit(t, "verify", "--dir", root, "--checkpoints", cps, "--json")
	var rep struct {
		OK       bool            `json:"ok"`
		Problems []audit.Problem `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != exitVerification || rep.OK || len(rep.Problems) != 1 || rep.Problems[0].Line != 1 {
		t.Fatalf("json report: %v %+v\n%s", err, rep, out)
	}
}

func TestAuditVerifyCLIErrors(t *testing.T) {
	root, _, _ := auditFixture(t)
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	os.WriteFile(bad, []byte(`{"controller":"x"}`+"\n"), 0o640)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"verify"}, 2, "--dir is required"},
		{[]string{"verify", "--dir", filepath.Join(root, "nope")}, 2, "is not a directory"},
		{[]string{"verify", "--dir", root, "--checkpoints", bad}, 2, "line 1"},
		{[]string{"verify", "--dir", root, "--checkpoints", filepath.Join(root, "missing")}, 2, "no such file"},
		{[]string{"verify", "--dir", t.TempDir()}, 1, "no audit segments"},
		{[]string{"verify", "--dir", root, "extra"}, 2, "unexpected arguments"},
		{[]string{"checkpoints", "export", "--token", "t"}, 2, "--admin (or MERIDIAN_ADMIN) is required"},
		{[]string{"checkpoints", "export", "--admin", "https://127.0.0.1:1", "--token", "t", "out.jsonl"}, 2, "unexpected arguments"},
	} {
		_, errOut, code := runAudit(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%v: code %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.msg)
		}
	}
}

func TestAuditQueryCLI(t *testing.T) {
	root, keyFile, _ := auditFixture(t)
	out, errOut, code := runAudit(t, "query", "--dir", root, "--region", "eu-west-1", "--kind", "residency_denied")
	if code != 0 || strings.Count(out, "\n") != 4 || !strings.Contains(errOut, "4 records") || !strings.Contains(out, "eu-west-1-a#1 residency_denied eu-west-1 -> us-west-2/pod-1") {
		t.Fatalf("query: code %d\n%s%s", code, out, errOut)
	}
	out, _, code = runAudit(t, "query", "--dir", root, "--tenant", "tenant-1", "--hmac-key-file", keyFile, "--json", "--limit", "3")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 {
		t.Fatalf("tenant query: code %d\n%s", code, out)
	}
	for _, l := range lines {
		var r audit.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.TenantHMAC == "" || strings.Contains(l, "tenant-1") {
			t.Fatalf("json line %s: %v", l, err)
		}
	}
	hashOut, _, _ := runAudit(t, "hash", "--hmac-key-file", keyFile, "--tenant", "tenant-1")
	if !strings.Contains(lines[0], strings.Fields(hashOut)[0]) {
		t.Fatalf("audit hash %q does not match the stored tenant_h in %s", hashOut, lines[0])
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if out, _, code := runAudit(t, "query", "--dir", root, "--from", future); code != 0 || out != "" {
		t.Fatalf("future range: code %d %q", code, out)
	}
	if out, _, code := runAudit(t, "query", "--dir", root, "--from", "1h", "--to", future, "--controller-id", "us-east-1-a"); code != 0 || strings.Count(out, "\n") != 10 {
		t.Fatalf("last hour of one controller: code %d\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"query", "--dir", root, "--tenant", "t"}, "--tenant needs the audit HMAC key"},
		{[]string{"query", "--dir", root, "--from", "last tuesday"}, "--from:"},
		{[]string{"query", "--dir", root, "--kind", "Cross Region"}, `kind "Cross Region"`},
		{[]string{"query", "--dir", root, "--from", "2026-12-02", "--to", "2026-12-01"}, "is not after"},
		{[]string{"query", "--dir", root, "--hmac-key-file", filepath.Join(root, "none")}, "--hmac-key-file"},
		{[]string{"hash", "--hmac-key-file", keyFile}, "exactly one of --tenant and --session"},
	} {
		_, errOut, code := runAudit(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%v: code %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.msg)
		}
	}
}

func TestAuditTailCLI(t *testing.T) {
	root, _, _ := auditFixture(t)
	cfg := audit.DefaultConfig()
	cfg.Dir, cfg.ControllerID, cfg.HMACKey = root, "us-east-1-a", auditTestKey
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw, _ := os.Pipe()
	app := newApp()
	app.Writer, app.ErrWriter = pw, os.Stderr
	done := make(chan int, 1)
	go func() {
		err := app.RunContext(ctx, []string{"meridian", "audit", "tail", "--dir", root, "--poll", "5ms", "--kind", "cross_region"})
		pw.Close()
		done <- exitCode(err)
	}()
	l, err := audit.Open(cfg, audit.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The tail starts at the end of the log as it finds it; it may still be
	// starting, so keep appending (a residency denial it must filter out,
	// then a cross-region record it must print) until it prints one.
	buf := make([]byte, 4096)
	var got string
	for i := 0; i < 200 && !strings.Contains(got, "cross_region"); i++ {
		for j, kind := range []audit.Kind{audit.KindResidencyDenied, audit.KindCrossRegion} {
			e := audit.Entry{Kind: kind, DecisionID: fmt.Sprintf("new-%d-%d", i, j), Origin: "us-east-1", Region: "us-west-2",
				Rule: "stay-in-us", PolicyVersion: "12", Cost: json.RawMessage(`{"winner":"us-west-2"}`)}
			if err := l.Append(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		_ = pr.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, _ := pr.Read(buf)
		got += string(buf[:n])
	}
	if !strings.Contains(got, "us-east-1-a#") || !strings.Contains(got, "decision=new-") || strings.Contains(got, "residency_denied") {
		t.Fatalf("tail printed %q", got)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("tail exit %d after interrupt", code)
	}
}
