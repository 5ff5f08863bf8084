package discovery

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// How a DNS source looks pods up (DNSConfig.Lookup).
const (
	LookupSRV = "srv" // SRV records _<service>._<proto>.<name>: a target and a port per pod
	LookupIP  = "ip"  // A/AAAA records of <name>, with the configured port
)

// How a DNS source names pods (DNSConfig.NameFrom).
const (
	NameFromIP     = "ip"     // <name_prefix>-<ip with dashes>, e.g. vllm-10-0-3-7
	NameFromTarget = "target" // the SRV target's first label, e.g. vllm-0 of a StatefulSet
)

// minDuration is the shortest interval, minimum interval or timeout a
// configuration may give: a YAML number without a unit decodes as
// nanoseconds, and this catches it.
const minDuration = time.Millisecond

// Config chooses and configures one pod source: exactly one of dns.name and
// file.path is set. It is the section a controller reads under
// pods.discovery and the bridge under discovery (see the package doc).
type Config struct {
	// DNS follows a Kubernetes headless Service.
	DNS DNSConfig `yaml:"dns"`
	// File follows a YAML or JSON file of pods.
	File FileConfig `yaml:"file"`
}

// DNSConfig configures a DNS source. Durations are YAML strings such as
// "5s".
type DNSConfig struct {
	// Name is the headless Service's DNS name, e.g.
	// "vllm.inference.svc.cluster.local." (a trailing dot skips the
	// resolver's search list, which Kubernetes' ndots:5 would otherwise try
	// first). Required.
	Name string `yaml:"name"`
	// Lookup is "srv" (default): SRV records _<service>._<proto>.<name>,
	// each naming a pod's host name and port, which is then resolved; or
	// "ip": A/AAAA records of name, each a pod, with Port.
	Lookup string `yaml:"lookup"`
	// Service and Proto name the SRV records (Kubernetes: the Service's port
	// name and protocol); defaults "http" and "tcp". Lookup srv only.
	Service string `yaml:"service"`
	Proto   string `yaml:"proto"`
	// Port is the pods' HTTP port with lookup ip (required there, e.g.
	// 8000); with srv the port comes from each record.
	Port int `yaml:"port"`
	// Network is the address family: "ip" (default: both), "ip4" or "ip6".
	// With srv, a host name that has both takes the IPv4 address; with ip
	// on a dual-stack Service, choose one family, else each pod is found
	// twice.
	Network string `yaml:"network"`
	// Scheme of the pods' HTTP endpoints: "http" (default) or "https".
	Scheme string `yaml:"scheme"`
	// Server is the DNS server (host:port) to ask, over UDP and then TCP
	// when an answer is truncated. Empty (default): the system's resolvers
	// (/etc/resolv.conf).
	Server string `yaml:"server"`

	// Interval is the longest time between two lookups; default 5s.
	Interval time.Duration `yaml:"interval"`
	// MinInterval is the shortest: the next lookup comes when the shortest
	// TTL of the last answer runs out, but not before MinInterval nor after
	// Interval. After a failed lookup the delay doubles from MinInterval up
	// to Interval. Default 1s.
	MinInterval time.Duration `yaml:"min_interval"`
	// Timeout bounds one lookup (the SRV records and every host name they
	// name); default 2s.
	Timeout time.Duration `yaml:"timeout"`
	// Grace and DropAfterMisses keep a pod that DNS stops returning: it is
	// dropped only when it has been missing from DropAfterMisses consecutive
	// answers (default 2) and for Grace since the first of them (default
	// 30s). Failed lookups are not answers: they change nothing.
	Grace           time.Duration `yaml:"grace"`
	DropAfterMisses int           `yaml:"drop_after_misses"`

	// NameFrom is how pods are named: "ip" (default):
	// <name_prefix>-<ip with dashes>, e.g. vllm-10-0-3-7 or vllm-fd00--3-7,
	// whatever the record type; "target" (srv only): the SRV target's first
	// label, e.g. vllm-0 for a StatefulSet's pod. The bridge and the
	// controllers must name pods alike: give them the same name, name_from
	// and name_prefix.
	NameFrom string `yaml:"name_from"`
	// NamePrefix begins names from IPs; default the first label of Name.
	NamePrefix string `yaml:"name_prefix"`
	// Model and Profile (hardware profile, e.g. "h100") are given to every
	// pod found.
	Model   string `yaml:"model"`
	Profile string `yaml:"profile"`

	// KVEventsPort is the engines' ZMQ PUB port (vLLM's
	// kv_events_config.endpoint, e.g. 5557): each pod then carries
	// KVEvents = tcp://<ip>:<port> for the bridge. 0 (default): none.
	KVEventsPort int `yaml:"kv_events_port"`
	// ReplayPort is the engines' ZMQ ROUTER replay port (vLLM's
	// replay_endpoint, e.g. 5558): each pod then carries Replay. 0
	// (default): none.
	ReplayPort int `yaml:"replay_port"`
}

// FileConfig configures a file source.
type FileConfig struct {
	// Path of the YAML or JSON file of pods (see the package doc for its
	// format). Required.
	Path string `yaml:"path"`
	// Interval is how often the file's modification time, size and identity
	// are checked; it is re-read when one changes. Default 5s.
	Interval time.Duration `yaml:"interval"`
	// Model and Profile are given to every pod of the file that names none.
	Model   string `yaml:"model"`
	Profile string `yaml:"profile"`
}

// DefaultConfig returns the defaults documented on the fields (no source
// chosen).
func DefaultConfig() Config {
	return Config{
		DNS: DNSConfig{
			Lookup:          LookupSRV,
			Service:         "http",
			Proto:           "tcp",
			Network:         "ip",
			Scheme:          "http",
			Interval:        5 * time.Second,
			MinInterval:     time.Second,
			Timeout:         2 * time.Second,
			Grace:           30 * time.Second,
			DropAfterMisses: 2,
			NameFrom:        NameFromIP,
		},
		File: FileConfig{Interval: 5 * time.Second},
	}
}

// Enabled reports whether c chooses a source.
func (c Config) Enabled() bool { return c.DNS.Name != "" || c.File.Path != "" }

// WithDefaults returns c with its zero fields at their defaults, as New
// uses it (Grace is taken as given: 0 is a valid grace).
func (c Config) WithDefaults() Config { return c.withDefaults() }

// withDefaults fills zero fields from DefaultConfig (Grace is taken as
// given: 0 is a valid grace).
func (c Config) withDefaults() Config {
	c.DNS = c.DNS.withDefaults()
	c.File = c.File.withDefaults()
	return c
}

func (c DNSConfig) withDefaults() DNSConfig {
	d := DefaultConfig().DNS
	setStr := func(v *string, def string) {
		if *v == "" {
			*v = def
		}
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setStr(&c.Lookup, d.Lookup)
	setStr(&c.Service, d.Service)
	setStr(&c.Proto, d.Proto)
	setStr(&c.Network, d.Network)
	setStr(&c.Scheme, d.Scheme)
	setStr(&c.NameFrom, d.NameFrom)
	setDur(&c.Interval, d.Interval)
	setDur(&c.MinInterval, d.MinInterval)
	setDur(&c.Timeout, d.Timeout)
	if c.DropAfterMisses == 0 {
		c.DropAfterMisses = d.DropAfterMisses
	}
	if c.NamePrefix == "" {
		first, _, _ := strings.Cut(c.Name, ".")
		c.NamePrefix = strings.ToLower(first)
	}
	return c
}

func (c FileConfig) withDefaults() FileConfig {
	if c.Interval == 0 {
		c.Interval = DefaultConfig().File.Interval
	}
	return c
}

// Validate reports the first invalid field of c (after defaults), naming
// it and the bad value. It does no I/O: the file need not exist yet, and
// the name need not resolve.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.DNS.Name != "" && c.File.Path != "":
		return errors.New("discovery: dns.name and file.path are both set: choose one source")
	case c.DNS.Name != "":
		return c.DNS.validate()
	case c.File.Path != "":
		return c.File.validate()
	}
	return errors.New("discovery: neither dns.name nor file.path is set")
}

func (c DNSConfig) validate() error {
	if err := checkDomain(c.Name); err != nil {
		return fmt.Errorf("discovery: dns.name %q: %w", c.Name, err)
	}
	switch c.Lookup {
	case LookupSRV:
		for _, f := range []struct{ name, v string }{{"service", c.Service}, {"proto", c.Proto}} {
			if err := checkLabel(f.v); err != nil {
				return fmt.Errorf("discovery: dns.%s %q: %w", f.name, f.v, err)
			}
		}
		if c.Port != 0 {
			return fmt.Errorf("discovery: dns.port %d: only with lookup ip (SRV records give the port)", c.Port)
		}
	case LookupIP:
		if c.Port < 1 || c.Port > 65535 {
			return fmt.Errorf("discovery: dns.port %d: want 1..65535 with lookup ip", c.Port)
		}
		if c.NameFrom == NameFromTarget {
			return fmt.Errorf("discovery: dns.name_from %q: only with lookup srv", c.NameFrom)
		}
	default:
		return fmt.Errorf("discovery: dns.lookup %q: want %q or %q", c.Lookup, LookupSRV, LookupIP)
	}
	if !slices.Contains([]string{"ip", "ip4", "ip6"}, c.Network) {
		return fmt.Errorf("discovery: dns.network %q: want ip, ip4 or ip6", c.Network)
	}
	if c.Scheme != "http" && c.Scheme != "https" {
		return fmt.Errorf("discovery: dns.scheme %q: want http or https", c.Scheme)
	}
	if c.Server != "" {
		if host, port, err := net.SplitHostPort(c.Server); err != nil || host == "" || port == "" {
			return fmt.Errorf("discovery: dns.server %q: want host:port", c.Server)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"interval", c.Interval}, {"min_interval", c.MinInterval}, {"timeout", c.Timeout}} {
		if d.v < minDuration {
			return fmt.Errorf("discovery: dns.%s %v: want at least %v (a duration such as \"5s\")", d.name, d.v, minDuration)
		}
	}
	switch {
	case c.MinInterval > c.Interval:
		return fmt.Errorf("discovery: dns.min_interval %v: must be <= interval %v", c.MinInterval, c.Interval)
	case c.Grace < 0:
		return fmt.Errorf("discovery: dns.grace %v: must be >= 0", c.Grace)
	case c.DropAfterMisses < 1:
		return fmt.Errorf("discovery: dns.drop_after_misses %d: must be >= 1", c.DropAfterMisses)
	}
	switch c.NameFrom {
	case NameFromIP:
		if err := checkLabel(c.NamePrefix); err != nil {
			return fmt.Errorf("discovery: dns.name_prefix %q: %w", c.NamePrefix, err)
		}
	case NameFromTarget:
	default:
		return fmt.Errorf("discovery: dns.name_from %q: want %q or %q", c.NameFrom, NameFromIP, NameFromTarget)
	}
	ports := map[int]string{}
	if c.Lookup == LookupIP {
		ports[c.Port] = "port"
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"kv_events_port", c.KVEventsPort}, {"replay_port", c.ReplayPort}} {
		if p.v < 0 || p.v > 65535 {
			return fmt.Errorf("discovery: dns.%s %d: want 1..65535, or 0 for none", p.name, p.v)
		}
		if other, dup := ports[p.v]; dup && p.v != 0 {
			return fmt.Errorf("discovery: dns.%s %d: also %s", p.name, p.v, other)
		}
		ports[p.v] = p.name
	}
	return nil
}

func (c FileConfig) validate() error {
	if c.Interval < minDuration {
		return fmt.Errorf("discovery: file.interval %v: want at least %v (a duration such as \"5s\")", c.Interval, minDuration)
	}
	return nil
}

// checkDomain accepts a DNS name of labels of letters, digits, '-' and '_',
// each 1..63 bytes, at most 253 bytes without the optional trailing dot.
func checkDomain(name string) error {
	n := strings.TrimSuffix(name, ".")
	if n == "" || len(n) > 253 {
		return errors.New("want a DNS name of 1..253 bytes")
	}
	for label := range strings.SplitSeq(n, ".") {
		if err := checkLabel(label); err != nil {
			return err
		}
	}
	return nil
}

// checkLabel accepts one DNS label: 1..63 letters, digits, '-' or '_'.
func checkLabel(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q: want 1..63 bytes", l)
	}
	for _, r := range l {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
		if !ok {
			return fmt.Errorf("label %q: %q is not a letter, digit, '-' or '_'", l, r)
		}
	}
	return nil
}

// UnmarshalYAML decodes the section with unknown keys as errors, also when
// the file's decoder does not check them for this node (a custom
// UnmarshalYAML above it, such as the controller's pods section, decodes
// without KnownFields).
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	type plain Config
	return decodeKnown(n, "discovery", (*plain)(c))
}

// UnmarshalYAML: see Config.UnmarshalYAML.
func (c *DNSConfig) UnmarshalYAML(n *yaml.Node) error {
	type plain DNSConfig
	return decodeKnown(n, "discovery.dns", (*plain)(c))
}

// UnmarshalYAML: see Config.UnmarshalYAML.
func (c *FileConfig) UnmarshalYAML(n *yaml.Node) error {
	type plain FileConfig
	return decodeKnown(n, "discovery.file", (*plain)(c))
}

// decodeKnown decodes a mapping node into out (a pointer to a struct whose
// fields keep their values for absent keys), failing on a key that no
// field's yaml tag names.
func decodeKnown(n *yaml.Node, section string, out any) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s: want a mapping", n.Line, section)
	}
	t := reflect.TypeOf(out).Elem()
	var known []string
	for f := range t.Fields() {
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != "" && tag != "-" {
			known = append(known, tag)
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; !slices.Contains(known, k.Value) {
			return fmt.Errorf("line %d: %s: unknown key %q (want %s)", k.Line, section, k.Value, strings.Join(known, ", "))
		}
	}
	return n.Decode(out)
}

// ResolvePaths makes a relative file.path relative to dir (the directory
// of the configuration file that named it).
func (c *Config) ResolvePaths(dir string) {
	if c.File.Path != "" && !filepath.IsAbs(c.File.Path) {
		c.File.Path = filepath.Join(dir, c.File.Path)
	}
}
