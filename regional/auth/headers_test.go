package auth_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
)

// TestTrustedHeadersByAddress: X-Tenant-Id and X-Data-Class are believed
// from a peer address in the CIDRs, never from another, and never because
// of X-Forwarded-For.
func TestTrustedHeadersByAddress(t *testing.T) {
	cfg := auth.DefaultConfig()
	cfg.Mode = auth.ModeTrustedHeaders
	cfg.TrustedHeaders.CIDRs = []string{"10.1.0.0/16", "fd00::/8"}
	cfg.TrustedHeaders.RateLimit = auth.RateLimit{RequestsPerSecond: 1000}
	a := openAuth(t, cfg, auth.Deps{})
	from := func(addr string, headers ...string) (auth.Identity, error) {
		r := request(headers...)
		r.RemoteAddr = addr
		return a.Authenticate(r)
	}
	id, err := from("10.1.2.3:5555", "X-Tenant-Id", "EU-Health", "X-Data-Class", "PHI")
	want := auth.Identity{Name: "addr:10.1.2.3", Tenant: "eu-health", DataClass: "phi", RateLimit: cfg.TrustedHeaders.RateLimit, Method: auth.MethodTrustedHeaders}
	if err != nil || !equalIdentity(id, want) {
		t.Fatalf("trusted gateway: %+v %v", id, err)
	}
	if id, err := from("[fd00::7]:80", "X-Tenant-Id", "acme"); err != nil || id.DataClass != "" || id.Name != "addr:fd00::7" {
		t.Fatalf("IPv6 gateway without a class: %+v %v", id, err)
	}
	if id, err := from("[::ffff:10.1.0.9]:80", "X-Tenant-Id", "acme"); err != nil || id.Name != "addr:10.1.0.9" {
		t.Fatalf("IPv4-mapped gateway: %+v %v", id, err)
	}
	wantErr(t, "untrusted address", errOf(from("192.0.2.1:1", "X-Tenant-Id", "eu-health")), auth.ErrMissingCredentials, 401)
	wantErr(t, "X-Forwarded-For is not believed", errOf(from("192.0.2.1:1", "X-Tenant-Id", "eu-health", "X-Forwarded-For", "10.1.2.3")), auth.ErrMissingCredentials, 401)
	wantErr(t, "no tenant", errOf(from("10.1.2.3:1")), auth.ErrMissingCredentials, 401)
	wantErr(t, "a malformed tenant", errOf(from("10.1.2.3:1", "X-Tenant-Id", "eu health")), auth.ErrInvalidCredentials, 401)
	wantErr(t, "two tenants", errOf(from("10.1.2.3:1", "X-Tenant-Id", "a", "X-Tenant-Id", "b")), auth.ErrInvalidCredentials, 401)
	wantErr(t, "a malformed class", errOf(from("10.1.2.3:1", "X-Tenant-Id", "a", "X-Data-Class", "a b")), auth.ErrDataClassNotAllowed, 403)
	if err := a.Reload(ctxT(t, time.Second)); err != nil {
		t.Fatalf("Reload in trusted_headers mode: %v", err)
	}
}

func equalIdentity(a, b auth.Identity) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// TestTrustedHeadersByIdentity: a gateway is trusted by its verified mTLS
// identity; another client of the same CA, on the same address, is not.
func TestTrustedHeadersByIdentity(t *testing.T) {
	pki, err := identity.InitDevPKI(filepath.Join(t.TempDir(), "pki"), []string{"eu-west-1"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := identity.LoadCA(pki.CACert, pki.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	gwCert, gwKey, err := ca.Issue(identity.CertRequest{Identity: identity.Client("gateway"), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	gwPair, err := tls.X509KeyPair(gwCert, gwKey)
	if err != nil {
		t.Fatal(err)
	}
	src := func(c identity.IssuedCert) *identity.Source {
		cfg := identity.DefaultTLSConfig()
		cfg.Cert, cfg.Key, cfg.ClientCA = c.Cert, c.Key, pki.CACert
		s, err := identity.Open(ctxT(t, 5*time.Second), cfg, identity.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(ctxT(t, 5*time.Second)) })
		return s
	}
	server, operator := src(pki.Controllers[0]), src(pki.Operator)

	cfg := auth.DefaultConfig()
	cfg.Mode = auth.ModeTrustedHeaders
	cfg.TrustedHeaders.Identities = []string{identity.Client("gateway").String()}
	a := openAuth(t, cfg, auth.Deps{})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, TLSConfig: server.ServerConfig(false), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.Authenticate(r)
		if err != nil {
			http.Error(w, err.Error(), auth.Status(err))
			return
		}
		_ = json.NewEncoder(w).Encode(id)
	})}
	done := make(chan error, 1)
	go func() { done <- hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		_ = hs.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	call := func(tc *tls.Config) (int, auth.Identity) {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: tc}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, "https://"+ln.Addr().String()+"/", nil)
		req.Header.Set("X-Tenant-Id", "ACME")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var id auth.Identity
		_ = json.NewDecoder(resp.Body).Decode(&id)
		return resp.StatusCode, id
	}
	gw := operator.ClientConfig("")
	gw.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &gwPair, nil }
	if code, id := call(gw); code != 200 || id.Name != "spiffe://meridian/client/gateway" || id.Tenant != "acme" {
		t.Fatalf("trusted gateway: %d %+v", code, id)
	}
	if code, _ := call(operator.ClientConfig("")); code != 401 {
		t.Fatalf("a client of the same CA that is not on the list: %d, want 401", code)
	}
	noCert := operator.ClientConfig("")
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	if code, _ := call(noCert); code != 401 {
		t.Fatalf("a client without a certificate: %d, want 401", code)
	}
}
