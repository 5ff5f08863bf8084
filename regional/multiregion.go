package regional

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/console"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/summary"
	"github.com/meridian-llm/meridian/residency"
)

// RaftConfig turns on the Raft-replicated global tier (package global) when
// DataDir is set.
type RaftConfig struct {
	// DataDir holds the Raft log and snapshots. Empty: no Raft tier.
	DataDir string `yaml:"data_dir"`
	// Bind is the Raft TCP listen address; default "0.0.0.0:7400".
	Bind string `yaml:"bind"`
	// Advertise is the address other controllers dial; default Bind.
	Advertise string `yaml:"advertise"`
	// Bootstrap creates a new cluster with this controller as its only voter
	// (exactly one controller of a new cluster); the others Join.
	Bootstrap bool `yaml:"bootstrap"`
	// BootstrapID, for replicas that share one configuration file (a
	// StatefulSet, a compose file with ${VAR}s): the controller with this
	// id bootstraps (as with bootstrap: true, its join list ignored), the
	// others join. Empty: Bootstrap decides.
	BootstrapID string `yaml:"bootstrap_id"`
	// Join lists admin URLs of existing members.
	Join []string `yaml:"join"`
	// Voters kept by the leader: 1, 3 or 5. Default 3.
	Voters int `yaml:"voters"`
	// VotersPerRegion caps the voters of one region once the cluster spans
	// three regions or more; default 1 (see global.Config.VotersPerRegion:
	// two regions hold three voters as two and one, one region up to
	// Voters). The other controllers replicate without voting.
	VotersPerRegion int `yaml:"voters_per_region"`
	// VoterDownAfter: a voter silent this long is replaced by a caught-up
	// controller (of its region first); default 10s.
	VoterDownAfter time.Duration `yaml:"voter_down_after"`
	// RemoveDownAfter: a controller silent this long leaves the Raft
	// configuration (it joins again if it comes back); default 24h, 0 in
	// the file keeps the default.
	RemoveDownAfter time.Duration `yaml:"remove_down_after"`
	// WAN uses Raft timings for cross-region links (global.WANTiming).
	WAN bool `yaml:"wan"`
	// ElectionTimeout, when set, replaces the timing's heartbeat and
	// election timeouts (the leader lease is half of it): longer for
	// voters on a heavily loaded host, where a starved leader would
	// otherwise be deposed over and over. 0: the timing's (LAN 1s, WAN 1.5s).
	ElectionTimeout time.Duration `yaml:"election_timeout"`
}

// GossipConfig turns on the WAN gossip pool (package gossip) when Keys are set.
type GossipConfig struct {
	// Bind is the UDP+TCP listen address; default "0.0.0.0:7947".
	Bind string `yaml:"bind"`
	// Advertise is the address the other controllers reach; default Bind.
	Advertise string `yaml:"advertise"`
	// Join lists seed controllers' gossip addresses.
	Join []string `yaml:"join"`
	// Keys: base64 AES keys (16, 24 or 32 bytes); the first encrypts.
	// MERIDIAN_GOSSIP_KEY, when set, is used instead.
	Keys []string `yaml:"keys"`
	// Label separates pools; default "meridian-wan".
	Label string `yaml:"label"`
	// StaticRTT is the fallback RTT matrix: region -> region -> RTT.
	StaticRTT map[string]map[string]time.Duration `yaml:"static_rtt"`
	// StaticRTTOverride uses StaticRTT instead of measurements.
	StaticRTTOverride bool `yaml:"static_rtt_override"`
	// Fast uses short probe and sync intervals (tests and the demo on
	// loopback).
	Fast bool `yaml:"fast"`
	// ReplicaInterval is how often this controller sends the other
	// controllers of its region its own in-flight accounting and session
	// pins (see replicaShare); default 200ms (100ms with Fast). The longer
	// it is, the longer a request another replica just sent to a pod goes
	// unseen here.
	ReplicaInterval time.Duration `yaml:"replica_interval"`
	// StateFile keeps this controller's gossip state across restarts: the
	// epoch of its summary generations (they keep increasing whatever the
	// wall clock does) and the controllers it has seen (it rejoins through
	// them). Default <raft.data_dir>/gossip-state.json with raft, else
	// <audit.dir>/<controller_id>/gossip-state.json.
	StateFile string `yaml:"state_file"`
}

// gossipStateFile is the state file, configured or by default.
func (c Config) gossipStateFile() string {
	switch {
	case c.Gossip.StateFile != "":
		return c.Gossip.StateFile
	case c.Raft.DataDir != "":
		return filepath.Join(c.Raft.DataDir, "gossip-state.json")
	}
	return filepath.Join(c.Audit.Dir, c.ControllerID, "gossip-state.json")
}

// AuditConfig turns on the audit log (package global/audit) when Dir is set.
type AuditConfig struct {
	// Dir is the audit root; this controller writes Dir/<controller id>/.
	Dir string `yaml:"dir"`
	// HMACKey keys the tenant and session HMACs (at least 16 bytes;
	// base64 if prefixed "base64:"). MERIDIAN_AUDIT_KEY, when set, is used
	// instead.
	HMACKey string `yaml:"hmac_key"`
	// CheckpointInterval: chain heads go into Raft this often (10s..60s);
	// default 30s.
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
	// MaxSegmentBytes and MaxSegmentAge rotate segments; defaults 64 MiB, 1h.
	MaxSegmentBytes int64         `yaml:"max_segment_bytes"`
	MaxSegmentAge   time.Duration `yaml:"max_segment_age"`
}

// AutoFailoverConfig is the automatic failover of the Raft leader. It fails
// a region only on evidence that its pods cannot serve (its own current
// report, or, when the leader holds none, the current reports a majority
// of the other regions hold of it), never because its controllers cannot
// be reached.
type AutoFailoverConfig struct {
	Enabled bool `yaml:"enabled"`
	// Interval is how often the Raft leader evaluates the regions'
	// reports; default 1s. A region is failed (recovered) at the first
	// evaluation after its Grace (HoldDown) has passed.
	Interval time.Duration `yaml:"interval"`
	// MinHealthyPods fails a region reporting fewer serving pods; default 1.
	MinHealthyPods int `yaml:"min_healthy_pods"`
	// ReportMaxAge is how old a region's report (its summary) may be and
	// still count as evidence; default 30s.
	ReportMaxAge time.Duration `yaml:"report_max_age"`
	// Grace a region must stay unhealthy before it is failed; default 10s.
	Grace time.Duration `yaml:"grace"`
	// HoldDown a recovered region must stay healthy before it takes traffic
	// again; default 60s.
	HoldDown time.Duration `yaml:"hold_down"`
}

// multiRegion holds the controller's cross-region components.
type multiRegion struct {
	node   *global.Node
	gossip *gossip.Node
	// gossipRef is gossip for readers that may run while it is being
	// opened (the admin API serves before the gossip pool is up).
	gossipRef atomic.Pointer[gossip.Node]
	audit     *audit.Log
	control   ControlPlane
	adminH    atomic.Pointer[http.Handler]
	adminLn   net.Listener
	adminS    *http.Server
	sink      checkpointSink
	// Summary generations: epoch<<generationSeqBits | seq. The epoch is
	// persisted and incremented at every start (gossipState).
	genEpoch, genSeq uint64
	// regionGen is the highest generation the region's other replicas
	// advertise (gossip.Node.RegionGeneration; nil: none known).
	regionGen   func() uint64
	gstateMu    sync.Mutex // guards gstate (the summary loop and gossip's rejoin)
	gstate      gossipState
	gstateFile  string
	adminClient *http.Client     // to other controllers' admin APIs
	console     *console.Console // nil without the admin listener
}

// nextGeneration is the generation of the next summary this controller
// publishes: above every one it published before, restarts included, and
// above every one the other replicas of its region advertise (the other
// regions keep the highest they got from any of them): when a replica
// takes over publishing it moves to an epoch above theirs, persisted.
func (mr *multiRegion) nextGeneration(log *slog.Logger) uint64 {
	if mr.regionGen != nil {
		if peer := mr.regionGen(); peer>>generationSeqBits >= mr.genEpoch {
			mr.adoptEpoch(peer>>generationSeqBits+1, log)
		}
	}
	mr.genSeq++
	return mr.genEpoch<<generationSeqBits | mr.genSeq
}

// adoptEpoch moves this controller's generations to epoch e and persists
// it (a failure to persist is logged: a restart could then publish below
// the others for OlderGenerationAfter, no worse).
func (mr *multiRegion) adoptEpoch(e uint64, log *slog.Logger) {
	mr.gstateMu.Lock()
	defer mr.gstateMu.Unlock()
	mr.genEpoch, mr.genSeq = e, 0
	mr.gstate.Epoch = e
	if mr.gstateFile != "" {
		if err := mr.gstate.save(mr.gstateFile); err != nil {
			log.Warn("summary generation epoch not persisted", "epoch", e, "err", err)
		}
	}
}

// enabled reports whether any cross-region component is configured.
func (c Config) multiRegion() bool {
	return c.Raft.DataDir != "" || len(c.Gossip.Keys) > 0 || c.Audit.Dir != "" || c.PolicyFile != ""
}

// validateMulti checks the cross-region sections.
func (c Config) validateMulti() error {
	if c.Raft.DataDir != "" {
		if c.AdminToken == "" {
			return errors.New("config: admin_token (or MERIDIAN_ADMIN_TOKEN) is required with raft")
		}
		if d := c.Raft.ElectionTimeout; d != 0 && (d < 100*time.Millisecond || d > time.Minute) {
			return fmt.Errorf("config: raft.election_timeout = %v: want 100ms..1m (0: the timing's default)", d)
		}
		if c.Raft.Voters != 0 && c.Raft.Voters != 1 && c.Raft.Voters != 3 && c.Raft.Voters != 5 {
			return fmt.Errorf("config: raft.voters = %d: want 1, 3 or 5", c.Raft.Voters)
		}
		if c.Raft.VotersPerRegion < 0 || c.Raft.VotersPerRegion > 5 {
			return fmt.Errorf("config: raft.voters_per_region = %d: want 1..5 (0: the default, 1)", c.Raft.VotersPerRegion)
		}
		if c.Raft.VoterDownAfter < 0 || c.Raft.RemoveDownAfter < 0 {
			return fmt.Errorf("config: raft.voter_down_after = %v, raft.remove_down_after = %v: want >= 0 (0: the default)", c.Raft.VoterDownAfter, c.Raft.RemoveDownAfter)
		}
		if c.Audit.Dir == "" {
			return errors.New("config: audit.dir is required with raft: policy applies, failovers and membership changes are recorded there")
		}
	}
	if len(c.Gossip.Keys) > 0 {
		if c.Audit.Dir == "" {
			return errors.New("config: audit.dir is required with gossip: cross-region decisions must be recorded")
		}
		if c.TLS == nil && c.HopToken == "" {
			return errors.New("config: without tls, hop_token (or MERIDIAN_HOP_TOKEN) is required with gossip: it authenticates forwarding between controllers")
		}
	}
	return nil
}

func (c Config) auditKey() []byte {
	k, _ := audit.DecodeKey(c.Audit.HMACKey) // nil when invalid: Validate names it
	return k
}

// ApplyEnv takes secrets from the environment: MERIDIAN_ADMIN_TOKEN,
// MERIDIAN_HOP_TOKEN, MERIDIAN_GOSSIP_KEY, MERIDIAN_AUDIT_KEY,
// MERIDIAN_ANNOUNCE_KEY.
func (c *Config) ApplyEnv(getenv func(string) string) {
	if v := getenv("MERIDIAN_ADMIN_TOKEN"); v != "" {
		c.AdminToken = v
	}
	if v := getenv("MERIDIAN_HOP_TOKEN"); v != "" {
		c.HopToken = v
	}
	if v := getenv("MERIDIAN_GOSSIP_KEY"); v != "" {
		c.Gossip.Keys = []string{v}
	}
	if v := getenv("MERIDIAN_AUDIT_KEY"); v != "" {
		c.Audit.HMACKey = v
	}
	if v := getenv("MERIDIAN_ANNOUNCE_KEY"); v != "" {
		c.Pods.AnnounceKey = v
	}
}

// checkpointSink hands audit checkpoints to the Raft tier once it is up.
type checkpointSink struct {
	node atomic.Pointer[global.Node]
}

func (s *checkpointSink) PublishCheckpoint(ctx context.Context, cp audit.Checkpoint) error {
	n := s.node.Load()
	if n == nil {
		return errors.New("raft tier not running")
	}
	_, err := n.AppendCheckpoint(ctx, global.CheckpointFromAudit(cp),
		global.WriteOptions{RequestID: "ckpt/" + cp.Controller + "/" + strconv.FormatUint(cp.LastSeq, 10) + "/" + cp.Head[:min(16, len(cp.Head))], Actor: "audit:" + cp.Controller})
	return err
}

// gossipRemotes adapts the gossip view to RemoteSource.
type gossipRemotes struct{ node *gossip.Node }

func (g gossipRemotes) Candidates(now time.Time, model string, chain []uint64, promptTokens int, allowed func(string) bool, cost *gorgo.Model, dst []gorgo.Candidate) []gorgo.Candidate {
	return g.node.View().Candidates(now, model, chain, promptTokens, allowed, cost, dst)
}

func (g gossipRemotes) Serves(model string) (serves, known bool) { return g.node.View().Serves(model) }

func (g gossipRemotes) Unseen(region string) (route.Unseen, bool) {
	rv, ok := g.node.View().Region(region)
	if !ok || rv.Summary == nil {
		return route.Unseen{}, false
	}
	// A summary that was already SentAge old when sent counts as received
	// that much earlier: it shows the region as it was then.
	return route.Unseen{ReceivedAt: rv.ReceivedAt.Add(-rv.SentAge), RTT: rv.RTT, Pods: rv.Summary.Totals().Pods}, true
}

// remoteForwardAddrs lists the forward addresses of every other region's
// controllers (those the failure detector declared dead too: they may be
// back).
func remoteForwardAddrs(n *gossip.Node) []string {
	var out []string
	for _, rv := range n.View().Regions {
		out = append(out, gossipRemotes{n}.ForwardAddrs(rv.Region)...)
	}
	return out
}

func (g gossipRemotes) ForwardAddrs(region string) []string {
	rv, ok := g.node.View().Region(region)
	if !ok {
		return nil
	}
	// Controllers answering pings first; then the suspect ones, which may
	// only have missed a few pings (under load, or a short partition); then
	// those this node's failure detector declared dead, which may yet
	// refute it (a refused connection costs little). A controller
	// advertises its forward address only while it can serve: not while
	// its index catches up after a start, nor once it began to stop.
	var out []string
	for _, st := range []gossip.ControllerState{gossip.StateAlive, gossip.StateSuspect, gossip.StateDead} {
		for _, c := range rv.Controllers {
			if c.ForwardAddr != "" && c.State == st {
				out = append(out, c.ForwardAddr)
			}
		}
	}
	return out
}

// openMulti starts the audit log, the Raft tier and the gossip pool as
// configured, and the admin listener serving the Raft admin API and audit
// queries; ctx bounds the start-up (joins), run is the lifetime of what it
// starts. fallback is the configured policy file, parsed (nil: none). It
// leaves c.mr set, to be closed by closeMulti.
func (c *Controller) openMulti(ctx, run context.Context, cfg *Config, fallback *residency.Policy) error {
	mr := &multiRegion{}
	c.mr = mr

	// Admin listener first: Raft joins and leader forwarding need it.
	if cfg.Raft.DataDir != "" || cfg.Audit.Dir != "" {
		ln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			return fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
		}
		mr.adminLn = ln
		mux := http.NewServeMux()
		// Health answers here too, under the admin listener's own limits:
		// probes keep answering while the API listener is flooded.
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		})
		mux.HandleFunc("GET /readyz", c.Server.serveReady)
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			if h := mr.adminH.Load(); h != nil {
				(*h).ServeHTTP(w, r)
				return
			}
			writeError(w, http.StatusServiceUnavailable, "starting", "the admin API is starting")
		})
		var adminTLS *tls.Config
		if c.tls != nil {
			// Operators and controllers may present a certificate (its
			// identity names them in audit records); the bearer token is
			// required either way.
			adminTLS = c.tls.ServerConfig(false)
		}
		var served net.Listener
		mr.adminS, served = serve("admin", ln, cfg.AdminLimits, adminTLS, mux, c.listenM, c.log)
		c.goRun("admin-http", func() error { return servedUntilClosed(mr.adminS.Serve(served)) })
	}

	if cfg.Audit.Dir != "" {
		acfg := audit.DefaultConfig()
		acfg.Dir, acfg.ControllerID, acfg.HMACKey = cfg.Audit.Dir, cfg.ControllerID, cfg.auditKey()
		if cfg.Audit.CheckpointInterval > 0 {
			acfg.CheckpointInterval = cfg.Audit.CheckpointInterval
		}
		if cfg.Audit.MaxSegmentBytes > 0 {
			acfg.MaxSegmentBytes = cfg.Audit.MaxSegmentBytes
		}
		if cfg.Audit.MaxSegmentAge > 0 {
			acfg.MaxSegmentAge = cfg.Audit.MaxSegmentAge
		}
		log, err := audit.Open(acfg, audit.Deps{Sink: &mr.sink, Registerer: c.Metrics, Logger: c.log})
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		mr.audit = log
	}

	if cfg.Raft.DataDir != "" {
		gcfg := global.DefaultConfig()
		gcfg.NodeID, gcfg.Region, gcfg.DataDir = cfg.ControllerID, cfg.Region, cfg.Raft.DataDir
		gcfg.RaftBind, gcfg.RaftAdvertise = cfg.Raft.Bind, cfg.Raft.Advertise
		gcfg.AdminAddr = c.AdminURL()
		gcfg.AdminToken = cfg.AdminToken
		gcfg.Bootstrap, gcfg.Join = cfg.Raft.Bootstrap, cfg.Raft.Join
		if cfg.Raft.Voters != 0 {
			gcfg.Voters = cfg.Raft.Voters
		}
		if cfg.Raft.VotersPerRegion != 0 {
			gcfg.VotersPerRegion = cfg.Raft.VotersPerRegion
		}
		if cfg.Raft.VoterDownAfter != 0 {
			gcfg.VoterDownAfter = cfg.Raft.VoterDownAfter
		}
		if cfg.Raft.RemoveDownAfter != 0 {
			gcfg.RemoveDownAfter = cfg.Raft.RemoveDownAfter
		}
		if cfg.Raft.WAN {
			gcfg.Timing = global.WANTiming()
		}
		if d := cfg.Raft.ElectionTimeout; d > 0 {
			gcfg.Timing.HeartbeatTimeout, gcfg.Timing.ElectionTimeout, gcfg.Timing.LeaderLeaseTimeout = d, d, d/2
		}
		gcfg.PolicyValidator, gcfg.PolicyCompiler, gcfg.Stranded = PolicyValidator, PolicyCompiler, PolicyStranded
		gcfg.Liveness = mr.liveness
		gcfg.Registerer, gcfg.Logger = c.Metrics, c.log
		gcfg.Now = c.now
		gcfg.Insecure = cfg.Insecure
		if mr.audit != nil {
			// Every privileged action of the admin API, and what the leader
			// does on its own, goes on this controller's chain first.
			gcfg.Audit = mr.audit
		}
		if c.tls != nil {
			// Raft only between controllers of the cluster's CA, both ways.
			gcfg.TLS = identity.RequireControllers(c.tls.ServerConfig(true))
			gcfg.TLSClient = c.tls.ClientConfig("")
			gcfg.AdminTLS = c.tls.ClientConfig("")
		}
		node, err := global.Open(ctx, gcfg)
		if err != nil {
			return fmt.Errorf("raft: %w", err)
		}
		mr.node = node
		mr.sink.node.Store(node)
		if mr.control, err = NewGlobalControl(node, fallback); err != nil {
			return err
		}
		if cfg.Raft.Bootstrap && fallback != nil {
			c.goRun("bootstrap-policy", func() error { return c.applyBootstrapPolicy(node, cfg.PolicyFile, fallback.Source()) })
		}
	} else if fallback != nil || len(cfg.Gossip.Keys) > 0 {
		sc, err := NewStaticControl(fallback)
		if err != nil {
			return err
		}
		mr.control = sc
	}

	admin := http.NewServeMux()
	if mr.node != nil {
		admin.Handle("/v1/global/", mr.node.Handler())
	}
	if mr.audit != nil {
		admin.Handle("/v1/audit/", bearer(cfg.AdminToken, http.StripPrefix("/v1/audit", audit.Handler(mr.audit))))
	}
	if len(cfg.Gossip.Keys) > 0 {
		// Key rotation (meridian gossip keys): each change is recorded in
		// the audit log before it takes effect (guardKeyOp).
		keys := bearer(cfg.AdminToken, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g := mr.gossipRef.Load()
			if g == nil {
				writeError(w, http.StatusServiceUnavailable, "starting", "the gossip pool is starting")
				return
			}
			gossip.GuardedKeysHandler(g, c.guardKeyOp).ServeHTTP(w, r)
		}))
		admin.Handle(gossip.KeysPath, keys)
		admin.Handle(gossip.KeysPath+"/", keys)
		admin.Handle("GET "+gossipSelfPath, bearer(cfg.AdminToken, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			g := mr.gossipRef.Load()
			if g == nil {
				writeError(w, http.StatusServiceUnavailable, "starting", "the gossip pool is starting")
				return
			}
			writeJSON(w, http.StatusOK, gossipSelf{Controller: cfg.ControllerID, Region: cfg.Region, GossipAddr: g.Addr()})
		})))
	}
	if mr.adminLn != nil {
		if err := c.openConsole(run, admin, cfg.AdminToken); err != nil {
			return err
		}
	}
	var h http.Handler = admin
	mr.adminH.Store(&h)

	if len(cfg.Gossip.Keys) > 0 {
		mr.gstateFile = cfg.gossipStateFile()
		st, err := nextEpoch(mr.gstateFile)
		if err != nil {
			return fmt.Errorf("gossip.state_file: %w", err)
		}
		mr.gstate, mr.genEpoch = st, st.Epoch
		tr := NewPodTransport()
		if c.tls != nil {
			tr.TLSClientConfig = c.tls.ClientConfig("")
		}
		mr.adminClient = &http.Client{Transport: tr, Timeout: 5 * time.Second}
		gcfg := gossip.DefaultConfig()
		if cfg.Gossip.Fast {
			fastGossip(&gcfg)
		}
		gcfg.NodeName, gcfg.Region = cfg.ControllerID, cfg.Region
		host, port, err := splitHostPortDefault(cfg.Gossip.Bind, "0.0.0.0", 7947)
		if err != nil {
			return fmt.Errorf("gossip.bind: %w", err)
		}
		gcfg.BindAddr, gcfg.BindPort = host, port
		if cfg.Gossip.Advertise != "" {
			ah, ap, err := splitHostPortDefault(cfg.Gossip.Advertise, "", 0)
			if err != nil {
				return fmt.Errorf("gossip.advertise: %w", err)
			}
			gcfg.AdvertiseAddr, gcfg.AdvertisePort = ah, ap
		}
		gcfg.Join, gcfg.Keys = cfg.Gossip.Join, cfg.Gossip.Keys
		if cfg.Gossip.Label != "" {
			gcfg.Label = cfg.Gossip.Label
		}
		// Advertised once the controller can serve (advertise).
		gcfg.ForwardAddr = ""
		for a, row := range cfg.Gossip.StaticRTT {
			for b, d := range row {
				gcfg.StaticRTT = append(gcfg.StaticRTT, gossip.StaticRTT{A: a, B: b, RTT: d})
			}
		}
		gcfg.StaticRTTOverride = cfg.Gossip.StaticRTTOverride
		share, err := newReplicaShare(c.Registry, c.Decider.Sessions(), func() int { n, _ := c.Server.servingPods(); return n }, time.Now, c.log.With("component", "replicas"), c.Metrics)
		if err != nil {
			return err
		}
		gcfg.Replicas = share
		if cfg.Gossip.ReplicaInterval > 0 {
			gcfg.ReplicaInterval = cfg.Gossip.ReplicaInterval
		}
		gcfg.Registerer, gcfg.Logger = c.Metrics, c.log
		gcfg.Now, gcfg.WrapTransport = c.now, c.deps.WrapGossipTransport
		gcfg.Rejoin = c.rejoinAddrs
		if n := mr.node; n != nil {
			gcfg.OtherRegions = func() bool {
				for _, m := range n.State().Members() {
					if m.Region != cfg.Region {
						return true
					}
				}
				return false
			}
		}
		node, err := gossip.Open(ctx, gcfg)
		if err != nil {
			return fmt.Errorf("gossip: %w", err)
		}
		mr.gossip = node
		mr.gossipRef.Store(node)
		mr.regionGen = node.RegionGeneration
		c.goRun("summary", func() error { return c.runSummaries(run, cfg.SummaryInterval) })
	}

	topo := Topology{Region: cfg.Region, Control: mr.control, HopToken: cfg.HopToken, HopByCertificate: c.tls != nil}
	if n := mr.node; n != nil {
		topo.IsMember = func(id string) bool {
			// The Raft configuration too: it knows a member whose
			// record this node has not applied yet.
			_, ok := n.State().Member(id)
			return ok || n.InConfiguration(id)
		}
	}
	if mr.audit != nil {
		topo.Audit = mr.audit
		if mr.console != nil {
			topo.Audit = consoleAuditor{Auditor: mr.audit, con: mr.console, now: c.now}
		}
	}
	if mr.gossip != nil {
		topo.Remotes = gossipRemotes{mr.gossip}
		topo.Replicas = mr.gossip.Replicas
		if n := mr.node; n != nil {
			topo.Replicas = func() []string {
				return regionReplicas(mr.gossip.Replicas(), n.State().Members(), cfg.Region, cfg.ControllerID)
			}
		}
	}
	c.Server.SetTopology(topo)
	if mr.gossip != nil {
		// After SetTopology: whether to advertise reads the topology
		// (Server.behindPeers).
		c.goRun("advertise", func() error { return c.advertise(run) })
	}

	if mr.node != nil && cfg.AutoFailover.Enabled {
		acfg := global.DefaultAutoFailoverConfig()
		if cfg.AutoFailover.Interval > 0 {
			acfg.Interval = cfg.AutoFailover.Interval
		}
		if cfg.AutoFailover.MinHealthyPods > 0 {
			acfg.MinHealthyPods = cfg.AutoFailover.MinHealthyPods
		}
		if cfg.AutoFailover.Grace > 0 {
			acfg.Grace = cfg.AutoFailover.Grace
		}
		if cfg.AutoFailover.HoldDown > 0 {
			acfg.HoldDown = cfg.AutoFailover.HoldDown
		}
		if cfg.AutoFailover.ReportMaxAge > 0 {
			acfg.ReportMaxAge = cfg.AutoFailover.ReportMaxAge
		}
		c.goRun("auto-failover", func() error { return mr.node.RunAutoFailover(run, acfg, c.observeRegions) })
	}
	return nil
}

// guardKeyOp records a gossip keyring change asked of the admin API
// (gossip_key_install, _use, _remove) in the audit log, with the caller's
// identity, before it takes effect, and refuses it when the record cannot
// be written (gossip.KeyOpGuard), as the Raft tier does for its writes: a
// key change on record is what lets an operator tell who could read the
// pool's traffic when.
func (c *Controller) guardKeyOp(r *http.Request, op gossip.KeyOp, fingerprint string, refused error,
	apply func() (gossip.KeyOpResult, error)) (gossip.KeyOpResult, error) {
	by := global.RequestActor(r)
	act := audit.AdminAction{Action: "gossip_key_" + string(op), Actor: by.Name, Auth: by.Auth, Args: map[string]string{}}
	if fingerprint != "" {
		act.Args["fingerprint"] = fingerprint
	}
	if n := c.mr.node; n != nil {
		act.PolicyVersion = n.State().PolicyVersionString()
	}
	var adm audit.Admin
	if c.mr.audit != nil {
		adm = audit.Admin{Log: c.mr.audit, Origin: c.cfg.Region}
	}
	if refused != nil {
		return gossip.KeyOpResult{}, adm.Refuse(r.Context(), act, refused)
	}
	var res gossip.KeyOpResult
	err := adm.Run(r.Context(), act, func(context.Context) (err error) {
		res, err = apply()
		return err
	})
	return res, err
}

// fastGossip shortens memberlist's intervals for loopback clusters (tests,
// the demo): summaries and liveness spread in well under a second, while
// probe timeouts stay long enough for a loaded machine.
func fastGossip(g *gossip.Config) {
	g.ProbeInterval, g.ProbeTimeout = 400*time.Millisecond, 300*time.Millisecond
	g.GossipInterval, g.PushPullInterval = 50*time.Millisecond, time.Second
	g.SyncInterval, g.PullRetry = 100*time.Millisecond, 500*time.Millisecond
	g.RetryJoinInterval = 500 * time.Millisecond
	g.SuspicionMult = 6
	g.ReplicaInterval = 100 * time.Millisecond
}

// applyBootstrapPolicy applies the configured policy once the new cluster
// has a leader, unless a policy is already committed.
func (c *Controller) applyBootstrapPolicy(node *global.Node, name string, doc []byte) error {
	for attempt := 0; ; attempt++ {
		if _, ok := node.State().Policy(); ok {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := node.ApplyPolicy(ctx, name, doc, "bootstrap policy from the controller configuration",
			global.WriteOptions{RequestID: "bootstrap-policy/" + shaHex(doc), Actor: "controller:" + c.cfg.ControllerID})
		cancel()
		if err == nil {
			c.log.Info("bootstrap residency policy applied", "file", name)
			return nil
		}
		if attempt > 60 {
			return fmt.Errorf("bootstrap policy: %w", err)
		}
		select {
		case <-c.stopping:
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func shaHex(b []byte) string {
	s := sha256.Sum256(b)
	return fmt.Sprintf("%x", s[:8])
}

// runSummaries builds and publishes this region's summary every interval.
func (c *Controller) runSummaries(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// A summary of an index still catching up with the topic would
		// tell the other regions this region holds less than it does, and
		// with several replicas per region the newest summary wins: publish
		// only once caught up (which also marks this controller, in its
		// digest, as one to forward to).
		// One replica per region publishes (PublishesForRegion): they hold
		// the same index, and each summary is pulled by every controller of
		// every other region.
		if c.Ingester.CaughtUp() && c.mr.gossip.PublishesForRegion(3*every) {
			if err := c.publishSummary(); err != nil {
				c.log.Warn("summary not published", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// advertise keeps this controller's forward address in its gossip digest
// once its index has caught up with the topic and it sees the pods its
// replicas see (a replica that has just started cannot serve yet: the
// other regions must not forward to it), and
// withdraws it while the index is rebuilt (a broker reset). A stopping
// controller keeps it until it leaves the pool: it still takes requests
// during its drain delay, and once its listener has closed a forward is
// refused and goes to another replica. The controller is ready only once
// it advertises (readiness).
func (c *Controller) advertise(ctx context.Context) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		addr := ""
		if behind, _ := c.Server.behindPeers(); c.Ingester.CaughtUp() && !behind && c.raftCaughtUp() {
			addr = c.PublicURL()
		}
		if err := c.mr.gossip.SetForwardAddr(addr); err != nil {
			c.log.Warn("forward address not advertised", "err", err)
		} else {
			c.advertised.Store(addr != "")
		}
		c.rememberGossipPeers()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (c *Controller) publishSummary() error {
	now := c.now()
	loads := map[string]*summary.ProfileLoad{}
	models := map[string]bool{}
	for _, p := range c.Registry.Pods() {
		if !c.Index.Alive(p.ID) || !p.Serving(now) {
			continue
		}
		info := p.Info()
		l := loads[info.Profile]
		if l == nil {
			l = &summary.ProfileLoad{Profile: info.Profile}
			loads[info.Profile] = l
		}
		ld := p.Load()
		rate, _ := c.Model.Rate(info.Profile)
		l.Pods++
		l.Running += int(ld.InFlight)
		l.PendingPrefillTokens += int64(route.BacklogTokens(p, now, rate))
		if info.Model != "" {
			models[info.Model] = true
		}
	}
	in := summary.Input{Region: c.cfg.Region, Generation: c.mr.nextGeneration(c.log), BuiltAt: now, BlockSize: c.cfg.BlockSize}
	for m := range models {
		in.Models = append(in.Models, m)
	}
	for _, l := range loads {
		in.Load = append(in.Load, *l)
	}
	s, err := summary.FromIndex(c.Index, in, summary.DefaultBuildConfig())
	if err != nil {
		return err
	}
	return c.mr.gossip.Publish(s)
}

// observeRegions feeds the automatic failover: per region, its own report
// of its serving pods and that report's age (this region from the
// registry, now; the others from their latest summaries held here), its
// controllers' liveness (gossip), which explains a stale report but is no
// evidence by itself, and every other region's view of it: the freshest
// report of it that any controller of that region holds, from the
// controllers' sightings (this controller's own among them).
func (c *Controller) observeRegions(context.Context) global.Observations {
	obs := global.Observations{}
	now := c.now()
	healthy := 0
	for _, p := range c.Registry.Pods() {
		if c.Index.Alive(p.ID) && p.Serving(now) {
			healthy++
		}
	}
	obs[c.cfg.Region] = global.RegionObservation{Controllers: 1, HealthyPods: healthy}
	if c.mr.gossip == nil {
		return obs
	}
	view := c.mr.gossip.View()
	for _, rv := range view.Regions {
		if rv.Region == c.cfg.Region {
			continue
		}
		o := global.RegionObservation{Controllers: len(rv.Controllers), HealthyPods: -1}
		for _, ctl := range rv.Controllers {
			if ctl.State == gossip.StateDead {
				o.DeadControllers++
			}
		}
		if rv.Summary != nil {
			o.HealthyPods, o.ReportAge = rv.Summary.Totals().Pods, rv.Age(now)
		}
		obs[rv.Region] = o
	}
	for region, views := range regionViews(view.Sightings, now) {
		o, ok := obs[region]
		if !ok {
			o = global.RegionObservation{HealthyPods: -1}
		}
		o.Views = views
		obs[region] = o
	}
	return obs
}

// regionViews turns the controllers' sightings into each region's view of
// every other region: the freshest report held by any controller of the
// observing region (a report beats none; between two, the younger).
func regionViews(sightings []gossip.Sighting, now time.Time) map[string]map[string]global.PeerView {
	out := map[string]map[string]global.PeerView{}
	for _, s := range sightings {
		if s.ObserverRegion == s.Region {
			continue
		}
		v := global.PeerView{HealthyPods: -1}
		if s.Pods >= 0 {
			v = global.PeerView{HealthyPods: s.Pods, ReportAge: s.SummaryAge(now)}
		}
		views := out[s.Region]
		if views == nil {
			views = map[string]global.PeerView{}
			out[s.Region] = views
		}
		if cur, ok := views[s.ObserverRegion]; ok && (v.HealthyPods < 0 || (cur.HealthyPods >= 0 && cur.ReportAge <= v.ReportAge)) {
			continue
		}
		views[s.ObserverRegion] = v
	}
	return out
}

// closeMulti stops the cross-region components: gossip first (the region
// leaves the pool), then the audit log (its last checkpoint goes to Raft),
// then the Raft node, then the admin listener.
func (c *Controller) closeMulti(ctx context.Context) error {
	mr := c.mr
	if mr == nil {
		return nil
	}
	var errs []error
	if mr.gossip != nil {
		errs = append(errs, mr.gossip.Close())
	}
	if mr.audit != nil {
		if err := mr.audit.Close(); err != nil {
			if mr.node != nil && (errors.Is(err, global.ErrNoLeader) || mr.node.Health().Leader == "") {
				// The cluster is going away too (no leader took the
				// checkpoint before the close's deadline): the segment is
				// sealed and verifiable; only its last checkpoint has
				// nowhere to go.
				c.log.Warn("final audit checkpoint not published: the raft tier has no leader", "err", err)
			} else {
				errs = append(errs, err)
			}
		}
	}
	if mr.node != nil {
		errs = append(errs, mr.node.Close(ctx))
	}
	if mr.adminS != nil {
		errs = append(errs, mr.adminS.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// killMulti stops the cross-region components as a crash would: gossip
// without leaving the pool, Raft without handing leadership over, the
// audit log without publishing its last checkpoint.
func (c *Controller) killMulti() error {
	mr := c.mr
	if mr == nil {
		return nil
	}
	var errs []error
	if mr.gossip != nil {
		errs = append(errs, mr.gossip.Kill())
	}
	mr.sink.node.Store(nil)
	if mr.node != nil {
		errs = append(errs, mr.node.Kill())
	}
	if mr.audit != nil {
		// Its segment is closed as the process's exit would close it; the
		// checkpoint it would publish has nowhere to go (the sink is
		// cleared), which is what a crash leaves too.
		_ = mr.audit.Close()
	}
	if mr.adminS != nil {
		errs = append(errs, mr.adminS.Close())
	}
	return errors.Join(errs...)
}

// bearer requires "Authorization: Bearer <token>" (constant-time compare of
// SHA-256 digests, so the comparison does not leak the token's length).
func bearer(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		gh := sha256.Sum256([]byte(got))
		if token == "" || !ok || subtle.ConstantTimeCompare(gh[:], want[:]) != 1 {
			writeError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func splitHostPortDefault(addr, defHost string, defPort int) (string, int, error) {
	if addr == "" {
		return defHost, defPort, nil
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q", p)
	}
	return h, port, nil
}

// liveness is a controller's state in this controller's gossip view (alive,
// suspect, dead), for the failover status.
func (mr *multiRegion) liveness(id string) (string, bool) {
	g := mr.gossipRef.Load()
	if g == nil {
		return "", false
	}
	for _, rv := range g.View().Regions {
		for _, c := range rv.Controllers {
			if c.Name == id {
				return string(c.State), true
			}
		}
	}
	return "", false
}

// regionReplicas is the other controllers of region, by id, sorted: those
// gossip counts as live replicas, and the Raft members of the region. A
// controller just started has not yet received its replicas' gossip
// digests (it does not know they are replicas of its region): without the
// Raft members it would know of none, see no pod because it has not read
// their announcements yet, and call itself ready with an empty registry
// (Server.behindPeers). A member that is gone holds a replica that sees no
// pod unready for at most peerReportFresh after its start.
func regionReplicas(live []string, members []global.Member, region, self string) []string {
	out := slices.Clone(live)
	for _, m := range members {
		if m.Region == region && m.ID != self {
			out = append(out, m.ID)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
