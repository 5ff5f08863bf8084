package regional

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/regional/auth"
)

// TestEffectiveIsTheSameConfiguration: the effective configuration,
// written out and loaded again, is valid and has the same effective
// configuration (filling in the defaults changes no meaning), and taking
// it twice changes nothing.
func TestEffectiveIsTheSameConfiguration(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.yaml")
	if err := os.WriteFile(keys, []byte("version: 1\nkeys: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"minimal": func(*Config) {},
		"multi-region": func(c *Config) {
			c.Insecure = true
			c.AdminToken = strings.Repeat("a", 32)
			c.HopToken = strings.Repeat("b", 32)
			c.Raft = RaftConfig{DataDir: filepath.Join(dir, "raft"), Bind: "127.0.0.1:0", WAN: true}
			c.Gossip = GossipConfig{Bind: "127.0.0.1:0", Keys: []string{"a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleSE="}, Fast: true}
			c.Audit = AuditConfig{Dir: filepath.Join(dir, "audit"), HMACKey: strings.Repeat("h", 32)}
			c.AutoFailover.Enabled = true
			c.Auth.Config = auth.Config{Mode: auth.ModeAPIKeys, APIKeys: auth.APIKeysConfig{File: keys}}
			c.Pods.Discovery.File.Path = filepath.Join(dir, "pods.yaml")
		},
	} {
		cfg := DefaultConfig()
		cfg.Region, cfg.ControllerID, cfg.Listen = "us-east-1", "ctl-1", "127.0.0.1:0"
		cfg.Kafka.Brokers = []string{"127.0.0.1:9092"}
		mut(&cfg)
		cfg.ApplyDefaults()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		eff := cfg.Effective()
		b := marshal(t, eff)
		if again := marshal(t, eff.Effective()); again != b {
			t.Errorf("%s: Effective is not idempotent:\n%s\n%s", name, b, again)
		}
		file := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(file, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
		loaded, err := LoadConfig(file)
		if err != nil {
			t.Fatalf("%s: the effective configuration does not load: %v\n%s", name, err, b)
		}
		loaded.ApplyDefaults()
		if err := loaded.Validate(); err != nil {
			t.Fatalf("%s: the effective configuration does not validate: %v\n%s", name, err, b)
		}
		if got := marshal(t, loaded.Effective()); got != b {
			t.Errorf("%s: loaded again, the effective configuration differs:\n%s\nwant\n%s", name, got, b)
		}
	}
}

func marshal(t *testing.T, c Config) string {
	t.Helper()
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
