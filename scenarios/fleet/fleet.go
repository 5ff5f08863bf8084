// Package fleet starts a whole multi-region Meridian system in one process
// on loopback: a Kafka-protocol broker (franz-go's kfake), engine simulators
// per region publishing their KV events to it, and one controller per region
// forming the Raft and gossip clusters, with a residency policy and an audit
// log. The demo, the failover drill and the cross-region tests run on it.
//
// Its one job is to assemble the real components as an operator would
// deploy them, through their public configuration (regional.Config,
// enginesim.Config), so that what runs on it is the production code.
//
// Invariants:
//   - Every port is ephemeral (127.0.0.1:0), every secret (admin and hop
//     token, gossip key, audit HMAC key) is random per fleet, and state
//     lives under Config.Dir (a fresh temporary directory by default), so
//     fleets in one process do not collide.
//   - Start returns only once every controller is ready (the Raft cluster
//     has a leader with every controller a member, the residency policy is
//     committed, every pod is registered, and every region has every other
//     region's summary), or an error after closing what it started.
//   - Close stops everything, traffic first: controllers, then engines, then
//     the broker, then the directory it created.
//
// It imports regional, residency, scenarios/enginesim and scenarios/sim
// (whose default regions and RTTs it uses) of ours, and must not import
// global, dr or cmd: it reaches the Raft tier only through the controllers
// it starts. Only the demo and tests (dr/drill's, cmd's, demo's) import it.
package fleet

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/auth"
	"github.com/meridian-llm/meridian/residency"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
	"github.com/meridian-llm/meridian/scenarios/sim"
)

// ExamplePolicy is deploy/policies/example.yaml (a test keeps the two
// identical): zones us (us-east-1, us-west-2) and eu (eu-west-1), and an EU
// health tenant whose PHI never leaves the EU.
//
//go:embed policy.yaml
var ExamplePolicy []byte

// RegionSpec describes one region.
type RegionSpec struct {
	Name        string
	Pods        int    // engine simulators; default 2
	Hardware    string // engine profile; default "h100"
	CacheBlocks int    // per pod, 16-token blocks; default the profile's
}

// Config describes the fleet.
type Config struct {
	// Regions; default sim.DefaultRegions (us-east-1, us-west-2, eu-west-1)
	// with 2 pods each.
	Regions []RegionSpec
	// Dir holds Raft data and audit logs; default a new temporary directory
	// removed by Close.
	Dir string
	// Policy is the residency policy document; default ExamplePolicy.
	Policy []byte
	// RTT between regions (symmetric, by "a|b" with a < b); used as the
	// gossip static RTT override so decisions see these values. Nil:
	// DefaultRTT of the regions.
	RTT map[string]time.Duration
	// TimeScale of the engine simulators (1: real time); default 0.2.
	TimeScale float64
	// Model served; default "meridian/sim-70b".
	Model string
	// MaxTokens is the engines' default output length; default 16.
	MaxTokens int
	// Logger; nil discards.
	Logger *slog.Logger
	// Controller adjusts each controller's configuration before it starts.
	Controller func(region string, c *regional.Config)
	// Deps adjusts what each controller is given (a clock, a gossip
	// transport wrapper) before it starts.
	Deps func(region string, d *regional.Deps)
	// Tenants, when set, authenticate with API keys (Fleet.APIKeys holds
	// one per tenant). Default: the controllers believe X-Tenant-Id and
	// X-Data-Class from loopback only, as from a trusted gateway.
	Tenants []Tenant
	// Insecure runs the controllers without TLS and without client
	// authentication (insecure: true). Default: the secure path, mutual TLS
	// between controllers with certificates of a fleet CA, https
	// everywhere.
	Insecure bool
}

// Tenant is an API key's holder: a tenant and the data classes it may send.
type Tenant struct {
	Name             string
	DataClasses      []string
	DefaultDataClass string
}

// DefaultRTT returns the multi-region simulator's round trips between the
// regions (sim.DefaultRTT: us-east-1<->us-west-2 65 ms, <->eu-west-1 75 ms,
// us-west-2<->eu-west-1 130 ms, ap-southeast-1 220 ms from anywhere, any
// other pair 150 ms), keyed as Config.RTT, so that the fleet and the
// simulator decide on the same distances.
func DefaultRTT(regions []string) map[string]time.Duration {
	m := map[string]time.Duration{}
	for i, row := range sim.DefaultRTT(regions) {
		for j, d := range row[i+1:] {
			m[key(regions[i], regions[i+1+j])] = d
		}
	}
	return m
}

func key(a, b string) string {
	if b < a {
		a, b = b, a
	}
	return a + "|" + b
}

// Region is one running region.
type Region struct {
	Name       string
	Controller *regional.Controller
	Engines    []*enginesim.Engine
	config     regional.Config // what the controller was opened with
	deps       regional.Deps
}

// Restart closes a region's controller and opens it again on the same
// state (Raft data, audit log, gossip state), after mut (if not nil)
// adjusts its configuration; it waits for the new controller to open, not
// for the fleet to be ready again.
func (f *Fleet) Restart(ctx context.Context, region string, mut func(*regional.Config)) error {
	r := f.Region(region)
	if r == nil {
		return fmt.Errorf("restart: no region %q", region)
	}
	if err := r.Controller.Close(ctx); err != nil {
		return fmt.Errorf("restart %s: close: %w", region, err)
	}
	cfg := r.config
	if mut != nil {
		mut(&cfg)
	}
	ctl, err := regional.Open(ctx, cfg, r.deps)
	if err != nil {
		return fmt.Errorf("restart %s: %w", region, err)
	}
	r.Controller, r.config = ctl, cfg
	return nil
}

// Fleet is the running system.
type Fleet struct {
	Broker     *kfake.Cluster
	Regions    []*Region
	AdminToken string
	// AuditKey is the audit HMAC key every controller is given (a
	// Config.Controller hook may change it), for tenant searches of the logs.
	AuditKey string
	// Policy is the residency policy the controllers start with.
	Policy *residency.Policy
	Dir    string
	// PKI is the fleet's CA and certificates (zero when Insecure).
	PKI identity.PKIResult
	// APIKeys maps each Config.Tenants entry to its API key.
	APIKeys map[string]string
	// HTTP is a client of the controllers' APIs and admin APIs: it trusts
	// the fleet's CA.
	HTTP   *http.Client
	ownDir bool
}

// AuditDir is the audit directory the controllers are given (one
// subdirectory per controller; a Config.Controller hook may change it).
func (f *Fleet) AuditDir() string { return filepath.Join(f.Dir, "audit") }

// Region returns a region by name.
func (f *Fleet) Region(name string) *Region {
	for _, r := range f.Regions {
		if r.Name == name {
			return r
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start brings the fleet up and waits until it is ready (or ctx ends).
func Start(ctx context.Context, cfg Config) (f *Fleet, err error) {
	if len(cfg.Regions) == 0 {
		for _, name := range sim.DefaultRegions() {
			cfg.Regions = append(cfg.Regions, RegionSpec{Name: name})
		}
	}
	for i := range cfg.Regions {
		if cfg.Regions[i].Pods == 0 {
			cfg.Regions[i].Pods = 2
		}
	}
	if cfg.Policy == nil {
		cfg.Policy = ExamplePolicy
	}
	policy, err := residency.Parse("policy.yaml", cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("fleet policy: %w", err)
	}
	if cfg.RTT == nil {
		var names []string
		for _, r := range cfg.Regions {
			names = append(names, r.Name)
		}
		cfg.RTT = DefaultRTT(names)
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 0.2
	}
	if cfg.Model == "" {
		cfg.Model = enginesim.DefaultConfig().Model
	}
	if cfg.MaxTokens == 0 {
		cfg.MaxTokens = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f = &Fleet{AdminToken: randomHex(16), AuditKey: randomHex(32), Policy: policy, Dir: cfg.Dir, HTTP: &http.Client{}}
	if f.Dir == "" {
		if f.Dir, err = os.MkdirTemp("", "meridian-fleet-"); err != nil {
			return nil, err
		}
		f.ownDir = true
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_ = f.Close(cctx)
			cancel()
			f = nil
		}
	}()
	if f.Broker, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4)); err != nil {
		return f, err
	}
	policyFile := filepath.Join(f.Dir, "policy.yaml")
	if err := os.WriteFile(policyFile, cfg.Policy, 0o600); err != nil {
		return f, err
	}
	gossipKey := base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	sec, err := f.security(cfg)
	if err != nil {
		return f, err
	}

	var seedAdmin, seedGossip string
	for i, spec := range cfg.Regions {
		r := &Region{Name: spec.Name}
		f.Regions = append(f.Regions, r)
		for p := 0; p < spec.Pods; p++ {
			ec := enginesim.DefaultConfig()
			ec.Name = fmt.Sprintf("%s-pod-%d", spec.Name, p)
			ec.Region, ec.Model, ec.TimeScale, ec.DefaultMaxTokens = spec.Name, cfg.Model, cfg.TimeScale, cfg.MaxTokens
			ec.HashSeed = spec.Name
			if spec.Hardware != "" {
				ec.Hardware = spec.Hardware
				prof := enginesim.Profiles()[spec.Hardware]
				ec.Timing, ec.CacheBlocks, ec.MaxConcurrency = prof.Timing, prof.CacheBlocks, prof.MaxConcurrency
			}
			if spec.CacheBlocks > 0 {
				ec.CacheBlocks = spec.CacheBlocks
			}
			ec.Kafka = &enginesim.KafkaConfig{Brokers: f.Broker.ListenAddrs()}
			e, err := enginesim.Open(ec)
			if err != nil {
				return f, fmt.Errorf("engine %s: %w", ec.Name, err)
			}
			r.Engines = append(r.Engines, e)
		}

		rc := regional.DefaultConfig()
		rc.Region, rc.ControllerID = spec.Name, "ctl-"+spec.Name
		rc.Listen, rc.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		rc.Kafka.Brokers = f.Broker.ListenAddrs()
		rc.Models = []regional.ModelConfig{{Name: cfg.Model, Tokenizer: enginesim.DefaultConfig().Tokenizer}}
		rc.PolicyFile = policyFile
		rc.ScrapeInterval = 200 * time.Millisecond
		rc.SummaryInterval = 500 * time.Millisecond
		// A 2 s election timeout: loopback is fast, but a fleet runs beside
		// tests and builds on a loaded machine, where a 1 s one deposes
		// starved leaders over and over.
		rc.Raft = regional.RaftConfig{DataDir: filepath.Join(f.Dir, spec.Name, "raft"), Bind: "127.0.0.1:0", Bootstrap: i == 0, Voters: 3,
			ElectionTimeout: 2 * time.Second}
		if i > 0 {
			rc.Raft.Join = []string{seedAdmin}
		}
		rc.Gossip = regional.GossipConfig{Bind: "127.0.0.1:0", Keys: []string{gossipKey}, Label: "meridian-fleet", Fast: true,
			StaticRTT: map[string]map[string]time.Duration{}, StaticRTTOverride: true}
		if i > 0 {
			rc.Gossip.Join = []string{seedGossip}
		}
		for k, d := range cfg.RTT {
			a, b, _ := strings.Cut(k, "|")
			if rc.Gossip.StaticRTT[a] == nil {
				rc.Gossip.StaticRTT[a] = map[string]time.Duration{}
			}
			rc.Gossip.StaticRTT[a][b] = d
		}
		rc.Audit = regional.AuditConfig{Dir: f.AuditDir(), HMACKey: f.AuditKey, CheckpointInterval: 10 * time.Second}
		sec(&rc)
		if cfg.Controller != nil {
			cfg.Controller(spec.Name, &rc)
		}
		deps := regional.Deps{Logger: cfg.Logger.With("controller", rc.ControllerID)}
		if cfg.Deps != nil {
			cfg.Deps(spec.Name, &deps)
		}
		ctl, err := regional.Open(ctx, rc, deps)
		if err != nil {
			return f, fmt.Errorf("controller %s: %w", spec.Name, err)
		}
		r.Controller, r.config, r.deps = ctl, rc, deps
		if i == 0 {
			seedAdmin = ctl.AdminURL()
			seedGossip = ctl.Gossip().Addr()
		}
	}
	return f, f.WaitReady(ctx)
}

// WaitReady waits until the fleet can serve: a Raft leader with every
// controller a member, the policy committed, every pod registered with its
// endpoint, every region holding every other region's summary.
func (f *Fleet) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		why := f.notReady()
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet not ready: %s: %w", why, ctx.Err())
		case <-t.C:
		}
	}
}

func (f *Fleet) notReady() string {
	for _, r := range f.Regions {
		c := r.Controller
		h := c.Global().Health()
		if h.Leader == "" {
			return r.Name + ": no raft leader"
		}
		st := c.Global().State()
		if _, ok := st.Policy(); !ok {
			return r.Name + ": no policy committed"
		}
		if len(st.Members()) < len(f.Regions) {
			return fmt.Sprintf("%s: %d raft members", r.Name, len(st.Members()))
		}
		n := 0
		for _, p := range c.Registry.Pods() {
			if p.Info().Endpoint != "" {
				n++
			}
		}
		if n < len(r.Engines) {
			return fmt.Sprintf("%s: %d of %d pods registered", r.Name, n, len(r.Engines))
		}
		view := c.Gossip().View()
		for _, o := range f.Regions {
			if o.Name == r.Name {
				continue
			}
			rv, ok := view.Region(o.Name)
			if !ok || rv.Summary == nil || !rv.Live {
				return fmt.Sprintf("%s: no summary of %s yet", r.Name, o.Name)
			}
		}
	}
	return ""
}

// Close stops the controllers, then the engines, then the broker.
func (f *Fleet) Close(ctx context.Context) error {
	var errs []error
	for _, r := range slices.Backward(f.Regions) {
		if r.Controller != nil {
			errs = append(errs, r.Controller.Close(ctx))
		}
	}
	for _, r := range f.Regions {
		for _, e := range r.Engines {
			errs = append(errs, e.Close(ctx))
		}
	}
	if f.Broker != nil {
		f.Broker.Close()
	}
	if f.ownDir {
		errs = append(errs, os.RemoveAll(f.Dir))
	}
	return errors.Join(errs...)
}

// security sets the fleet up for the secure path: a CA and a certificate
// per controller (https, mutual TLS between controllers), and client
// authentication (API keys for Config.Tenants, else a trusted gateway on
// loopback). It returns what to apply to each controller's config.
func (f *Fleet) security(cfg Config) (func(*regional.Config), error) {
	if cfg.Insecure {
		return func(rc *regional.Config) {
			rc.Insecure = true
			rc.AdminToken, rc.HopToken = f.AdminToken, f.AdminToken
		}, nil
	}
	var regions []string
	for _, r := range cfg.Regions {
		regions = append(regions, r.Name)
	}
	pki, err := identity.InitDevPKI(filepath.Join(f.Dir, "pki"), regions, identity.PKIOptions{Operator: "operator"})
	if err != nil {
		return nil, fmt.Errorf("fleet pki: %w", err)
	}
	f.PKI = pki
	caPEM, err := os.ReadFile(pki.CACert)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	f.HTTP = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13},
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}

	ac := auth.DefaultConfig()
	if len(cfg.Tenants) == 0 {
		ac.Mode = auth.ModeTrustedHeaders
		ac.TrustedHeaders.CIDRs = []string{"127.0.0.0/8", "::1/128"}
	} else {
		ac.Mode = auth.ModeAPIKeys
		ac.APIKeys.File = filepath.Join(f.Dir, "api-keys.yaml")
		f.APIKeys = map[string]string{}
		var b strings.Builder
		b.WriteString("version: 1\nkeys:\n")
		for _, t := range cfg.Tenants {
			key, digest, err := auth.GenerateKey()
			if err != nil {
				return nil, err
			}
			f.APIKeys[t.Name] = key
			fmt.Fprintf(&b, "  - name: %s\n    sha256: %s\n    tenant: %s\n", t.Name, digest, t.Name)
			if len(t.DataClasses) > 0 {
				fmt.Fprintf(&b, "    data_classes: [%s]\n", strings.Join(t.DataClasses, ", "))
			}
			if t.DefaultDataClass != "" {
				fmt.Fprintf(&b, "    default_data_class: %s\n", t.DefaultDataClass)
			}
			b.WriteString("    rate_limit: {requests_per_second: 1000, burst: 2000}\n")
		}
		if err := os.WriteFile(ac.APIKeys.File, []byte(b.String()), 0o600); err != nil {
			return nil, err
		}
	}
	certs := map[string]identity.IssuedCert{}
	for _, c := range pki.Controllers {
		certs[c.Identity.ControllerID] = c
	}
	return func(rc *regional.Config) {
		c := certs[rc.ControllerID]
		rc.TLS = &identity.TLSConfig{Cert: c.Cert, Key: c.Key, ClientCA: pki.CACert}
		rc.Auth = regional.AuthConfig{Config: ac}
		rc.AdminToken = f.AdminToken
	}, nil
}
