package regional

import (
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
