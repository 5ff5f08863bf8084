package kafkasec_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kafkasec/kafkasectest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKafkaConfigValidate(t *testing.T) {
	scram := &kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA512, Username: "u", PasswordFile: "/run/secrets/p"}
	plain := &kafkasec.SASLConfig{Mechanism: kafkasec.Plain, Username: "u"}
	tlsCA := &identity.ClientTLSConfig{CA: "ca.pem"}
	skip := &identity.ClientTLSConfig{InsecureSkipVerify: true}
	local, remote := []string{"127.0.0.1:9092", "localhost:9093", "[::1]:9092"}, []string{"127.0.0.1:9092", "kafka:9092"}
	for _, c := range []struct {
		name     string
		cfg      kafkasec.Config
		brokers  []string
		insecure bool
		want     string // "" = valid
		uses     int    // InsecureUses
	}{
		{"plaintext on loopback", kafkasec.Config{}, local, false, "", 0},
		{"plaintext beyond loopback", kafkasec.Config{}, remote, false, "kafka.brokers kafka:9092: not loopback and kafka.tls is not set", 1},
		{"plaintext beyond loopback, insecure", kafkasec.Config{}, remote, true, "", 1},
		{"tls beyond loopback", kafkasec.Config{TLS: tlsCA}, remote, false, "", 0},
		{"tls and scram", kafkasec.Config{TLS: tlsCA, SASL: scram}, remote, false, "", 0},
		{"scram on loopback without tls", kafkasec.Config{SASL: scram}, local, false, "", 0},
		{"skip verify", kafkasec.Config{TLS: skip}, remote, false, "kafka.tls.insecure_skip_verify: the brokers would not be authenticated", 1},
		{"skip verify, insecure", kafkasec.Config{TLS: skip}, remote, true, "", 1},
		{"plain without tls", kafkasec.Config{SASL: plain}, local, false, "kafka.sasl.mechanism = plain without kafka.tls", 1},
		{"plain without tls, insecure", kafkasec.Config{SASL: plain}, local, true, "", 1},
		{"plain with tls", kafkasec.Config{TLS: tlsCA, SASL: plain}, remote, false, "", 0},
		{"unknown mechanism", kafkasec.Config{TLS: tlsCA, SASL: &kafkasec.SASLConfig{Mechanism: "gssapi", Username: "u"}}, remote, false,
			`kafka.sasl.mechanism = "gssapi": want scram-sha-256, scram-sha-512 or plain`, 0},
		{"no username", kafkasec.Config{TLS: tlsCA, SASL: &kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA256}}, remote, false, "kafka.sasl.username: must be set", 0},
		{"file and env", kafkasec.Config{TLS: tlsCA, SASL: &kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA256, Username: "u", PasswordFile: "f", PasswordEnv: "E"}},
			remote, false, `kafka.sasl: password_file "f" and password_env "E": set one`, 0},
		{"cert without key", kafkasec.Config{TLS: &identity.ClientTLSConfig{Cert: "c.pem"}}, remote, false, "kafka.tls: cert", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate("kafka", c.brokers, c.insecure)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Validate = %v, want an error containing %q", err, c.want)
			}
			if got := c.cfg.InsecureUses("kafka", c.brokers); len(got) != c.uses {
				t.Fatalf("InsecureUses = %q, want %d", got, c.uses)
			}
		})
	}
}

func TestKafkaOpenReadsThePasswordOnly(t *testing.T) {
	env := map[string]string{"MERIDIAN_KAFKA_PASSWORD": "from-the-env", "OTHER": "other-env"}
	getenv := func(k string) string { return env[k] }
	for _, c := range []struct {
		sasl kafkasec.SASLConfig
		want string // error, "" = opens
	}{
		{kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA256, Username: "u"}, ""},
		{kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA512, Username: "u", PasswordEnv: "OTHER"}, ""},
		{kafkasec.SASLConfig{Mechanism: kafkasec.Plain, Username: "u", PasswordFile: kafkasectest.WritePassword(t, "from-a-file")}, ""},
		{kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA256, Username: "u", PasswordEnv: "UNSET"}, "kafka.sasl: the password variable UNSET is not set"},
		{kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA256, Username: "u", PasswordFile: "/nonexistent/p"}, "kafka.sasl.password_file: open /nonexistent/p"},
		{kafkasec.SASLConfig{Mechanism: kafkasec.ScramSHA256, Username: "u", PasswordFile: kafkasectest.WritePassword(t, "")}, "empty"},
	} {
		cl, err := kafkasec.Config{SASL: &c.sasl}.Open("kafka", getenv)
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v: Open = %v, want %q", c.sasl, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: Open: %v", c.sasl, err)
			continue
		}
		// Whatever prints the client shows its mechanism and user, never
		// the password.
		var logs bytes.Buffer
		slog.New(slog.NewJSONHandler(&logs, nil)).Info("kafka", "client", cl)
		printed := fmt.Sprintf("%v %+v %#v %s", cl, cl, cl, logs.String())
		if want := c.sasl.Mechanism + " as u"; !strings.Contains(printed, want) {
			t.Errorf("printed %q, want it to say %q", printed, want)
		}
		for _, secret := range []string{"from-the-env", "other-env", "from-a-file"} {
			if strings.Contains(printed, secret) {
				t.Errorf("the password %q is printed: %s", secret, printed)
			}
		}
	}
}

// metadata asks the broker for the cluster's metadata through a Transport
// of cl, as the ingester's probe does.
func metadata(t *testing.T, cl *kafkasec.Client, addrs []string) error {
	t.Helper()
	tr := cl.Transport("kafkasec-test", 5*time.Second)
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := (&kafka.Client{Addr: kafka.TCP(addrs...), Timeout: 10 * time.Second, Transport: tr}).Metadata(ctx, &kafka.MetadataRequest{})
	return err
}

// dial opens one connection through a Dialer of cl, as a Reader does.
func dial(t *testing.T, cl *kafkasec.Client, addr string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := cl.Dialer(5*time.Second).DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
	}
	return err
}

func open(t *testing.T, c kafkasec.Config) *kafkasec.Client {
	t.Helper()
	cl, err := c.Open("kafka", func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// TestKafkaHandshakes against real brokers (kfake over loopback TCP): TLS
// with SCRAM-SHA-256, SCRAM-SHA-512, PLAIN and a client certificate connect
// through both the Dialer and the Transport; a wrong password, a broker
// certificate of another CA and a plaintext client are refused, each
// classified and explained.
func TestKafkaHandshakes(t *testing.T) {
	for _, o := range []kafkasectest.Options{
		{},
		{Mechanism: kafkasec.ScramSHA512},
		{Mechanism: kafkasec.Plain},
		{NoSASL: true, ClientCert: true},
	} {
		t.Run(fmt.Sprintf("%s/clientcert=%v", o.Mechanism, o.ClientCert), func(t *testing.T) {
			b := kafkasectest.Start(t, o)
			cl := open(t, b.Config)
			if err := metadata(t, cl, b.Addrs); err != nil {
				t.Fatalf("transport: %v", err)
			}
			if err := dial(t, cl, b.Addrs[0]); err != nil {
				t.Fatalf("dialer: %v", err)
			}
		})
	}

	b := kafkasectest.Start(t, kafkasectest.Options{})
	wrong := open(t, b.WrongPassword(t))
	for name, err := range map[string]error{"transport": metadata(t, wrong, b.Addrs), "dialer": dial(t, wrong, b.Addrs[0])} {
		if wrong.Kind(err) != kafkasec.KindAuth {
			t.Fatalf("wrong password, %s: %v (kind %q), want an authentication error", name, err, wrong.Kind(err))
		}
		msg := wrong.Explain(err).Error()
		if !strings.Contains(msg, `the brokers refused scram-sha-256 as "meridian-test": check kafka.sasl.username and the password (password_file`) {
			t.Fatalf("wrong password, %s: explained as %q", name, msg)
		}
		if strings.Contains(msg, kafkasectest.Password) {
			t.Fatalf("the explanation holds the password: %s", msg)
		}
	}

	foreign := kafkasectest.Start(t, kafkasectest.Options{ForeignCert: true})
	cl := open(t, foreign.Config)
	for name, err := range map[string]error{"transport": metadata(t, cl, foreign.Addrs), "dialer": dial(t, cl, foreign.Addrs[0])} {
		if cl.Kind(err) != kafkasec.KindTLS {
			t.Fatalf("foreign broker certificate, %s: %v (kind %q), want a TLS error", name, err, cl.Kind(err))
		}
		if msg := cl.Explain(err).Error(); !strings.Contains(msg, "the broker's certificate is not signed by a CA in kafka.tls.ca") {
			t.Fatalf("foreign broker certificate, %s: explained as %q", name, msg)
		}
	}

	plaintext := open(t, kafkasec.Config{})
	if err := metadata(t, plaintext, b.Addrs); err == nil {
		t.Fatal("a plaintext client got metadata from a TLS broker")
	}
	mutual := kafkasectest.Start(t, kafkasectest.Options{NoSASL: true, ClientCert: true})
	noCert := mutual.Config
	noCert.TLS = &identity.ClientTLSConfig{CA: mutual.Config.TLS.CA}
	if err := metadata(t, open(t, noCert), mutual.Addrs); err == nil {
		t.Fatal("a client without a certificate got metadata from a broker that requires one")
	}
}
