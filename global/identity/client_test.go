package identity_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-llm/meridian/global/identity"
)

func TestClientTLSConfigValidate(t *testing.T) {
	for _, ok := range []identity.ClientTLSConfig{
		{},
		{CA: "ca.pem"},
		{CA: "ca.pem", Cert: "c.pem", Key: "k.pem", ServerName: "kafka", MinVersion: "1.3"},
		{InsecureSkipVerify: true},
	} {
		if err := ok.Validate("kafka.tls"); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, c := range []struct {
		cfg  identity.ClientTLSConfig
		want string
	}{
		{identity.ClientTLSConfig{Cert: "c.pem"}, `kafka.tls: cert "c.pem" and key "": set both`},
		{identity.ClientTLSConfig{Key: "k.pem"}, `kafka.tls: cert "" and key "k.pem"`},
		{identity.ClientTLSConfig{MinVersion: "1.0"}, `kafka.tls.min_version = "1.0"`},
		{identity.ClientTLSConfig{CA: "ca.pem", InsecureSkipVerify: true}, "kafka.tls: insecure_skip_verify with a ca"},
	} {
		if err := c.cfg.Validate("kafka.tls"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Validate = %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestClientTLSHandshakes: a client config verifies the server against its
// CA for the host dialled (or server_name), presents its certificate to a
// mutual server, and picks up a rotated certificate at the next handshake.
func TestClientTLSHandshakes(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	other := devPKI(t, identity.PKIOptions{})
	server := openSource(t, tlsFiles(pki, pki.Controllers[0]), identity.Deps{})
	mutual := newEchoServer(t, server.ServerConfig(true))
	foreign := newEchoServer(t, openSource(t, tlsFiles(other, other.Controllers[0]), identity.Deps{}).ServerConfig(false))

	load := func(c identity.ClientTLSConfig) *tls.Config {
		t.Helper()
		tc, err := c.Load("kafka.tls")
		if err != nil {
			t.Fatalf("load %+v: %v", c, err)
		}
		return tc
	}
	// The certificates name 127.0.0.1: the default server name is the
	// host dialled, which the caller (kafka-go, net/http) fills in.
	withHost := func(c *tls.Config, host string) *tls.Config {
		tc := c.Clone()
		if tc.ServerName == "" {
			tc.ServerName = host
		}
		return tc
	}

	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	copyFile(t, pki.Controllers[1].Cert, cert)
	copyFile(t, pki.Controllers[1].Key, key)
	cl := load(identity.ClientTLSConfig{CA: pki.CACert, Cert: cert, Key: key})
	r := dial(t, mutual.addr(), withHost(cl, "127.0.0.1"))
	if r.err != nil || r.peer != "spiffe://meridian/region/b/controller/ctl-b" {
		t.Fatalf("mutual server, client certificate: %+v", r)
	}
	mustErr(t, dial(t, foreign.addr(), withHost(cl, "127.0.0.1")), "server of another CA")
	mustErr(t, dial(t, mutual.addr(), withHost(cl, "ctl-b")), "server not valid for the name dialled")
	named := load(identity.ClientTLSConfig{CA: pki.CACert, Cert: cert, Key: key, ServerName: "ctl-a"})
	if r := dial(t, mutual.addr(), named); r.err != nil {
		t.Fatalf("server_name the certificate names: %v", r.err)
	}
	noCert := load(identity.ClientTLSConfig{CA: pki.CACert})
	mustErr(t, dial(t, mutual.addr(), withHost(noCert, "127.0.0.1")), "mutual server, no client certificate")
	if r := dial(t, foreign.addr(), load(identity.ClientTLSConfig{InsecureSkipVerify: true})); r.err != nil {
		t.Fatalf("insecure_skip_verify accepts any server: %v", r.err)
	}

	// Rotation: the operator's certificate replaces the file; the next
	// handshake presents it.
	writeFile(t, cert, mustRead(t, pki.Operator.Cert))
	writeFile(t, key, mustRead(t, pki.Operator.Key))
	if r := dial(t, mutual.addr(), withHost(cl, "127.0.0.1")); r.err != nil || r.peer != "spiffe://meridian/client/operator" {
		t.Fatalf("after rotation: %+v", r)
	}
	// A half-written rotation keeps the certificate in use.
	writeFile(t, cert, []byte("not pem"))
	if r := dial(t, mutual.addr(), withHost(cl, "127.0.0.1")); r.err != nil || r.peer != "spiffe://meridian/client/operator" {
		t.Fatalf("after a bad rotation: %+v", r)
	}
}

func TestClientTLSLoadRefuses(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg  identity.ClientTLSConfig
		want string
	}{
		{identity.ClientTLSConfig{CA: filepath.Join(dir, "missing.pem")}, "kafka.tls.ca: open"},
		{identity.ClientTLSConfig{CA: junk}, "kafka.tls.ca " + junk + ": trailing data"},
		{identity.ClientTLSConfig{CA: pki.Controllers[0].Key}, `PEM block "PRIVATE KEY"`},
		{identity.ClientTLSConfig{Cert: pki.Controllers[0].Cert, Key: pki.Controllers[1].Key}, "private key does not match"},
		{identity.ClientTLSConfig{Cert: filepath.Join(dir, "missing.pem"), Key: pki.Controllers[1].Key}, "kafka.tls.cert: open"},
	} {
		if _, err := c.cfg.Load("kafka.tls"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Load = %v, want %q", c.cfg, err, c.want)
		}
	}
}
