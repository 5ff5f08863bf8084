package auth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/auth"
)

func TestConfigValidate(t *testing.T) {
	good := map[auth.Mode]func() auth.Config{
		auth.ModeAPIKeys: func() auth.Config {
			c := auth.DefaultConfig()
			c.Mode, c.APIKeys.File = auth.ModeAPIKeys, "keys.yaml"
			return c
		},
		auth.ModeJWT: func() auth.Config {
			c := auth.DefaultConfig()
			c.Mode, c.JWT.JWKSURL, c.JWT.Issuer, c.JWT.Audience = auth.ModeJWT, "https://idp.example/jwks.json", "https://idp.example", "meridian"
			return c
		},
		auth.ModeTrustedHeaders: func() auth.Config {
			c := auth.DefaultConfig()
			c.Mode, c.TrustedHeaders.CIDRs = auth.ModeTrustedHeaders, []string{"10.0.0.0/8"}
			return c
		},
	}
	for mode, g := range good {
		if err := g().Validate(); err != nil {
			t.Errorf("%s: %v", mode, err)
		}
	}
	zero := auth.Config{Mode: auth.ModeJWT, JWT: auth.JWTConfig{JWKSFile: "k.json", Issuer: "i", Audience: "a"}}
	if err := zero.Validate(); err != nil {
		t.Errorf("zero optional fields are defaults: %v", err)
	}
	cases := []struct {
		mode auth.Mode
		mut  func(*auth.Config)
		want string
	}{
		{auth.ModeAPIKeys, func(c *auth.Config) { c.Mode = "magic" }, `auth.mode = "magic"`},
		{auth.ModeAPIKeys, func(c *auth.Config) { c.APIKeys.File = "" }, "auth.api_keys.file: must be set"},
		{auth.ModeAPIKeys, func(c *auth.Config) { c.APIKeys.ReloadInterval = time.Millisecond }, "auth.api_keys.reload_interval = 1ms"},
		{auth.ModeAPIKeys, func(c *auth.Config) { c.DefaultRateLimit.RequestsPerSecond = -1 }, "auth.default_rate_limit.requests_per_second = -1"},
		{auth.ModeAPIKeys, func(c *auth.Config) { c.DefaultRateLimit.Burst = -1 }, "auth.default_rate_limit.burst = -1"},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.JWKSFile = "k.json" }, "exactly one of jwks_file and jwks_url"},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.JWKSURL = "" }, "exactly one of jwks_file and jwks_url"},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.JWKSURL = "http://idp.example/jwks" }, "plain http lets anyone on the path swap the keys"},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.JWKSURL = "ftp://idp.example/jwks" }, `auth.jwt.jwks_url = "ftp://idp.example/jwks"`},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.Issuer = "" }, "auth.jwt.issuer: must be set"},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.Audience = "" }, "auth.jwt.audience: must be set"},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.Algorithms = []string{"HS256"} }, `auth.jwt.algorithms: "HS256"`},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.Leeway = time.Hour }, "auth.jwt.leeway = 1h0m0s"},
		{auth.ModeJWT, func(c *auth.Config) { c.JWT.RefreshInterval = time.Millisecond }, "auth.jwt.refresh_interval = 1ms"},
		{auth.ModeTrustedHeaders, func(c *auth.Config) { c.TrustedHeaders.CIDRs = nil }, "list at least one gateway"},
		{auth.ModeTrustedHeaders, func(c *auth.Config) { c.TrustedHeaders.CIDRs = []string{"10.0.0.1"} }, `auth.trusted_headers.cidrs[0] = "10.0.0.1"`},
		{auth.ModeTrustedHeaders, func(c *auth.Config) { c.TrustedHeaders.Identities = []string{"gateway"} }, `auth.trusted_headers.identities[0] = "gateway"`},
		{auth.ModeTrustedHeaders, func(c *auth.Config) { c.TrustedHeaders.RateLimit.RequestsPerSecond = 1e9 }, "auth.trusted_headers.rate_limit.requests_per_second"},
	}
	for _, c := range cases {
		cfg := good[c.mode]()
		c.mut(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want %q", c.mode, err, c.want)
		}
	}
	lc := auth.DefaultLimiterConfig()
	if err := lc.Validate(); err != nil {
		t.Fatal(err)
	}
	lc.MaxKeys = 1
	if err := lc.Validate(); err == nil || !strings.Contains(err.Error(), "MaxKeys = 1") {
		t.Fatalf("limiter config: %v", err)
	}
}
