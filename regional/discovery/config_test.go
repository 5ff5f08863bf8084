package discovery

import (
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestDefaultConfigIsValidOnceASourceIsChosen(t *testing.T) {
	c := DefaultConfig()
	if c.Enabled() {
		t.Fatal("DefaultConfig chooses a source")
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "neither dns.name nor file.path") {
		t.Fatalf("Validate of no source = %v", err)
	}
	c.DNS.Name = "vllm.inference.svc.cluster.local."
	if err := c.Validate(); err != nil {
		t.Fatalf("DNS defaults: %v", err)
	}
	c = DefaultConfig()
	c.File.Path = "/etc/meridian/pods.yaml"
	if err := c.Validate(); err != nil {
		t.Fatalf("file defaults: %v", err)
	}
	// Zero values take the defaults too (a section decoded from YAML
	// without DefaultConfig underneath).
	if err := (Config{DNS: DNSConfig{Name: "vllm"}}).Validate(); err != nil {
		t.Fatalf("zero DNS config: %v", err)
	}
	if got := (DNSConfig{Name: "Vllm.inference.svc"}).withDefaults().NamePrefix; got != "vllm" {
		t.Fatalf("default name_prefix %q, want vllm", got)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	dns := func(f func(*DNSConfig)) Config {
		c := DefaultConfig()
		c.DNS.Name = "vllm.ns.svc.cluster.local."
		f(&c.DNS)
		return c
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{dns(func(c *DNSConfig) { c.Name = "vllm..svc" }), `dns.name "vllm..svc"`},
		{dns(func(c *DNSConfig) { c.Name = "vllm svc" }), `dns.name "vllm svc"`},
		{dns(func(c *DNSConfig) { c.Lookup = "a" }), `dns.lookup "a"`},
		{dns(func(c *DNSConfig) { c.Service = "ht tp" }), `dns.service "ht tp"`},
		{dns(func(c *DNSConfig) { c.Port = 8000 }), "dns.port 8000: only with lookup ip"},
		{dns(func(c *DNSConfig) { c.Lookup = LookupIP }), "dns.port 0: want 1..65535"},
		{dns(func(c *DNSConfig) { c.Lookup, c.Port, c.NameFrom = LookupIP, 8000, NameFromTarget }), `dns.name_from "target": only with lookup srv`},
		{dns(func(c *DNSConfig) { c.Network = "tcp" }), `dns.network "tcp"`},
		{dns(func(c *DNSConfig) { c.Scheme = "grpc" }), `dns.scheme "grpc"`},
		{dns(func(c *DNSConfig) { c.Server = "10.96.0.10" }), `dns.server "10.96.0.10": want host:port`},
		{dns(func(c *DNSConfig) { c.Interval = 5 }), "dns.interval 5ns: want at least 1ms"},
		{dns(func(c *DNSConfig) { c.MinInterval = -time.Second }), "dns.min_interval -1s"},
		{dns(func(c *DNSConfig) { c.Timeout = -1 }), "dns.timeout -1ns"},
		{dns(func(c *DNSConfig) { c.MinInterval = time.Minute }), "dns.min_interval 1m0s: must be <= interval 5s"},
		{dns(func(c *DNSConfig) { c.Grace = -time.Second }), "dns.grace -1s"},
		{dns(func(c *DNSConfig) { c.DropAfterMisses = -1 }), "dns.drop_after_misses -1"},
		{dns(func(c *DNSConfig) { c.NameFrom = "pod" }), `dns.name_from "pod"`},
		{dns(func(c *DNSConfig) { c.NamePrefix = "vllm.a" }), `dns.name_prefix "vllm.a"`},
		{dns(func(c *DNSConfig) { c.KVEventsPort = 70000 }), "dns.kv_events_port 70000"},
		{dns(func(c *DNSConfig) { c.KVEventsPort, c.ReplayPort = 5557, 5557 }), "dns.replay_port 5557: also kv_events_port"},
		{dns(func(c *DNSConfig) { c.Lookup, c.Port, c.KVEventsPort = LookupIP, 8000, 8000 }), "dns.kv_events_port 8000: also port"},
		{Config{DNS: DNSConfig{Name: "a"}, File: FileConfig{Path: "p"}}, "both set"},
		{Config{File: FileConfig{Path: "p", Interval: -time.Second}}, "file.interval -1s"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "discovery: ") {
			t.Errorf("Validate(%+v) = %v, want an error with %q", tc.cfg, err, tc.want)
		}
	}
}

// The YAML of the package doc, as a controller and the bridge would read
// it, decodes and validates; a misspelt key is an error even below a
// section with its own UnmarshalYAML.
func TestDocYAML(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur []string
	for line := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//\t"); ok {
			cur = append(cur, rest)
			continue
		}
		if len(cur) > 0 {
			blocks = append(blocks, strings.Join(cur, "\n"))
			cur = nil
		}
	}
	var controller, bridge string
	for _, b := range blocks {
		switch {
		case strings.HasPrefix(b, "pods:"):
			controller = b
		case strings.HasPrefix(b, "discovery:"):
			bridge = b
		}
	}
	if controller == "" || bridge == "" {
		t.Fatalf("doc.go has no pods: or discovery: YAML block; blocks: %q", blocks)
	}
	var c struct {
		Pods struct {
			Discovery Config `yaml:"discovery"`
		} `yaml:"pods"`
	}
	c.Pods.Discovery = DefaultConfig()
	decodeStrict(t, controller, &c)
	if err := c.Pods.Discovery.Validate(); err != nil {
		t.Fatalf("controller YAML: %v", err)
	}
	if d := c.Pods.Discovery.DNS; d.Name != "vllm.inference.svc.cluster.local." || d.Grace != 30*time.Second || d.Profile != "h100" {
		t.Fatalf("controller YAML decoded as %+v", d)
	}
	var b struct {
		Discovery Config `yaml:"discovery"`
	}
	decodeStrict(t, bridge, &b)
	if err := b.Discovery.Validate(); err != nil {
		t.Fatalf("bridge YAML: %v", err)
	}
	if d := b.Discovery.DNS; d.KVEventsPort != 5557 || d.ReplayPort != 5558 {
		t.Fatalf("bridge YAML decoded as %+v", d)
	}

	// A section decoded by hand (yaml.Node.Decode does not check keys).
	var n yaml.Node
	if err := yaml.Unmarshal([]byte("discovery:\n  dns:\n    name: vllm\n    intreval: 5s\n"), &n); err != nil {
		t.Fatal(err)
	}
	var loose struct {
		Discovery Config `yaml:"discovery"`
	}
	err = n.Decode(&loose)
	if err == nil || !strings.Contains(err.Error(), `line 4: discovery.dns: unknown key "intreval"`) {
		t.Fatalf("misspelt key: %v", err)
	}
}

func decodeStrict(t *testing.T, doc string, out any) {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		t.Fatalf("decode:\n%s\n%v", doc, err)
	}
}

func TestNewChoosesTheSource(t *testing.T) {
	c := DefaultConfig()
	c.DNS.Name = "vllm.ns.svc."
	if src, err := New(c, Deps{}); err != nil {
		t.Fatal(err)
	} else if _, ok := src.(*DNS); !ok {
		t.Fatalf("dns.name set: New returned a %T", src)
	}
	c = DefaultConfig()
	c.File.Path = "pods.yaml"
	if src, err := New(c, Deps{}); err != nil {
		t.Fatal(err)
	} else if _, ok := src.(*File); !ok {
		t.Fatalf("file.path set: New returned a %T", src)
	}
	if _, err := New(DefaultConfig(), Deps{}); err == nil {
		t.Fatal("New with no source chosen returned no error")
	}
}
