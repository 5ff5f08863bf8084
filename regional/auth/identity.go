package auth

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Method says how an identity was established.
type Method string

// The methods.
const (
	MethodAPIKey         Method = "api_key"
	MethodJWT            Method = "jwt"
	MethodTrustedHeaders Method = "trusted_headers"
)

// Identity is an authenticated caller and what this request may carry.
type Identity struct {
	// Name identifies the caller: the key entry's name, the token's name
	// claim, or the gateway's identity URI or address. It keys rate limits
	// and is what audit records name as the actor.
	Name string
	// Tenant, in lower case.
	Tenant string
	// DataClasses the caller may send, in lower case (nil: none may be
	// asked for; trusted gateways are not restricted).
	DataClasses []string
	// DefaultDataClass is taken by requests without X-Data-Class ("" when
	// none is configured).
	DefaultDataClass string
	// DataClass is this request's class: X-Data-Class if sent (and
	// allowed), else DefaultDataClass; "" means none, and the caller applies
	// its policy's strictest treatment.
	DataClass string
	// RateLimit is the caller's limit (Limiter enforces it).
	RateLimit RateLimit
	// Method that established the identity.
	Method Method
}

// Headers read by the Authenticator.
const (
	HeaderTenant    = "X-Tenant-Id"
	HeaderDataClass = "X-Data-Class"
	HeaderAPIKey    = "X-Api-Key"
)

// Sentinels of the refusals; every error Authenticate returns is an *Error
// wrapping one of them.
var (
	// ErrMissingCredentials: no credential at all (401).
	ErrMissingCredentials = errors.New("missing credentials")
	// ErrInvalidCredentials: a credential that does not authenticate (401).
	ErrInvalidCredentials = errors.New("invalid credentials")
	// ErrTenantMismatch: X-Tenant-Id differs from the identity's tenant (403).
	ErrTenantMismatch = errors.New("tenant header does not match the credential")
	// ErrDataClassNotAllowed: X-Data-Class is not one of the identity's
	// allowed classes (403).
	ErrDataClassNotAllowed = errors.New("data class not allowed for this credential")
)

// Error is a refusal: its Kind is one of the sentinels, its Status the HTTP
// status to answer with, Code a stable machine-readable reason.
type Error struct {
	Kind   error
	Status int
	Code   string
	// Detail says what was wrong, for the client (never the credential).
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Kind.Error()
	}
	return e.Kind.Error() + ": " + e.Detail
}

func (e *Error) Unwrap() error { return e.Kind }

func refuse(kind error, format string, args ...any) *Error {
	e := &Error{Kind: kind, Detail: fmt.Sprintf(format, args...)}
	switch kind {
	case ErrMissingCredentials:
		e.Status, e.Code = http.StatusUnauthorized, "missing_credentials"
	case ErrInvalidCredentials:
		e.Status, e.Code = http.StatusUnauthorized, "invalid_credentials"
	case ErrTenantMismatch:
		e.Status, e.Code = http.StatusForbidden, "tenant_mismatch"
	case ErrDataClassNotAllowed:
		e.Status, e.Code = http.StatusForbidden, "data_class_not_allowed"
	default:
		e.Status, e.Code = http.StatusInternalServerError, "internal"
	}
	return e
}

// Status returns the HTTP status of an Authenticate error (500 for any
// other error).
func Status(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return http.StatusInternalServerError
}

// MaxValueLen is the longest tenant or data-class value (as in package
// residency).
const MaxValueLen = 256

// normValue lower-cases a tenant or data-class value and checks it against
// the alphabet residency policies use: letters, digits and - _ . : @ / +,
// 1..MaxValueLen bytes.
func normValue(v string) (string, bool) {
	v = strings.TrimSpace(v)
	if len(v) == 0 || len(v) > MaxValueLen {
		return "", false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-', c == '_', c == '.', c == ':', c == '@', c == '/', c == '+':
		default:
			return "", false
		}
	}
	return strings.ToLower(v), true
}

// headerValue returns the single value of a header ("" when absent); two
// different values are an error.
func headerValue(h http.Header, name string) (string, bool) {
	vs := h.Values(name)
	v := ""
	for _, x := range vs {
		x = strings.TrimSpace(x)
		if x == "" {
			continue
		}
		if v != "" && !strings.EqualFold(v, x) {
			return "", false
		}
		v = x
	}
	return v, true
}

// applyHeaders checks a credential-backed identity against the tenant and
// data-class headers: a tenant header must name the identity's tenant; a
// data-class header must be one of its classes and becomes the request's
// class; without one the request takes the default.
func applyHeaders(id *Identity, h http.Header) error {
	if raw, ok := headerValue(h, HeaderTenant); !ok {
		return refuse(ErrTenantMismatch, "several different %s values", HeaderTenant)
	} else if raw != "" {
		t, ok := normValue(raw)
		if !ok || t != id.Tenant {
			return refuse(ErrTenantMismatch, "%s %q is not the tenant of this credential", HeaderTenant, clip(raw))
		}
	}
	raw, ok := headerValue(h, HeaderDataClass)
	if !ok {
		return refuse(ErrDataClassNotAllowed, "several different %s values", HeaderDataClass)
	}
	if raw == "" {
		id.DataClass = id.DefaultDataClass
		return nil
	}
	dc, ok := normValue(raw)
	if !ok || !contains(id.DataClasses, dc) {
		return refuse(ErrDataClassNotAllowed, "%s %q is not one of this credential's data classes", HeaderDataClass, clip(raw))
	}
	id.DataClass = dc
	return nil
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// clip bounds a client-supplied value quoted back in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
