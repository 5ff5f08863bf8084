package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// TrustDomain is the SPIFFE trust domain of every Meridian identity: the
// host part of the identity URI.
const TrustDomain = "meridian"

// Identity is who a verified certificate says its holder is: a controller
// (ControllerID and Region set) or a client such as an operator's CLI or an
// authenticating gateway (Client set). Exactly one of ControllerID and
// Client is set in an identity read from a certificate.
type Identity struct {
	// ControllerID is the controller's id (its Raft server id).
	ControllerID string
	// Region is the controller's region.
	Region string
	// Client is the name of a client-only certificate.
	Client string
}

// Controller returns the identity of controller id in region.
func Controller(id, region string) Identity { return Identity{ControllerID: id, Region: region} }

// Client returns the identity of a client-only certificate.
func Client(name string) Identity { return Identity{Client: name} }

// IsController reports whether the identity is a controller's.
func (i Identity) IsController() bool { return i.ControllerID != "" }

// Name is the controller id, or the client name: the certificate's
// CommonName.
func (i Identity) Name() string {
	if i.IsController() {
		return i.ControllerID
	}
	return i.Client
}

// URI is the identity's URI SAN:
// spiffe://meridian/region/<region>/controller/<id> or
// spiffe://meridian/client/<name>.
func (i Identity) URI() *url.URL {
	if i.IsController() {
		return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/region/" + i.Region + "/controller/" + i.ControllerID}
	}
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/client/" + i.Client}
}

// String is the identity URI, for logs and audit records.
func (i Identity) String() string { return i.URI().String() }

// Validate checks that exactly one kind is set and every name is well formed.
func (i Identity) Validate() error {
	switch {
	case i.ControllerID != "" && i.Client != "":
		return fmt.Errorf("identity: both controller %q and client %q set", i.ControllerID, i.Client)
	case i.ControllerID != "":
		if err := validName("controller id", i.ControllerID); err != nil {
			return err
		}
		return ValidRegion(i.Region)
	case i.Client != "":
		if i.Region != "" {
			return fmt.Errorf("identity: client %q has a region (%q)", i.Client, i.Region)
		}
		return validName("client name", i.Client)
	}
	return errors.New("identity: neither a controller id nor a client name")
}

// ParseURI reads an identity URI (see Identity.URI).
func ParseURI(u *url.URL) (Identity, error) {
	if u == nil || u.Scheme != "spiffe" || u.Host != TrustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Identity{}, fmt.Errorf("identity URI %q: want spiffe://%s/<path>", u, TrustDomain)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	var id Identity
	switch {
	case len(parts) == 4 && parts[0] == "region" && parts[2] == "controller":
		id = Controller(parts[3], parts[1])
	case len(parts) == 2 && parts[0] == "client":
		id = Client(parts[1])
	default:
		return Identity{}, fmt.Errorf("identity URI %q: want path /region/<region>/controller/<id> or /client/<name>", u)
	}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("identity URI %q: %w", u, err)
	}
	return id, nil
}

// ValidRegion checks a region name: 1-63 characters of a-z, 0-9 and '-',
// not starting or ending with '-' (the rule of package global).
func ValidRegion(r string) error {
	ok := len(r) > 0 && len(r) <= 63 && r[0] != '-' && r[len(r)-1] != '-'
	for i := 0; ok && i < len(r); i++ {
		c := r[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
	}
	if !ok {
		return fmt.Errorf("region name %q must be 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'", r)
	}
	return nil
}

func validName(what, s string) error {
	ok := len(s) > 0 && len(s) <= 128 && s != "." && s != ".."
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("%s %q must be 1-128 characters of letters, digits, '.', '_' and '-'", what, s)
	}
	return nil
}

// fromCertificate reads the identity of a certificate. It does not verify
// the certificate: callers pass only leaves of verified chains.
func fromCertificate(c *x509.Certificate) (Identity, error) {
	var found []*url.URL
	for _, u := range c.URIs {
		if u.Scheme == "spiffe" && u.Host == TrustDomain {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %q has no spiffe://%s/ URI SAN", c.Subject.CommonName, TrustDomain)
	case 1:
	default:
		return Identity{}, fmt.Errorf("certificate %q has %d spiffe://%s/ URI SANs, want one", c.Subject.CommonName, len(found), TrustDomain)
	}
	id, err := ParseURI(found[0])
	if err != nil {
		return Identity{}, err
	}
	if c.Subject.CommonName != id.Name() {
		return Identity{}, fmt.Errorf("certificate CommonName %q does not match its identity %s", c.Subject.CommonName, id)
	}
	return id, nil
}

// PeerIdentity returns the identity of the peer of a completed handshake
// whose certificate chain the TLS stack verified (a server's client with
// ServerConfig, or any config that verifies). It returns false when there is
// no verified chain (no client certificate, or a client config that verifies
// in VerifyConnection, such as ClientConfig: use Source.VerifyPeer there) or
// when the leaf carries no identity.
func PeerIdentity(cs *tls.ConnectionState) (Identity, bool) {
	if cs == nil || !cs.HandshakeComplete {
		return Identity{}, false
	}
	return verifiedIdentity(cs)
}

// verifiedIdentity reads the identity of the leaf of the first verified
// chain (also during the handshake, in VerifyConnection).
func verifiedIdentity(cs *tls.ConnectionState) (Identity, bool) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := fromCertificate(cs.VerifiedChains[0][0])
	return id, err == nil
}

// RequireControllers returns a copy of the server config cfg (such as
// Source.ServerConfig(true)) whose handshakes complete only when the
// client's verified certificate carries a controller identity: an
// operator's or a gateway's certificate of the same CA is refused. Use it
// for listeners only controllers may talk to (Raft, forwarding between
// controllers).
func RequireControllers(cfg *tls.Config) *tls.Config {
	check := func(cs tls.ConnectionState) error {
		id, ok := verifiedIdentity(&cs)
		if !ok || !id.IsController() {
			return errors.New("tls: the client presented no controller identity")
		}
		return nil
	}
	out := cfg.Clone()
	out.VerifyConnection = chainVerify(cfg.VerifyConnection, check)
	if get := cfg.GetConfigForClient; get != nil {
		out.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			inner, err := get(h)
			if err != nil || inner == nil {
				return inner, err
			}
			inner = inner.Clone()
			inner.VerifyConnection = chainVerify(inner.VerifyConnection, check)
			return inner, nil
		}
	}
	return out
}

func chainVerify(first, then func(tls.ConnectionState) error) func(tls.ConnectionState) error {
	if first == nil {
		return then
	}
	return func(cs tls.ConnectionState) error {
		if err := first(cs); err != nil {
			return err
		}
		return then(cs)
	}
}

// FromRequest returns the verified identity of the client of an HTTP
// request served over TLS (PeerIdentity of r.TLS).
func FromRequest(r *http.Request) (Identity, bool) {
	if r == nil {
		return Identity{}, false
	}
	return PeerIdentity(r.TLS)
}
