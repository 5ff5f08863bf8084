package identity

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ClientTLSConfig is the TLS of a client that dials servers outside the
// controllers' own PKI: Kafka brokers (kafka.tls), inference pods served
// over https (pods.tls). Unlike TLSConfig it names no identity of ours: the
// server is verified against CA (or the system's roots) and the host it is
// dialled at, and a client certificate is presented only when configured.
type ClientTLSConfig struct {
	// CA is the PEM file of the certificates a server's chain must end in
	// (CA certificates, or a self-signed server certificate to pin). Empty:
	// the system's roots.
	CA string `yaml:"ca,omitempty" json:"ca,omitempty"`
	// Cert and Key are the PEM files of a client certificate, presented to
	// servers that ask for one (mutual TLS). Both or neither. The files are
	// read again at the next handshake after they change, so a rotated
	// certificate needs no restart.
	Cert string `yaml:"cert,omitempty" json:"cert,omitempty"`
	Key  string `yaml:"key,omitempty" json:"key,omitempty"`
	// ServerName is the name the server's certificate must be valid for.
	// Default: the host dialled (a broker's advertised host, a pod's
	// endpoint host).
	ServerName string `yaml:"server_name,omitempty" json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate: the connection is
	// encrypted but the server is not authenticated, so whoever sits on the
	// path can read and forge what it carries. Refused unless the process
	// runs with insecure: true.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify,omitempty" json:"insecure_skip_verify,omitempty"`
	// MinVersion is the lowest TLS version offered: "1.2" or "1.3".
	// Default "1.2" (also when empty): brokers and engines are not ours to
	// upgrade.
	MinVersion string `yaml:"min_version,omitempty" json:"min_version,omitempty"`
}

// DefaultClientMinVersion is ClientTLSConfig's default MinVersion.
const DefaultClientMinVersion = "1.2"

// Validate checks the fields without reading the files (Load reads them).
// field names the section in errors, e.g. "kafka.tls".
func (c ClientTLSConfig) Validate(field string) error {
	var errs []error
	if (c.Cert == "") != (c.Key == "") {
		errs = append(errs, fmt.Errorf("%s: cert %q and key %q: set both (a client certificate) or neither", field, c.Cert, c.Key))
	}
	switch c.MinVersion {
	case "", "1.2", "1.3":
	default:
		errs = append(errs, fmt.Errorf("%s.min_version = %q: want \"1.2\" or \"1.3\"", field, c.MinVersion))
	}
	if c.InsecureSkipVerify && c.CA != "" {
		errs = append(errs, fmt.Errorf("%s: insecure_skip_verify with a ca (%s): the CA would not be checked; drop one", field, c.CA))
	}
	return errors.Join(errs...)
}

func (c ClientTLSConfig) minVersion() uint16 {
	if c.MinVersion == "1.3" {
		return tls.VersionTLS13
	}
	return tls.VersionTLS12
}

// Load reads the files and returns the client's tls.Config: the server is
// verified against CA (or the system's roots) for ServerName (or, when
// empty, the host the caller dials: kafka-go and net/http fill it in), and
// the client certificate, if any, is presented when a server asks. A
// missing or unreadable file, a file that is not PEM, or a key that does not
// match its certificate fails Load, naming field and file.
func (c ClientTLSConfig) Load(field string) (*tls.Config, error) {
	if err := c.Validate(field); err != nil {
		return nil, err
	}
	tc := &tls.Config{MinVersion: c.minVersion(), ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify}
	if c.CA != "" {
		b, err := readLimited(c.CA)
		if err != nil {
			return nil, fmt.Errorf("%s.ca: %w", field, err)
		}
		if tc.RootCAs, err = parseRoots(b); err != nil {
			return nil, fmt.Errorf("%s.ca %s: %w", field, c.CA, err)
		}
	}
	if c.Cert != "" {
		kp := &keyPair{field: field, cert: c.Cert, key: c.Key}
		if _, err := kp.get(); err != nil {
			return nil, err
		}
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	return tc, nil
}

// parseRoots reads a PEM bundle of trust anchors: any certificate, CA or
// self-signed server certificate.
func parseRoots(b []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %q: want CERTIFICATE", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		pool.AddCert(c)
		n++
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("trailing data that is not PEM")
	}
	if n == 0 {
		return nil, errors.New("no certificate")
	}
	return pool, nil
}

// keyPair is a client certificate read from its files again when they
// change (size or modification time), keeping the last good one when the
// new files do not load.
type keyPair struct {
	field, cert, key string

	mu    sync.Mutex
	stamp [2]fileStamp
	cur   *tls.Certificate
}

type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(name string) (fileStamp, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{size: fi.Size(), mod: fi.ModTime()}, nil
}

func (k *keyPair) get() (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	cs, cerr := stampOf(k.cert)
	ks, kerr := stampOf(k.key)
	if k.cur != nil && (cerr != nil || kerr != nil || [2]fileStamp{cs, ks} == k.stamp) {
		return k.cur, nil
	}
	cb, err := readLimited(k.cert)
	if err != nil {
		return k.keep(fmt.Errorf("%s.cert: %w", k.field, err))
	}
	kb, err := readLimited(k.key)
	if err != nil {
		return k.keep(fmt.Errorf("%s.key: %w", k.field, err))
	}
	c, err := tls.X509KeyPair(cb, kb)
	if err != nil {
		return k.keep(fmt.Errorf("%s.cert %s / %s.key %s: %w", k.field, k.cert, k.field, k.key, err))
	}
	k.cur, k.stamp = &c, [2]fileStamp{cs, ks}
	return k.cur, nil
}

// keep returns the certificate in use when there is one (a rotation caught
// half-written is retried at the next handshake), else err.
func (k *keyPair) keep(err error) (*tls.Certificate, error) {
	if k.cur != nil {
		return k.cur, nil
	}
	return nil, err
}
