package kafkasec

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/meridian-llm/meridian/global/identity"
)

// SASL mechanisms (SASLConfig.Mechanism).
const (
	ScramSHA256 = "scram-sha-256"
	ScramSHA512 = "scram-sha-512"
	Plain       = "plain"
)

// DefaultPasswordEnv is the environment variable the SASL password is read
// from when neither password_file nor password_env is set.
const DefaultPasswordEnv = "MERIDIAN_KAFKA_PASSWORD"

// Config is the security of one Kafka client, as the kafka section of a
// controller or kv-bridge configuration carries it (tls and sasl keys).
// The zero value is plaintext without authentication, which Validate
// accepts only for loopback brokers or an insecure caller.
type Config struct {
	// TLS encrypts the connections and authenticates the brokers: ca (the
	// brokers' CA; default the system's roots), cert and key (a client
	// certificate, for brokers that require one), server_name (default: each
	// broker's advertised host), insecure_skip_verify (insecure callers only),
	// min_version (default "1.2"). Nil: plaintext.
	TLS *identity.ClientTLSConfig `yaml:"tls,omitempty" json:"tls,omitempty"`
	// SASL authenticates this client to the brokers. Nil: none.
	SASL *SASLConfig `yaml:"sasl,omitempty" json:"sasl,omitempty"`
}

// SASLConfig names a SASL user and where its password is. The password
// itself is never part of a configuration.
type SASLConfig struct {
	// Mechanism: scram-sha-256, scram-sha-512, or plain (the password in
	// clear on the wire: TLS required unless insecure). Required.
	Mechanism string `yaml:"mechanism" json:"mechanism"`
	// Username. Required.
	Username string `yaml:"username" json:"username"`
	// PasswordFile is a file holding the password (one trailing newline is
	// ignored), e.g. a mounted Kubernetes Secret.
	PasswordFile string `yaml:"password_file,omitempty" json:"password_file,omitempty"`
	// PasswordEnv is the environment variable holding the password. Default
	// MERIDIAN_KAFKA_PASSWORD when PasswordFile is empty. At most one of the
	// two.
	PasswordEnv string `yaml:"password_env,omitempty" json:"password_env,omitempty"`
}

// passwordEnv is the variable the password is read from ("" with a file).
func (s SASLConfig) passwordEnv() string {
	if s.PasswordFile != "" {
		return ""
	}
	if s.PasswordEnv == "" {
		return DefaultPasswordEnv
	}
	return s.PasswordEnv
}

// passwordSource describes where the password is read from, for errors.
func (s SASLConfig) passwordSource() string {
	if s.PasswordFile != "" {
		return "password_file " + s.PasswordFile
	}
	return "$" + s.passwordEnv()
}

// Validate checks the sections without reading any file: field names the
// section in errors ("kafka"), brokers are the addresses the client dials,
// insecure is the caller's opt-out (the controller's insecure: true). It
// refuses, unless insecure: a broker beyond loopback without TLS (KV events
// and pod announcements would cross the network in clear, and anyone on the
// path could forge them), insecure_skip_verify, and PLAIN without TLS.
func (c Config) Validate(field string, brokers []string, insecure bool) error {
	var errs []error
	if c.TLS != nil {
		if err := c.TLS.Validate(field + ".tls"); err != nil {
			errs = append(errs, err)
		}
		if c.TLS.InsecureSkipVerify && !insecure {
			errs = append(errs, fmt.Errorf("%s.tls.insecure_skip_verify: the brokers would not be authenticated (anyone on the path could read and forge events); give %s.tls.ca instead, or set insecure: true (--kafka-insecure) to accept it", field, field))
		}
	}
	if s := c.SASL; s != nil {
		switch s.Mechanism {
		case ScramSHA256, ScramSHA512:
		case Plain:
			if c.TLS == nil && !insecure {
				errs = append(errs, fmt.Errorf("%s.sasl.mechanism = plain without %s.tls: the password would cross the network in clear; configure %s.tls, use scram-sha-512, or set insecure: true (--kafka-insecure) to accept it", field, field, field))
			}
		default:
			errs = append(errs, fmt.Errorf("%s.sasl.mechanism = %q: want %s, %s or %s", field, s.Mechanism, ScramSHA256, ScramSHA512, Plain))
		}
		if s.Username == "" {
			errs = append(errs, fmt.Errorf("%s.sasl.username: must be set", field))
		}
		if s.PasswordFile != "" && s.PasswordEnv != "" {
			errs = append(errs, fmt.Errorf("%s.sasl: password_file %q and password_env %q: set one", field, s.PasswordFile, s.PasswordEnv))
		}
	}
	if c.TLS == nil && !insecure {
		if far := remoteBrokers(brokers); len(far) > 0 {
			errs = append(errs, fmt.Errorf("%s.brokers %s: not loopback and %s.tls is not set: KV events and pod announcements would cross the network in clear and could be forged on the way; configure %s.tls (and %s.sasl), or set insecure: true (--kafka-insecure) to accept plaintext",
				field, strings.Join(far, ", "), field, field, field))
		}
	}
	return errors.Join(errs...)
}

// InsecureUses lists what the caller's insecure opt-out accepts in this
// configuration (none when it is secure), one phrase each, for the caller's
// loud start-up log and its count of insecure links.
func (c Config) InsecureUses(field string, brokers []string) []string {
	var out []string
	if c.TLS == nil {
		if far := remoteBrokers(brokers); len(far) > 0 {
			out = append(out, fmt.Sprintf("%s plaintext to %s", field, strings.Join(far, ", ")))
		}
	} else if c.TLS.InsecureSkipVerify {
		out = append(out, field+".tls.insecure_skip_verify (brokers not authenticated)")
	}
	if c.SASL != nil && c.SASL.Mechanism == Plain && c.TLS == nil {
		out = append(out, field+".sasl plain without tls (password in clear)")
	}
	return out
}

// remoteBrokers returns the brokers that are not on loopback.
func remoteBrokers(brokers []string) []string {
	var out []string
	for _, b := range brokers {
		host, _, err := net.SplitHostPort(b)
		if err != nil {
			host = b
		}
		if !loopbackHost(host) {
			out = append(out, b)
		}
	}
	return out
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ResolvePaths makes the relative file names of c (tls.ca, tls.cert,
// tls.key, sasl.password_file) relative to dir (the directory of the
// configuration file that named them).
func (c *Config) ResolvePaths(dir string) {
	if c.TLS != nil {
		c.TLS.ResolvePaths(dir)
	}
	if c.SASL != nil && c.SASL.PasswordFile != "" && !filepath.IsAbs(c.SASL.PasswordFile) {
		c.SASL.PasswordFile = filepath.Join(dir, c.SASL.PasswordFile)
	}
}
