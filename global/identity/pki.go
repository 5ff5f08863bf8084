package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Errors of InitDevPKI.
var (
	// ErrPKIExists: the directory already holds a CA and PKIOptions.Force is
	// not set.
	ErrPKIExists = errors.New("a CA already exists")
	// ErrInvalidPKIInput wraps every complaint about the regions or options
	// (nothing was written).
	ErrInvalidPKIInput = errors.New("invalid input")
)

// File names written by InitDevPKI in its directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
)

// PKIOptions tune InitDevPKI. The zero value is valid.
type PKIOptions struct {
	// ReplicasPerRegion is the number of controllers per region. 1 (also
	// when 0): one controller ctl-<region>; n > 1: ctl-<region>-1 ..
	// ctl-<region>-n. At most 100.
	ReplicasPerRegion int
	// Hosts are extra DNS names or IP addresses put on every controller
	// certificate (the addresses peers dial it at).
	Hosts []string
	// Operator names the client-only certificate for the CLI. Default
	// "operator".
	Operator string
	// Force overwrites an existing CA (and every certificate) in the
	// directory.
	Force bool
	// Validity of the controller and operator certificates. Default 365
	// days (also when 0).
	Validity time.Duration
	// CAValidity of the CA certificate. Default 10 years (also when 0).
	CAValidity time.Duration
	// Now is the issuing time; nil: time.Now. Certificates are valid from
	// five minutes before it (clock skew between hosts).
	Now func() time.Time
}

// PKIResult lists what InitDevPKI wrote.
type PKIResult struct {
	Dir    string
	CACert string // path of ca.pem
	CAKey  string // path of ca-key.pem (mode 0600)
	// Controllers, in region order then replica order.
	Controllers []IssuedCert
	// Operator is the client-only certificate.
	Operator IssuedCert
}

// IssuedCert is one certificate written to disk.
type IssuedCert struct {
	Identity Identity
	Cert     string // path of <name>.pem
	Key      string // path of <name>-key.pem (mode 0600)
}

// ControllerIDs returns the controller ids InitDevPKI issues for region.
func ControllerIDs(region string, replicas int) []string {
	if replicas <= 1 {
		return []string{"ctl-" + region}
	}
	ids := make([]string, replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("ctl-%s-%d", region, i+1)
	}
	return ids
}

// InitDevPKI writes a development PKI to dir (created if missing): a CA
// (ca.pem, ca-key.pem), one certificate per controller (<id>.pem,
// <id>-key.pem, usable for both server and client authentication) and a
// client-only certificate for the operator CLI (operator.pem,
// operator-key.pem). Keys are ECDSA P-256 and written with mode 0600. A
// controller certificate carries its identity (see doc.go) and the SANs DNS
// localhost, <id> and ctl-<region>, IP 127.0.0.1 and ::1, and opts.Hosts. It
// refuses (ErrPKIExists) to replace an existing CA unless opts.Force.
func InitDevPKI(dir string, regions []string, opts PKIOptions) (PKIResult, error) {
	res := PKIResult{Dir: dir, CACert: filepath.Join(dir, CACertFile), CAKey: filepath.Join(dir, CAKeyFile)}
	if err := opts.validate(dir, regions); err != nil {
		return res, fmt.Errorf("init dev pki: %w: %w", ErrInvalidPKIInput, err)
	}
	if !opts.Force {
		for _, f := range []string{res.CACert, res.CAKey} {
			if _, err := os.Stat(f); err == nil {
				return res, fmt.Errorf("init dev pki: %w: %s (use --force to replace it and every certificate)", ErrPKIExists, f)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return res, fmt.Errorf("init dev pki: %w", err)
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	t := now()
	validity, caValidity := opts.Validity, opts.CAValidity
	if validity == 0 {
		validity = 365 * 24 * time.Hour
	}
	if caValidity == 0 {
		caValidity = 10 * 365 * 24 * time.Hour
	}
	ca, err := NewCA("meridian dev CA", t.Add(-5*time.Minute), t.Add(caValidity))
	if err != nil {
		return res, fmt.Errorf("init dev pki: %w", err)
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return res, fmt.Errorf("init dev pki: %w", err)
	}
	if err := writeFileAtomic(res.CAKey, caKey, 0o600); err != nil {
		return res, fmt.Errorf("init dev pki: %w", err)
	}
	if err := writeFileAtomic(res.CACert, ca.CertPEM(), 0o644); err != nil {
		return res, fmt.Errorf("init dev pki: %w", err)
	}
	issue := func(id Identity, hosts []string) (IssuedCert, error) {
		certPEM, keyPEM, err := ca.Issue(CertRequest{Identity: id, Hosts: hosts, NotBefore: t.Add(-5 * time.Minute), NotAfter: t.Add(validity)})
		if err != nil {
			return IssuedCert{}, err
		}
		ic := IssuedCert{Identity: id, Cert: filepath.Join(dir, id.Name()+".pem"), Key: filepath.Join(dir, id.Name()+"-key.pem")}
		if err := writeFileAtomic(ic.Key, keyPEM, 0o600); err != nil {
			return IssuedCert{}, err
		}
		return ic, writeFileAtomic(ic.Cert, certPEM, 0o644)
	}
	for _, region := range regions {
		for _, id := range ControllerIDs(region, opts.ReplicasPerRegion) {
			hosts := []string{"localhost", id, "ctl-" + region, "127.0.0.1", "::1"}
			for _, h := range opts.Hosts {
				if !slices.Contains(hosts, h) {
					hosts = append(hosts, h)
				}
			}
			ic, err := issue(Controller(id, region), hosts)
			if err != nil {
				return res, fmt.Errorf("init dev pki: controller %s: %w", id, err)
			}
			res.Controllers = append(res.Controllers, ic)
		}
	}
	op := opts.Operator
	if op == "" {
		op = "operator"
	}
	if res.Operator, err = issue(Client(op), nil); err != nil {
		return res, fmt.Errorf("init dev pki: operator %s: %w", op, err)
	}
	return res, nil
}

func (o PKIOptions) validate(dir string, regions []string) error {
	var errs []error
	if dir == "" {
		errs = append(errs, errors.New("dir must be set"))
	}
	if len(regions) == 0 {
		errs = append(errs, errors.New("regions: at least one region"))
	}
	seen := map[string]bool{}
	for _, r := range regions {
		if err := ValidRegion(r); err != nil {
			errs = append(errs, fmt.Errorf("regions: %w", err))
		}
		if seen[r] {
			errs = append(errs, fmt.Errorf("regions: %q listed twice", r))
		}
		seen[r] = true
	}
	if o.ReplicasPerRegion < 0 || o.ReplicasPerRegion > 100 {
		errs = append(errs, fmt.Errorf("replicas per region = %d: want 1..100", o.ReplicasPerRegion))
	}
	for _, h := range o.Hosts {
		if h == "" || strings.ContainsAny(h, " \t/,") {
			errs = append(errs, fmt.Errorf("hosts: %q is not a DNS name or IP address", h))
		}
	}
	if o.Operator != "" {
		if err := validName("operator name", o.Operator); err != nil {
			errs = append(errs, err)
		}
		for _, r := range regions {
			for _, id := range ControllerIDs(r, o.ReplicasPerRegion) {
				if id == o.Operator {
					errs = append(errs, fmt.Errorf("operator name %q is also a controller id", o.Operator))
				}
			}
		}
	}
	if o.Validity < 0 || o.CAValidity < 0 {
		errs = append(errs, fmt.Errorf("validity %v / CA validity %v: want > 0 (0: the default)", o.Validity, o.CAValidity))
	}
	return errors.Join(errs...)
}

// CA is a certificate authority that issues Meridian certificates.
type CA struct {
	// Cert is the CA certificate.
	Cert *x509.Certificate
	key  crypto.Signer
}

// NewCA makes a self-signed ECDSA P-256 CA valid from notBefore to
// notAfter, which may issue leaf certificates only.
func NewCA(name string, notBefore, notAfter time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new ca: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("new ca: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"meridian"}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("new ca: %w", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new ca: %w", err)
	}
	return &CA{Cert: c, key: key}, nil
}

// LoadCA reads a CA certificate and its private key from PEM files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	cb, err := readLimited(certFile)
	if err != nil {
		return nil, fmt.Errorf("load ca: %w", err)
	}
	kb, err := readLimited(keyFile)
	if err != nil {
		return nil, fmt.Errorf("load ca: %w", err)
	}
	cblock, _ := pem.Decode(cb)
	kblock, _ := pem.Decode(kb)
	if cblock == nil || cblock.Type != "CERTIFICATE" || kblock == nil {
		return nil, fmt.Errorf("load ca: %s or %s is not PEM", certFile, keyFile)
	}
	c, err := x509.ParseCertificate(cblock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load ca: %s: %w", certFile, err)
	}
	if !c.IsCA {
		return nil, fmt.Errorf("load ca: %s is not a CA certificate", certFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(kblock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load ca: %s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("load ca: %s: not a signing key", keyFile)
	}
	return &CA{Cert: c, key: signer}, nil
}

// CertPEM is the CA certificate in PEM.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM is the CA's private key in PEM (PKCS#8).
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.key) }

// CertRequest describes a certificate to issue.
type CertRequest struct {
	// Identity is put in the CommonName and the URI SAN. A controller
	// identity gets a certificate for server and client authentication; a
	// client identity one for client authentication only.
	Identity Identity
	// Hosts are DNS names or IP addresses (SANs).
	Hosts []string
	// NotBefore and NotAfter bound the validity.
	NotBefore, NotAfter time.Time
}

// Issue makes a new ECDSA P-256 key and a certificate for it signed by the
// CA, both in PEM.
func (ca *CA) Issue(req CertRequest) (certPEM, keyPEMBytes []byte, err error) {
	if err := req.Identity.Validate(); err != nil {
		return nil, nil, fmt.Errorf("issue certificate: %w", err)
	}
	if !req.NotAfter.After(req.NotBefore) {
		return nil, nil, fmt.Errorf("issue certificate: NotAfter %v is not after NotBefore %v", req.NotAfter, req.NotBefore)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: req.Identity.Name(), Organization: []string{"meridian"}},
		NotBefore:             req.NotBefore,
		NotAfter:              req.NotAfter,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:                  []*url.URL{req.Identity.URI()},
	}
	if req.Identity.IsController() {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, h := range req.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate: %w", err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
}

func keyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// writeFileAtomic writes name through a temporary file in the same
// directory, created with perm, and renames it into place.
func writeFileAtomic(name string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		return err
	}
	ok = true
	return nil
}
