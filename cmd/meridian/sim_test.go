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

// TestSimCommandTrace: `meridian sim --trace FILE --regions N
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
	out, _, err := runSim(t, "--trace", trace, "--regions", "4", "--pods-per-region", "2", "--policy", "all", "--json", "--charts", charts, "--quiet")
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
	if len(rows) != 6 || rows[4].Policy != "meridian" || rows[4].HitRate == nil || *rows[4].HitRate <= 0 {
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
		{"--workload", "short", "--regions", "0"},
		{"--workload", "short", "--origin-shares", "1,x,1"},
		{"--trace", "does-not-exist.jsonl"},
		{"--trace", "x.jsonl", "--workload", "rag"},
	} {
		_, _, err := runSim(t, args...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("%v: error %v, want exit status 2", args, err)
		}
	}
}
