package auth_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meridian-llm/meridian/global/audit/audittest"
	"github.com/meridian-llm/meridian/regional/auth"
)

// issuer is a test identity provider: signing keys and their JWKS.
type issuer struct {
	t    testing.TB
	mu   sync.Mutex
	keys map[string]signingKey
}

type signingKey struct {
	alg jose.SignatureAlgorithm
	key crypto.Signer
}

func newIssuer(t testing.TB) *issuer { return &issuer{t: t, keys: map[string]signingKey{}} }

func (is *issuer) add(kid string, alg jose.SignatureAlgorithm) {
	is.t.Helper()
	var k crypto.Signer
	var err error
	switch alg {
	case jose.RS256:
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.EdDSA:
		_, k, err = ed25519.GenerateKey(rand.Reader)
	}
	if err != nil {
		is.t.Fatal(err)
	}
	is.mu.Lock()
	is.keys[kid] = signingKey{alg: alg, key: k}
	is.mu.Unlock()
}

func (is *issuer) jwks() []byte {
	is.mu.Lock()
	defer is.mu.Unlock()
	var set jose.JSONWebKeySet
	for kid, k := range is.keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.key.Public(), KeyID: kid, Algorithm: string(k.alg), Use: "sig"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		is.t.Fatal(err)
	}
	return b
}

// token signs claims with key kid (std's zero fields are left out).
func (is *issuer) token(kid string, std jwt.Claims, custom map[string]any) string {
	is.t.Helper()
	is.mu.Lock()
	k := is.keys[kid]
	is.mu.Unlock()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: k.alg, Key: jose.JSONWebKey{Key: k.key, KeyID: kid}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		is.t.Fatal(err)
	}
	tok, err := jwt.Signed(sig).Claims(std).Claims(custom).Serialize()
	if err != nil {
		is.t.Fatal(err)
	}
	return tok
}

const (
	testIssuer   = "https://idp.example"
	testAudience = "meridian"
)

func claimsAt(now time.Time) jwt.Claims {
	return jwt.Claims{Issuer: testIssuer, Audience: jwt.Audience{"other", testAudience}, Subject: "svc-acme",
		Expiry: jwt.NewNumericDate(now.Add(time.Hour)), NotBefore: jwt.NewNumericDate(now.Add(-time.Minute)), IssuedAt: jwt.NewNumericDate(now)}
}

func acmeClaims() map[string]any {
	return map[string]any{"tenant": "ACME", "data_classes": []string{"General", "phi"}, "default_data_class": "general"}
}

func jwtConfig(jwksFile string) auth.Config {
	cfg := auth.DefaultConfig()
	cfg.Mode = auth.ModeJWT
	cfg.JWT.JWKSFile, cfg.JWT.Issuer, cfg.JWT.Audience = jwksFile, testIssuer, testAudience
	return cfg
}

// TestJWT: RS256, ES256 and EdDSA tokens of the JWKS authenticate and map
// their claims; every bad token is refused.
func TestJWT(t *testing.T) {
	is := newIssuer(t)
	is.add("rsa", jose.RS256)
	is.add("ec", jose.ES256)
	is.add("ed", jose.EdDSA)
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeAtomic(t, file, string(is.jwks()))
	clock := audittest.NewClock(time.Now())
	a := openAuth(t, jwtConfig(file), auth.Deps{Clock: clock})
	now := clock.Now()
	bearer := func(tok string, more ...string) error {
		_, err := a.Authenticate(request(append([]string{"Authorization", "Bearer " + tok}, more...)...))
		return err
	}

	want := auth.Identity{Name: "svc-acme", Tenant: "acme", DataClasses: []string{"general", "phi"}, DefaultDataClass: "general",
		DataClass: "general", RateLimit: auth.DefaultConfig().DefaultRateLimit, Method: auth.MethodJWT}
	for _, kid := range []string{"rsa", "ec", "ed"} {
		id, err := a.Authenticate(request("Authorization", "Bearer "+is.token(kid, claimsAt(now), acmeClaims())))
		if err != nil || !reflect.DeepEqual(id, want) {
			t.Fatalf("%s: %+v %v", kid, id, err)
		}
	}
	id, err := a.Authenticate(request("Authorization", "Bearer "+is.token("ec", claimsAt(now), acmeClaims()), "X-Data-Class", "PHI", "X-Tenant-Id", "acme"))
	if err != nil || id.DataClass != "phi" {
		t.Fatalf("narrowed: %+v %v", id, err)
	}
	spaced := map[string]any{"tenant": "acme", "data_classes": "general phi"}
	if id, err := a.Authenticate(request("Authorization", "Bearer "+is.token("ed", claimsAt(now), spaced))); err != nil || len(id.DataClasses) != 2 || id.DataClass != "" {
		t.Fatalf("space-separated classes, no default: %+v %v", id, err)
	}
	// Within the leeway: expired 10s ago, not valid for another 10s.
	c := claimsAt(now)
	c.Expiry = jwt.NewNumericDate(now.Add(-10 * time.Second))
	if err := bearer(is.token("rsa", c, acmeClaims())); err != nil {
		t.Fatalf("expired within the leeway: %v", err)
	}

	refused := map[string]string{}
	mut := func(name string, f func(*jwt.Claims, map[string]any)) {
		c, m := claimsAt(now), acmeClaims()
		f(&c, m)
		refused[name] = is.token("rsa", c, m)
	}
	mut("another issuer", func(c *jwt.Claims, _ map[string]any) { c.Issuer = "https://evil.example" })
	mut("another audience", func(c *jwt.Claims, _ map[string]any) { c.Audience = jwt.Audience{"someone-else"} })
	mut("expired", func(c *jwt.Claims, _ map[string]any) { c.Expiry = jwt.NewNumericDate(now.Add(-time.Hour)) })
	mut("no exp", func(c *jwt.Claims, _ map[string]any) { c.Expiry = nil })
	mut("not yet valid", func(c *jwt.Claims, _ map[string]any) { c.NotBefore = jwt.NewNumericDate(now.Add(time.Hour)) })
	mut("issued in the future", func(c *jwt.Claims, _ map[string]any) { c.IssuedAt = jwt.NewNumericDate(now.Add(time.Hour)) })
	mut("no tenant", func(_ *jwt.Claims, m map[string]any) { delete(m, "tenant") })
	mut("a tenant that is not a string", func(_ *jwt.Claims, m map[string]any) { m["tenant"] = 7 })
	mut("no subject", func(c *jwt.Claims, _ map[string]any) { c.Subject = "" })
	mut("a default outside the classes", func(_ *jwt.Claims, m map[string]any) { m["default_data_class"] = "pci" })
	mut("a malformed class", func(_ *jwt.Claims, m map[string]any) { m["data_classes"] = []any{"ok", 3} })
	// Another key under a known kid: the signature does not verify.
	other := newIssuer(t)
	other.add("rsa", jose.RS256)
	other.add("nope", jose.ES256)
	refused["signed by another key"] = other.token("rsa", claimsAt(now), acmeClaims())
	refused["unknown kid"] = other.token("nope", claimsAt(now), acmeClaims())
	// HS256 with the RSA public key as the secret (the classic confusion)
	// and alg none are not accepted algorithms.
	pub := is.jwks()
	hs, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: pub}, nil)
	if err != nil {
		t.Fatal(err)
	}
	refused["HS256"], _ = jwt.Signed(hs).Claims(claimsAt(now)).Claims(acmeClaims()).Serialize()
	head := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	body, _ := json.Marshal(map[string]any{"iss": testIssuer, "aud": testAudience, "sub": "x", "tenant": "acme", "exp": now.Add(time.Hour).Unix()})
	refused["alg none"] = head + "." + base64.RawURLEncoding.EncodeToString(body) + "."
	refused["garbage"] = "not-a-jwt"
	refused["huge"] = strings.Repeat("a", 20<<10)
	for name, tok := range refused {
		wantErr(t, name, bearer(tok), auth.ErrInvalidCredentials, 401)
	}
	wantErr(t, "no token", errOf(a.Authenticate(request())), auth.ErrMissingCredentials, 401)
	wantErr(t, "X-Api-Key is not a JWT carrier", errOf(a.Authenticate(request("X-Api-Key", is.token("rsa", claimsAt(now), acmeClaims())))), auth.ErrMissingCredentials, 401)
	wantErr(t, "tenant header of another tenant", bearer(is.token("rsa", claimsAt(now), acmeClaims()), "X-Tenant-Id", "globex"), auth.ErrTenantMismatch, 403)
	wantErr(t, "class outside the token's", bearer(is.token("rsa", claimsAt(now), acmeClaims()), "X-Data-Class", "pci"), auth.ErrDataClassNotAllowed, 403)

	// Only the configured algorithms are accepted.
	cfg := jwtConfig(file)
	cfg.JWT.Algorithms = []string{"ES256"}
	es := openAuth(t, cfg, auth.Deps{Clock: clock})
	if _, err := es.Authenticate(request("Authorization", "Bearer "+is.token("ec", claimsAt(now), acmeClaims()))); err != nil {
		t.Fatalf("ES256 with ES256 only: %v", err)
	}
	wantErr(t, "RS256 with ES256 only", errOf(es.Authenticate(request("Authorization", "Bearer "+is.token("rsa", claimsAt(now), acmeClaims())))), auth.ErrInvalidCredentials, 401)
}

// TestJWKSURL: the JWKS comes from a URL; a token naming a kid the set does
// not hold triggers a refresh (at most once per MinRefreshInterval), after
// which the rotated-in key is accepted.
func TestJWKSURL(t *testing.T) {
	is := newIssuer(t)
	is.add("k1", jose.ES256)
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(is.jwks())
	}))
	defer srv.Close()
	clock := audittest.NewClock(time.Now())
	cfg := jwtConfig("")
	cfg.JWT.JWKSURL = srv.URL + "/jwks.json"
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	a := openAuth(t, cfg, auth.Deps{Clock: clock, HTTPClient: hc})
	ok := func(kid string) bool {
		_, err := a.Authenticate(request("Authorization", "Bearer "+is.token(kid, claimsAt(clock.Now()), acmeClaims())))
		return err == nil
	}
	if !ok("k1") {
		t.Fatal("k1 refused")
	}
	is.add("k2", jose.EdDSA) // the provider rotates a key in
	if ok("k2") {
		t.Fatal("k2 accepted before any refresh")
	}
	if n := fetches.Load(); n != 1 {
		t.Fatalf("%d fetches: an unknown kid within MinRefreshInterval of the last fetch must not trigger one", n)
	}
	// Within MinRefreshInterval of the last load, an unknown kid does not
	// trigger a fetch; after it, it does.
	clock.Advance(cfg.JWT.MinRefreshInterval)
	if ok("k2") {
		t.Fatal("k2 accepted by the request that triggered the refresh")
	}
	waitFor(t, 5*time.Second, "the refresh triggered by an unknown kid", func() bool { return ok("k2") })
	if n := fetches.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
	// A provider that fails keeps the keys in use.
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusBadGateway) })
	if err := a.Reload(ctxT(t, 5*time.Second)); err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("reload from a failing provider: %v", err)
	}
	if !ok("k1") || !ok("k2") {
		t.Fatal("a failed refresh dropped the keys in use")
	}
}
