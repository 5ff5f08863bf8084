// Package fleet starts a whole multi-region Meridian system in one process
// on loopback: a Kafka-protocol broker (franz-go's kfake), engine simulators
// per region publishing their KV events to it, and one or several
// controllers (replicas) per region forming the Raft and gossip clusters,
// with a residency policy and an audit log per controller. The demo, the
// failover drill and the cross-region and replica tests run on it. A
// replica can be killed (as a crash), stopped gracefully (as on SIGTERM)
// and started again on its addresses and state; a Balancer spreads
// requests over a region's replicas as a load balancer in front of them
// would.
//
// Its one job is to assemble the real components as an operator would
// deploy them, through their public configuration (regional.Config,
// enginesim.Config), so that what runs on it is the production code.
//
// Invariants:
//   - Every port is on loopback: the engines' and the broker's ephemeral
//     (127.0.0.1:0), the controllers' picked free below the kernel's
//     ephemeral range (a replica started again binds them again, and no
//     outgoing connection can have taken one as its source port); every
//     secret (admin and hop token, gossip key, audit HMAC key) is random
//     per fleet, and state
//     lives under Config.Dir (a fresh temporary directory by default), so
//     fleets in one process do not collide.
//   - Start returns only once every controller is ready (the Raft cluster
//     has a leader with every controller a member and its voters placed
//     across the regions, the residency policy is
//     committed, every pod is registered, every controller's index has
//     caught up with its topic, and every region has every other region's
//     summary), or an error after closing what it started.
//   - Close stops everything, traffic first: the controllers (their audit
//     logs sealed first, while Raft can take the final checkpoints), then
//     engines, then the broker, then the directory it created.
//
// It imports regional (and regional/auth for its types), global/identity
// (the fleet's PKI), residency, scenarios/enginesim and scenarios/sim
// (whose default regions and RTTs it uses) of ours, and must not import
// global itself, dr or cmd: it reaches the Raft tier only through the
// controllers it starts. Only the demo and tests (dr/drill's, cmd's,
// demo's) import it.
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
	Replicas    int    // controllers; default Config.Replicas
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
	// Replicas is the number of controllers per region (RegionSpec.Replicas
	// overrides it); default 1. With one, a region's controller is
	// ctl-<region>; with n, ctl-<region>-1 .. ctl-<region>-n.
	Replicas int
	// ElectionTimeout is the controllers' Raft heartbeat and election
	// timeout; default 2s: loopback is fast, but a fleet runs beside tests
	// and builds on a loaded machine, where a 1 s one (hashicorp/raft's
	// default) deposes starved leaders over and over.
	ElectionTimeout time.Duration
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
	Name string
	// Controller is the region's first replica as it was started: with
	// one replica, the region's controller. After that replica is killed
	// or stopped it stays the closed controller; use Replicas (and
	// Replica.Controller) to follow restarts.
	Controller *regional.Controller
	// Replicas are the region's controllers, in id order.
	Replicas []*Replica
	Engines  []*enginesim.Engine
}

// Live returns the controllers of the region's replicas that are running
// (started and not killed or stopped), in replica order.
func (r *Region) Live() []*regional.Controller {
	var out []*regional.Controller
	for _, rep := range r.Replicas {
		if c := rep.Controller(); c != nil {
			out = append(out, c)
		}
	}
	return out
}

// Replica returns the replica with the given controller id, or nil.
func (r *Region) Replica(id string) *Replica {
	for _, rep := range r.Replicas {
		if rep.ID == id {
			return rep
		}
	}
	return nil
}

// Restart closes a region's first replica and opens it again on the same
// state (Raft data, audit log, gossip state), after mut (if not nil)
// adjusts its configuration; it waits for the new controller to open, not
// for the fleet to be ready again. Region.Controller is the new one.
func (f *Fleet) Restart(ctx context.Context, region string, mut func(*regional.Config)) error {
	r := f.Region(region)
	if r == nil || len(r.Replicas) == 0 {
		return fmt.Errorf("restart: no region %q", region)
	}
	rep := r.Replicas[0]
	if err := rep.close(ctx); err != nil {
		return fmt.Errorf("restart %s: close: %w", region, err)
	}
	rep.mu.Lock()
	if mut != nil {
		mut(&rep.cfg)
	}
	rep.mu.Unlock()
	if err := rep.open(ctx); err != nil {
		return fmt.Errorf("restart %s: %w", region, err)
	}
	r.Controller = rep.Controller()
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
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = 2 * time.Second
	}
	for i := range cfg.Regions {
		if cfg.Regions[i].Pods == 0 {
			cfg.Regions[i].Pods = 2
		}
		if cfg.Regions[i].Replicas == 0 {
			cfg.Regions[i].Replicas = cfg.Replicas
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

	maxReplicas := 1
	for _, spec := range cfg.Regions {
		maxReplicas = max(maxReplicas, spec.Replicas)
	}
	first := true
	for _, spec := range cfg.Regions {
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

		// The ids the fleet's PKI issues certificates for (it issues as
		// many per region as the largest region has replicas).
		for _, id := range identity.ControllerIDs(spec.Name, maxReplicas)[:spec.Replicas] {
			rc := regional.DefaultConfig()
			rc.Region, rc.ControllerID = spec.Name, id
			// Addresses picked free below the kernel's ephemeral range: a
			// replica started again binds them again, and an ephemeral port
			// could meanwhile be any outgoing connection's source port.
			var addrs [4]string
			for i := range addrs {
				if addrs[i], err = pickAddr(); err != nil {
					return f, fmt.Errorf("controller %s: %w", id, err)
				}
			}
			rc.Listen, rc.AdminListen = addrs[0], addrs[1]
			rc.Kafka.Brokers = f.Broker.ListenAddrs()
			rc.Models = []regional.ModelConfig{{Name: cfg.Model, Tokenizer: enginesim.DefaultConfig().Tokenizer}}
			rc.PolicyFile = policyFile
			rc.ScrapeInterval = 200 * time.Millisecond
			rc.SummaryInterval = 500 * time.Millisecond
			dataDir := filepath.Join(f.Dir, spec.Name, "raft")
			if maxReplicas > 1 {
				dataDir = filepath.Join(f.Dir, spec.Name, id, "raft")
			}
			rc.Raft = regional.RaftConfig{DataDir: dataDir, Bind: addrs[2], Bootstrap: first, Voters: 3,
				ElectionTimeout: cfg.ElectionTimeout}
			rc.Gossip = regional.GossipConfig{Bind: addrs[3], Keys: []string{gossipKey}, Label: "meridian-fleet", Fast: true,
				StaticRTT: map[string]map[string]time.Duration{}, StaticRTTOverride: true}
			if !first {
				rc.Raft.Join, rc.Gossip.Join = f.joinAddrs(nil)
			}
			for k, d := range cfg.RTT {
				a, b, _ := strings.Cut(k, "|")
				if rc.Gossip.StaticRTT[a] == nil {
					rc.Gossip.StaticRTT[a] = map[string]time.Duration{}
				}
				rc.Gossip.StaticRTT[a][b] = d
			}
			rc.Audit = regional.AuditConfig{Dir: f.AuditDir(), HMACKey: f.AuditKey, CheckpointInterval: 10 * time.Second}
			// A graceful stop keeps taking requests for a while after
			// /readyz turned 503: long enough for a Balancer's probe to
			// notice on a loaded machine, so that no new request races the
			// closing of the replica's idle connections.
			rc.Shutdown.DrainDelay = 4 * BalancerProbeInterval
			sec(&rc)
			if cfg.Controller != nil {
				cfg.Controller(spec.Name, &rc)
			}
			deps := regional.Deps{Logger: cfg.Logger.With("controller", id)}
			if cfg.Deps != nil {
				cfg.Deps(spec.Name, &deps)
			}
			rep := &Replica{ID: id, Region: spec.Name, f: f, deps: deps, cfg: rc}
			r.Replicas = append(r.Replicas, rep)
			if err := rep.open(ctx); err != nil {
				return f, fmt.Errorf("controller %s: %w", id, err)
			}
			if r.Controller == nil {
				r.Controller = rep.Controller()
			}
			first = false
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
	total := 0
	for _, r := range f.Regions {
		total += len(r.Replicas)
	}
	for _, r := range f.Regions {
		for _, rep := range r.Replicas {
			c := rep.Controller()
			if c == nil {
				return rep.ID + ": down"
			}
			if why := f.replicaNotReady(r, c); why != "" {
				return rep.ID + ": " + why
			}
			if n := len(c.Global().State().Members()); n < total {
				return fmt.Sprintf("%s: %d of %d raft members", rep.ID, n, total)
			}
		}
	}
	// The voters placed (3 of the controllers, spread across regions; 1 of
	// 2): until then the bootstrapping controller may be the only voter.
	want := min(3, total)
	if want%2 == 0 {
		want--
	}
	voters := 0
	for _, ids := range f.Voters() {
		voters += len(ids)
	}
	if voters != want {
		return fmt.Sprintf("%d of %d raft voters placed", voters, want)
	}
	return ""
}

// replicaNotReady says why one controller cannot serve as the fleet
// expects yet ("" when it can): a Raft leader known, the policy
// committed, every pod of its region registered with its endpoint, its
// index caught up with the topic, and every other region's summary held.
func (f *Fleet) replicaNotReady(r *Region, c *regional.Controller) string {
	h := c.Global().Health()
	if h.Leader == "" {
		return "no raft leader"
	}
	st := c.Global().State()
	if _, ok := st.Policy(); !ok {
		return "no policy committed"
	}
	n := 0
	for _, p := range c.Registry.Pods() {
		if p.Info().Endpoint != "" {
			n++
		}
	}
	if n < len(r.Engines) {
		return fmt.Sprintf("%d of %d pods registered", n, len(r.Engines))
	}
	if !c.Ready() {
		return "not ready (index catching up)"
	}
	view := c.Gossip().View()
	for _, o := range f.Regions {
		if o.Name == r.Name {
			continue
		}
		rv, ok := view.Region(o.Name)
		if !ok || rv.Summary == nil || !rv.Live {
			return "no summary of " + o.Name + " yet"
		}
		// Every other region may forward here (a replica started again
		// advertises its address once ready; the others must have it
		// before the next replica of a rolling restart stops).
		for _, oc := range o.Live() {
			advertised := false
			if orv, ok := oc.Gossip().View().Region(r.Name); ok {
				for _, x := range orv.Controllers {
					advertised = advertised || (x.Name == c.ID() && x.ForwardAddr != "")
				}
			}
			if !advertised {
				return oc.ID() + " has no forward address of it yet"
			}
		}
	}
	return ""
}

// Voters returns the Raft voters by region, as the leader's
// configuration has them (nil when no running controller knows a leader).
func (f *Fleet) Voters() map[string][]string {
	for _, c := range f.Controllers() {
		n := c.Global()
		if !n.IsLeader() {
			continue
		}
		servers, err := n.Servers()
		if err != nil {
			return nil
		}
		out := map[string][]string{}
		for _, s := range servers {
			if s.Suffrage != "voter" {
				continue
			}
			m, _ := n.State().Member(s.ID)
			out[m.Region] = append(out[m.Region], s.ID)
		}
		return out
	}
	return nil
}

// Controllers returns every running controller, region by region.
func (f *Fleet) Controllers() []*regional.Controller {
	var out []*regional.Controller
	for _, r := range f.Regions {
		out = append(out, r.Live()...)
	}
	return out
}

// joinAddrs are the admin URLs and gossip addresses of the running
// controllers other than except, for a controller joining (or rejoining)
// the Raft and gossip clusters.
func (f *Fleet) joinAddrs(except *Replica) (admin, gossipAddrs []string) {
	for _, r := range f.Regions {
		for _, rep := range r.Replicas {
			if rep == except {
				continue
			}
			if c := rep.Controller(); c != nil {
				admin = append(admin, c.AdminURL())
				gossipAddrs = append(gossipAddrs, c.Gossip().Addr())
			}
		}
	}
	return admin, gossipAddrs
}

// Close stops the controllers, then the engines, then the broker. It
// first seals every running controller's audit log, while the Raft
// quorum is there to commit their final checkpoints: sealed by each
// controller's own Close, the last voters' would wait out the audit
// log's checkpoint timeout (5 s) for a quorum that has gone. A seal's
// error is the controller's Close's to report, as it was.
func (f *Fleet) Close(ctx context.Context) error {
	for _, c := range f.Controllers() {
		if l := c.Audit(); l != nil {
			_ = l.Close()
		}
	}
	var errs []error
	for _, r := range slices.Backward(f.Regions) {
		for _, rep := range slices.Backward(r.Replicas) {
			errs = append(errs, rep.close(ctx))
		}
		if r.Controller != nil {
			errs = append(errs, r.Controller.Close(ctx)) // already closed: a no-op
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
	replicas := 1
	for _, r := range cfg.Regions {
		replicas = max(replicas, r.Replicas)
	}
	pki, err := identity.InitDevPKI(filepath.Join(f.Dir, "pki"), regions, identity.PKIOptions{Operator: "operator", ReplicasPerRegion: replicas})
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
