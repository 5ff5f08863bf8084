package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// TestAgainstFleet runs the commands that talk to controllers against one
// 3-region fleet on loopback: route, then audit query fanned out over the
// admin APIs, then audit verify --admin, which seals the audit logs (last).
func TestAgainstFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, err := fleet.Start(ctx, fleet.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := f.Close(cctx); err != nil {
			t.Errorf("fleet close: %v", err)
		}
	})
	t.Setenv("MERIDIAN_CA_CERT", f.PKI.CACert) // https, with the fleet's CA
	var urls []string
	for _, r := range f.Regions {
		urls = append(urls, r.Controller.AdminURL())
	}
	t.Run("route", func(t *testing.T) { testRouteCommand(t, f) })
	t.Run("audit query", func(t *testing.T) { testAuditQueryFansOut(t, f, urls) })
	t.Run("audit verify --admin", func(t *testing.T) {
		for _, r := range f.Regions {
			_ = r.Controller.Audit().Close() // seal, and checkpoint into Raft
		}
		out, errOut, err := runApp(t, "audit", "verify", "--dir", f.AuditDir(), "--admin", urls[0], "--token", f.AdminToken)
		t.Logf("verify:\n%s%s", out, errOut)
		if err != nil || !strings.Contains(out, "ctl-us-east-1") || strings.Contains(errOut, "no --checkpoints") {
			t.Fatalf("audit verify --admin: %v\n%s", err, out)
		}
	})
	t.Run("audit checkpoints export", func(t *testing.T) { testCheckpointsExport(t, f, urls[1]) })
}

// audit checkpoints export writes what audit verify --checkpoints reads: the
// export of the sealed logs' checkpoints verifies them, and catches a tail
// cut after the export that a verify without checkpoints cannot see.
func testCheckpointsExport(t *testing.T, f *fleet.Fleet, admin string) {
	exported, errOut, err := runApp(t, "audit", "checkpoints", "export", "--admin", admin, "--token", f.AdminToken)
	if err != nil || !strings.Contains(errOut, "checkpoints of ") {
		t.Fatalf("export: %v\n%s", err, errOut)
	}
	file := filepath.Join(t.TempDir(), "checkpoints.jsonl")
	if err := os.WriteFile(file, []byte(exported), 0o600); err != nil {
		t.Fatal(err)
	}
	cps, err := audit.ReadCheckpointsFile(file)
	if err != nil {
		t.Fatalf("the export does not read back: %v\n%s", err, exported)
	}
	if n := strings.Count(exported, "\n"); n != len(cps) {
		t.Fatalf("%d checkpoints read back from %d lines", len(cps), n)
	}
	// The export verifies the logs exactly as the Raft tier's checkpoints do.
	verified, errOut, err := runApp(t, "audit", "verify", "--dir", f.AuditDir(), "--checkpoints", file)
	if err != nil || !strings.Contains(verified, "0 problems") || strings.Contains(errOut, "no --checkpoints") {
		t.Fatalf("verify --checkpoints of the export: %v\n%s%s", err, verified, errOut)
	}
	viaAdmin, _, err := runApp(t, "audit", "verify", "--dir", f.AuditDir(), "--admin", admin, "--token", f.AdminToken)
	if err != nil || viaAdmin != verified {
		t.Fatalf("verify --admin says\n%s\nverify --checkpoints of the export says\n%s", viaAdmin, verified)
	}
	// Every controller has checkpoints, and --controller-id exports exactly
	// its lines of the whole export.
	byController := map[string]string{}
	last := map[string]audit.Checkpoint{}
	for i, line := range strings.SplitAfter(exported, "\n")[:len(cps)] {
		byController[cps[i].Controller] += line
		last[cps[i].Controller] = cps[i]
	}
	for id, want := range byController {
		one, _, err := runApp(t, "audit", "checkpoints", "export", "--admin", admin, "--token", f.AdminToken, "--controller-id", id)
		if err != nil || one != want {
			t.Fatalf("export --controller-id %s: %v\n%s\nwant\n%s", id, err, one, want)
		}
	}

	// Cut the last record of one chain: without checkpoints the shorter
	// chain looks intact, against the export it is a verification failure.
	victim := last[cps[0].Controller]
	seg := filepath.Join(f.AuditDir(), victim.Controller, victim.Segment)
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	if err := os.WriteFile(seg, []byte(strings.Join(lines[:len(lines)-1], "")), 0o640); err != nil {
		t.Fatal(err)
	}
	if out, _, err := runApp(t, "audit", "verify", "--dir", f.AuditDir()); err != nil {
		t.Fatalf("without checkpoints the cut chain should still verify: %v\n%s", err, out)
	}
	out, _, err := runApp(t, "audit", "verify", "--dir", f.AuditDir(), "--checkpoints", file)
	if code := exitCode(err); code != exitVerification || !strings.Contains(out, victim.Controller) {
		t.Fatalf("verify of a cut chain against the export: exit %d (want %d)\n%s", code, exitVerification, out)
	}
}

// audit query --admin fans out over the controllers' admin APIs.
func testAuditQueryFansOut(t *testing.T, f *fleet.Fleet, urls []string) {
	body, _ := json.Marshal(map[string]any{"model": "meridian/sim-70b", "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": "records of a patient"}}})
	req, _ := http.NewRequest(http.MethodPost, f.Region("us-east-1").Controller.URL()+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set(regional.HeaderTenant, "eu-health")
	req.Header.Set(regional.HeaderDataClass, "phi")
	resp, err := f.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	id := resp.Header.Get(regional.HeaderDecisionID)
	if resp.StatusCode != 200 || id == "" || resp.Header.Get("X-Meridian-Forwarded-To") != "eu-west-1" {
		t.Fatalf("EU PHI from us-east-1: %d, decision %q, to %q", resp.StatusCode, id, resp.Header.Get("X-Meridian-Forwarded-To"))
	}
	out, _, err := runApp(t, "audit", "query", "--admin", strings.Join(urls, ","), "--token", f.AdminToken, "--kind", "cross_region", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, id) != 1 || !strings.Contains(out, `"region":"eu-west-1"`) {
		t.Fatalf("the cross-region decision %s is not listed once:\n%s", id, out)
	}
	if _, _, err := runApp(t, "audit", "query", "--admin", urls[0], "--token", "wrong", "--kind", "cross_region"); err == nil {
		t.Fatal("a wrong token was accepted")
	}
}

func testRouteCommand(t *testing.T, f *fleet.Fleet) {
	us := f.Region("us-east-1").Controller.URL()
	out, _, err := runApp(t, "route", "--controller", us, "--tenant", "acme", "--data-class", "public", "hello there")
	if err != nil || !strings.Contains(out, "region: us-east-1 (here)") || !strings.Contains(out, "pod: us-east-1-pod-") {
		t.Fatalf("local route: %v\n%s", err, out)
	}
	out, _, err = runApp(t, "route", "--controller", us, "--tenant", "eu-health", "--data-class", "phi", "records of a patient")
	if err != nil || !strings.Contains(out, "region: eu-west-1 (another region") || !strings.Contains(out, "regions compared") {
		t.Fatalf("EU PHI route: %v\n%s", err, out)
	}
	// The cost table carries the estimate's terms (a decode that misses the
	// JSON keys prints 0 in every column).
	if total, ok := comparedTotal(out, "eu-west-1"); !ok || total <= 0 {
		t.Fatalf("EU PHI route: eu-west-1's total cost is %v (found %v), want > 0:\n%s", total, ok, out)
	}
	if _, _, err := runApp(t, "route", "--controller", us, "--tenant", "embargoed-1", "--data-class", "public", "x"); err == nil || !strings.Contains(err.Error(), "residency_denied") {
		t.Fatalf("embargoed route: %v", err)
	}
	if _, _, err := runApp(t, "route", "--controller", us); err == nil {
		t.Fatal("no prompt accepted")
	}
}

// comparedTotal returns the "total ms" column of region's row in the
// "regions compared" table that `meridian route` prints.
func comparedTotal(out, region string) (float64, bool) {
	_, table, ok := strings.Cut(out, "regions compared")
	if !ok {
		return 0, false
	}
	for _, line := range strings.Split(table, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(line, "  ") {
			break // the table ends at the first line that is not a row
		}
		if f[0] == region && len(f) >= 7 {
			v, err := strconv.ParseFloat(f[6], 64)
			return v, err == nil
		}
	}
	return 0, false
}
