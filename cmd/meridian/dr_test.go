package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-llm/meridian/dr/check"
	"github.com/meridian-llm/meridian/dr/check/checktest"
)

// runDR runs the meridian CLI with args and returns stdout, stderr and the
// exit status main would use.
func runDR(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	err := app.Run(append([]string{"meridian"}, args...))
	return out.String(), errOut.String(), exitCode(err)
}

func healthyDir(t *testing.T, v checktest.Variant) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := checktest.WriteHealthy(dir, v); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDRCheckHealthyAndBroken(t *testing.T) {
	dir := healthyDir(t, checktest.BF16)
	out, _, code := runDR(t, "dr", "check", dir)
	if code != 0 || !strings.Contains(out, "OK: 0 blocking") {
		t.Fatalf("healthy: exit %d\n%s", code, out)
	}
	if err := os.Remove(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	out, _, code = runDR(t, "dr", "check", dir)
	if code != 1 || !strings.Contains(out, "tokenizer.json  [tokenizer_missing]") || !strings.Contains(out, "FAIL: 1 blocking") {
		t.Fatalf("broken: exit %d\n%s", code, out)
	}
	out, _, code = runDR(t, "dr", "check", "--json", dir)
	if code != 1 {
		t.Fatalf("broken --json: exit %d", code)
	}
	var rep check.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output is not a report: %v\n%s", err, out)
	}
	if rep.Counts.Blocking != 1 || rep.Findings[0].Code != check.CodeTokenizerMissing || rep.Findings[0].Path != "tokenizer.json" {
		t.Fatalf("json report %+v", rep)
	}
}

func TestDRManifestInitAndCheck(t *testing.T) {
	dir := healthyDir(t, checktest.AWQ)
	out, _, code := runDR(t, "dr", "manifest", "init", dir)
	manifest := filepath.Join(dir, check.DefaultManifestName)
	if code != 0 || !strings.Contains(out, "wrote "+manifest+": 12 files") {
		t.Fatalf("init: exit %d\n%s", code, out)
	}
	m, err := check.LoadManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 12 || m.Files[0].SHA256 == "" {
		t.Fatalf("manifest %+v", m)
	}
	// check DIR picks up DIR/dr-manifest.yaml and verifies every checksum.
	out, _, code = runDR(t, "dr", "check", dir)
	if code != 0 || !strings.Contains(out, "against "+manifest) || !strings.Contains(out, "12 checksums verified") {
		t.Fatalf("check with manifest: exit %d\n%s", code, out)
	}
	// --manifest FILE alone checks the manifest's directory.
	if out, _, code = runDR(t, "dr", "check", "--manifest", manifest); code != 0 {
		t.Fatalf("check --manifest: exit %d\n%s", code, out)
	}
	// A flipped byte in the tokenizer: same size, different sha256.
	tok := filepath.Join(dir, "tokenizer.json")
	b, err := os.ReadFile(tok)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(`"version": "1.0"`), []byte(`"version": "1.1"`), 1)
	if err := os.WriteFile(tok, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, code = runDR(t, "dr", "check", dir)
	if code != 1 || !strings.Contains(out, "tokenizer.json  [checksum_mismatch]") {
		t.Fatalf("corrupted: exit %d\n%s", code, out)
	}
	// --checksums never skips it (and says so); --no-manifest ignores the manifest.
	out, _, code = runDR(t, "dr", "check", "--checksums", "never", dir)
	if code != 0 || !strings.Contains(out, "[checksums_skipped]") {
		t.Fatalf("--checksums never: exit %d\n%s", code, out)
	}
	if out, _, code = runDR(t, "dr", "check", "--no-manifest", dir); code != 0 || strings.Contains(out, "against") {
		t.Fatalf("--no-manifest: exit %d\n%s", code, out)
	}
}

func TestDRManifestInitRefusesUnhealthyFolder(t *testing.T) {
	dir := healthyDir(t, checktest.BF16)
	if err := os.Remove(filepath.Join(dir, checktest.Shard2)); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runDR(t, "dr", "manifest", "init", dir)
	if code != 1 || !strings.Contains(errOut, "[shard_missing]") {
		t.Fatalf("init of a broken folder: exit %d\n%s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, check.DefaultManifestName)); !os.IsNotExist(err) {
		t.Fatalf("manifest written for a broken folder: %v", err)
	}
	out, _, code := runDR(t, "dr", "manifest", "init", "--force", "--no-checksums", "-o", "-", dir)
	if code != 0 || !strings.HasPrefix(out, "# Meridian DR manifest") || strings.Contains(out, "sha256:") {
		t.Fatalf("init --force -o -: exit %d\n%s", code, out)
	}
}

func TestDRCompareRegions(t *testing.T) {
	us := healthyDir(t, checktest.BF16)
	eu := healthyDir(t, checktest.BF16)
	out, _, code := runDR(t, "dr", "check", "--compare", "us-east-1="+us, "eu-west-1="+eu)
	if code != 0 || !strings.Contains(out, "compared 14 files across us-east-1, eu-west-1: 14 by sha256") {
		t.Fatalf("identical regions: exit %d\n%s", code, out)
	}
	if err := os.Remove(filepath.Join(eu, "tokenizer_config.json")); err != nil {
		t.Fatal(err)
	}
	out, _, code = runDR(t, "dr", "check", "--compare", "us-east-1="+us, "--compare", "eu-west-1="+eu)
	if code != 1 || !strings.Contains(out, "tokenizer_config.json  [region_file_missing]\n      missing in eu-west-1; present in us-east-1") {
		t.Fatalf("differing regions: exit %d\n%s", code, out)
	}
}

func TestDRCheckUsage(t *testing.T) {
	dir := healthyDir(t, checktest.BF16)
	for name, args := range map[string][]string{
		"nothing":          {"dr", "check"},
		"two dirs":         {"dr", "check", dir, dir},
		"one region":       {"dr", "check", "--compare", "a=" + dir},
		"dir and compare":  {"dr", "check", "--compare", "a=" + dir, "b=" + dir, dir},
		"bad region spec":  {"dr", "check", "--compare", "a=" + dir, "--compare", "=" + dir},
		"flag after args":  {"dr", "check", dir, "--json"},
		"bad checksums":    {"dr", "check", "--checksums", "sometimes", dir},
		"bad workers":      {"dr", "check", "--workers", "-1", dir},
		"init without dir": {"dr", "manifest", "init"},
	} {
		_, _, code := runDR(t, args...)
		if code != 2 {
			t.Errorf("%s: exit %d, want 2", name, code)
		}
	}
	// A manifest that does not parse: exit 1 with the file and line.
	bad := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(bad, []byte("version: 1\nfiles:\n  - path: /abs\n    kind: other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	app := newApp()
	app.Writer = &bytes.Buffer{}
	err := app.Run([]string{"meridian", "dr", "check", "--manifest", bad, dir})
	if exitCode(err) != 1 || !strings.Contains(err.Error(), bad+":3: files[0].path") {
		t.Fatalf("bad manifest: %v", err)
	}
	// A folder that does not exist is an error, not a report.
	if _, _, code := runDR(t, "dr", "check", filepath.Join(dir, "nope")); code != 1 {
		t.Fatalf("missing folder: exit %d", code)
	}
}

func TestDRCommandTakesExtraSubcommands(t *testing.T) {
	cmd := drCommand(versionCommand())
	var names []string
	for _, c := range cmd.Subcommands {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "check,manifest,version" {
		t.Fatalf("subcommands %v", names)
	}
}
