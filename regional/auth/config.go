package auth

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"time"

	"github.com/meridian-llm/meridian/global/identity"
)

// Mode selects how clients authenticate.
type Mode string

// The modes.
const (
	ModeAPIKeys        Mode = "api_keys"
	ModeJWT            Mode = "jwt"
	ModeTrustedHeaders Mode = "trusted_headers"
)

// Config configures an Authenticator. Start from DefaultConfig.
type Config struct {
	// Mode is api_keys, jwt or trusted_headers. Required.
	Mode Mode `yaml:"mode" json:"mode"`
	// APIKeys configures the api_keys mode.
	APIKeys APIKeysConfig `yaml:"api_keys" json:"api_keys"`
	// JWT configures the jwt mode.
	JWT JWTConfig `yaml:"jwt" json:"jwt"`
	// TrustedHeaders configures the trusted_headers mode.
	TrustedHeaders TrustedHeadersConfig `yaml:"trusted_headers" json:"trusted_headers"`
	// DefaultRateLimit applies to API keys without a rate_limit of their own
	// and to every JWT identity. Default 50 requests/s, burst 100.
	DefaultRateLimit RateLimit `yaml:"default_rate_limit" json:"default_rate_limit"`
}

// APIKeysConfig names the keys file.
type APIKeysConfig struct {
	// File is the keys file (YAML or JSON; see ParseKeys). Required in
	// api_keys mode.
	File string `yaml:"file" json:"file"`
	// ReloadInterval is how often the file is read again. Default 10s (also
	// when 0); at least 100ms.
	ReloadInterval time.Duration `yaml:"reload_interval" json:"reload_interval"`
}

// JWTConfig configures the verification of bearer JWTs.
type JWTConfig struct {
	// JWKSFile or JWKSURL (exactly one) holds the verification keys as a JSON
	// Web Key Set. The URL must be https (http only for a loopback host).
	JWKSFile string `yaml:"jwks_file" json:"jwks_file"`
	JWKSURL  string `yaml:"jwks_url" json:"jwks_url"`
	// Issuer must equal the iss claim. Required.
	Issuer string `yaml:"issuer" json:"issuer"`
	// Audience must be one of the aud claim's values. Required.
	Audience string `yaml:"audience" json:"audience"`
	// Algorithms accepted, among RS256, ES256 and EdDSA. Default all three.
	Algorithms []string `yaml:"algorithms" json:"algorithms"`
	// Leeway for exp, nbf and iat (clock skew). Default 30s (also when 0);
	// at most 5m.
	Leeway time.Duration `yaml:"leeway" json:"leeway"`
	// RefreshInterval is how often the JWKS is read again. Default 5m (also
	// when 0); at least 1s. A token naming an unknown kid triggers a
	// refresh too, at most once per MinRefreshInterval.
	RefreshInterval time.Duration `yaml:"refresh_interval" json:"refresh_interval"`
	// MinRefreshInterval bounds refreshes triggered by unknown kids.
	// Default 10s (also when 0).
	MinRefreshInterval time.Duration `yaml:"min_refresh_interval" json:"min_refresh_interval"`
	// Claims names the claims identities are read from.
	Claims ClaimNames `yaml:"claims" json:"claims"`
}

// ClaimNames are the JWT claims an identity is read from; empty fields take
// the defaults.
type ClaimNames struct {
	// Name identifies the caller (the rate limiter's key). Default "sub".
	Name string `yaml:"name" json:"name"`
	// Tenant (a string) is required in every token. Default "tenant".
	Tenant string `yaml:"tenant" json:"tenant"`
	// DataClasses: an array of strings or one space-separated string.
	// Default "data_classes".
	DataClasses string `yaml:"data_classes" json:"data_classes"`
	// DefaultDataClass: a string, one of DataClasses. Default
	// "default_data_class".
	DefaultDataClass string `yaml:"default_data_class" json:"default_data_class"`
}

// TrustedHeadersConfig lists the gateways whose X-Tenant-Id and
// X-Data-Class are believed.
type TrustedHeadersConfig struct {
	// Identities are the mTLS identity URIs of trusted gateways
	// (spiffe://meridian/client/<name>; see global/identity).
	Identities []string `yaml:"identities" json:"identities"`
	// CIDRs are the TCP peer addresses of trusted gateways.
	CIDRs []string `yaml:"cidrs" json:"cidrs"`
	// RateLimit applies per gateway. Default unlimited (the gateway limits
	// its own users).
	RateLimit RateLimit `yaml:"rate_limit" json:"rate_limit"`
}

// RateLimit is a token bucket.
type RateLimit struct {
	// RequestsPerSecond is the sustained rate; 0 is unlimited.
	RequestsPerSecond float64 `yaml:"requests_per_second" json:"requests_per_second"`
	// Burst is the bucket size in requests. Default (0): the rate rounded
	// up, at least 1.
	Burst int `yaml:"burst" json:"burst"`
}

// Unlimited reports whether the limit lets everything through.
func (r RateLimit) Unlimited() bool { return r.RequestsPerSecond == 0 }

func (r RateLimit) validate(field string) error {
	if math.IsNaN(r.RequestsPerSecond) || math.IsInf(r.RequestsPerSecond, 0) || r.RequestsPerSecond < 0 || r.RequestsPerSecond > 1e6 {
		return fmt.Errorf("%s.requests_per_second = %v: want 0 (unlimited) .. 1e6", field, r.RequestsPerSecond)
	}
	if r.RequestsPerSecond > 0 && r.RequestsPerSecond < 1e-3 {
		return fmt.Errorf("%s.requests_per_second = %v: want at least 0.001 (or 0, unlimited)", field, r.RequestsPerSecond)
	}
	if r.Burst < 0 || r.Burst > 1e6 {
		return fmt.Errorf("%s.burst = %d: want 0 (default) .. 1e6", field, r.Burst)
	}
	return nil
}

// Defaults.
const (
	DefaultKeysReloadInterval    = 10 * time.Second
	DefaultJWTLeeway             = 30 * time.Second
	DefaultJWKSRefreshInterval   = 5 * time.Minute
	DefaultJWKSMinRefresh        = 10 * time.Second
	maxLeeway                    = 5 * time.Minute
	minKeysReloadInterval        = 100 * time.Millisecond
	minJWKSRefreshInterval       = time.Second
	defaultNameClaim             = "sub"
	defaultTenantClaim           = "tenant"
	defaultDataClassesClaim      = "data_classes"
	defaultDefaultDataClassClaim = "default_data_class"
)

var supportedAlgorithms = []string{"RS256", "ES256", "EdDSA"}

// DefaultConfig returns a Config with every optional field at its default;
// Mode and the mode's section must still be set.
func DefaultConfig() Config {
	return Config{
		APIKeys: APIKeysConfig{ReloadInterval: DefaultKeysReloadInterval},
		JWT: JWTConfig{
			Algorithms:         slices.Clone(supportedAlgorithms),
			Leeway:             DefaultJWTLeeway,
			RefreshInterval:    DefaultJWKSRefreshInterval,
			MinRefreshInterval: DefaultJWKSMinRefresh,
			Claims: ClaimNames{Name: defaultNameClaim, Tenant: defaultTenantClaim,
				DataClasses: defaultDataClassesClaim, DefaultDataClass: defaultDefaultDataClassClaim},
		},
		DefaultRateLimit: RateLimit{RequestsPerSecond: 50, Burst: 100},
	}
}

// Validate checks the configuration without reading files or the network;
// errors name the field (as in YAML) and the bad value.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("auth."+format, args...)) }
	switch c.Mode {
	case ModeAPIKeys:
		if c.APIKeys.File == "" {
			bad("api_keys.file: must be set in api_keys mode")
		}
		if d := c.APIKeys.ReloadInterval; d < 0 || (d > 0 && d < minKeysReloadInterval) {
			bad("api_keys.reload_interval = %v: want at least %v (0: the default %v)", d, minKeysReloadInterval, DefaultKeysReloadInterval)
		}
	case ModeJWT:
		j := c.JWT
		switch {
		case (j.JWKSFile == "") == (j.JWKSURL == ""):
			bad("jwt: set exactly one of jwks_file and jwks_url")
		case j.JWKSURL != "":
			u, err := url.Parse(j.JWKSURL)
			switch {
			case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
				bad("jwt.jwks_url = %q: want an https:// URL", j.JWKSURL)
			case u.Scheme == "http" && !loopbackHost(u.Hostname()):
				bad("jwt.jwks_url = %q: plain http lets anyone on the path swap the keys; use https (http only on loopback)", j.JWKSURL)
			}
		}
		if j.Issuer == "" {
			bad("jwt.issuer: must be set (the iss every token must carry)")
		}
		if j.Audience == "" {
			bad("jwt.audience: must be set (one of the aud values every token must carry)")
		}
		for _, a := range j.Algorithms {
			if !slices.Contains(supportedAlgorithms, a) {
				bad("jwt.algorithms: %q: want RS256, ES256 or EdDSA", a)
			}
		}
		if j.Leeway < 0 || j.Leeway > maxLeeway {
			bad("jwt.leeway = %v: want 0 (the default %v) .. %v", j.Leeway, DefaultJWTLeeway, maxLeeway)
		}
		if d := j.RefreshInterval; d < 0 || (d > 0 && d < minJWKSRefreshInterval) {
			bad("jwt.refresh_interval = %v: want at least %v (0: the default %v)", d, minJWKSRefreshInterval, DefaultJWKSRefreshInterval)
		}
		if j.MinRefreshInterval < 0 {
			bad("jwt.min_refresh_interval = %v: want >= 0", j.MinRefreshInterval)
		}
	case ModeTrustedHeaders:
		th := c.TrustedHeaders
		if len(th.Identities) == 0 && len(th.CIDRs) == 0 {
			bad("trusted_headers: list at least one gateway (identities or cidrs)")
		}
		for i, s := range th.Identities {
			u, err := url.Parse(s)
			if err == nil {
				_, err = identity.ParseURI(u)
			}
			if err != nil {
				bad("trusted_headers.identities[%d] = %q: %v", i, s, err)
			}
		}
		for i, s := range th.CIDRs {
			if _, err := netip.ParsePrefix(s); err != nil {
				bad("trusted_headers.cidrs[%d] = %q: want a CIDR such as 10.0.0.0/8", i, s)
			}
		}
		if err := th.RateLimit.validate("trusted_headers.rate_limit"); err != nil {
			bad("%v", err)
		}
	default:
		bad("mode = %q: want api_keys, jwt or trusted_headers", c.Mode)
	}
	if err := c.DefaultRateLimit.validate("default_rate_limit"); err != nil {
		bad("%v", err)
	}
	return errors.Join(errs...)
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// WithDefaults returns c with its zero optional fields at their defaults,
// as Open uses it.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// withDefaults fills zero optional fields (zero values are defaults where
// the field comment says so).
func (c Config) withDefaults() Config {
	if c.APIKeys.ReloadInterval == 0 {
		c.APIKeys.ReloadInterval = DefaultKeysReloadInterval
	}
	j := &c.JWT
	if len(j.Algorithms) == 0 {
		j.Algorithms = slices.Clone(supportedAlgorithms)
	}
	if j.Leeway == 0 {
		j.Leeway = DefaultJWTLeeway
	}
	if j.RefreshInterval == 0 {
		j.RefreshInterval = DefaultJWKSRefreshInterval
	}
	if j.MinRefreshInterval == 0 {
		j.MinRefreshInterval = DefaultJWKSMinRefresh
	}
	cl := &j.Claims
	for _, f := range []struct {
		p   *string
		def string
	}{{&cl.Name, defaultNameClaim}, {&cl.Tenant, defaultTenantClaim}, {&cl.DataClasses, defaultDataClassesClaim}, {&cl.DefaultDataClass, defaultDefaultDataClassClaim}} {
		if *f.p == "" {
			*f.p = f.def
		}
	}
	return c
}

// ResolvePaths makes the relative file names of c (api_keys.file,
// jwt.jwks_file) relative to dir (the directory of the configuration file
// that named them).
func (c *Config) ResolvePaths(dir string) {
	for _, p := range []*string{&c.APIKeys.File, &c.JWT.JWKSFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}
