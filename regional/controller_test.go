package regional

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
