package identity_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/global/identity"
)

func parseCert(t testing.TB, name string) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(mustRead(t, name))
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s holds no certificate", name)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestInitDevPKI: every certificate verifies against the CA for its
// usages, carries its identity and SANs; keys are P-256 and mode 0600.
func TestInitDevPKI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	res, err := identity.InitDevPKI(dir, []string{"eu-west-1", "us-east-1"}, identity.PKIOptions{
		ReplicasPerRegion: 2, Hosts: []string{"meridian.internal", "10.1.2.3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range res.Controllers {
		ids = append(ids, c.Identity.ControllerID)
	}
	if want := []string{"ctl-eu-west-1-1", "ctl-eu-west-1-2", "ctl-us-east-1-1", "ctl-us-east-1-2"}; !slices.Equal(ids, want) {
		t.Fatalf("controller ids %v, want %v", ids, want)
	}
	ca := parseCert(t, res.CACert)
	if !ca.IsCA || ca.Subject.CommonName == "" {
		t.Fatalf("CA certificate %+v", ca.Subject)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, key := range append([]string{res.CAKey, res.Operator.Key}, keysOf(res.Controllers)...) {
		st, err := os.Stat(key)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", key, st.Mode().Perm())
		}
		block, _ := pem.Decode(mustRead(t, key))
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if ek, ok := k.(*ecdsa.PrivateKey); !ok || ek.Curve != elliptic.P256() {
			t.Errorf("%s is not an ECDSA P-256 key", key)
		}
	}
	for _, c := range res.Controllers {
		if filepath.Base(c.Cert) != c.Identity.ControllerID+".pem" || filepath.Base(c.Key) != c.Identity.ControllerID+"-key.pem" {
			t.Errorf("files %s %s", c.Cert, c.Key)
		}
		cert := parseCert(t, c.Cert)
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("%s does not verify for %v: %v", c.Cert, usage, err)
			}
		}
		for _, h := range []string{"localhost", c.Identity.ControllerID, "ctl-" + c.Identity.Region, "127.0.0.1", "::1", "meridian.internal", "10.1.2.3"} {
			if err := cert.VerifyHostname(h); err != nil {
				t.Errorf("%s: %v", c.Cert, err)
			}
		}
		if cert.Subject.CommonName != c.Identity.ControllerID || len(cert.URIs) != 1 ||
			cert.URIs[0].String() != "spiffe://meridian/region/"+c.Identity.Region+"/controller/"+c.Identity.ControllerID {
			t.Errorf("%s: CN %q URIs %v", c.Cert, cert.Subject.CommonName, cert.URIs)
		}
		if cert.PublicKeyAlgorithm != x509.ECDSA || cert.NotAfter.Sub(cert.NotBefore) < 364*24*time.Hour {
			t.Errorf("%s: %v, valid %v", c.Cert, cert.PublicKeyAlgorithm, cert.NotAfter.Sub(cert.NotBefore))
		}
	}
	op := parseCert(t, res.Operator.Cert)
	if _, err := op.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("operator certificate: %v", err)
	}
	if _, err := op.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Fatal("the operator certificate is valid for servers")
	}
	if res.Operator.Identity != identity.Client("operator") || op.URIs[0].String() != "spiffe://meridian/client/operator" {
		t.Fatalf("operator identity %+v %v", res.Operator.Identity, op.URIs)
	}

	// Every certificate loads as a Source and carries its identity.
	for _, c := range append(slices.Clone(res.Controllers), res.Operator) {
		s := openSource(t, tlsFiles(res, c), identity.Deps{})
		if id, err := s.Identity(); err != nil || id != c.Identity {
			t.Fatalf("%s: identity %+v %v, want %+v", c.Cert, id, err, c.Identity)
		}
	}

	// A second run refuses to replace the CA; --force replaces it.
	if _, err := identity.InitDevPKI(dir, []string{"eu-west-1"}, identity.PKIOptions{}); !errors.Is(err, identity.ErrPKIExists) {
		t.Fatalf("second run: %v, want ErrPKIExists", err)
	}
	if got := parseCert(t, res.CACert); !got.Equal(ca) {
		t.Fatal("a refused run changed the CA")
	}
	if _, err := identity.InitDevPKI(dir, []string{"eu-west-1"}, identity.PKIOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if got := parseCert(t, res.CACert); got.Equal(ca) {
		t.Fatal("--force kept the old CA")
	}
	if st, _ := os.Stat(res.CAKey); st.Mode().Perm() != 0o600 {
		t.Fatalf("replaced CA key has mode %v", st.Mode().Perm())
	}
	if ids := identity.ControllerIDs("eu-west-1", 1); !slices.Equal(ids, []string{"ctl-eu-west-1"}) {
		t.Fatalf("one replica: %v", ids)
	}
}

func keysOf(cs []identity.IssuedCert) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Key)
	}
	return out
}

func TestInitDevPKIRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		regions []string
		opts    identity.PKIOptions
		want    string
	}{
		{nil, identity.PKIOptions{}, "at least one region"},
		{[]string{"EU"}, identity.PKIOptions{}, `region name "EU"`},
		{[]string{"a", "a"}, identity.PKIOptions{}, `"a" listed twice`},
		{[]string{"a"}, identity.PKIOptions{ReplicasPerRegion: 101}, "replicas per region = 101"},
		{[]string{"a"}, identity.PKIOptions{Hosts: []string{"a b"}}, `hosts: "a b"`},
		{[]string{"a"}, identity.PKIOptions{Operator: "ctl-a"}, `operator name "ctl-a" is also a controller id`},
		{[]string{"a"}, identity.PKIOptions{Operator: "a/b"}, `operator name "a/b"`},
	}
	for _, c := range cases {
		_, err := identity.InitDevPKI(dir, c.regions, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("InitDevPKI(%v, %+v) = %v, want %q", c.regions, c.opts, err, c.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("refused runs wrote %d files", len(entries))
	}
}

// TestIdentityURIRoundTrip: every valid identity survives URI -> ParseURI,
// and the certificate issued for it carries it.
func TestIdentityURIRoundTrip(t *testing.T) {
	region := rapid.StringMatching(`[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?`)
	name := rapid.StringMatching(`[A-Za-z0-9_-][A-Za-z0-9._-]{0,30}`)
	rapid.Check(t, func(t *rapid.T) {
		var id identity.Identity
		if rapid.Bool().Draw(t, "controller") {
			id = identity.Controller(name.Draw(t, "id"), region.Draw(t, "region"))
		} else {
			id = identity.Client(name.Draw(t, "client"))
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("generated identity %+v invalid: %v", id, err)
		}
		u, err := url.Parse(id.String())
		if err != nil {
			t.Fatal(err)
		}
		got, err := identity.ParseURI(u)
		if err != nil || got != id {
			t.Fatalf("round trip of %s: %+v %v", id, got, err)
		}
	})
	pki := devPKI(t, identity.PKIOptions{})
	ca, err := identity.LoadCA(pki.CACert, pki.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []identity.Identity{identity.Controller("ctl.eu_1", "eu-west-1"), identity.Client("gateway-1")} {
		c, k, err := ca.Issue(identity.CertRequest{Identity: id, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		cfg := tlsFiles(pki, identity.IssuedCert{Cert: filepath.Join(dir, "c.pem"), Key: filepath.Join(dir, "k.pem")})
		writeFile(t, cfg.Cert, c)
		writeFile(t, cfg.Key, k)
		if got, err := openSource(t, cfg, identity.Deps{}).Identity(); err != nil || got != id {
			t.Fatalf("certificate of %s: %+v %v", id, got, err)
		}
	}
}

func TestParseURIRefuses(t *testing.T) {
	for _, s := range []string{
		"https://meridian/region/a/controller/ctl-a",
		"spiffe://other/region/a/controller/ctl-a",
		"spiffe://meridian/region/a/controller",
		"spiffe://meridian/region/A/controller/ctl-a",
		"spiffe://meridian/region/a/controller/ctl a",
		"spiffe://meridian/region/a/controller/..",
		"spiffe://meridian/client/",
		"spiffe://meridian/client/x/y",
		"spiffe://meridian/client/x?y=1",
		"spiffe://user@meridian/client/x",
		"spiffe://meridian/region/-a/controller/x",
	} {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if id, err := identity.ParseURI(u); err == nil {
			t.Errorf("ParseURI(%q) = %+v, want an error", s, id)
		}
	}
	// Certificates whose identity is ambiguous or contradicts itself have none.
	pki := devPKI(t, identity.PKIOptions{})
	ctlURI, _ := url.Parse("spiffe://meridian/region/a/controller/ctl-a")
	otherURI, _ := url.Parse("spiffe://meridian/region/b/controller/ctl-b")
	foreignURI, _ := url.Parse("spiffe://example.org/ns/a")
	for name, mut := range map[string]func(*x509.Certificate){
		"no URI":               func(*x509.Certificate) {},
		"CommonName differs":   func(c *x509.Certificate) { c.URIs = []*url.URL{ctlURI} },
		"two identities":       func(c *x509.Certificate) { c.Subject.CommonName = "ctl-a"; c.URIs = []*url.URL{ctlURI, otherURI} },
		"another trust domain": func(c *x509.Certificate) { c.Subject.CommonName = "ctl-a"; c.URIs = []*url.URL{foreignURI} },
	} {
		c, k := issueCustom(t, pki, mut)
		dir := t.TempDir()
		cfg := tlsFiles(pki, identity.IssuedCert{Cert: filepath.Join(dir, "c.pem"), Key: filepath.Join(dir, "k.pem")})
		writeFile(t, cfg.Cert, c)
		writeFile(t, cfg.Key, k)
		if id, err := openSource(t, cfg, identity.Deps{}).Identity(); err == nil {
			t.Errorf("%s: identity %+v", name, id)
		}
	}
	c, k := issueCustom(t, pki, func(c *x509.Certificate) { c.Subject.CommonName = "ctl-a"; c.URIs = []*url.URL{ctlURI, foreignURI} })
	dir := t.TempDir()
	cfg := tlsFiles(pki, identity.IssuedCert{Cert: filepath.Join(dir, "c.pem"), Key: filepath.Join(dir, "k.pem")})
	writeFile(t, cfg.Cert, c)
	writeFile(t, cfg.Key, k)
	if id, err := openSource(t, cfg, identity.Deps{}).Identity(); err != nil || id != identity.Controller("ctl-a", "a") {
		t.Errorf("a URI of another trust domain beside ours: %+v %v", id, err)
	}
	if err := (identity.Identity{ControllerID: "a", Region: "r", Client: "c"}).Validate(); err == nil {
		t.Error("an identity with both kinds is valid")
	}
	if err := (identity.Identity{}).Validate(); err == nil {
		t.Error("the empty identity is valid")
	}
}
