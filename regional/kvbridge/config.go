package kvbridge

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/regional/discovery"
	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvbridge/zmtp"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// Config configures a Bridge. Durations are YAML strings such as "5s".
type Config struct {
	// Region names the default topic. Required unless Topic is set.
	Region string `yaml:"region"`
	// Brokers are Kafka seed addresses (host:port). Required.
	Brokers []string `yaml:"brokers"`
	// Topic; default "meridian.kv-events.<Region>".
	Topic string `yaml:"topic"`
	// Kafka is how the brokers are reached: its tls and sasl keys are the
	// controller's kafka.tls and kafka.sasl (see kafkasec.Config). Brokers
	// beyond loopback need tls unless Insecure.
	Kafka kafkasec.Config `yaml:"kafka,omitempty"`
	// Insecure accepts plaintext to brokers beyond loopback,
	// kafka.tls.insecure_skip_verify and SASL PLAIN without TLS: an explicit
	// opt-out for development, logged at every start.
	Insecure bool `yaml:"insecure,omitempty"`
	// Pods are the engines to subscribe to. At least one, unless Discovery
	// finds them.
	Pods []PodConfig `yaml:"pods"`
	// Discovery follows the engines without a static list: a Kubernetes
	// headless Service through DNS, or a file (see regional/discovery, the
	// same section a controller reads under pods.discovery). Each pod found
	// is subscribed to at its ZMQ endpoint (dns.kv_events_port and
	// replay_port at the pod's address; kv_events and replay in the file)
	// under its name, announced with its HTTP endpoint, and unsubscribed
	// from (with a PodDown) when it leaves. Give the controllers the same
	// section, so they name the pods alike and believe the announcements.
	Discovery discovery.Config `yaml:"discovery"`
	// AnnounceInterval is how often the bridge announces each pod it knows
	// an HTTP endpoint of (discovered pods, and static pods with
	// http_endpoint): a PodUp with a TTL of AnnounceTTLFactor intervals,
	// which vLLM never sends, so that controllers learn the pods'
	// endpoints and forget those that go away. Default 10s; negative:
	// never.
	AnnounceInterval time.Duration `yaml:"announce_interval"`
	// AnnounceKey signs the announcements (kvevents.AnnounceMAC) for
	// controllers configured with pods.announce_key
	// (MERIDIAN_ANNOUNCE_KEY); at least 32 bytes. Empty: unsigned.
	AnnounceKey string `yaml:"announce_key"`

	// BatchTimeout is the Kafka writer's linger; default 2ms (kafka-go's own
	// 1s would delay every batch by a second).
	BatchTimeout time.Duration `yaml:"batch_timeout"`
	// WriteTimeout bounds one Kafka write; default 10s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// MaxMessageBytes bounds one Kafka message (kafka-go's BatchBytes);
	// default 1 MiB, Kafka's default message.max.bytes. A larger batch is
	// dropped and counted (meridian_kvbridge_produce_errors_total{kind="too_large"}).
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
	// DialTimeout bounds one ZMQ connect plus its ZMTP handshake; default 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// ReplayTimeout bounds one replay exchange with an engine's ROUTER
	// socket (connect, request, every reply up to the end marker); default 5s.
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// BackoffMin and BackoffMax bound the delay between reconnect attempts
	// and Kafka write retries; defaults 100ms and 5s (llm-d retries its ZMQ
	// subscriber every 5s).
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
	// QueueSize bounds the batches held per pod connection between the ZMQ
	// reader and the Kafka writer; when full, the reader stops reading and
	// the engine's PUB socket drops for this subscriber (a gap, repaired by
	// replay). Default 4096.
	QueueSize int `yaml:"queue_size"`
	// MaxWriteBatch bounds the Kafka messages handed to one write; default 512.
	MaxWriteBatch int `yaml:"max_write_batch"`
	// MaxStreams bounds the streams (pod, topic, rank) one endpoint keeps
	// state for (about 100 bytes each); batches of further streams are
	// dropped and counted (reason too_many_streams). It matters with bind,
	// where any peer that connects chooses its topics. Default 4096.
	MaxStreams int `yaml:"max_streams"`
	// MetricsAddr, when set, makes Run serve GET /metrics (Prometheus),
	// /healthz, /readyz (503 while no engine is connected) and /streams
	// (JSON: totals and per-stream state) on this address, e.g.
	// "127.0.0.1:9108". Empty: none.
	MetricsAddr string `yaml:"metrics_addr"`
	// SkipValidation turns off decoding each payload with regional/kvevents.
	// Decoding counts malformed payloads (they are forwarded all the same:
	// see the package doc) and reads the data-parallel rank from the
	// envelope; without it, the rank is the connection's.
	SkipValidation bool `yaml:"skip_validation"`

	// Logger; nil = discard.
	Logger *slog.Logger `yaml:"-"`
	// Registerer receives the metrics; nil = a private registry (never the
	// global one).
	Registerer prometheus.Registerer `yaml:"-"`
	// Now is the clock of latency metrics and logs' rate limits; nil =
	// time.Now.
	Now func() time.Time `yaml:"-"`
}

// PodConfig is one engine (or, with Bind, one listening endpoint that many
// engines connect to).
type PodConfig struct {
	// Name is the pod name: the Kafka key and the pod header. Empty: taken
	// from each message's topic "kv@<pod>@<model>" (llm-d's convention); a
	// message whose topic does not follow it is dropped and counted.
	Name string `yaml:"name"`
	// Endpoint is the engine's PUB socket, e.g. "tcp://10.0.0.7:5557" or
	// "ipc:///run/vllm/kv". Required.
	Endpoint string `yaml:"endpoint"`
	// Bind makes the bridge listen on Endpoint (e.g. "tcp://*:5557") for
	// engines that connect: vLLM connects when its endpoint has neither "*"
	// nor "::" and is not ipc.
	Bind bool `yaml:"bind"`
	// ReplayEndpoint is the engine's ROUTER socket (vLLM's replay_endpoint,
	// e.g. "tcp://10.0.0.7:5558"). Empty: gaps cannot be repaired, only
	// counted. With Bind, every pod connecting there is asked at this one
	// endpoint, so give it only for a single pod.
	ReplayEndpoint string `yaml:"replay_endpoint"`
	// Model goes in the model header; empty: from the topic when it follows
	// the convention, else no header (the ingester then needs a PodUp or its
	// default model).
	Model string `yaml:"model"`
	// Hardware goes in the hardware header (e.g. "h100"); empty: none.
	Hardware string `yaml:"hardware"`
	// Engine is the engine kind, "vllm", "sglang" or "trtllm", sent in the
	// engine header: the controller scrapes the pod's metrics by it. Empty:
	// none (vLLM's names).
	Engine string `yaml:"engine"`
	// KVBlocks is the engine's KV-cache capacity in blocks (GPU plus
	// offload tiers), sent in the kv-blocks header: the controller sizes
	// the pod's re-keyer by it. 0: none.
	KVBlocks int `yaml:"kv_blocks"`
	// Subscribe is the topic prefix subscribed to; default "" (everything).
	Subscribe string `yaml:"subscribe"`
	// DataParallelSize subscribes to ranks 0..n-1 of a vLLM data-parallel
	// deployment, whose rank r publishes at the endpoints offset as vLLM
	// offsets them (tcp port + r, ipc path + "_dp<r>"). Default 1.
	DataParallelSize int `yaml:"data_parallel_size"`
	// HTTPEndpoint is the base URL of the engine's OpenAI-compatible API,
	// e.g. "http://10.0.0.7:8000": with it (and a Name) the bridge
	// announces the pod (see Config.AnnounceInterval). Empty: no PodUp.
	HTTPEndpoint string `yaml:"http_endpoint"`
}

// AnnounceTTLFactor is the TTL of the bridge's announcements in announce
// intervals: a controller lets a pod lapse only after three announcements
// in a row are missing (and the pod does not answer).
const AnnounceTTLFactor = 3

// DefaultConfig returns the defaults documented on Config (no brokers, no
// pods).
func DefaultConfig() Config {
	return Config{
		BatchTimeout:     2 * time.Millisecond,
		WriteTimeout:     10 * time.Second,
		MaxMessageBytes:  1 << 20,
		DialTimeout:      5 * time.Second,
		ReplayTimeout:    5 * time.Second,
		BackoffMin:       100 * time.Millisecond,
		BackoffMax:       5 * time.Second,
		QueueSize:        4096,
		MaxWriteBatch:    512,
		MaxStreams:       4096,
		AnnounceInterval: 10 * time.Second,
		Discovery:        discovery.DefaultConfig(),
	}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.BatchTimeout, d.BatchTimeout)
	setDur(&c.WriteTimeout, d.WriteTimeout)
	setDur(&c.DialTimeout, d.DialTimeout)
	setDur(&c.ReplayTimeout, d.ReplayTimeout)
	setDur(&c.BackoffMin, d.BackoffMin)
	setDur(&c.BackoffMax, d.BackoffMax)
	setDur(&c.AnnounceInterval, d.AnnounceInterval)
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = d.MaxMessageBytes
	}
	if c.QueueSize == 0 {
		c.QueueSize = d.QueueSize
	}
	if c.MaxWriteBatch == 0 {
		c.MaxWriteBatch = d.MaxWriteBatch
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = d.MaxStreams
	}
	if c.Topic == "" && c.Region != "" {
		c.Topic = kvevents.TopicFor(c.Region)
	}
	pods := make([]PodConfig, len(c.Pods))
	for i, p := range c.Pods {
		if p.DataParallelSize == 0 {
			p.DataParallelSize = 1
		}
		pods[i] = p
	}
	c.Pods = pods
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field of c (after defaults), naming it
// and the bad value.
func (c Config) Validate() error {
	c = c.withDefaults()
	if len(c.Brokers) == 0 {
		return errors.New("kvbridge config: brokers: at least one Kafka broker (host:port) is required")
	}
	for i, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("kvbridge config: brokers[%d] %q: want host:port", i, b)
		}
	}
	if err := c.Kafka.Validate("kafka", c.Brokers, c.Insecure); err != nil {
		return fmt.Errorf("kvbridge config: %w", err)
	}
	if c.Topic == "" {
		return errors.New("kvbridge config: region: required to name the topic (or set topic)")
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return fmt.Errorf("kvbridge config: metrics_addr %q: want host:port", c.MetricsAddr)
		}
	}
	if len(c.Pods) == 0 && !c.Discovery.Enabled() {
		return errors.New("kvbridge config: pods: at least one pod endpoint is required (or discovery)")
	}
	if c.Discovery.Enabled() {
		if err := c.Discovery.Validate(); err != nil {
			return fmt.Errorf("kvbridge config: %w", err)
		}
		if c.Discovery.DNS.Name != "" && c.Discovery.DNS.KVEventsPort == 0 {
			return errors.New("kvbridge config: discovery.dns.kv_events_port: required: the engines' ZMQ PUB port (vLLM's kv_events_config endpoint, e.g. 5557)")
		}
	}
	if c.AnnounceKey != "" && len(c.AnnounceKey) < 32 {
		return fmt.Errorf("kvbridge config: announce_key: %d bytes, at least 32 are required", len(c.AnnounceKey))
	}
	durs := []struct {
		name string
		v    time.Duration
	}{{"batch_timeout", c.BatchTimeout}, {"write_timeout", c.WriteTimeout}, {"dial_timeout", c.DialTimeout},
		{"replay_timeout", c.ReplayTimeout}, {"backoff_min", c.BackoffMin}, {"backoff_max", c.BackoffMax}}
	for _, d := range durs {
		if d.v < 0 {
			return fmt.Errorf("kvbridge config: %s %v: must be > 0", d.name, d.v)
		}
	}
	switch {
	case c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("kvbridge config: backoff_max %v: must be >= backoff_min %v", c.BackoffMax, c.BackoffMin)
	case c.MaxMessageBytes < 1:
		return fmt.Errorf("kvbridge config: max_message_bytes %d: must be >= 1", c.MaxMessageBytes)
	case c.QueueSize < 1:
		return fmt.Errorf("kvbridge config: queue_size %d: must be >= 1", c.QueueSize)
	case c.MaxWriteBatch < 1:
		return fmt.Errorf("kvbridge config: max_write_batch %d: must be >= 1", c.MaxWriteBatch)
	case c.MaxStreams < 1:
		return fmt.Errorf("kvbridge config: max_streams %d: must be >= 1", c.MaxStreams)
	}
	names := map[string]int{}
	endpoints := map[string]int{}
	var replays []string
	for i, p := range c.Pods {
		field := fmt.Sprintf("kvbridge config: pods[%d]", i)
		if p.Name != "" {
			if j, dup := names[p.Name]; dup {
				return fmt.Errorf("%s.name %q: already used by pods[%d]", field, p.Name, j)
			}
			names[p.Name] = i
		}
		if p.Endpoint == "" {
			return fmt.Errorf("%s.endpoint: required (e.g. tcp://10.0.0.7:5557)", field)
		}
		if p.DataParallelSize < 1 || p.DataParallelSize > 1024 {
			return fmt.Errorf("%s.data_parallel_size %d: want 1..1024", field, p.DataParallelSize)
		}
		if p.Engine != "" && !slices.Contains(kvevents.Engines(), p.Engine) {
			return fmt.Errorf("%s.engine %q: want one of %s", field, p.Engine, strings.Join(kvevents.Engines(), ", "))
		}
		if p.KVBlocks < 0 {
			return fmt.Errorf("%s.kv_blocks %d: want >= 0", field, p.KVBlocks)
		}
		for r := 0; r < p.DataParallelSize; r++ {
			ep, err := parseEndpoint(p.Endpoint, r, p.Bind)
			if err != nil {
				return fmt.Errorf("%s.endpoint: %w", field, err)
			}
			if j, dup := endpoints[ep.String()]; dup {
				return fmt.Errorf("%s.endpoint %q: %s is also pods[%d]'s", field, p.Endpoint, ep, j)
			}
			endpoints[ep.String()] = i
			if p.ReplayEndpoint != "" {
				rep, err := parseEndpoint(p.ReplayEndpoint, r, false)
				if err != nil {
					return fmt.Errorf("%s.replay_endpoint: %w", field, err)
				}
				replays = append(replays, rep.String())
			}
		}
		if p.HTTPEndpoint != "" {
			if p.Name == "" {
				return fmt.Errorf("%s.http_endpoint: needs a name to announce the pod under", field)
			}
			if u, err := url.Parse(p.HTTPEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("%s.http_endpoint %q: want an http(s) URL with a host", field, p.HTTPEndpoint)
			}
		}
		if strings.ContainsAny(p.Name, "\x00") {
			return fmt.Errorf("%s.name %q: contains a NUL byte", field, p.Name)
		}
	}
	for _, rep := range replays {
		if j, clash := endpoints[rep]; clash {
			return fmt.Errorf("kvbridge config: replay endpoint %s is also pods[%d]'s PUB endpoint (with data_parallel_size, rank r uses port + r for both)", rep, j)
		}
	}
	return nil
}

// LoadConfig reads a YAML configuration file over DefaultConfig; unknown
// keys are errors. Relative file names in it (kafka.tls.*,
// kafka.sasl.password_file, discovery.file.path) are relative to the
// file's own directory.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	f, err := os.Open(path)
	if err != nil {
		return cfg, fmt.Errorf("load kvbridge config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("load kvbridge config %s: %w", path, err)
	}
	// Relative file names are relative to the file's own directory.
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return cfg, fmt.Errorf("load kvbridge config %s: %w", path, err)
	}
	cfg.Kafka.ResolvePaths(dir)
	cfg.Discovery.ResolvePaths(dir)
	return cfg, nil
}

// ParsePodFlag parses the command line's pod syntax:
// "name=tcp://host:5557[,replay=tcp://host:5558][,http=http://host:8000][,model=M][,hardware=H][,dp=N][,bind]".
// An empty name ("=tcp://...", or no "name=" at all: "tcp://...") takes
// pod names from the topics.
func ParsePodFlag(s string) (PodConfig, error) {
	var p PodConfig
	parts := strings.Split(s, ",")
	first := parts[0]
	if i := strings.Index(first, "="); i >= 0 && !strings.Contains(first[:i], "://") {
		p.Name, p.Endpoint = first[:i], first[i+1:]
	} else {
		p.Endpoint = first
	}
	if p.Endpoint == "" {
		return p, fmt.Errorf("pod %q: no endpoint (want name=tcp://host:port)", s)
	}
	for _, kv := range parts[1:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "replay":
			p.ReplayEndpoint = v
		case "http":
			p.HTTPEndpoint = v
		case "model":
			p.Model = v
		case "hardware":
			p.Hardware = v
		case "engine":
			p.Engine = v
		case "kv_blocks":
			n, err := strconv.Atoi(v)
			if err != nil {
				return p, fmt.Errorf("pod %q: kv_blocks=%q: not an integer", s, v)
			}
			p.KVBlocks = n
		case "subscribe":
			p.Subscribe = v
		case "dp":
			n, err := strconv.Atoi(v)
			if err != nil {
				return p, fmt.Errorf("pod %q: dp=%q: not an integer", s, v)
			}
			p.DataParallelSize = n
		case "bind":
			p.Bind = v == "" || v == "true"
		default:
			return p, fmt.Errorf("pod %q: unknown option %q (want replay, http, model, hardware, engine, kv_blocks, subscribe, dp or bind)", s, k)
		}
	}
	return p, nil
}

// endpoint is a parsed tcp:// or ipc:// endpoint and its direction.
type endpoint struct {
	zmtp.Endpoint
	bind bool
}

// parseEndpoint parses an endpoint for rank r of a data-parallel deployment
// (zmtp.Parse: vLLM's tcp port + r, ipc path + "_dp<r>" for r > 0). A
// dialed tcp endpoint needs a host and a port > 0; a bound one may use "*"
// (every interface) and port 0 (ephemeral).
func parseEndpoint(ep string, rank int, bind bool) (endpoint, error) {
	e, err := zmtp.Parse(ep, rank)
	if err != nil {
		return endpoint{}, err
	}
	if e.Network == "tcp" && !bind {
		host, port, _ := net.SplitHostPort(e.Addr)
		switch {
		case e.Wildcard:
			return endpoint{}, fmt.Errorf("%q: cannot connect to \"*\" (name the engine's host, or set bind)", ep)
		case host == "" || port == "0":
			return endpoint{}, fmt.Errorf("%q: connecting needs a host and a port > 0", ep)
		}
	}
	return endpoint{Endpoint: e, bind: bind}, nil
}

// parseTopic splits llm-d's topic convention "kv@<pod>@<model>".
func parseTopic(topic string) (pod, model string, ok bool) {
	rest, found := strings.CutPrefix(topic, "kv@")
	if !found {
		return "", "", false
	}
	pod, model, found = strings.Cut(rest, "@")
	if !found || pod == "" {
		return "", "", false
	}
	return pod, model, true
}
