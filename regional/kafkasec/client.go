package kafkasec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// maxPasswordBytes bounds the password file read.
const maxPasswordBytes = 64 << 10

// Client is an opened Config: the TLS material and the SASL credentials
// loaded, ready to build kafka-go dialers and transports. It prints (String,
// LogValue) as what it does, never with the password.
type Client struct {
	field string
	tls   *tls.Config
	mech  sasl.Mechanism
	sasl  SASLConfig // without the password
	auth  authTracker
}

// Open reads the files and the password that c names (getenv reads the
// environment; nil is os.Getenv). field names the section in errors. A
// missing file, an empty password, or TLS material that does not load
// fails Open with the field and file or variable, never the password.
func (c Config) Open(field string, getenv func(string) string) (*Client, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	cl := &Client{field: field}
	if c.TLS != nil {
		var err error
		if cl.tls, err = c.TLS.Load(field + ".tls"); err != nil {
			return nil, err
		}
	}
	if c.SASL != nil {
		s := *c.SASL
		pass, err := readPassword(field, s, getenv)
		if err != nil {
			return nil, err
		}
		switch s.Mechanism {
		case ScramSHA256, ScramSHA512:
			algo := scram.SHA256
			if s.Mechanism == ScramSHA512 {
				algo = scram.SHA512
			}
			if cl.mech, err = scram.Mechanism(algo, s.Username, pass); err != nil {
				// xdg-go/scram's errors name the string it could not prepare
				// (SASLprep), which may be the password: do not wrap them.
				return nil, fmt.Errorf("%s.sasl: username %q or its password is not valid for SCRAM (SASLprep refused it)", field, s.Username)
			}
		case Plain:
			cl.mech = plain.Mechanism{Username: s.Username, Password: pass}
		default:
			return nil, fmt.Errorf("%s.sasl.mechanism = %q: want %s, %s or %s", field, s.Mechanism, ScramSHA256, ScramSHA512, Plain)
		}
		cl.sasl = s
		cl.mech = &trackedMechanism{Mechanism: cl.mech, t: &cl.auth}
	}
	return cl, nil
}

// Password reads the password s names (getenv nil: os.Getenv), for the
// rare caller that must know it itself: a development broker that accepts
// this user. Clients use Open.
func (s SASLConfig) Password(field string, getenv func(string) string) (string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	return readPassword(field, s, getenv)
}

func readPassword(field string, s SASLConfig, getenv func(string) string) (string, error) {
	if s.PasswordFile != "" {
		f, err := os.Open(s.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("%s.sasl.password_file: %w", field, err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxPasswordBytes+1))
		if err != nil {
			return "", fmt.Errorf("%s.sasl.password_file %s: %w", field, s.PasswordFile, err)
		}
		if len(b) > maxPasswordBytes {
			return "", fmt.Errorf("%s.sasl.password_file %s: larger than %d bytes", field, s.PasswordFile, maxPasswordBytes)
		}
		pass := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if pass == "" {
			return "", fmt.Errorf("%s.sasl.password_file %s: empty", field, s.PasswordFile)
		}
		return pass, nil
	}
	env := s.passwordEnv()
	pass := getenv(env)
	if pass == "" {
		return "", fmt.Errorf("%s.sasl: the password variable %s is not set (or set %s.sasl.password_file)", field, env, field)
	}
	return pass, nil
}

// String describes the client's security: "plaintext", "tls",
// "tls+scram-sha-512 as meridian-ingest".
func (c *Client) String() string {
	s := "plaintext"
	if c.tls != nil {
		s = "tls"
		if c.tls.InsecureSkipVerify {
			s = "tls (brokers not verified)"
		}
	}
	if c.mech != nil {
		s += fmt.Sprintf("+%s as %s", c.sasl.Mechanism, c.sasl.Username)
	}
	return s
}

// LogValue makes slog print the description, whatever the handler.
func (c *Client) LogValue() slog.Value { return slog.StringValue(c.String()) }

// GoString keeps %#v from printing the credentials.
func (c *Client) GoString() string { return "kafkasec.Client(" + c.String() + ")" }

// Dialer returns a kafka-go Dialer (the Reader's, for consumer groups)
// with the client's TLS and SASL.
func (c *Client) Dialer(timeout time.Duration) *kafka.Dialer {
	return &kafka.Dialer{Timeout: timeout, DualStack: true, TLS: c.tlsConfig(), SASLMechanism: c.mech}
}

// Transport returns a kafka-go Transport (Writers, Clients) of its own with
// the client's TLS and SASL. Close it with CloseIdleConnections.
func (c *Client) Transport(clientID string, dialTimeout time.Duration) *kafka.Transport {
	return &kafka.Transport{ClientID: clientID, DialTimeout: dialTimeout, TLS: c.tlsConfig(), SASL: c.mech}
}

// tlsConfig is a copy for each dialer: kafka-go clones it to fill in the
// server name, and no caller may change ours.
func (c *Client) tlsConfig() *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls.Clone()
}

// Kinds of broker errors (Kind).
const (
	KindAuth  = "auth"  // SASL refused, or a mechanism the brokers do not offer
	KindTLS   = "tls"   // handshake failed: untrusted or misnamed certificate, no TLS listener
	KindOther = "other" // network, broker or protocol errors
)

// Kinds lists the kinds Kind returns, for metrics to pre-register.
func Kinds() []string { return []string{KindAuth, KindTLS, KindOther} }

// Kind classifies a kafka-go error by what the operator must fix. A
// broker that refuses credentials answers SASL_AUTHENTICATION_FAILED, or
// (kfake, some proxies) just closes the connection: a connection closed
// while this client's latest SASL exchange had sent its credentials and
// not completed counts as a refusal too.
func (c *Client) Kind(err error) string {
	if err != nil && c.mech != nil && c.auth.refused() && closedByPeer(err) {
		return KindAuth
	}
	return kindOf(err)
}

// closedByPeer reports whether err says the broker closed the connection.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// kindOf classifies by the error alone.
func kindOf(err error) string {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		record  tls.RecordHeaderError
		alert   tls.AlertError
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, kafka.SASLAuthenticationFailed), errors.Is(err, kafka.UnsupportedSASLMechanism),
		errors.Is(err, kafka.IllegalSASLState):
		return KindAuth
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid),
		errors.As(err, &record), errors.As(err, &alert):
		return KindTLS
	}
	return KindOther
}

// Explain wraps err, when it is a refused authentication or a failed TLS
// handshake, with what to check in the configuration; other errors are
// returned as they are.
func (c *Client) Explain(err error) error {
	var (
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		record  tls.RecordHeaderError
	)
	ca := "the system's roots"
	if c.tls != nil && c.tls.RootCAs != nil {
		ca = c.field + ".tls.ca"
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kafka.SASLAuthenticationFailed) || (c.Kind(err) == KindAuth && !errors.Is(err, kafka.UnsupportedSASLMechanism)):
		if c.mech == nil {
			return fmt.Errorf("%s.sasl is not set but the brokers require SASL: %w", c.field, err)
		}
		return fmt.Errorf("kafka sasl: the brokers refused %s as %q: check %s.sasl.username and the password (%s): %w",
			c.sasl.Mechanism, c.sasl.Username, c.field, c.sasl.passwordSource(), err)
	case errors.Is(err, kafka.UnsupportedSASLMechanism):
		return fmt.Errorf("kafka sasl: the brokers do not offer %s (%s.sasl.mechanism): %w", c.sasl.Mechanism, c.field, err)
	case errors.As(err, &unknown):
		return fmt.Errorf("kafka tls: the broker's certificate is not signed by a CA in %s: %w", ca, err)
	case errors.As(err, &host):
		return fmt.Errorf("kafka tls: the broker's certificate is not valid for the host dialled (set %s.tls.server_name, or fix the brokers' advertised names): %w", c.field, err)
	case errors.As(err, &record):
		return fmt.Errorf("kafka tls: the broker did not answer with TLS (a plaintext listener?): %w", err)
	case c.mech == nil && closedByPeer(err):
		return fmt.Errorf("kafka: the broker closed the connection (down, or does it require %s.sasl or %s.tls?): %w", c.field, c.field, err)
	}
	return err
}

// authTracker remembers this client's latest SASL exchange.
type authTracker struct {
	last atomic.Pointer[trackedSession]
}

// refused reports whether the latest exchange has sent credentials and not
// completed: its connection closing now means the broker refused them.
func (t *authTracker) refused() bool {
	s := t.last.Load()
	return s != nil && !s.done.Load()
}

// trackedMechanism is a SASL mechanism whose exchanges the Client follows,
// so that a broker that refuses by closing the connection is recognised.
type trackedMechanism struct {
	sasl.Mechanism
	t *authTracker
}

func (m *trackedMechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	sm, ir, err := m.Mechanism.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	s := &trackedSession{StateMachine: sm}
	m.t.last.Store(s)
	return s, ir, nil
}

type trackedSession struct {
	sasl.StateMachine
	done atomic.Bool
}

func (s *trackedSession) Next(ctx context.Context, challenge []byte) (bool, []byte, error) {
	done, resp, err := s.StateMachine.Next(ctx, challenge)
	if done && err == nil {
		s.done.Store(true)
	}
	return done, resp, err
}
