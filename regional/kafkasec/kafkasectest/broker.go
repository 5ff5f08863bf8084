// Package kafkasectest runs Kafka-protocol brokers (franz-go's kfake, in
// process on loopback) that require TLS and SASL, with certificates from
// the development PKI, for the tests of every Kafka client of Meridian.
// Tests import it; production code must not.
package kafkasectest

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/kafkasec"
)

// User and Password are the SASL credentials Start's brokers accept.
const (
	User     = "meridian-test"
	Password = "s3cret-never-in-logs-7f3a9c"
)

// Options tune Start. The zero value is TLS and SCRAM-SHA-256.
type Options struct {
	// Mechanism of the broker's user (kafkasec.ScramSHA256 by default).
	Mechanism string
	// NoSASL: TLS only.
	NoSASL bool
	// ClientCert makes the brokers require a client certificate of the
	// PKI's CA (mutual TLS); Config then presents the operator's.
	ClientCert bool
	// ForeignCert: the brokers serve a certificate of another CA than the
	// one Config trusts (a broker that must be refused).
	ForeignCert bool
	// Partitions of auto-created topics; default 4.
	Partitions int
	// Topics to create at start.
	Topics []string
}

// Broker is a running secured cluster.
type Broker struct {
	Cluster *kfake.Cluster
	// Addrs are the brokers' loopback addresses.
	Addrs []string
	// PKI is the development PKI whose CA Config trusts.
	PKI identity.PKIResult
	// PasswordFile holds Password.
	PasswordFile string
	// Config is the client configuration that connects: the PKI's CA, and
	// the user with its password file.
	Config kafkasec.Config
}

// Start runs a one-broker cluster that speaks only TLS (with a certificate
// of a new dev PKI, valid for 127.0.0.1) and, unless NoSASL, accepts only
// the user User with Password. It is closed when the test ends.
func Start(t testing.TB, o Options) *Broker {
	t.Helper()
	if o.Mechanism == "" {
		o.Mechanism = kafkasec.ScramSHA256
	}
	if o.Partitions == 0 {
		o.Partitions = 4
	}
	dir := t.TempDir()
	pki, err := identity.InitDevPKI(filepath.Join(dir, "pki"), []string{"kafka"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	served := pki
	if o.ForeignCert {
		if served, err = identity.InitDevPKI(filepath.Join(dir, "foreign"), []string{"kafka"}, identity.PKIOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kp, err := tls.LoadX509KeyPair(served.Controllers[0].Cert, served.Controllers[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	srv := &tls.Config{Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}
	if o.ClientCert {
		cfg := identity.ClientTLSConfig{CA: pki.CACert}
		roots, err := cfg.Load("broker")
		if err != nil {
			t.Fatal(err)
		}
		srv.ClientCAs, srv.ClientAuth = roots.RootCAs, tls.RequireAndVerifyClientCert
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(o.Partitions), kfake.TLS(srv)}
	if len(o.Topics) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(o.Partitions), o.Topics...))
	}
	if !o.NoSASL {
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(strings.ToUpper(o.Mechanism), User, Password))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b := &Broker{Cluster: c, Addrs: c.ListenAddrs(), PKI: pki, PasswordFile: WritePassword(t, Password)}
	b.Config.TLS = &identity.ClientTLSConfig{CA: pki.CACert}
	if o.ClientCert {
		b.Config.TLS.Cert, b.Config.TLS.Key = pki.Operator.Cert, pki.Operator.Key
	}
	if !o.NoSASL {
		b.Config.SASL = &kafkasec.SASLConfig{Mechanism: o.Mechanism, Username: User, PasswordFile: b.PasswordFile}
	}
	return b
}

// WrongPassword is Config with a password file holding another password.
func (b *Broker) WrongPassword(t testing.TB) kafkasec.Config {
	t.Helper()
	c := b.Config
	s := *c.SASL
	s.PasswordFile = WritePassword(t, "not-"+Password)
	c.SASL = &s
	return c
}

// WritePassword writes pass (with a trailing newline, as secrets often
// have) to a new file of mode 0600 and returns its path.
func WritePassword(t testing.TB, pass string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "kafka-password-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(pass + "\n"); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
