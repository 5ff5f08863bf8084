package identity

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxFileBytes bounds each PEM file read.
const maxFileBytes = 1 << 20

// Clock is the time source of a Source: certificate validity checks and the
// reload interval. global/audit/audittest.Clock is a manual one.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Deps are a Source's collaborators; every field may be nil.
type Deps struct {
	// Logger receives reload outcomes; nil: discard.
	Logger *slog.Logger
	// Clock: nil is the system clock.
	Clock Clock
	// Registerer receives meridian_tls_reloads_total{result} and
	// meridian_tls_cert_expiry_timestamp_seconds; nil: not exported.
	Registerer prometheus.Registerer
}

// Source holds a controller's TLS material, re-read from its files every
// ReloadInterval and on Reload, and hands out tls.Configs that use the
// material current at each handshake.
type Source struct {
	cfg        TLSConfig
	minVersion uint16
	log        *slog.Logger
	clock      Clock
	m          *metrics

	cur atomic.Pointer[material]

	loadMu  sync.Mutex // serialises loads
	lastBad [32]byte   // digest of the files of the last failed load

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// material is one successfully loaded set of files.
type material struct {
	cert  tls.Certificate // Leaf set
	pool  *x509.CertPool
	sum   [32]byte // of the three files' bytes
	id    Identity
	idErr error
}

// Open loads the files named by cfg (any error fails Open) and starts the
// periodic reload. ctx only bounds Open. Close stops the reload.
func Open(ctx context.Context, cfg TLSConfig, deps Deps) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("open tls source: %w", err)
	}
	minVersion, _ := parseMinVersion(cfg.MinVersion)
	s := &Source{cfg: cfg, minVersion: minVersion, log: deps.Logger, clock: deps.Clock, done: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "tls", "cert", cfg.Cert)
	if s.clock == nil {
		s.clock = systemClock{}
	}
	m, sum, err := s.load()
	if err != nil {
		return nil, fmt.Errorf("open tls source: %w", err)
	}
	m.sum = sum
	if s.m, err = newMetrics(deps.Registerer); err != nil {
		return nil, fmt.Errorf("open tls source: %w", err)
	}
	s.install(m)
	if m.idErr != nil {
		s.log.Info("certificate carries no meridian identity", "err", m.idErr)
	}
	var runCtx context.Context
	runCtx, s.cancel = context.WithCancel(context.Background())
	go s.run(runCtx)
	return s, nil
}

// Close stops the periodic reload; safe to call more than once. The
// tls.Configs handed out keep working with the last material.
func (s *Source) Close(ctx context.Context) error {
	s.once.Do(s.cancel)
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close tls source: %w", ctx.Err())
	}
}

func (s *Source) run(ctx context.Context) {
	defer close(s.done)
	every := s.cfg.reloadInterval()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(every):
			_ = s.reload(false)
		}
	}
}

// Reload reads the files again now. Unchanged files are a no-op. New valid
// material is used by every later handshake; invalid material is refused,
// the previous material stays in use, and the error is returned (and
// counted as meridian_tls_reloads_total{result="error"}).
func (s *Source) Reload() error { return s.reload(true) }

// reload loads the files; on the periodic path (explicit false) a failure
// with the same bytes as the last failure is not reported again.
func (s *Source) reload(explicit bool) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	sum, files, err := s.readFiles()
	if err == nil && sum == s.cur.Load().sum {
		return nil
	}
	var m *material
	if err == nil {
		m, err = s.parse(files)
	}
	if err != nil {
		if !explicit && sum == s.lastBad && sum != ([32]byte{}) {
			return err
		}
		s.lastBad = sum
		s.m.reloads.WithLabelValues("error").Inc()
		s.log.Error("tls material not reloaded; the previous certificate stays in use", "err", err)
		return fmt.Errorf("reload tls material: %w", err)
	}
	m.sum = sum
	s.lastBad = [32]byte{}
	s.install(m)
	s.m.reloads.WithLabelValues("ok").Inc()
	s.log.Info("tls material reloaded", "subject", m.cert.Leaf.Subject.CommonName, "serial", m.cert.Leaf.SerialNumber.String(),
		"not_after", m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// Update is TLS material read and checked by Prepare, not yet in use.
type Update struct {
	s    *Source
	m    *material
	base [32]byte // digest of the material in use when it was read
}

// Prepare reads the files and checks them as Reload would, without
// putting them in use: nil when they are unchanged, an error (neither
// logged nor counted: the caller reports it) when they do not load. Install
// puts the result in use. A configuration reload prepares every part first,
// so that one invalid part leaves all of them as they were.
func (s *Source) Prepare() (*Update, error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	sum, files, err := s.readFiles()
	if err != nil {
		return nil, err
	}
	base := s.cur.Load().sum
	if sum == base {
		return nil, nil
	}
	m, err := s.parse(files)
	if err != nil {
		return nil, err
	}
	m.sum = sum
	return &Update{s: s, m: m, base: base}, nil
}

// Subject names the update's certificate, for logs and audit records.
func (u *Update) Subject() string { return u.m.cert.Leaf.Subject.CommonName }

// Install puts the prepared material in use for every later handshake,
// counted as meridian_tls_reloads_total{result="ok"}. If the material in
// use changed since Prepare (the periodic reload got there first, with
// files read later), it does nothing.
func (u *Update) Install() {
	s := u.s
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if s.cur.Load().sum != u.base {
		return
	}
	s.lastBad = [32]byte{}
	s.install(u.m)
	s.m.reloads.WithLabelValues("ok").Inc()
	s.log.Info("tls material reloaded", "subject", u.m.cert.Leaf.Subject.CommonName, "serial", u.m.cert.Leaf.SerialNumber.String(),
		"not_after", u.m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
}

func (s *Source) install(m *material) {
	s.cur.Store(m)
	s.m.expiry.Set(float64(m.cert.Leaf.NotAfter.Unix()))
}

type pemFiles struct{ cert, key, ca []byte }

// load reads and parses the files (Open's first load).
func (s *Source) load() (*material, [32]byte, error) {
	sum, files, err := s.readFiles()
	if err != nil {
		return nil, sum, err
	}
	m, err := s.parse(files)
	return m, sum, err
}

func (s *Source) readFiles() ([32]byte, pemFiles, error) {
	var f pemFiles
	var err error
	if f.cert, err = readLimited(s.cfg.Cert); err != nil {
		return [32]byte{}, f, fmt.Errorf("tls.cert: %w", err)
	}
	if f.key, err = readLimited(s.cfg.Key); err != nil {
		return [32]byte{}, f, fmt.Errorf("tls.key: %w", err)
	}
	if f.ca, err = readLimited(s.cfg.ClientCA); err != nil {
		return [32]byte{}, f, fmt.Errorf("tls.client_ca: %w", err)
	}
	h := sha256.New()
	for _, b := range [][]byte{f.cert, f.key, f.ca} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, f, nil
}

func readLimited(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, maxFileBytes)
	}
	return b, nil
}

// parse checks one set of files: a certificate and its key that match, a
// certificate valid now, and a CA file of CA certificates only.
func (s *Source) parse(f pemFiles) (*material, error) {
	cert, err := tls.X509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("tls.cert %s / tls.key %s: %w", s.cfg.Cert, s.cfg.Key, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls.cert %s: %w", s.cfg.Cert, err)
		}
	}
	now := s.clock.Now()
	if now.After(cert.Leaf.NotAfter) {
		return nil, fmt.Errorf("tls.cert %s: certificate %q expired at %s", s.cfg.Cert, cert.Leaf.Subject.CommonName, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	pool, cas, err := parseCAs(f.ca)
	if err != nil {
		return nil, fmt.Errorf("tls.client_ca %s: %w", s.cfg.ClientCA, err)
	}
	m := &material{cert: cert, pool: pool}
	m.id, m.idErr = fromCertificate(cert.Leaf)
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		s.log.Warn("this certificate does not chain to tls.client_ca: peers that verify against the same CA will refuse it",
			"client_ca", s.cfg.ClientCA, "cas", len(cas), "err", err)
	}
	return m, nil
}

// parseCAs reads a PEM bundle of CA certificates.
func parseCAs(b []byte) (*x509.CertPool, []*x509.Certificate, error) {
	pool := x509.NewCertPool()
	var cas []*x509.Certificate
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, nil, fmt.Errorf("PEM block %q: want CERTIFICATE", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, nil, err
		}
		if !c.IsCA || !c.BasicConstraintsValid {
			return nil, nil, fmt.Errorf("certificate %q is not a CA", c.Subject.CommonName)
		}
		pool.AddCert(c)
		cas = append(cas, c)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, nil, errors.New("trailing data that is not PEM")
	}
	if len(cas) == 0 {
		return nil, nil, errors.New("no CA certificate")
	}
	return pool, cas, nil
}

// Leaf returns the certificate in use.
func (s *Source) Leaf() *x509.Certificate { return s.cur.Load().cert.Leaf }

// Identity returns the identity of the certificate in use, or an error if
// it carries none.
func (s *Source) Identity() (Identity, error) {
	m := s.cur.Load()
	return m.id, m.idErr
}

// ServerConfig returns the config of a TLS listener. Each handshake takes
// the certificate and CA current at that moment (GetConfigForClient), so a
// rotation needs no restart. mutual: the client must present a certificate
// that chains to the CA (tls.RequireAndVerifyClientCert); otherwise a
// client certificate is optional but verified when given
// (tls.VerifyClientCertIfGiven), so PeerIdentity only ever reports verified
// identities. Session tickets are off: every connection is verified against
// the current CA.
//
// Fields the caller sets on the returned config before serving (NextProtos
// for ALPN, CipherSuites) are copied into each handshake's config. Note that
// http.Server's automatic HTTP/2 setup does not reach that copy: set
// NextProtos to {"h2", "http/1.1"} to offer HTTP/2.
func (s *Source) ServerConfig(mutual bool) *tls.Config {
	outer := &tls.Config{MinVersion: s.minVersion, Time: s.clock.Now, SessionTicketsDisabled: true}
	outer.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c := s.cur.Load().cert
		return &c, nil
	}
	outer.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m := s.cur.Load()
		c := outer.Clone()
		c.GetConfigForClient = nil
		c.GetCertificate = nil
		c.Certificates = []tls.Certificate{m.cert}
		c.ClientCAs = m.pool
		c.ClientAuth = tls.VerifyClientCertIfGiven
		if mutual {
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
		return c, nil
	}
	return outer
}

// ClientConfig returns the config of a client: it presents the current
// certificate and verifies the server's chain against the current CA at each
// handshake (VerifyConnection; Go's own verifier, which would pin the CA of
// the moment the config was made, is turned off in its favour). With a
// serverName, the server's certificate must also be valid for it (DNS name
// or IP address); with "", the server must present a controller identity
// instead, whatever address it was dialled at (identity, not host name,
// authenticates a controller). Because the chain is verified in
// VerifyConnection, ConnectionState.VerifiedChains stays empty on the client
// side: read the server's identity with VerifyPeer.
func (s *Source) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: s.minVersion,
		Time:       s.clock.Now,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := s.cur.Load().cert
			return &c, nil
		},
		// Verification is not skipped: VerifyConnection does it, against the
		// CA current at the handshake.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			leaf, err := s.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, serverName)
			if err != nil {
				return err
			}
			if serverName == "" {
				id, err := fromCertificate(leaf)
				if err != nil {
					return fmt.Errorf("tls: server has no controller identity: %w", err)
				}
				if !id.IsController() {
					return fmt.Errorf("tls: server identity %s is not a controller", id)
				}
			}
			return nil
		},
	}
}

// VerifyPeer verifies the peer certificates of a connection against the
// current CA for usage (x509.ExtKeyUsageServerAuth for the server a client
// dialled, ExtKeyUsageClientAuth for a server's client) and returns the
// identity of the leaf.
func (s *Source) VerifyPeer(cs *tls.ConnectionState, usage x509.ExtKeyUsage) (Identity, error) {
	if cs == nil {
		return Identity{}, errors.New("verify peer: no TLS connection")
	}
	leaf, err := s.verify(cs.PeerCertificates, usage, "")
	if err != nil {
		return Identity{}, err
	}
	return fromCertificate(leaf)
}

func (s *Source) verify(certs []*x509.Certificate, usage x509.ExtKeyUsage, host string) (*x509.Certificate, error) {
	if len(certs) == 0 {
		return nil, errors.New("tls: peer presented no certificate")
	}
	m := s.cur.Load()
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         m.pool,
		Intermediates: inter,
		CurrentTime:   s.clock.Now(),
		KeyUsages:     []x509.ExtKeyUsage{usage},
		DNSName:       host,
	})
	if err != nil {
		return nil, fmt.Errorf("tls: verify peer certificate %q: %w", certs[0].Subject.CommonName, err)
	}
	return certs[0], nil
}

type metrics struct {
	reloads *prometheus.CounterVec
	expiry  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_tls_reloads_total",
			Help: "Reloads of the TLS certificate, key and CA files after the first load, by result (ok, error: the previous material stays in use).",
		}, []string{"result"}),
		expiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_tls_cert_expiry_timestamp_seconds",
			Help: "NotAfter of the certificate in use, as a Unix timestamp.",
		}),
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.reloads, m.expiry} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register tls metrics: %w", err)
		}
	}
	return m, nil
}
