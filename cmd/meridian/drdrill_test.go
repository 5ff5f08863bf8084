package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/dr/drill"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

func TestDRDrillUsage(t *testing.T) {
	t.Setenv("MERIDIAN_ADMIN_TOKEN", "")
	t.Setenv("MERIDIAN_ADMIN", "")
	base := []string{"dr", "drill", "--admin", "http://127.0.0.1:1", "--token", "t", "--region", "us-west-2",
		"--controller", "us-west-2=http://127.0.0.1:2"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dr", "drill", "--token", "t", "--region", "r", "--controller", "r=http://127.0.0.1:2"}, "--admin: required"},
		{[]string{"dr", "drill", "--admin", "http://127.0.0.1:1", "--region", "r", "--controller", "r=http://127.0.0.1:2"}, "--token: required"},
		{[]string{"dr", "drill", "--admin", "http://127.0.0.1:1", "--token", "t", "--region", "r"}, "--controller: at least one"},
		{append(base, "--controller", "us-east-1"), `--controller "us-east-1": want REGION=URL`},
		{append(base, "--controller", "us-west-2=http://127.0.0.1:3"), "us-west-2 given twice"},
		{append(base, "--controller", "eu-west-1=127.0.0.1:3"), `--controller[eu-west-1]: "127.0.0.1:3" is not an http`},
		{append(base, "--probe", "us-west-2:acme"), "want origin:tenant:class"},
		{append(base, "--probe", "eu-west-1:acme:public"), "no controller URL for origin eu-west-1"},
		{append(base, "--interval", "0s"), "--interval: 0s, want more than 0"},
		{append(base, "--target-moved", "10s", "--moved-timeout", "5s"), "--moved-timeout: 5s is shorter than --target-moved 10s"},
		{append(base, "extra"), `unexpected arguments ["extra"]`},
		{[]string{"dr", "drill", "--admin", "http://127.0.0.1:1", "--token", "t", "--controller", "r=http://127.0.0.1:2"}, "--region: required"},
	} {
		_, code, err := runCLI(t, newApp(), c.args...)
		if code != 2 || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: exit %d, want 2 and %q in %v", c.args, code, c.want, err)
		}
	}
}

// TestDRDrillCLI runs the command against a 3-region fleet on loopback.
func TestDRDrillCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region fleet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
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
	t.Setenv("MERIDIAN_ADMIN_TOKEN", f.AdminToken)
	t.Setenv("MERIDIAN_CA_CERT", f.PKI.CACert) // https, with the fleet's CA
	args := []string{"dr", "drill", "--admin", f.Region("us-east-1").Controller.AdminURL(), "--hold", "500ms",
		// The drill's time targets judge a deployment; here they are wide
		// (a loaded CI machine), the test checks the drill's mechanics.
		"--target-moved", "2m", "--target-back", "2m", "--moved-timeout", "3m", "--back-timeout", "3m"}
	for _, r := range f.Regions {
		args = append(args, "--controller", r.Name+"="+r.Controller.URL())
	}
	dir := t.TempDir()
	md, js := filepath.Join(dir, "drill.md"), filepath.Join(dir, "drill.json")

	out, code, err := runCLI(t, newApp(), append(args, "--region", "us-west-2", "--report-md", md, "--report-json", js)...)
	if code != 0 || !strings.Contains(out, "# Failover drill of us-west-2: PASS") || !strings.Contains(out, "dr drill: moved in ") {
		t.Fatalf("drill of us-west-2: exit %d (%v)\n%s", code, err, out)
	}
	b, err := os.ReadFile(md)
	if err != nil || !strings.Contains(string(b), "## Timeline") || !strings.Contains(string(b), "| traffic moved | ≤ 2m0s |") {
		t.Fatalf("markdown report: %v\n%s", err, b)
	}
	var rep drill.Report
	b, err = os.ReadFile(js)
	if err != nil || json.Unmarshal(b, &rep) != nil || !rep.Passed || rep.Region != "us-west-2" || rep.Moved == nil || rep.Back == nil || rep.Violations != 0 {
		t.Fatalf("json report: %v\n%s", err, b)
	}
	t.Logf("CLI drill of us-west-2: moved %v, back %v, %d requests, %d errors", rep.Moved.D(), rep.Back.D(), rep.Requests, rep.Errors)

	// A drill that affects no probe proves nothing: exit 1, with the JSON
	// report on stdout.
	// (Failing eu-west-1 empties the EU zone: the cluster wants --force.)
	out, code, err = runCLI(t, newApp(), append(args, "--region", "eu-west-1", "--force", "--json", "--no-default-probes",
		"--probe", "us-east-1:acme:public", "--probe", "us-west-2:acme:pii")...)
	if code != 1 || err == nil || !strings.Contains(err.Error(), "probes affected 0 of 2 (target ≥ 1)") {
		t.Fatalf("drill affecting nothing: exit %d (%v)\n%s", code, err, out)
	}
	start := strings.Index(out, "{")
	dec := json.NewDecoder(strings.NewReader(out[start:]))
	if err := dec.Decode(&rep); err != nil || rep.Passed || rep.Affected != 0 || !rep.Recovered {
		t.Fatalf("json on stdout: %v %+v", err, rep)
	}
	if !f.Region("us-east-1").Controller.Global().State().Routable("eu-west-1") {
		t.Fatal("eu-west-1 not recovered")
	}
	// The global admin commands reach the https admin API with the CA
	// (MERIDIAN_CA_CERT, set above) and an operator certificate; without
	// the CA the system roots refuse the dev certificate.
	status := []string{"failover", "status", "--admin", f.Region("us-west-2").Controller.AdminURL()}
	out, code, err = runCLI(t, newApp(), append(status, "--client-cert", f.PKI.Operator.Cert, "--client-key", f.PKI.Operator.Key)...)
	if code != 0 || !strings.Contains(out, "eu-west-1") {
		t.Fatalf("failover status over https: exit %d (%v)\n%s", code, err, out)
	}
	t.Setenv("MERIDIAN_CA_CERT", "")
	if _, code, err = runCLI(t, newApp(), status...); code != 1 || err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("failover status without the CA: exit %d (%v), want 1 and a certificate error", code, err)
	}
}
