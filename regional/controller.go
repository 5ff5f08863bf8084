package regional

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/auth"
	"github.com/meridian-llm/meridian/regional/discovery"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/tokenize"
	"github.com/meridian-llm/meridian/residency"
)

// Config is one region controller's configuration (the YAML file of
// `meridian controller --config`). Field comments give units and defaults.
type Config struct {
	// Region this controller serves, e.g. "us-east-1". Required.
	Region string `yaml:"region"`
	// ControllerID is this controller's stable id; default the host name.
	ControllerID string `yaml:"controller_id"`
	// Listen is the HTTP address of the API and proxy; default ":8080".
	Listen string `yaml:"listen"`
	// BlockSize is the router's block size in tokens; default 64.
	BlockSize int `yaml:"block_size"`
	// PodCapacity is the index's pod slots (multiple of 64); default 256.
	PodCapacity int `yaml:"pod_capacity"`
	// ExpectedBlocks pre-sizes the index (see index.Config); default 0.
	ExpectedBlocks int `yaml:"expected_blocks"`
	// Kafka is where the region's KV events come from.
	Kafka IngestConfig `yaml:"kafka"`
	// Models and how to tokenize them; default one model named by
	// Kafka.DefaultModel (or "default") with the cl100k_base tokenizer.
	Models []ModelConfig `yaml:"models"`
	// Pods: the static ones, and which pod announcements are believed.
	Pods PodsConfig `yaml:"pods"`
	// Decision is the pipeline; Server the HTTP API; Gorgo the cost model.
	Decision route.Config `yaml:"decision"`
	Server   ServerConfig `yaml:"server"`
	Gorgo    gorgo.Config `yaml:"gorgo"`
	// ScrapeInterval between scrapes of the pods' /metrics; default 1s.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// SweepInterval between index sweep passes; default 1s.
	SweepInterval time.Duration `yaml:"sweep_interval"`
	// SessionTokenCache is how many sessions' previous-turn encodings are
	// kept; default 10000.
	SessionTokenCache int `yaml:"session_token_cache"`

	// AdminListen is the admin API's address (the Raft tier's admin API,
	// audit queries and gossip key rotation, bearer-authenticated; every
	// write through it is recorded in the audit log); default ":8081".
	AdminListen string `yaml:"admin_listen"`
	// AdminLimits bound what clients can hold of the admin listener,
	// separately from the API's (a flood on the API leaves the admin API,
	// /readyz included, answering); see ListenerConfig.
	AdminLimits ListenerConfig `yaml:"admin_limits"`
	// AdminURL is how other controllers reach this controller's admin API;
	// default http(s)://<admin listen address>.
	AdminURL string `yaml:"admin_url"`
	// AdminToken authenticates the admin API (MERIDIAN_ADMIN_TOKEN); at
	// least 32 bytes.
	AdminToken string `yaml:"admin_token"`
	// PublicURL is how other controllers reach this controller's API to
	// forward requests; default http://<listen address>.
	PublicURL string `yaml:"public_url"`
	// HopToken authenticates controller-to-controller forwarding without
	// TLS (MERIDIAN_HOP_TOKEN; at least 32 bytes; insecure controllers
	// only). With TLS a hop is authenticated by the sending controller's
	// certificate: its identity must be a member of the Raft configuration.
	HopToken string `yaml:"hop_token"`
	// TLS is this controller's certificate and the CA its peers' chain to.
	// It turns on https for the API and the admin API, and mutual TLS for
	// Raft and for forwarding between controllers. Required for any of
	// those on a non-loopback address, unless Insecure.
	TLS *identity.TLSConfig `yaml:"tls"`
	// Insecure accepts plaintext Raft, admin API and forwarding on
	// non-loopback addresses, and client identity from headers without
	// authentication: an explicit opt-out for development, logged at every
	// start and exported as meridian_insecure_listeners.
	Insecure bool `yaml:"insecure"`
	// Auth is how clients are authenticated (their tenant and data class
	// come from it). Required where residency is decided, unless Insecure.
	Auth AuthConfig `yaml:"auth"`
	// PolicyFile is a residency policy: the policy of a controller without
	// Raft, and the first policy of a new Raft cluster (applied by the
	// bootstrapping controller). Empty: the shipped default (stay in the
	// origin zone) once any cross-region component is on.
	PolicyFile string `yaml:"policy_file"`
	// Raft, Gossip and Audit turn on the cross-region components; see each.
	Raft         RaftConfig         `yaml:"raft"`
	Gossip       GossipConfig       `yaml:"gossip"`
	Audit        AuditConfig        `yaml:"audit"`
	AutoFailover AutoFailoverConfig `yaml:"auto_failover"`
	// SummaryInterval between summaries published to the other regions;
	// default 5s.
	SummaryInterval time.Duration `yaml:"summary_interval"`
	// Shutdown is what a graceful stop (SIGTERM) does.
	Shutdown ShutdownConfig `yaml:"shutdown"`
	// Reload is how the controller follows changes to its files (see
	// Controller.Reload for what changes live).
	Reload ReloadConfig `yaml:"reload"`
	// Runtime is how the Go runtime of the process runs (GOMAXPROCS);
	// see RuntimeConfig.
	Runtime RuntimeConfig `yaml:"runtime"`
}

// ShutdownConfig is the graceful stop of a controller (Controller.Shutdown).
type ShutdownConfig struct {
	// DrainDelay is how long requests are still taken after /readyz turned
	// 503, so that load balancers polling readiness stop sending new ones
	// before the listener closes. Under Kubernetes the preStop hook waits
	// instead (a terminating pod leaves the Service's endpoints at once):
	// 0 there. Default 0.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// Grace bounds how long the requests in flight may still finish once
	// no new one is taken; those still running then are cut (the client
	// sees a broken stream). Keep DrainDelay + Grace + a few seconds (the
	// gossip leave, the Raft leadership transfer) under the orchestrator's
	// kill deadline (Kubernetes terminationGracePeriodSeconds, after the
	// preStop hook). Default 25s.
	Grace time.Duration `yaml:"grace"`
}

// Deps is what a controller is given rather than configured with.
type Deps struct {
	// Logger; nil discards.
	Logger *slog.Logger
	// Metrics is the registry every component of the controller registers
	// in and /metrics serves; nil: a new one (Controller.Metrics).
	Metrics *prometheus.Registry
	// Clock is the controller's wall clock (tests inject one: a fast
	// forward, a skew): the decision layer, summaries, gossip's receive
	// times and ages, the Raft tier's command stamps and the automatic
	// failover read it. nil: time.Now.
	Clock func() time.Time
	// WrapGossipTransport, if set, wraps the gossip pool's transport (tests
	// partition the pool with it, see gossip/gossiptest); nil: none.
	WrapGossipTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// ConfigFile is the file the configuration was read from ("": none):
	// the watch (reload.watch_interval) follows it, and a reload reads it
	// again when LoadConfig is nil.
	ConfigFile string
	// LoadConfig reads the configuration again for a reload, as it was
	// read for Open (the file, then the flags and environment over it).
	// nil: LoadConfig(ConfigFile) with the environment's secrets, or,
	// without a ConfigFile, the configuration given to Open (the files it
	// names are read again).
	LoadConfig func() (Config, error)
	// Reload, for Run: each value received reloads the configuration
	// (meridian controller sends SIGHUP here). nil: none.
	Reload <-chan os.Signal
}

// DefaultConfig returns the defaults documented on Config (Region and the
// Kafka brokers are still required).
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ControllerID:      host,
		Listen:            ":8080",
		BlockSize:         64,
		PodCapacity:       256,
		Kafka:             DefaultIngestConfig(),
		Pods:              PodsConfig{Discovery: discovery.DefaultConfig()},
		Decision:          route.DefaultConfig(),
		Server:            DefaultServerConfig(),
		Gorgo:             gorgo.DefaultConfig(),
		ScrapeInterval:    time.Second,
		SweepInterval:     time.Second,
		SessionTokenCache: 10000,
		AdminListen:       ":8081",
		AdminLimits:       DefaultAdminListener(),
		SummaryInterval:   5 * time.Second,
		Shutdown:          ShutdownConfig{Grace: 25 * time.Second},
		Reload:            ReloadConfig{WatchInterval: DefaultWatchInterval},
	}
}

// LoadConfig reads a YAML configuration over the defaults. ${VAR} (and
// $VAR) references are replaced by environment variables first, so one file
// can serve every replica of a StatefulSet. Unknown keys are errors (a
// misspelt key must not silently fall back to a default). Relative file
// and directory names in it are relative to the file's own directory, not
// to the working directory (ResolvePaths).
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	b = []byte(os.ExpandEnv(string(b)))
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	cfg.ResolvePaths(dir)
	return cfg, nil
}

// ResolvePaths makes every relative file or directory name of the
// configuration relative to dir: policy_file, models[].dir, tls.*,
// auth.api_keys.file, auth.jwt.jwks_file, kafka.tls.*,
// kafka.sasl.password_file, pods.tls.*, pods.discovery.file.path,
// raft.data_dir, audit.dir and gossip.state_file. Empty and absolute names
// are kept.
func (c *Config) ResolvePaths(dir string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	for _, p := range []*string{&c.PolicyFile, &c.Raft.DataDir, &c.Audit.Dir, &c.Gossip.StateFile} {
		abs(p)
	}
	for i := range c.Models {
		abs(&c.Models[i].Dir)
	}
	if c.TLS != nil {
		c.TLS.ResolvePaths(dir)
	}
	c.Auth.Config.ResolvePaths(dir)
	c.Kafka.Security.ResolvePaths(dir)
	if c.Pods.TLS != nil {
		c.Pods.TLS.ResolvePaths(dir)
	}
	c.Pods.Discovery.ResolvePaths(dir)
}

// ApplyDefaults fills the defaults that derive from other fields: the
// ingest section's region, controller id, block size, topic and default
// model; one model when none is configured; the admin listen address; the
// Raft bind address; the auth section's own defaults. Call it before
// Validate; Open calls both.
func (c *Config) ApplyDefaults() {
	c.Kafka.Region = c.Region
	c.Kafka.ControllerID = c.ControllerID
	c.Kafka.BlockSize = c.BlockSize
	c.Kafka.Insecure = c.Insecure || c.Kafka.Insecure
	if len(c.Models) == 0 {
		name := c.Kafka.DefaultModel
		if name == "" {
			name = "default"
		}
		c.Models = []ModelConfig{{Name: name, Encoding: tokenize.Cl100kBase}}
	}
	if c.Kafka.DefaultModel == "" {
		c.Kafka.DefaultModel = c.Models[0].Name
	}
	if c.Kafka.Topic == "" && c.Region != "" {
		c.Kafka.Topic = kvevents.TopicFor(c.Region)
	}
	if c.AdminListen == "" {
		c.AdminListen = ":8081"
	}
	if c.Raft.DataDir != "" && c.Raft.Bind == "" {
		c.Raft.Bind = "0.0.0.0:7400"
	}
	if c.Raft.BootstrapID != "" {
		c.Raft.Bootstrap = c.Raft.BootstrapID == c.ControllerID
		if c.Raft.Bootstrap {
			c.Raft.Join = nil
		}
	}
	if c.Auth.enabled() {
		d := auth.DefaultConfig()
		if c.Auth.APIKeys.ReloadInterval == 0 {
			c.Auth.APIKeys.ReloadInterval = d.APIKeys.ReloadInterval
		}
		if len(c.Auth.JWT.Algorithms) == 0 {
			c.Auth.JWT.Algorithms = d.JWT.Algorithms
		}
		if c.Auth.DefaultRateLimit == (auth.RateLimit{}) {
			c.Auth.DefaultRateLimit = d.DefaultRateLimit
		}
	}
	if c.TLS != nil {
		t := identity.DefaultTLSConfig()
		if c.TLS.MinVersion == "" {
			c.TLS.MinVersion = t.MinVersion
		}
		if c.TLS.ReloadInterval == 0 {
			c.TLS.ReloadInterval = t.ReloadInterval
		}
	}
}

// Validate names the first field that is wrong. It changes nothing and
// reads no file: defaults are applied before it (ApplyDefaults), files are
// read after it (LoadPolicy).
func (c Config) Validate() error {
	if c.Region == "" {
		return errors.New("config: region is required")
	}
	if c.Listen == "" {
		return errors.New("config: listen: an address is required")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("config: listen %q: %w", c.Listen, err)
	}
	if len(c.Models) == 0 {
		return errors.New("config: models: at least one model is required")
	}
	if err := (index.Config{PodCapacity: c.PodCapacity, ExpectedBlocks: c.ExpectedBlocks}).Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	for _, v := range []interface{ Validate() error }{c.Kafka, c.Decision, c.Server, c.Gorgo} {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	if err := c.Pods.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if c.ScrapeInterval <= 0 || c.SweepInterval <= 0 || c.SessionTokenCache < 1 {
		return errors.New("config: scrape_interval and sweep_interval must be > 0, session_token_cache >= 1")
	}
	if c.SummaryInterval <= 0 {
		return fmt.Errorf("config: summary_interval = %v: want > 0", c.SummaryInterval)
	}
	if c.Shutdown.DrainDelay < 0 || c.Shutdown.DrainDelay > 10*time.Minute {
		return fmt.Errorf("config: shutdown.drain_delay = %v: want 0..10m", c.Shutdown.DrainDelay)
	}
	if c.Shutdown.Grace <= 0 || c.Shutdown.Grace > time.Hour {
		return fmt.Errorf("config: shutdown.grace = %v: want > 0 and <= 1h", c.Shutdown.Grace)
	}
	if err := c.Runtime.Validate(); err != nil {
		return err
	}
	if err := c.Reload.validate(); err != nil {
		return err
	}
	if c.AdminListen == "" {
		return errors.New("config: admin_listen: an address is required")
	}
	if err := c.AdminLimits.Validate("config: admin_limits"); err != nil {
		return err
	}
	if err := c.validateMulti(); err != nil {
		return err
	}
	return c.validateSecurity()
}

// LoadPolicy reads and parses PolicyFile (nil without one), with errors
// that name the file, line and offending value.
func (c Config) LoadPolicy() (*residency.Policy, error) {
	if c.PolicyFile == "" {
		return nil, nil
	}
	p, _, err := c.loadPolicy()
	return p, err
}

// Redacted is the configuration with its secrets replaced, for printing.
func (c Config) Redacted() Config {
	const r = "<redacted>"
	red := func(s string) string {
		if s == "" {
			return ""
		}
		return r
	}
	c.AdminToken, c.HopToken, c.Audit.HMACKey = red(c.AdminToken), red(c.HopToken), red(c.Audit.HMACKey)
	c.Pods.AnnounceKey = red(c.Pods.AnnounceKey)
	if len(c.Gossip.Keys) > 0 {
		keys := make([]string, len(c.Gossip.Keys))
		for i := range keys {
			keys[i] = r
		}
		c.Gossip.Keys = keys
	}
	return c
}

// Controller is one region's running controller.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	Index    *index.Index
	Registry *route.Registry
	Ingester *Ingester
	Decider  *route.Decider
	Server   *Server
	Model    *gorgo.Model
	Calib    *gorgo.Calibrator
	Metrics  *prometheus.Registry

	mr *multiRegion
	// auditLog is mr.audit once the controller is open (nil without one):
	// the recorder of the controller's own actions (reloads), which may
	// run before Open returns.
	auditLog atomic.Pointer[audit.Log]
	reload   reloader
	stopping chan struct{}
	// draining is set once a graceful shutdown began: /readyz answers 503
	// so load balancers stop sending new requests here.
	draining atomic.Bool
	// advertised: the gossip digest carries this controller's forward
	// address (advertise); without gossip it stays false and is not asked.
	advertised atomic.Bool
	now        func() time.Time
	deps       Deps

	gate       *podGate
	discovery  discovery.Source // nil without pods.discovery
	discovered []discovery.Pod  // the last snapshot applied (the discovery goroutine's)

	tls        *identity.Source // nil without TLS
	auth       *ClientAuth      // nil without client authentication
	listenM    *listenerMetrics
	ln         net.Listener // the API listener (TLS and capped)
	rawLn      net.Listener // its TCP listener
	http       *h1Server
	transports []*http.Transport  // to the pods and peers: idle connections closed on Close
	handBack   context.CancelFunc // ends every request's context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	once       sync.Once
	errs       []error
	errMu      sync.Mutex
}

// Open builds the controller and starts its goroutines: Kafka ingestion, the
// index sweeper, the metrics scraper, the HTTP server and, as configured,
// the cross-region components. It applies the config's defaults, validates
// it and reads the policy file. ctx bounds the start-up only (joining the
// Raft cluster and gossip pool); Close stops the controller.
func Open(ctx context.Context, cfg Config, deps Deps) (*Controller, error) {
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The watch compares with the files as they are before anything reads
	// them: a change while the controller starts is seen, at worst twice.
	rl := reloader{running: cfg}
	rl.watched = fingerprint(watchedFiles(cfg, deps.ConfigFile))
	var policy *residency.Policy
	if cfg.PolicyFile != "" {
		p, doc, err := cfg.loadPolicy()
		if err != nil {
			return nil, err
		}
		policy, rl.policySum = p, sha256.Sum256(doc)
	}
	now := deps.Clock
	if now == nil {
		now = time.Now
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = slog.New(newLibraryNoise(log.Handler(), time.Minute, now))
	metrics := deps.Metrics
	if metrics == nil {
		metrics = prometheus.NewRegistry()
	}
	idx, err := index.New(index.Config{PodCapacity: cfg.PodCapacity, ExpectedBlocks: cfg.ExpectedBlocks})
	if err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, log: log.With("region", cfg.Region), Index: idx, Registry: route.NewRegistry(idx),
		Metrics: metrics, stopping: make(chan struct{}), now: now, deps: deps}
	c.Metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.reload.running, c.reload.policySum, c.reload.watched = rl.running, rl.policySum, rl.watched
	if c.reload.m, err = newReloadMetrics(c.Metrics); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.closeSecurity(context.WithoutCancel(ctx))
		}
	}()
	if err := c.openSecurity(ctx); err != nil {
		return nil, err
	}
	for _, p := range cfg.Pods.Static {
		p.Static = true
		if _, _, err := c.Registry.Upsert(p); err != nil {
			return nil, fmt.Errorf("static pod %s: %w", p.Name, err)
		}
	}
	c.gate = newPodGate(cfg.Pods)
	if c.Ingester, err = NewIngester(cfg.Kafka, IngestDeps{Index: idx, Pods: c.Registry, Logger: c.log, Metrics: c.Metrics, Clock: now,
		Announcements: c.gate.check}); err != nil {
		return nil, err
	}
	if cfg.Pods.Discovery.Enabled() {
		if c.discovery, err = discovery.New(cfg.Pods.Discovery, discovery.Deps{Logger: c.log.With("component", "discovery"),
			Registerer: c.Metrics, Now: now}); err != nil {
			return nil, fmt.Errorf("pods.discovery: %w", err)
		}
	}
	if c.Model, err = gorgo.New(cfg.Gorgo); err != nil {
		return nil, err
	}
	c.Calib = gorgo.NewCalibrator(c.Model, gorgo.DefaultCalibratorConfig())
	if c.Decider, err = route.NewDecider(cfg.Decision, idx, c.Registry, c.Model, now); err != nil {
		return nil, err
	}
	prompts, err := NewPrompts(cfg.Models, cfg.BlockSize, cfg.SessionTokenCache)
	if err != nil {
		return nil, err
	}
	transport := NewPodTransport()
	if cfg.Pods.TLS != nil {
		// https pods: scraped and proxied to with the pods' CA (and a
		// client certificate, if configured).
		if transport.TLSClientConfig, err = cfg.Pods.TLS.Load("pods.tls"); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	c.transports = append(c.transports, transport)
	var peer http.RoundTripper
	if c.tls != nil {
		// Forwarding between controllers: mutual TLS, and the other end
		// must present a controller identity of the cluster's CA.
		pt := NewPeerTransport()
		pt.TLSClientConfig = c.tls.ClientConfig("")
		peer = pt
		c.transports = append(c.transports, pt)
	}
	if c.Server, err = NewServer(cfg.Server, ServerDeps{Decider: c.Decider, Prompts: prompts, Calibrator: c.Calib,
		Transport: transport, PeerTransport: peer, Auth: c.auth, Logger: c.log, Metrics: c.Metrics, Ready: c.readiness, Clock: now,
		ControllerID: cfg.ControllerID}); err != nil {
		return nil, err
	}
	scraper, err := NewScraper(c.Registry, &http.Client{Transport: transport}, cfg.ScrapeInterval, c.log, c.Metrics)
	if err != nil {
		return nil, err
	}
	scraper.now = now
	c.Server.Handle("GET /debug/calibration", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, c.Calib.Fits())
	}))
	if c.rawLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	var apiTLS *tls.Config
	if c.tls != nil {
		// Clients need no certificate; a controller forwarding a request
		// presents its own, verified (VerifyClientCertIfGiven).
		apiTLS = c.tls.ServerConfig(false)
	}
	c.http, c.ln = serveAPI(c.rawLn, cfg.Server.Limits, apiTLS, c.Server, c.listenM, c.log)
	// Every request's context ends when a graceful stop's grace is over
	// (handBack), so the requests still waiting for an answer can be
	// handed back with a retryable status.
	reqCtx, handBack := context.WithCancel(context.WithoutCancel(ctx))
	c.handBack = handBack
	c.http.BaseContext = func(net.Listener) context.Context { return reqCtx }
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	if cfg.multiRegion() {
		if err := c.openMulti(ctx, runCtx, &cfg, policy); err != nil {
			cancel()
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			_ = c.closeMulti(cctx)
			close(c.stopping)
			c.wg.Wait()
			c.ln.Close()
			return nil, err
		}
	}
	c.goRun("ingest", func() error { return c.Ingester.Run(runCtx) })
	c.goRun("sweep", func() error { return idx.RunSweeper(runCtx, cfg.SweepInterval, 4096) })
	c.goRun("scrape", func() error { return scraper.Run(runCtx) })
	c.goRun("pod-leases", func() error { return c.Ingester.RunLeases(runCtx, cfg.SweepInterval) })
	if c.discovery != nil {
		c.goRun("discovery", func() error { return c.discovery.Run(runCtx, c.applyDiscovered) })
	}
	c.goRun("http", func() error { return servedUntilClosed(c.http.Serve(c.ln)) })
	if gn := c.Gossip(); gn != nil {
		c.goRun("peer-links", func() error {
			return c.Server.links.run(runCtx, PeerWarmInterval, func() []string { return remoteForwardAddrs(gn) })
		})
	}
	if c.mr != nil && c.mr.audit != nil {
		c.auditLog.Store(c.mr.audit)
	}
	if d := cfg.Reload.WatchInterval; d > 0 {
		c.goRun("reload-watch", func() error { return c.runWatch(runCtx, d) })
	}
	c.log.Info("controller started", "listen", c.ln.Addr().String(), "url", c.URL(), "tls", c.tls != nil,
		"client_auth", string(cfg.Auth.Mode), "kafka", c.Ingester.Security(), "topic", c.Ingester.Config().Topic,
		"group", c.Ingester.Config().GroupID, "static_pods", len(cfg.Pods.Static), "discovery", c.discovery != nil)
	ok = true
	return c, nil
}

func (c *Controller) goRun(name string, f func() error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := f(); err != nil && !errors.Is(err, context.Canceled) {
			c.errMu.Lock()
			c.errs = append(c.errs, fmt.Errorf("%s: %w", name, err))
			c.errMu.Unlock()
			c.log.Error("controller component stopped", "component", name, "err", err)
		}
	}()
}

// applyDiscovered takes one snapshot of the discovered pods: the gate
// believes their announcements first, then the registry follows the change.
func (c *Controller) applyDiscovered(pods []discovery.Pod) {
	if c.cfg.Pods.RequireHTTPS {
		pods = slices.DeleteFunc(pods, func(p discovery.Pod) bool {
			if httpsEndpoint(p.Endpoint) {
				return false
			}
			c.log.Warn("discovered pod not registered: pods.require_https and its endpoint is plain http", "pod", p.Name, "endpoint", p.Endpoint)
			return true
		})
	}
	eps := make(map[string]string, len(pods))
	for _, p := range pods {
		eps[p.Name] = p.Endpoint
	}
	c.gate.setDiscovered(eps)
	d := discovery.Diff(c.discovered, pods)
	c.discovered = pods
	c.Ingester.ApplyDiscovered(d)
}

// RefreshDiscovery asks the pod discovery to look up now and returns once
// its answer is applied (nil without pods.discovery).
func (c *Controller) RefreshDiscovery(ctx context.Context) error {
	if c.discovery == nil {
		return nil
	}
	return c.discovery.Refresh(ctx)
}

// Addr is the address the HTTP API listens on.
func (c *Controller) Addr() string { return c.rawLn.Addr().String() }

// URL is the base URL of the HTTP API (https with TLS).
func (c *Controller) URL() string { return c.cfg.scheme() + "://" + c.Addr() }

// PublicURL is the URL other controllers forward requests to.
func (c *Controller) PublicURL() string {
	if c.cfg.PublicURL != "" {
		return c.cfg.PublicURL
	}
	return c.URL()
}

// AdminURL is the base URL of the admin API ("" without one).
func (c *Controller) AdminURL() string {
	if c.cfg.AdminURL != "" {
		return c.cfg.AdminURL
	}
	if c.mr == nil || c.mr.adminLn == nil {
		return ""
	}
	return c.cfg.scheme() + "://" + c.mr.adminLn.Addr().String()
}

// Global returns the Raft node, or nil when the controller runs without one.
func (c *Controller) Global() *global.Node {
	if c.mr == nil {
		return nil
	}
	return c.mr.node
}

// Gossip returns the gossip node, or nil.
func (c *Controller) Gossip() *gossip.Node {
	if c.mr == nil {
		return nil
	}
	return c.mr.gossip
}

// Audit returns the audit log, or nil.
func (c *Controller) Audit() *audit.Log {
	if c.mr == nil {
		return nil
	}
	return c.mr.audit
}

// ID is the controller's id (its Raft server id and gossip name).
func (c *Controller) ID() string { return c.cfg.ControllerID }

// Ready reports what /readyz answers: the index has caught up with the
// topic, the controller advertises its forward address to the other
// regions (with gossip), and no shutdown has begun.
func (c *Controller) Ready() bool {
	ok, _ := c.readiness()
	return ok
}

// readiness: ready once the index has caught up with the topic, until a
// graceful shutdown begins.
func (c *Controller) readiness() (bool, map[string]any) {
	g := c.Ingester
	ingest := map[string]any{"caught_up": g.CaughtUp(), "connected": g.Connected(), "lag_messages": g.Lag(),
		"staleness_seconds": g.Staleness().Seconds(), "rebuilding_after_reset": g.Rebuilding(), "kafka": g.Security()}
	if e := g.LastError(); e != "" {
		ingest["error"] = e // what to check: a refused SASL user, an untrusted broker
	}
	detail := map[string]any{"region": c.cfg.Region, "controller": c.cfg.ControllerID, "ingest": ingest}
	if n := c.Global(); n != nil {
		h := n.Health()
		// Without quorum the controller keeps routing on the last committed
		// state: still ready, and says so.
		detail["raft"] = map[string]any{"leader": h.Leader, "stale": h.Stale, "state": h.RaftState,
			"applied_index": h.AppliedIndex, "policy_version": h.PolicyVersion,
			"note": map[bool]string{true: "no leader: routing on the last committed policy and region states", false: ""}[h.Stale]}
		detail["region_state"] = n.State().RegionState(c.cfg.Region).String()
	}
	if gn := c.Gossip(); gn != nil {
		regions := map[string]any{}
		for _, rv := range gn.View().Regions {
			r := map[string]any{"live": rv.Live, "summary_age_seconds": rv.Age(c.now()).Seconds(), "rtt_ms": float64(rv.RTT) / 1e6}
			if rv.SkewKnown {
				// How far its controllers' clocks are ahead of ours: ages
				// do not depend on it, but audit times and logs do.
				r["clock_skew_seconds"] = rv.ClockSkew.Seconds()
			}
			regions[rv.Region] = r
		}
		detail["gossip"] = regions
		if gn.Isolated() {
			// Local traffic is still served (the controller stays ready);
			// nothing can cross regions until the pool is rejoined.
			detail["gossip_isolated"] = true
			detail["cross_region_ready"] = false
			detail["cross_region_note"] = "isolated from every other region: no summaries, no forwarding, no failover evidence; rejoining through every known address"
		} else {
			detail["cross_region_ready"] = true
		}
	}
	if reps := c.Registry.PeerReports(); len(reps) > 0 {
		// The region's other replicas whose load this one counts, and how
		// old their last report is (a stale one keeps its pods busy).
		peers := map[string]any{}
		for _, r := range reps {
			peers[r.Peer] = map[string]any{"report_age_seconds": time.Since(r.At).Seconds(), "in_flight": r.InFlight, "pods": r.Pods, "pods_serving": r.Serving}
		}
		detail["replicas"] = peers
	}
	if c.draining.Load() {
		detail["draining"] = true
		return false, detail
	}
	if !c.raftCaughtUp() {
		// Restarted, its state is its last snapshot until the leader
		// says what was committed: members, region states and policy
		// versions may be missing.
		detail["raft_caught_up"] = false
		return false, detail
	}
	if c.Gossip() != nil && !c.advertised.Load() {
		// Caught up, but the other regions do not know yet that they may
		// forward here.
		detail["forward_address_advertised"] = false
		return false, detail
	}
	return g.CaughtUp(), detail
}

// raftCaughtUp reports whether the global tier's state is current
// (global.Node.CaughtUp); true without one.
func (c *Controller) raftCaughtUp() bool {
	n := c.Global()
	return n == nil || n.CaughtUp()
}

// Close stops the HTTP server (letting requests in flight finish until ctx
// ends, then cutting those still running), then the background work: it
// leaves the gossip pool, seals the audit log and hands Raft leadership
// over before closing the Raft node. Safe to call twice (also after Kill).
func (c *Controller) Close(ctx context.Context) error { return c.close(ctx, ctx) }

// close drains the HTTP server within drain, then stops the rest within
// ctx.
func (c *Controller) close(drain, ctx context.Context) error {
	var err error
	c.once.Do(func() {
		c.draining.Store(true)
		if err = c.http.Shutdown(drain); err != nil {
			// The grace is over: the requests still without an answer are
			// cancelled and answered 503 shutting_down (the client may send
			// them again, to another replica); a moment later whatever is
			// still running is cut.
			c.Server.handingBack.Store(true)
			c.handBack()
			hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			if c.http.Shutdown(hctx) != nil {
				_ = c.http.Close()
			}
			cancel()
			err = fmt.Errorf("requests still in flight after the grace period were handed back or cut: %w", err)
		}
		c.handBack()
		close(c.stopping)
		c.cancel()
		err = errors.Join(err, c.closeMulti(ctx))
		c.wg.Wait()
		for _, t := range c.transports {
			t.CloseIdleConnections()
		}
		if c.Server != nil {
			c.Server.pods.CloseIdleConnections()
		}
		c.closeSecurity(ctx)
		c.errMu.Lock()
		err = errors.Join(append([]error{err}, c.errs...)...)
		c.errMu.Unlock()
	})
	return err
}

// Kill stops the controller as a crash would, for drills, the demo and
// the replica tests: its listeners and every connection are cut at once
// (requests in flight fail), it does not leave the gossip pool (the others
// find it dead by probing), it hands no Raft leadership over (the others
// elect a new leader when its heartbeats stop) and publishes no final
// audit checkpoint. Its state on disk (Raft log, audit segments) is what a
// crash leaves, so a controller opened again on the same directories
// recovers from it. Safe to call twice, and Close after it does nothing.
func (c *Controller) Kill() error {
	var err error
	c.once.Do(func() {
		c.draining.Store(true)
		err = c.http.Close()
		c.handBack()
		close(c.stopping)
		c.cancel()
		err = errors.Join(err, c.killMulti())
		c.wg.Wait()
		for _, t := range c.transports {
			t.CloseIdleConnections()
		}
		if c.Server != nil {
			c.Server.pods.CloseIdleConnections()
		}
		c.closeSecurity(context.Background())
	})
	return err
}

// Shutdown stops the controller gracefully, as on SIGTERM: /readyz turns
// 503 at once (load balancers stop sending new requests), requests are
// still taken for Shutdown.DrainDelay, then the listener closes (no new
// request is taken: a client sees its connection refused and tries another
// replica) and the requests in flight may finish for Shutdown.Grace (those
// still running then are cut); then the controller leaves the gossip pool,
// seals its audit log and hands Raft leadership over if it holds it (see
// Close). ctx bounds the whole (an interruption cuts the wait short).
func (c *Controller) Shutdown(ctx context.Context) error {
	c.draining.Store(true)
	c.log.Info("shutting down: not ready, draining", "drain_delay", c.cfg.Shutdown.DrainDelay, "grace", c.cfg.Shutdown.Grace)
	if d := c.cfg.Shutdown.DrainDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	drain, cancel := context.WithTimeout(ctx, c.cfg.Shutdown.Grace)
	defer cancel()
	rest, cancelRest := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancelRest()
	return c.close(drain, rest)
}

// Run runs a controller until ctx is done, then shuts it down gracefully
// (Shutdown); each signal on deps.Reload reloads its configuration. It is
// the binary's entry: it also applies cfg.Runtime to the process's Go
// runtime (Open, for controllers that share a process, does not).
func Run(ctx context.Context, cfg Config, deps Deps) error {
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rctx, stopRuntime := context.WithCancel(ctx)
	runtimeDone := make(chan struct{})
	go func() {
		defer close(runtimeDone)
		runRuntime(rctx, cfg.Runtime, cfg.multiRegion(), log)
	}()
	defer func() {
		stopRuntime()
		<-runtimeDone
	}()
	c, err := Open(ctx, cfg, deps)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return c.Shutdown(context.WithoutCancel(ctx))
		case <-deps.Reload:
			_, _ = c.Reload(ctx, "signal") // logged and counted; the controller runs on
		}
	}
}
