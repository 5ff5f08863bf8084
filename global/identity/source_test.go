package identity_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global/audit/audittest"
	"github.com/meridian-llm/meridian/global/identity"
)

func TestTLSConfigValidate(t *testing.T) {
	ok := identity.DefaultTLSConfig()
	ok.Cert, ok.Key, ok.ClientCA = "c.pem", "k.pem", "ca.pem"
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	zero := identity.TLSConfig{Cert: "c.pem", Key: "k.pem", ClientCA: "ca.pem"}
	if err := zero.Validate(); err != nil {
		t.Fatalf("empty min_version and reload_interval are the defaults: %v", err)
	}
	cases := []struct {
		mut  func(*identity.TLSConfig)
		want string
	}{
		{func(c *identity.TLSConfig) { c.Cert = "" }, "tls.cert: must be set"},
		{func(c *identity.TLSConfig) { c.Key = "" }, "tls.key: must be set"},
		{func(c *identity.TLSConfig) { c.ClientCA = "" }, "tls.client_ca: must be set"},
		{func(c *identity.TLSConfig) { c.MinVersion = "1.1" }, `tls.min_version = "1.1"`},
		{func(c *identity.TLSConfig) { c.ReloadInterval = 10 * time.Millisecond }, "tls.reload_interval = 10ms"},
		{func(c *identity.TLSConfig) { c.ReloadInterval = -time.Second }, "tls.reload_interval = -1s"},
	}
	for _, c := range cases {
		cfg := ok
		c.mut(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want an error containing %q", err, c.want)
		}
	}
}

// TestHandshakeMatrix: on a mutual listener, a controller of the cluster CA
// gets in and is identified; no certificate, a certificate of another CA or
// an expired one is refused. The client side refuses a server of another CA,
// and a server that is not valid for the name asked.
func TestHandshakeMatrix(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	server := openSource(t, tlsFiles(pki, pki.Controllers[0]), identity.Deps{})
	client := openSource(t, tlsFiles(pki, pki.Controllers[1]), identity.Deps{})
	srv := newEchoServer(t, server.ServerConfig(true))

	r := dial(t, srv.addr(), client.ClientConfig(""))
	if r.err != nil {
		t.Fatalf("mutual handshake: %v", r.err)
	}
	if want := "spiffe://meridian/region/b/controller/ctl-b"; r.peer != want {
		t.Fatalf("server saw %q, want %q", r.peer, want)
	}
	if id, err := client.VerifyPeer(&r.serverCfg, x509.ExtKeyUsageServerAuth); err != nil || id != identity.Controller("ctl-a", "a") {
		t.Fatalf("client's view of the server: %+v %v", id, err)
	}
	if _, ok := identity.PeerIdentity(&r.serverCfg); ok {
		t.Fatal("PeerIdentity on the client side must not report an identity: the TLS stack verified no chain there")
	}
	for _, name := range []string{"127.0.0.1", "localhost", "ctl-a"} {
		if r := dial(t, srv.addr(), client.ClientConfig(name)); r.err != nil {
			t.Fatalf("server name %q: %v", name, r.err)
		}
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(mustRead(t, pki.CACert))
	before := srv.failures()
	mustErr(t, dial(t, srv.addr(), &tls.Config{RootCAs: pool, ServerName: "localhost"}), "client without a certificate")

	other := devPKI(t, identity.PKIOptions{})
	foreign := openSource(t, tlsFiles(other, other.Controllers[1]), identity.Deps{})
	foreignCfg := foreign.ClientConfig("")
	foreignCfg.InsecureSkipVerify, foreignCfg.VerifyConnection = true, nil // the attacker trusts anything
	mustErr(t, dial(t, srv.addr(), foreignCfg), "client with a certificate of another CA")

	ca, err := identity.LoadCA(pki.CACert, pki.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	expiredCert, expiredKey, err := ca.Issue(identity.CertRequest{Identity: identity.Controller("ctl-old", "a"), Hosts: []string{"127.0.0.1"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.X509KeyPair(expiredCert, expiredKey)
	if err != nil {
		t.Fatal(err)
	}
	mustErr(t, dial(t, srv.addr(), &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{kp}}), "client with an expired certificate")
	if got := srv.failuresAtLeast(before+3) - before; got != 3 {
		t.Fatalf("server recorded %d refused handshakes, want 3", got)
	}

	// The client side: a server of another CA, a wrong name, a server
	// certificate without a controller identity.
	foreignSrv := newEchoServer(t, foreign.ServerConfig(false))
	mustErr(t, dial(t, foreignSrv.addr(), client.ClientConfig("")), "server of another CA")
	mustErr(t, dial(t, srv.addr(), client.ClientConfig("ctl-b")), "server not valid for the name asked")
	plainCert, plainKey, err := ca.Issue(identity.CertRequest{Identity: identity.Controller("ctl-x", "a"), Hosts: []string{"127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if r := dial(t, newEchoServer(t, serverOf(t, plainCert, plainKey)).addr(), client.ClientConfig("")); r.err != nil {
		t.Fatalf("a controller certificate from the CA served by a bare config: %v", r.err)
	}
	anonCert, anonKey := issueWithoutIdentity(t, pki)
	mustErr(t, dial(t, newEchoServer(t, serverOf(t, anonCert, anonKey)).addr(), client.ClientConfig("")), "server without a controller identity")
	if r := dial(t, newEchoServer(t, serverOf(t, anonCert, anonKey)).addr(), client.ClientConfig("127.0.0.1")); r.err != nil {
		t.Fatalf("with a server name the identity is not required: %v", r.err)
	}

	// A listener only controllers may use refuses an operator's certificate
	// of the same CA.
	operator := openSource(t, tlsFiles(pki, pki.Operator), identity.Deps{})
	ctlOnly := newEchoServer(t, identity.RequireControllers(server.ServerConfig(true)))
	if r := dial(t, ctlOnly.addr(), client.ClientConfig("")); r.err != nil {
		t.Fatalf("controllers-only listener, controller: %v", r.err)
	}
	if r := dial(t, srv.addr(), operator.ClientConfig("")); r.err != nil || r.peer != "spiffe://meridian/client/operator" {
		t.Fatalf("mutual listener, operator: %+v", r)
	}
	mustErr(t, dial(t, ctlOnly.addr(), operator.ClientConfig("")), "controllers-only listener, operator certificate")

	// A listener that is not mutual accepts a client without a certificate
	// (and reports no identity) but still refuses a foreign one.
	open := newEchoServer(t, server.ServerConfig(false))
	if r := dial(t, open.addr(), &tls.Config{RootCAs: pool, ServerName: "localhost"}); r.err != nil || r.peer != "-" {
		t.Fatalf("non-mutual listener, no client certificate: %+v", r)
	}
	mustErr(t, dial(t, open.addr(), foreignCfg), "non-mutual listener, client certificate of another CA")
	if r := dial(t, open.addr(), client.ClientConfig("")); r.err != nil || r.peer != "spiffe://meridian/region/b/controller/ctl-b" {
		t.Fatalf("non-mutual listener, controller certificate: %+v", r)
	}
}

func mustRead(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func serverOf(t testing.TB, certPEM, keyPEM []byte) *tls.Config {
	t.Helper()
	kp, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS13}
}

// issueWithoutIdentity signs, with the CA of pki, a server certificate
// for 127.0.0.1 with no identity URI: valid, but not a controller.
func issueWithoutIdentity(t testing.TB, pki identity.PKIResult) (certPEM, keyPEM []byte) {
	t.Helper()
	return issueCustom(t, pki, func(*x509.Certificate) {})
}

// issueCustom signs with the CA of pki a certificate for 127.0.0.1 with
// CommonName "anonymous" and no URI, as changed by mut.
func issueCustom(t testing.TB, pki identity.PKIResult, mut func(*x509.Certificate)) (certPEM, keyPEM []byte) {
	t.Helper()
	caKP, err := tls.X509KeyPair(mustRead(t, pki.CACert), mustRead(t, pki.CAKey))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "anonymous"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	mut(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caKP.Leaf, &key.PublicKey, caKP.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// TestOpenRefusesBadMaterial: Open fails on anything a reload would refuse.
func TestOpenRefusesBadMaterial(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	ctl := pki.Controllers[0]
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := identity.LoadCA(pki.CACert, pki.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	expCert, expKey, err := ca.Issue(identity.CertRequest{Identity: identity.Controller("ctl-old", "a"),
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	expiredCert, expiredKey := filepath.Join(dir, "exp.pem"), filepath.Join(dir, "exp-key.pem")
	writeFile(t, expiredCert, expCert)
	writeFile(t, expiredKey, expKey)
	cases := []struct {
		name           string
		cert, key, cas string
		want           string
	}{
		{"missing cert", filepath.Join(dir, "nope.pem"), ctl.Key, pki.CACert, "tls.cert"},
		{"garbage cert", garbage, ctl.Key, pki.CACert, "tls.cert"},
		{"key of another cert", ctl.Cert, pki.Controllers[1].Key, pki.CACert, "private key does not match"},
		{"expired", expiredCert, expiredKey, pki.CACert, "expired"},
		{"CA file holds a leaf", ctl.Cert, ctl.Key, ctl.Cert, "is not a CA"},
		{"CA file not PEM", ctl.Cert, ctl.Key, garbage, "tls.client_ca"},
	}
	for _, c := range cases {
		cfg := identity.DefaultTLSConfig()
		cfg.Cert, cfg.Key, cfg.ClientCA = c.cert, c.key, c.cas
		s, err := identity.Open(ctxT(t, 5*time.Second), cfg, identity.Deps{})
		if err == nil {
			_ = s.Close(ctxT(t, time.Second))
			t.Errorf("%s: Open succeeded", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to mention %q", c.name, err, c.want)
		}
	}
}

// TestRotation: replaced files are used by the next handshake after a
// Reload or the periodic check; an invalid file keeps the old material and
// is counted once.
func TestRotation(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	dir := t.TempDir()
	cfg := identity.DefaultTLSConfig()
	cfg.Cert, cfg.Key, cfg.ClientCA = filepath.Join(dir, "tls.pem"), filepath.Join(dir, "tls-key.pem"), filepath.Join(dir, "ca.pem")
	copyFile(t, pki.Controllers[0].Cert, cfg.Cert)
	copyFile(t, pki.Controllers[0].Key, cfg.Key)
	copyFile(t, pki.CACert, cfg.ClientCA)
	clock := audittest.NewClock(time.Now())
	reg := prometheus.NewRegistry()
	server := openSource(t, cfg, identity.Deps{Clock: clock, Registerer: reg})
	client := openSource(t, tlsFiles(pki, pki.Controllers[1]), identity.Deps{})
	srv := newEchoServer(t, server.ServerConfig(true))
	reloads := func(result string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "meridian_tls_reloads_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}
	serial := func() string {
		t.Helper()
		r := dial(t, srv.addr(), client.ClientConfig(""))
		if r.err != nil {
			t.Fatalf("handshake: %v", r.err)
		}
		return r.serverSN
	}
	first := serial()
	if first != server.Leaf().SerialNumber.String() {
		t.Fatalf("served serial %s, source holds %s", first, server.Leaf().SerialNumber)
	}
	if err := server.Reload(); err != nil || reloads("ok") != 0 {
		t.Fatalf("reload of unchanged files: %v, ok reloads %v", err, reloads("ok"))
	}

	// Rotate to a new certificate of the same controller; Reload on demand.
	ca, err := identity.LoadCA(pki.CACert, pki.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	rotate := func() string {
		t.Helper()
		c, k, err := ca.Issue(identity.CertRequest{Identity: identity.Controller("ctl-a", "a"), Hosts: []string{"127.0.0.1"},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, cfg.Key, k)
		writeFile(t, cfg.Cert, c)
		leaf, _ := tls.X509KeyPair(c, k)
		return leaf.Leaf.SerialNumber.String()
	}
	second := rotate()
	if got := serial(); got != first {
		t.Fatalf("the new file was used before a reload: %s", got)
	}
	if err := server.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := serial(); got != second {
		t.Fatalf("after Reload the server presents %s, want the new %s", got, second)
	}
	if reloads("ok") != 1 {
		t.Fatalf("ok reloads = %v, want 1", reloads("ok"))
	}
	if got := gauge(t, reg, "meridian_tls_cert_expiry_timestamp_seconds"); got != float64(server.Leaf().NotAfter.Unix()) {
		t.Fatalf("expiry gauge %v, want %v", got, server.Leaf().NotAfter.Unix())
	}

	// The periodic check picks up the next rotation.
	third := rotate()
	if err := clock.WaitForWaiters(ctxT(t, 5*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(cfg.ReloadInterval)
	waitFor(t, 5*time.Second, "the periodic reload", func() bool { return server.Leaf().SerialNumber.String() == third })
	if got := serial(); got != third {
		t.Fatalf("after the periodic reload the server presents %s, want %s", got, third)
	}

	// An invalid certificate file: the old material stays, the error is
	// returned and counted; the periodic check does not count it again.
	writeFile(t, cfg.Cert, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	if err := server.Reload(); err == nil {
		t.Fatal("Reload accepted a broken certificate")
	}
	if got := serial(); got != third {
		t.Fatalf("after a failed reload the server presents %s, want the old %s", got, third)
	}
	if reloads("error") != 1 {
		t.Fatalf("error reloads = %v, want 1", reloads("error"))
	}
	if err := clock.WaitForWaiters(ctxT(t, 5*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(cfg.ReloadInterval)
	if err := clock.WaitForWaiters(ctxT(t, 5*time.Second), 1); err != nil { // the loop went round
		t.Fatal(err)
	}
	if reloads("error") != 1 {
		t.Fatalf("the periodic check counted the same broken file again: %v", reloads("error"))
	}
	// A key that does not match is refused too.
	copyFile(t, pki.Controllers[1].Cert, cfg.Cert)
	if err := server.Reload(); err == nil || !strings.Contains(err.Error(), "private key does not match") {
		t.Fatalf("mismatched key: %v", err)
	}
	if got := serial(); got != third {
		t.Fatalf("after a mismatched key the server presents %s, want %s", got, third)
	}

	// CA rotation: a bundle of the old and a new CA accepts clients of both;
	// then the new CA alone refuses the old clients.
	next := devPKI(t, identity.PKIOptions{})
	newClient := openSource(t, tlsFiles(next, next.Controllers[1]), identity.Deps{})
	newCfg := newClient.ClientConfig("")
	newCfg.InsecureSkipVerify, newCfg.VerifyConnection = true, nil // it does not know the old CA yet
	copyFile(t, pki.Controllers[0].Cert, cfg.Cert)
	copyFile(t, pki.Controllers[0].Key, cfg.Key)
	writeFile(t, cfg.ClientCA, append(mustRead(t, pki.CACert), mustRead(t, next.CACert)...))
	if err := server.Reload(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*tls.Config{"old CA": client.ClientConfig(""), "new CA": newCfg} {
		if r := dial(t, srv.addr(), c); r.err != nil {
			t.Fatalf("CA bundle: client of the %s refused: %v", name, r.err)
		}
	}
	copyFile(t, next.Controllers[0].Cert, cfg.Cert)
	copyFile(t, next.Controllers[0].Key, cfg.Key)
	copyFile(t, next.CACert, cfg.ClientCA)
	if err := server.Reload(); err != nil {
		t.Fatal(err)
	}
	mustErr(t, dial(t, srv.addr(), client.ClientConfig("")), "client of the retired CA")
	if r := dial(t, srv.addr(), newClient.ClientConfig("")); r.err != nil {
		t.Fatalf("client of the new CA: %v", r.err)
	}
}

func gauge(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, within)
		}
		<-tick.C
	}
}

// TestFromRequest: an HTTP server on a mutual listener reads the client's
// identity from the request.
func TestFromRequest(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	server := openSource(t, tlsFiles(pki, pki.Controllers[0]), identity.Deps{})
	operator := openSource(t, tlsFiles(pki, pki.Operator), identity.Deps{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := identity.FromRequest(r)
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": ok, "client": id.Client, "controller": id.ControllerID, "uri": id.String()})
	}), TLSConfig: server.ServerConfig(true)}
	done := make(chan error, 1)
	go func() { done <- hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		_ = hs.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	tr := &http.Transport{TLSClientConfig: operator.ClientConfig("")}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got["ok"] != true || got["client"] != "operator" || got["controller"] != "" || got["uri"] != "spiffe://meridian/client/operator" {
		t.Fatalf("identity from request: %v", got)
	}
	if _, ok := identity.FromRequest(&http.Request{}); ok {
		t.Fatal("a plain request has an identity")
	}
	if _, ok := identity.FromRequest(nil); ok {
		t.Fatal("a nil request has an identity")
	}
}

func TestCloseTwice(t *testing.T) {
	pki := devPKI(t, identity.PKIOptions{})
	s, err := identity.Open(ctxT(t, 5*time.Second), tlsFiles(pki, pki.Controllers[0]), identity.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Close(ctxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if id, err := s.Identity(); err != nil || id != identity.Controller("ctl-a", "a") {
		t.Fatalf("own identity: %+v %v", id, err)
	}
	reg := prometheus.NewRegistry()
	openSource(t, tlsFiles(pki, pki.Controllers[0]), identity.Deps{Registerer: reg})
	if _, err := identity.Open(ctxT(t, 5*time.Second), tlsFiles(pki, pki.Controllers[0]), identity.Deps{Registerer: reg}); err == nil {
		t.Fatal("two sources registered the same metrics")
	}
}
