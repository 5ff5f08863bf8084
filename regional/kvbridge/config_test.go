package kvbridge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Region = "r"
	c.Brokers = []string{"127.0.0.1:9092"}
	c.Pods = []PodConfig{{Name: "a", Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5558"}}
	return c
}

func TestConfigValidateNamesTheField(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for want, mut := range map[string]func(*Config){
		"brokers:":                   func(c *Config) { c.Brokers = nil },
		`brokers[0] "nohost"`:        func(c *Config) { c.Brokers = []string{"nohost"} },
		"region":                     func(c *Config) { c.Region = "" },
		"pods:":                      func(c *Config) { c.Pods = nil },
		"pods[0].endpoint: required": func(c *Config) { c.Pods[0].Endpoint = "" },
		"pods[0].endpoint: \"udp":    func(c *Config) { c.Pods[0].Endpoint = "udp://x:1" },
		"pods[0].endpoint: \"inproc": func(c *Config) { c.Pods[0].Endpoint = "inproc://x" },
		`cannot connect to "*"`:      func(c *Config) { c.Pods[0].Endpoint = "tcp://*:5557" },
		"pods[0].replay_endpoint":    func(c *Config) { c.Pods[0].ReplayEndpoint = "tcp://host" },
		"pods[0].data_parallel_size": func(c *Config) { c.Pods[0].DataParallelSize = -1 },
		`pods[1].name "a"`:           func(c *Config) { c.Pods = append(c.Pods, PodConfig{Name: "a", Endpoint: "tcp://10.0.0.2:1"}) },
		"is also pods[0]'s":          func(c *Config) { c.Pods = append(c.Pods, PodConfig{Name: "b", Endpoint: "tcp://10.0.0.1:5557"}) },
		"backoff_max":                func(c *Config) { c.BackoffMax = time.Millisecond },
		"queue_size -1":              func(c *Config) { c.QueueSize = -1 },
		"max_write_batch -3":         func(c *Config) { c.MaxWriteBatch = -3 },
		"max_message_bytes -1":       func(c *Config) { c.MaxMessageBytes = -1 },
		"max_streams -1":             func(c *Config) { c.MaxStreams = -1 },
		`metrics_addr "nope"`:        func(c *Config) { c.MetricsAddr = "nope" },
		"replay_timeout -1s":         func(c *Config) { c.ReplayTimeout = -time.Second },
		"connecting needs a host":    func(c *Config) { c.Pods[0].Endpoint = "tcp://:5557" },
		"is also pods[0]'s PUB":      func(c *Config) { c.Pods[0].DataParallelSize = 2 },
		`pods[0].engine "tgi"`:       func(c *Config) { c.Pods[0].Engine = "tgi" },
		"pods[0].kv_blocks -5":       func(c *Config) { c.Pods[0].KVBlocks = -5 },
		"pods[0].http_endpoint":      func(c *Config) { c.Pods[0].HTTPEndpoint = "ftp://10.0.0.1" },
		"needs a name to announce":   func(c *Config) { c.Pods[0].Name, c.Pods[0].HTTPEndpoint = "", "http://10.0.0.1:8000" },
		"announce_key":               func(c *Config) { c.AnnounceKey = "short" },
		"discovery.dns.kv_events_port": func(c *Config) {
			c.Pods, c.Discovery.DNS.Name = nil, "vllm.ns.svc.cluster.local."
		},
		"discovery: dns.name": func(c *Config) { c.Discovery.DNS.Name = "bad name" },
	} {
		c := validConfig()
		mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
	// Two pods whose data-parallel ranks collide on one port.
	c := validConfig()
	c.Pods = []PodConfig{{Endpoint: "tcp://h:5557", DataParallelSize: 2}, {Endpoint: "tcp://h:5558"}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pods[1].endpoint") {
		t.Errorf("overlapping ranks: %v", err)
	}
	// Discovery instead of a pod list.
	c = validConfig()
	c.Pods, c.Discovery.DNS.Name, c.Discovery.DNS.KVEventsPort = nil, "vllm.ns.svc.cluster.local.", 5557
	if err := c.Validate(); err != nil {
		t.Fatalf("discovery without pods: %v", err)
	}
	// A topic instead of a region; a bound endpoint may use * and port 0.
	c = validConfig()
	c.Region, c.Topic = "", "custom"
	c.Pods = []PodConfig{{Endpoint: "tcp://*:0", Bind: true}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseEndpointRanks(t *testing.T) {
	for _, c := range []struct {
		ep   string
		rank int
		bind bool
		want string
	}{
		{"tcp://10.0.0.7:5557", 0, false, "tcp://10.0.0.7:5557"},
		{"tcp://10.0.0.7:5557", 2, false, "tcp://10.0.0.7:5559"},
		{"tcp://[fd00::1]:5557", 1, false, "tcp://[fd00::1]:5558"},
		{"tcp://*:5557", 1, true, "tcp://:5558"},
		{"tcp://127.0.0.1:0", 3, true, "tcp://127.0.0.1:0"},
		{"ipc:///run/kv", 0, false, "ipc:///run/kv"},
		{"ipc:///run/kv", 2, false, "ipc:///run/kv_dp2"},
	} {
		e, err := parseEndpoint(c.ep, c.rank, c.bind)
		if err != nil || e.String() != c.want {
			t.Errorf("%s rank %d: %v %v, want %s", c.ep, c.rank, e, err, c.want)
		}
	}
}

func TestParsePodFlag(t *testing.T) {
	p, err := ParsePodFlag("pod-a=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5558,http=http://10.0.0.7:8000,model=llama,hardware=h100,dp=2,engine=sglang,kv_blocks=70112")
	if err != nil {
		t.Fatal(err)
	}
	want := PodConfig{Name: "pod-a", Endpoint: "tcp://10.0.0.7:5557", ReplayEndpoint: "tcp://10.0.0.7:5558",
		HTTPEndpoint: "http://10.0.0.7:8000", Model: "llama", Hardware: "h100", DataParallelSize: 2, Engine: "sglang", KVBlocks: 70112}
	if p != want {
		t.Fatalf("got %+v", p)
	}
	if p, err := ParsePodFlag("tcp://*:5557,bind"); err != nil || p.Name != "" || !p.Bind || p.Endpoint != "tcp://*:5557" {
		t.Fatalf("unnamed bind: %+v %v", p, err)
	}
	for _, bad := range []string{"a=", "a=tcp://h:1,dp=x", "a=tcp://h:1,colour=red", "a=tcp://h:1,kv_blocks=many"} {
		if _, err := ParsePodFlag(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseTopic(t *testing.T) {
	for topic, want := range map[string][2]string{
		"kv@10.0.0.7:8000@meta-llama/Llama-3-70B": {"10.0.0.7:8000", "meta-llama/Llama-3-70B"},
		"kv@pod-a@":    {"pod-a", ""},
		"kv@pod-a@m@x": {"pod-a", "m@x"},
	} {
		pod, model, ok := parseTopic(topic)
		if !ok || pod != want[0] || model != want[1] {
			t.Errorf("%q: %q %q %v", topic, pod, model, ok)
		}
	}
	for _, bad := range []string{"", "kv@", "kv@@m", "kv@pod", "vllm@pod@m"} {
		if _, _, ok := parseTopic(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestExampleConfig(t *testing.T) {
	c, err := LoadConfig("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.Pods) != 3 || !c.Pods[2].Bind || c.Pods[1].DataParallelSize != 2 {
		t.Fatalf("loaded %+v", c.Pods)
	}
	if k := c.Kafka; k.TLS == nil || k.TLS.CA == "" || k.SASL == nil || k.SASL.Mechanism != "scram-sha-512" || k.SASL.PasswordFile == "" {
		t.Fatalf("kafka section %+v %+v", k.TLS, k.SASL)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bridge.yaml")
	if err := os.WriteFile(path, []byte(`region: us-east-1
brokers: ["127.0.0.1:9092"]
replay_timeout: 2s
pods:
  - name: pod-a
    endpoint: tcp://10.0.0.7:5557
    replay_endpoint: tcp://10.0.0.7:5558
    hardware: h100
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ReplayTimeout != 2*time.Second || c.DialTimeout != DefaultConfig().DialTimeout || c.Pods[0].Hardware != "h100" ||
		c.withDefaults().Topic != "meridian.kv-events.us-east-1" {
		t.Fatalf("loaded %+v", c)
	}
	if err := os.WriteFile(path, []byte("region: x\npods:\n  - nmae: typo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "nmae") {
		t.Fatalf("unknown key: %v", err)
	}
}

// TestLoadConfigRelativePaths: the files a bridge configuration names by
// relative paths are found beside it, not in the working directory.
func TestLoadConfigRelativePaths(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "conf")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bridge.yaml"), []byte(`region: us-east-1
brokers: ["127.0.0.1:9092"]
kafka:
  tls: {ca: kafka/ca.pem, cert: kafka/c.pem, key: kafka/k.pem}
  sasl: {mechanism: scram-sha-512, username: u, password_file: kafka/password}
discovery:
  file: {path: pods.yaml}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	c, err := LoadConfig(filepath.Join("conf", "bridge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{c.Kafka.TLS.CA: "kafka/ca.pem", c.Kafka.TLS.Cert: "kafka/c.pem", c.Kafka.TLS.Key: "kafka/k.pem",
		c.Kafka.SASL.PasswordFile: "kafka/password", c.Discovery.File.Path: "pods.yaml"} {
		if got != filepath.Join(dir, want) {
			t.Errorf("%s resolved to %q, want %q", want, got, filepath.Join(dir, want))
		}
	}
}
