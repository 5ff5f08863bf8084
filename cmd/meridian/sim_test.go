package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runSim(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	err = app.Run(append([]string{"meridian", "sim"}, args...))
	return out.String(), errOut.String(), err
}

// TestSimCommandTrace: `meridian sim --trace FILE --region-count N
// --pods-per-region M --policy all --json` on a small Mooncake-format file
// prints one JSON array with one object per policy.
func TestSimCommandTrace(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	var b strings.Builder
	for i := range 200 {
		conv := i % 37
		turn := i / 37
		ids := []string{"0", fmt.Sprint(1000 + conv)}
		for k := range turn {
			ids = append(ids, fmt.Sprint(100000+conv*100+k))
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 50, "hash_ids": [%s]}`+"\n",
			i*300, len(ids)*512-100, strings.Join(ids, ", "))
	}
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	charts := filepath.Join(dir, "charts")
	out, _, err := runSim(t, "--trace", trace, "--region-count", "4", "--pods-per-region", "2", "--policy", "all", "--json", "--charts", charts, "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Policy  string   `json:"policy"`
		HitRate *float64 `json:"hit_rate"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rows) != 12 || rows[10].Policy != "meridian" || rows[10].HitRate == nil || *rows[10].HitRate <= 0 {
		t.Errorf("rows: %s", out)
	}
	if _, err := os.Stat(filepath.Join(charts, "ttft_cdf.svg")); err != nil {
		t.Error(err)
	}
}

func TestSimCommandWorkloadsAndErrors(t *testing.T) {
	out, _, err := runSim(t, "--workload", "short", "--duration", "10s", "--pods-per-region", "2", "--policy", "round_robin,meridian", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "meridian") || strings.Contains(out, "least_loaded") {
		t.Errorf("table:\n%s", out)
	}
	for _, args := range [][]string{
		{},
		{"--workload", "trace"},
		{"--workload", "chat"},
		{"--workload", "short", "--policy", "random"},
		{"--workload", "short", "--region-count", "0"},
		{"--workload", "short", "--origin-shares", "1,x,1"},
		{"--trace", "does-not-exist.jsonl"},
		{"--trace", "x.jsonl", "--workload", "rag"},
		{"--workload", "short", "--seeds", "3"},
		{"--workload", "short", "--load", "0.2,x"},
		{"--workload", "short", "--load", "0.2", "--seeds", "0"},
		{"--workload", "short", "--scenario", "mars"},
		{"--workload", "short", "--model-error", "2"},
	} {
		_, _, err := runSim(t, args...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("%v: error %v, want exit status 2", args, err)
		}
	}
}

// TestSimCommandControllerConfig: --controller-config runs Meridian's
// policies with a controller config file's decision and gorgo sections.
// A config that makes the decision layer round-robin over live pods and
// never forward reproduces the round-robin baseline exactly; a config the
// controller would refuse is refused here too.
func TestSimCommandControllerConfig(t *testing.T) {
	dir := t.TempDir()
	rr := filepath.Join(dir, "rr.yaml")
	if err := os.WriteFile(rr, []byte("region: us-east-1\nlisten: 127.0.0.1:0\ndecision:\n  policy: round_robin\n  filters: [alive]\ngorgo:\n  forward_margin_ms: 1e9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	type row struct {
		Policy  string  `json:"policy"`
		HitRate float64 `json:"hit_rate"`
		P50     float64 `json:"ttft_p50_ms"`
		P95     float64 `json:"ttft_p95_ms"`
		Cross   int     `json:"cross_region_requests"`
	}
	run := func(extra ...string) map[string]row {
		args := append([]string{"--workload", "rag", "--duration", "20s", "--pods-per-region", "2", "--eu-health-share", "0", "--policy", "round_robin,meridian", "--json", "--quiet"}, extra...)
		out, _, err := runSim(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		var rows []row
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		m := map[string]row{}
		for _, r := range rows {
			m[r.Policy] = r
		}
		return m
	}
	def := run()
	if def["meridian"] == def["round_robin"] {
		t.Fatalf("with the default config meridian equals round-robin: %+v", def)
	}
	got := run("--controller-config", rr)
	m, base := got["meridian"], got["round_robin"]
	m.Policy = base.Policy
	if m != base || m.Cross != 0 {
		t.Errorf("round-robin controller config: meridian %+v, round-robin baseline %+v", got["meridian"], base)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("region: us-east-1\ndecision:\n  bounded_load_factr: 1.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runSim(t, "--workload", "short", "--controller-config", bad, "--quiet")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "bounded_load_factr") {
		t.Errorf("misspelt key: error %v, want exit status 2 naming the key", err)
	}
}

// TestSimCommandSweep: --load L1,L2 --seeds N --json prints {"runs": [...]}
// with one object per (load, policy); --report writes one HTML page.
func TestSimCommandSweep(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, "report.html")
	out, _, err := runSim(t, "--workload", "short", "--duration", "15s", "--pods-per-region", "2", "--load", "0.3,0.6", "--seeds", "2",
		"--policy", "gorgo,meridian", "--ablations", "--scenario", "roaming", "--model-error", "0.3", "--json", "--report", report, "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Runs []struct {
			Load   float64    `json:"load"`
			Policy string     `json:"policy"`
			Seeds  int        `json:"seeds"`
			CI     [2]float64 `json:"ttft_p95_ci95_ms"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Runs) != 2*6 || doc.Runs[0].Load != 0.3 || doc.Runs[0].Policy != "gorgo" || doc.Runs[0].Seeds != 2 {
		t.Errorf("runs: %s", out)
	}
	page, err := os.ReadFile(report)
	if err != nil || !bytes.Contains(page, []byte("<svg")) || !bytes.Contains(page, []byte("roam share")) {
		t.Errorf("report: %v, %d bytes", err, len(page))
	}
}
