package regional

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

// TestKafkaConfigSections: the kafka section's tls and sasl keys and the
// pods section's tls and require_https load from YAML (misspelt keys are
// refused by name), and --check's printout names the password's file or
// variable, never a password.
func TestKafkaConfigSections(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	text := `region: us-east-1
listen: 127.0.0.1:8080
kafka:
  brokers: ["kafka-1.internal:9093"]
  tls:
    ca: /etc/meridian/kafka/ca.crt
    cert: /etc/meridian/kafka/tls.crt
    key: /etc/meridian/kafka/tls.key
    server_name: kafka.internal
  sasl:
    mechanism: scram-sha-512
    username: meridian-us-east-1
    password_file: /etc/meridian/kafka/password
pods:
  tls:
    ca: /etc/meridian/pods/ca.crt
  require_https: true
insecure: true
`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	k := cfg.Kafka.Security
	if k.TLS == nil || k.TLS.CA != "/etc/meridian/kafka/ca.crt" || k.TLS.Cert == "" || k.TLS.ServerName != "kafka.internal" ||
		k.SASL == nil || k.SASL.Mechanism != kafkasec.ScramSHA512 || k.SASL.Username != "meridian-us-east-1" || k.SASL.PasswordFile != "/etc/meridian/kafka/password" {
		t.Fatalf("kafka security %+v %+v", k.TLS, k.SASL)
	}
	if cfg.Pods.TLS == nil || cfg.Pods.TLS.CA != "/etc/meridian/pods/ca.crt" || !cfg.Pods.RequireHTTPS {
		t.Fatalf("pods %+v", cfg.Pods)
	}
	out, err := yaml.Marshal(cfg.Redacted())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "password_file: /etc/meridian/kafka/password") || strings.Contains(string(out), "password:") {
		t.Fatalf("printed config:\n%s", out)
	}
	for _, bad := range []string{"  sasl:\n    mechanism: plain\n    usrname: x\n", "  tls:\n    ca_file: x\n", "pods:\n  tls:\n    ca_file: x\n"} {
		p := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(p, []byte("region: r\nkafka:\n  brokers: [\"127.0.0.1:9092\"]\n"+bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadConfig(p); err == nil {
			t.Errorf("%q: loaded, want the misspelt key refused", bad)
		}
	}
}

// TestKafkaSecureByDefault: a controller refuses plaintext to a broker
// beyond loopback, an unverified broker, PLAIN without TLS, unverified
// https pods and plain http pods under require_https, naming the field;
// insecure: true accepts the Kafka ones and lists them among the insecure
// links it logs and counts.
func TestKafkaSecureByDefault(t *testing.T) {
	base := func(mut func(*Config)) Config {
		c := DefaultConfig()
		c.Region, c.ControllerID, c.Listen, c.AdminListen = "us-east-1", "ctl-1", "127.0.0.1:8080", "127.0.0.1:8081"
		c.Kafka.Brokers = []string{"kafka:9092"}
		c.Kafka.Security.TLS = &identity.ClientTLSConfig{CA: "ca.pem"}
		mut(&c)
		c.ApplyDefaults()
		return c
	}
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want string // "" = valid
		uses []string
	}{
		{"tls", func(*Config) {}, "", nil},
		{"plaintext beyond loopback", func(c *Config) { c.Kafka.Security.TLS = nil },
			"kafka.brokers kafka:9092: not loopback and kafka.tls is not set", nil},
		{"plaintext beyond loopback, insecure", func(c *Config) { c.Kafka.Security.TLS, c.Insecure = nil, true },
			"", []string{"kafka plaintext to kafka:9092"}},
		// kafka.insecure: the Kafka-only opt-out, which leaves the rest of
		// the controller secure (compose's plaintext broker).
		{"plaintext beyond loopback, kafka.insecure", func(c *Config) { c.Kafka.Security.TLS, c.Kafka.Insecure = nil, true },
			"", []string{"kafka plaintext to kafka:9092"}},
		{"plaintext on loopback", func(c *Config) { c.Kafka.Security.TLS, c.Kafka.Brokers = nil, []string{"127.0.0.1:9092"} }, "", nil},
		{"unverified broker", func(c *Config) { c.Kafka.Security.TLS = &identity.ClientTLSConfig{InsecureSkipVerify: true} },
			"kafka.tls.insecure_skip_verify: the brokers would not be authenticated", nil},
		{"unverified broker, insecure", func(c *Config) {
			c.Kafka.Security.TLS, c.Insecure = &identity.ClientTLSConfig{InsecureSkipVerify: true}, true
		}, "", []string{"kafka.tls.insecure_skip_verify (brokers not authenticated)"}},
		{"plain without tls", func(c *Config) {
			c.Kafka.Brokers, c.Kafka.Security = []string{"127.0.0.1:9092"}, kafkasec.Config{SASL: &kafkasec.SASLConfig{Mechanism: "plain", Username: "u"}}
		}, "kafka.sasl.mechanism = plain without kafka.tls", nil},
		{"unknown mechanism", func(c *Config) {
			c.Kafka.Security.SASL = &kafkasec.SASLConfig{Mechanism: "scram-sha-1", Username: "u"}
		}, `kafka.sasl.mechanism = "scram-sha-1"`, nil},
		{"unverified pods", func(c *Config) { c.Pods.TLS = &identity.ClientTLSConfig{InsecureSkipVerify: true} },
			"pods.tls.insecure_skip_verify: https pods would not be authenticated", nil},
		{"unverified pods, insecure", func(c *Config) { c.Pods.TLS, c.Insecure = &identity.ClientTLSConfig{InsecureSkipVerify: true}, true },
			"", []string{"pods.tls.insecure_skip_verify (https pods not authenticated)"}},
		{"http pod under require_https", func(c *Config) {
			c.Pods.RequireHTTPS, c.Pods.Static = true, []route.PodInfo{{Name: "a", Endpoint: "http://127.0.0.1:8000"}}
		}, "pods.static[0] (a): endpoint \"http://127.0.0.1:8000\" is not https and pods.require_https is set", nil},
		{"pods.tls without a key", func(c *Config) { c.Pods.TLS = &identity.ClientTLSConfig{Cert: "c.pem"} }, "pods.tls: cert", nil},
	} {
		c := base(tc.mut)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
		if got := c.insecureListeners(); tc.want == "" && !slices.Equal(got, tc.uses) {
			t.Errorf("%s: insecure links %q, want %q", tc.name, got, tc.uses)
		}
	}
}

// TestKafkaRequireHTTPSRefusesPlainPods: under pods.require_https a PodUp
// with an http endpoint is refused and counted as plaintext_endpoint; an
// https one is believed.
func TestKafkaRequireHTTPSRefusesPlainPods(t *testing.T) {
	g := newPodGate(PodsConfig{RequireHTTPS: true})
	if why := g.check("a", &kvevents.PodUp{Pod: "a", Endpoint: "http://127.0.0.1:8000"}, ""); why != rejectPlaintext {
		t.Fatalf("http PodUp: %q, want %q", why, rejectPlaintext)
	}
	if why := g.check("a", &kvevents.PodUp{Pod: "a", Endpoint: "https://127.0.0.1:8000"}, ""); why != "" {
		t.Fatalf("https PodUp refused: %q", why)
	}
	if why := newPodGate(PodsConfig{}).check("a", &kvevents.PodUp{Pod: "a", Endpoint: "http://127.0.0.1:8000"}, ""); why != "" {
		t.Fatalf("http PodUp without require_https refused: %q", why)
	}
}
