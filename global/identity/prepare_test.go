package identity_test

import (
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global/audit/audittest"
	"github.com/meridian-llm/meridian/global/identity"
)

// TestPrepareInstall: Prepare reads and checks rotated files without
// putting them in use (nil when unchanged, an error for a key that does
// not match its certificate); Install makes the next handshake serve the
// new certificate; an Install overtaken by a later reload does nothing.
func TestPrepareInstall(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	dir := t.TempDir()
	cfg := identity.DefaultTLSConfig()
	cfg.Cert, cfg.Key, cfg.ClientCA = filepath.Join(dir, "tls.pem"), filepath.Join(dir, "tls-key.pem"), filepath.Join(dir, "ca.pem")
	copyFile(t, pki.Controllers[0].Cert, cfg.Cert)
	copyFile(t, pki.Controllers[0].Key, cfg.Key)
	copyFile(t, pki.CACert, cfg.ClientCA)
	server := openSource(t, cfg, identity.Deps{Clock: audittest.NewClock(time.Now())})
	client := openSource(t, tlsFiles(pki, pki.Controllers[1]), identity.Deps{})
	srv := newEchoServer(t, server.ServerConfig(true))
	serial := func() string {
		t.Helper()
		r := dial(t, srv.addr(), client.ClientConfig(""))
		if r.err != nil {
			t.Fatalf("handshake: %v", r.err)
		}
		return r.serverSN
	}
	first := serial()
	if u, err := server.Prepare(); u != nil || err != nil {
		t.Fatalf("unchanged files: %v, %v", u, err)
	}
	ca, err := identity.LoadCA(pki.CACert, pki.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	issue := func() ([]byte, []byte, string) {
		c, k, err := ca.Issue(identity.CertRequest{Identity: identity.Controller("ctl-a", "a"), Hosts: []string{"127.0.0.1"},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		kp, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return c, k, kp.Leaf.SerialNumber.String()
	}
	// A certificate whose key is another's: refused, nothing changes.
	c2, _, _ := issue()
	writeFile(t, cfg.Cert, c2)
	if u, err := server.Prepare(); u != nil || err == nil {
		t.Fatalf("mismatched key: %v, %v", u, err)
	}
	if got := serial(); got != first {
		t.Fatalf("a refused certificate is served: %s", got)
	}
	// A good rotation: prepared, not served until installed.
	c3, k3, third := issue()
	writeFile(t, cfg.Key, k3)
	writeFile(t, cfg.Cert, c3)
	u, err := server.Prepare()
	if err != nil || u == nil || u.Subject() == "" {
		t.Fatalf("rotated files: %v, %v", u, err)
	}
	if got := serial(); got != first {
		t.Fatalf("Prepare put the new certificate in use: %s", got)
	}
	u.Install()
	if got := serial(); got != third {
		t.Fatalf("after Install: serial %s, want %s", got, third)
	}
	// An update prepared before a later reload is not installed over it.
	c4, k4, _ := issue()
	writeFile(t, cfg.Key, k4)
	writeFile(t, cfg.Cert, c4)
	stale, err := server.Prepare()
	if err != nil || stale == nil {
		t.Fatal(err)
	}
	c5, k5, fifth := issue()
	writeFile(t, cfg.Key, k5)
	writeFile(t, cfg.Cert, c5)
	if err := server.Reload(); err != nil {
		t.Fatal(err)
	}
	stale.Install()
	if got := serial(); got != fifth {
		t.Fatalf("a stale update replaced a later reload: serial %s, want %s", got, fifth)
	}
}
