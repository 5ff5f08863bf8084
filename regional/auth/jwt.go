package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// maxJWKSBytes bounds a JWKS document; maxTokenBytes a presented token.
const (
	maxJWKSBytes  = 1 << 20
	maxTokenBytes = 16 << 10
)

// verifier checks bearer JWTs against a key set.
type verifier struct {
	cfg  JWTConfig
	algs []jose.SignatureAlgorithm
}

// parseJWKS reads a JWKS document and keeps the public signing keys usable
// with the accepted algorithms.
func parseJWKS(data []byte, algs []jose.SignatureAlgorithm) (*jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	out := &jose.JSONWebKeySet{}
	for i, k := range set.Keys {
		if !k.Valid() {
			return nil, fmt.Errorf("jwks: key %d (kid %q) is not a valid key", i, k.KeyID)
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if k.Algorithm != "" && !containsAlg(algs, jose.SignatureAlgorithm(k.Algorithm)) {
			continue
		}
		out.Keys = append(out.Keys, k.Public())
	}
	if len(out.Keys) == 0 {
		return nil, fmt.Errorf("jwks: no signing key usable with %v (of %d keys)", algs, len(set.Keys))
	}
	return out, nil
}

func containsAlg(algs []jose.SignatureAlgorithm, a jose.SignatureAlgorithm) bool {
	for _, x := range algs {
		if x == a {
			return true
		}
	}
	return false
}

// errUnknownKID is returned (wrapped) for a token whose kid is not in the
// set: the caller refreshes the set.
var errUnknownKID = errors.New("no key with this kid")

// verify checks a token's signature with set and its registered claims at
// now, and maps its claims to an Identity.
func (v *verifier) verify(token string, set *jose.JSONWebKeySet, now time.Time) (Identity, error) {
	if len(token) > maxTokenBytes {
		return Identity{}, refuse(ErrInvalidCredentials, "token longer than %d bytes", maxTokenBytes)
	}
	tok, err := jwt.ParseSigned(token, v.algs)
	if err != nil {
		return Identity{}, refuse(ErrInvalidCredentials, "not a signed JWT with an accepted algorithm (%v)", v.cfg.Algorithms)
	}
	if len(tok.Headers) != 1 {
		return Identity{}, refuse(ErrInvalidCredentials, "token has %d signatures, want 1", len(tok.Headers))
	}
	h := tok.Headers[0]
	keys := set.Keys
	if h.KeyID != "" {
		keys = set.Key(h.KeyID)
	}
	if len(keys) == 0 {
		return Identity{}, fmt.Errorf("%w: %w %q", refuse(ErrInvalidCredentials, "unknown key id %q", clip(h.KeyID)), errUnknownKID, h.KeyID)
	}
	var std jwt.Claims
	var claims map[string]any
	verified := false
	for _, k := range keys {
		if k.Algorithm != "" && k.Algorithm != h.Algorithm {
			continue
		}
		std, claims = jwt.Claims{}, nil
		if err := tok.Claims(k.Key, &std, &claims); err == nil {
			verified = true
			break
		}
	}
	if !verified {
		return Identity{}, refuse(ErrInvalidCredentials, "signature does not verify")
	}
	if std.Expiry == nil {
		return Identity{}, refuse(ErrInvalidCredentials, "token has no exp claim")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: v.cfg.Issuer, AnyAudience: jwt.Audience{v.cfg.Audience}, Time: now}, v.cfg.Leeway); err != nil {
		return Identity{}, refuse(ErrInvalidCredentials, "%v", err)
	}
	return v.identity(claims)
}

// identity maps verified claims to an Identity.
func (v *verifier) identity(claims map[string]any) (Identity, error) {
	c := v.cfg.Claims
	id := Identity{Method: MethodJWT}
	name, _ := claims[c.Name].(string)
	if name == "" || len(name) > MaxValueLen || !printable(name) {
		return Identity{}, refuse(ErrInvalidCredentials, "token has no usable %q claim", c.Name)
	}
	id.Name = name
	raw, _ := claims[c.Tenant].(string)
	t, ok := normValue(raw)
	if !ok {
		return Identity{}, refuse(ErrInvalidCredentials, "token's %q claim %q is not a tenant", c.Tenant, clip(raw))
	}
	id.Tenant = t
	var classes []string
	switch x := claims[c.DataClasses].(type) {
	case nil:
	case string:
		classes = strings.Fields(x)
	case []any:
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return Identity{}, refuse(ErrInvalidCredentials, "token's %q claim holds a non-string", c.DataClasses)
			}
			classes = append(classes, s)
		}
	default:
		return Identity{}, refuse(ErrInvalidCredentials, "token's %q claim is neither a string nor an array", c.DataClasses)
	}
	for _, s := range classes {
		n, ok := normValue(s)
		if !ok {
			return Identity{}, refuse(ErrInvalidCredentials, "token's %q claim holds %q, not a data class", c.DataClasses, clip(s))
		}
		if !contains(id.DataClasses, n) {
			id.DataClasses = append(id.DataClasses, n)
		}
	}
	if raw, present := claims[c.DefaultDataClass]; present && raw != "" {
		s, _ := raw.(string)
		n, ok := normValue(s)
		if !ok || !contains(id.DataClasses, n) {
			return Identity{}, refuse(ErrInvalidCredentials, "token's %q claim %q is not one of its data classes", c.DefaultDataClass, clip(s))
		}
		id.DefaultDataClass = n
	}
	return id, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// fetchJWKS reads the JWKS document from the file or URL.
func fetchJWKS(ctx context.Context, cfg JWTConfig, hc *http.Client) ([]byte, error) {
	if cfg.JWKSFile != "" {
		b, err := readFileLimited(cfg.JWKSFile, maxJWKSBytes)
		if err != nil {
			return nil, fmt.Errorf("jwt.jwks_file: %w", err)
		}
		return b, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.JWKSURL, nil)
	if err != nil {
		return nil, fmt.Errorf("jwt.jwks_url: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jwt.jwks_url: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("jwt.jwks_url %s: status %s", cfg.JWKSURL, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("jwt.jwks_url %s: %w", cfg.JWKSURL, err)
	}
	if len(b) > maxJWKSBytes {
		return nil, fmt.Errorf("jwt.jwks_url %s: document larger than %d bytes", cfg.JWKSURL, maxJWKSBytes)
	}
	return b, nil
}
