package regional

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
	"github.com/meridian-llm/meridian/regional/route"
)

// TestLoadConfig: a controller config loads with ${VAR} expansion and its
// decision settings; unknown keys are refused by name, including keys that
// look like settings but are derived (the kafka section takes its region,
// controller id and block size from the top level).
func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("MERIDIAN_TEST_BROKER", "127.0.0.1:9092")
	good := write("good.yaml", "region: us-east-1\nlisten: 127.0.0.1:8080\nblock_size: 32\nkafka:\n  brokers: [\"${MERIDIAN_TEST_BROKER}\"]\ndecision:\n  affinity_cache_weight: 0.5\n")
	cfg, err := LoadConfig(good)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Kafka.Brokers[0] != "127.0.0.1:9092" || cfg.Kafka.Region != "us-east-1" || cfg.Kafka.BlockSize != 32 ||
		cfg.Decision.AffinityCacheWeight != 0.5 || cfg.Decision.BoundedLoadFactor != route.DefaultConfig().BoundedLoadFactor {
		t.Fatalf("loaded %+v", cfg)
	}
	for _, key := range []string{"region", "controller_id", "block_size", "brokres"} {
		p := write(key+".yaml", "region: us-east-1\nlisten: 127.0.0.1:8080\nkafka:\n  brokers: [b:9092]\n  "+key+": x\n")
		if _, err := LoadConfig(p); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("kafka.%s: error %v, want it refused by name", key, err)
		}
	}
}

// TestValidateIsPure: Validate changes nothing and reads no file; defaults
// come from ApplyDefaults before it, the policy file from LoadPolicy after.
func TestValidateIsPure(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Region, cfg.Listen = "us-east-1", "127.0.0.1:0"
	cfg.Kafka.Brokers = []string{"127.0.0.1:9092"}
	cfg.PolicyFile = filepath.Join(t.TempDir(), "missing.yaml")
	cfg.Insecure = true // no client authentication: this test is about purity
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "models") {
		t.Fatalf("before ApplyDefaults: %v, want the missing models named", err)
	}
	cfg.ApplyDefaults()
	before := fmt.Sprintf("%+v", cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if after := fmt.Sprintf("%+v", cfg); after != before {
		t.Fatalf("Validate changed the config:\n%s\n%s", before, after)
	}
	if cfg.Kafka.Topic != "meridian.kv-events.us-east-1" || cfg.Kafka.Region != "us-east-1" || cfg.Models[0].Name != "default" {
		t.Fatalf("defaults: %+v", cfg.Kafka)
	}
	if _, err := cfg.LoadPolicy(); err == nil || !strings.Contains(err.Error(), "policy_file") {
		t.Fatalf("LoadPolicy of a missing file: %v", err)
	}
}

// TestSecureByDefault: plaintext Raft, admin API or forwarding beyond
// loopback, residency decided on unauthenticated headers, and short
// secrets are refused, naming what to do, unless insecure is set.
func TestSecureByDefault(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Region, c.ControllerID = "us-east-1", "ctl-1"
		c.Kafka.Brokers = []string{"127.0.0.1:9092"}
		c.Raft = RaftConfig{DataDir: t.TempDir(), Bind: "10.0.0.5:7400"}
		c.Audit = AuditConfig{Dir: t.TempDir(), HMACKey: strings.Repeat("h", 32)}
		c.AdminToken = strings.Repeat("a", 32)
		c.Auth.Config = auth.DefaultConfig()
		c.Auth.Mode, c.Auth.APIKeys.File = auth.ModeAPIKeys, "keys.yaml"
		c.ApplyDefaults()
		return c
	}
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want string // "" = valid
	}{
		{"plaintext raft and admin beyond loopback", func(*Config) {}, "raft.bind 10.0.0.5:7400, admin_listen :8081"},
		{"insecure opt-out", func(c *Config) { c.Insecure = true }, ""},
		{"TLS", func(c *Config) {
			c.TLS = &identity.TLSConfig{Cert: "c.pem", Key: "k.pem", ClientCA: "ca.pem"}
			c.ApplyDefaults()
		}, ""},
		{"loopback only", func(c *Config) { c.Raft.Bind, c.AdminListen = "127.0.0.1:7400", "127.0.0.1:8081" }, ""},
		{"forwarding beyond loopback", func(c *Config) {
			c.Raft.Bind, c.AdminListen = "127.0.0.1:7400", "127.0.0.1:8081"
			c.Gossip.Keys, c.Audit = []string{"k"}, AuditConfig{Dir: t.TempDir(), HMACKey: strings.Repeat("h", 32)}
			c.HopToken = strings.Repeat("t", 32)
		}, "listen :8080 (forwarding between controllers)"},
		{"headers believed", func(c *Config) {
			c.TLS = &identity.TLSConfig{Cert: "c", Key: "k", ClientCA: "ca"}
			c.Auth = AuthConfig{}
		}, "auth.mode is required"},
		{"short admin token", func(c *Config) { c.Insecure, c.AdminToken = true, "a" }, "admin_token: 1 bytes, at least 32"},
		{"raft without an audit log", func(c *Config) { c.Insecure, c.Audit = true, AuditConfig{} }, "audit.dir is required with raft"},
		{"short audit key", func(c *Config) {
			c.Insecure, c.Audit = true, AuditConfig{Dir: t.TempDir(), HMACKey: strings.Repeat("h", 20)}
		}, "audit.hmac_key: at least 32"},
	} {
		c := base()
		tc.mut(&c)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// Replicas sharing one configuration file: the one whose id is
// raft.bootstrap_id bootstraps (its join list dropped), the others join.
func TestBootstrapID(t *testing.T) {
	for id, want := range map[string]bool{"us-east-1-0": true, "us-east-1-1": false} {
		cfg := DefaultConfig()
		cfg.Region, cfg.ControllerID = "us-east-1", id
		cfg.Raft = RaftConfig{DataDir: t.TempDir(), BootstrapID: "us-east-1-0", Join: []string{"https://meridian-us-east-1:8081"}}
		cfg.ApplyDefaults()
		if cfg.Raft.Bootstrap != want || (len(cfg.Raft.Join) == 0) != want {
			t.Errorf("%s: bootstrap %v join %v", id, cfg.Raft.Bootstrap, cfg.Raft.Join)
		}
	}
}
