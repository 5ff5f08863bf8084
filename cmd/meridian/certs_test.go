package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCertsInitCLI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	out, code, err := runCLI(t, newApp(), "certs", "init", "--dir", dir, "--regions", "us-east-1, eu-west-1", "--replicas", "2", "--hosts", "meridian.internal")
	if code != 0 {
		t.Fatalf("certs init: %d %v %q", code, err, out)
	}
	for _, want := range []string{
		"ca=" + filepath.Join(dir, "ca.pem") + "\n",
		"spiffe://meridian/region/us-east-1/controller/ctl-us-east-1-1",
		"spiffe://meridian/region/eu-west-1/controller/ctl-eu-west-1-2",
		"spiffe://meridian/client/operator",
		filepath.Join(dir, "ctl-eu-west-1-2-key.pem"),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "ctl-us-east-1-1.pem", "ctl-us-east-1-2-key.pem", "operator.pem", "operator-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	_, code, err = runCLI(t, newApp(), "certs", "init", "--dir", dir, "--regions", "us-east-1")
	if code != 1 || err == nil || !strings.Contains(err.Error(), "a CA already exists") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("second run: %d %v", code, err)
	}
	if out, code, _ = runCLI(t, newApp(), "certs", "init", "--dir", dir, "--regions", "us-east-1", "--force"); code != 0 {
		t.Fatalf("--force: %d %q", code, out)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"certs", "init", "--regions", "a"}, "--dir is required"},
		{[]string{"certs", "init", "--dir", dir}, "--regions is required"},
		{[]string{"certs", "init", "--dir", dir, "--regions", "EU", "--force"}, `region name "EU"`},
		{[]string{"certs", "init", "--dir", dir, "--regions", "a", "--replicas", "0", "--force", "--validity", "0s"}, "--validity 0s"},
		{[]string{"certs", "init", "--dir", dir, "--regions", "a", "extra"}, "unexpected arguments"},
	}
	for _, c := range cases {
		out, code, err := runCLI(t, newApp(), c.args...)
		if code != 2 || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: exit %d, %v, output %q; want exit 2 and %q", c.args, code, err, out, c.want)
		}
	}
}
