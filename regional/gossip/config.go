package gossip

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/coordinate"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/summary"
)

// Config configures one controller's membership of the WAN pool. Zero values
// are not defaults: start from DefaultConfig.
type Config struct {
	// NodeName is the controller id, unique in the pool. Required.
	NodeName string
	// Region is the controller's region. Required.
	Region string

	// BindAddr and BindPort: where to listen, UDP and TCP on the same port.
	// Default 0.0.0.0:7947; port 0 takes an ephemeral port (tests).
	BindAddr string
	BindPort int
	// AdvertiseAddr/AdvertisePort: the address the other controllers dial;
	// it must be routable from every region. Default: the bind address (or a
	// private address of this host when bound to 0.0.0.0) and the bound port.
	AdvertiseAddr string
	AdvertisePort int
	// Join lists seed controllers ("host:port"). Open tries them once.
	// While the node is isolated from every other region (no controller of
	// another region alive for it), it rejoins every RetryJoinInterval
	// through every address it knows: Join, the addresses of every
	// controller it has seen (Peers), and Rejoin's.
	Join              []string
	RetryJoinInterval time.Duration // default 30s
	// Rejoin, if set, gives more addresses to rejoin through (the
	// controller's: the Raft configuration's members, the peers it
	// remembers from before a restart). It is called on the node's worker,
	// at most once per RetryJoinInterval, and only while isolated; it must
	// return within RetryJoinInterval.
	Rejoin func(ctx context.Context) []string
	// OtherRegions, if set, reports whether controllers of other regions
	// exist (the Raft configuration has some): a node that has seen only
	// its own region's is isolated then. Without it, or when it says no,
	// only a node that has seen another region's controllers, or none at
	// all, can be isolated (a single-region pool of replicas is not). It
	// is called with the node's lock held and must not call back into it.
	OtherRegions func() bool

	// Label tags every packet and stream (bound into the encryption as
	// additional data): pools with different labels never talk. Default
	// "meridian-wan".
	Label string
	// Keys are the gossip encryption keys, base64 of 32 bytes (AES-256-GCM;
	// shorter keys are refused). The first encrypts; all decrypt. Required:
	// the pool is never plaintext. When KeyringFile exists it is used
	// instead. Rotate at run time with InstallKey, UseKey and RemoveKey (see
	// keyring.go), which reach the whole pool.
	Keys []string
	// KeyringFile, if set, persists the keyring across restarts: Open reads
	// it when it exists (instead of Keys) and every key operation rewrites
	// it (JSON, mode 0600). Without it a restarted controller starts from
	// Keys again, and cannot rejoin once a rotation removed them.
	KeyringFile string
	// KeyOpTimeout bounds how long InstallKey, UseKey, RemoveKey and a pool
	// listing wait for the other controllers' answers. Default 5s.
	KeyOpTimeout time.Duration

	// ForwardAddr is where other controllers forward requests to this one
	// (its controller-to-controller API), advertised in the digest. Optional,
	// at most 200 bytes.
	ForwardAddr string

	// Timing of memberlist. DefaultConfig is memberlist's WAN preset with
	// probes every 2s (not 5s) and push/pull every 15s (not 60s), as
	// ../shared/reference/substrate.md §2 recommends for a pool of a few
	// controllers per region.
	ProbeInterval       time.Duration // default 2s
	ProbeTimeout        time.Duration // default 1.5s; must exceed the largest RTT and stay below ProbeInterval
	GossipInterval      time.Duration // default 500ms
	GossipNodes         int           // default 4
	PushPullInterval    time.Duration // default 15s: the anti-entropy backstop for summaries
	TCPTimeout          time.Duration // default 30s
	SuspicionMult       int           // default 6
	GossipToTheDeadTime time.Duration // default 60s
	DeadNodeReclaimTime time.Duration // default 60s: a restarted controller may come back on a new address
	// Compression turns on memberlist's LZW compression. Default off: summary
	// bodies are filter fingerprints, which do not compress.
	Compression bool

	// SyncInterval is how often the node refreshes its digest, asks for
	// newer summaries, re-evaluates liveness and rebuilds the view. Default 1s.
	SyncInterval time.Duration
	// SightingInterval is how often the node sends the other controllers
	// its sightings of the other regions (sightings.go), for the Raft
	// leader's automatic failover, which judges reports by the tens of
	// seconds. Default 1s.
	SightingInterval time.Duration
	// PullRetry is how long to wait for a requested summary before asking
	// again. Default 5s.
	PullRetry time.Duration
	// OlderGenerationAfter: a summary of a lower generation than the one
	// held is rejected (counted, logged) until the held one is this old;
	// then it is taken, as the region's controllers evidently restarted
	// without their generation. Default 30s.
	OlderGenerationAfter time.Duration
	// UpdateTimeout bounds the wait for the digest broadcast, LeaveTimeout
	// the wait for the leave broadcast on Close. Defaults 2s and 2s.
	UpdateTimeout time.Duration
	LeaveTimeout  time.Duration
	// MaxSummaryBytes: larger summary bodies are rejected (and counted)
	// before decoding. Default 1 MiB.
	MaxSummaryBytes int
	// SuspectAfterProbes: a controller that has not answered a direct ping
	// for this many probe rounds (each round probes every other controller
	// once) is suspect, and a region with no alive, unsuspected controller
	// is not Live. Default 3.
	SuspectAfterProbes int

	// Coordinate configures the Vivaldi client; nil: coordinate.DefaultConfig().
	Coordinate *coordinate.Config
	// RTTWindow is how many direct ping samples are kept per controller (the
	// direct RTT is their median); RTTMinSamples how many it takes before a
	// controller's RTT counts. Defaults 8 and 3.
	RTTWindow     int
	RTTMinSamples int
	// StaticRTT is the configured RTT matrix (symmetric entries). It is the
	// fallback for a region with no measurement yet, and with
	// StaticRTTOverride it replaces measurements for the regions it names.
	StaticRTT         []StaticRTT
	StaticRTTOverride bool

	// Replicas, when set, is this controller's side of the exchange with
	// the other controllers of its region, every ReplicaInterval (see
	// ReplicaExchange). Default 200ms; 0 with Replicas set is an error.
	Replicas        ReplicaExchange
	ReplicaInterval time.Duration

	// Registerer receives the meridian_gossip_* metrics; nil: not exported.
	Registerer prometheus.Registerer
	// Logger receives the node's and memberlist's logs; nil: discarded.
	Logger *slog.Logger
	// Now is the clock for receive times, ages and liveness; nil: time.Now.
	Now func() time.Time
	// WrapTransport, if set, wraps the UDP/TCP transport (tests inject
	// latency and faults with it; see gossiptest).
	WrapTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
}

// StaticRTT is one entry of the configured RTT matrix.
type StaticRTT struct {
	A, B string
	RTT  time.Duration
}

// DefaultConfig returns the WAN preset. NodeName, Region and Keys must still
// be set.
func DefaultConfig() Config {
	wan := memberlist.DefaultWANConfig()
	return Config{
		BindAddr:             "0.0.0.0",
		BindPort:             7947,
		RetryJoinInterval:    30 * time.Second,
		Label:                "meridian-wan",
		ProbeInterval:        2 * time.Second,
		ProbeTimeout:         1500 * time.Millisecond,
		GossipInterval:       wan.GossipInterval,
		GossipNodes:          wan.GossipNodes,
		PushPullInterval:     15 * time.Second,
		TCPTimeout:           wan.TCPTimeout,
		SuspicionMult:        wan.SuspicionMult,
		GossipToTheDeadTime:  wan.GossipToTheDeadTime,
		DeadNodeReclaimTime:  60 * time.Second,
		SyncInterval:         time.Second,
		SightingInterval:     time.Second,
		PullRetry:            5 * time.Second,
		OlderGenerationAfter: 30 * time.Second,
		UpdateTimeout:        2 * time.Second,
		KeyOpTimeout:         5 * time.Second,
		LeaveTimeout:         2 * time.Second,
		MaxSummaryBytes:      1 << 20,
		SuspectAfterProbes:   3,
		RTTWindow:            8,
		RTTMinSamples:        3,
		ReplicaInterval:      200 * time.Millisecond,
	}
}

// ErrInvalidConfig is wrapped by Validate's errors.
var ErrInvalidConfig = errors.New("invalid gossip config")

// Limits on digest fields (the digest must fit memberlist's 512-byte meta).
const (
	maxNodeNameLen    = 128
	maxForwardAddrLen = 200
)

// Validate checks every field and names each bad one with its value.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...)))
	}
	if !printable(c.NodeName) || len(c.NodeName) > maxNodeNameLen {
		bad("NodeName = %q: want 1..%d printable bytes", c.NodeName, maxNodeNameLen)
	}
	if !printable(c.Region) || len(c.Region) > summary.MaxRegionLen {
		bad("Region = %q: want 1..%d printable bytes", c.Region, summary.MaxRegionLen)
	}
	if net.ParseIP(c.BindAddr) == nil {
		bad("BindAddr = %q: want an IP address", c.BindAddr)
	}
	if c.BindPort < 0 || c.BindPort > math.MaxUint16 {
		bad("BindPort = %d: want 0..65535", c.BindPort)
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		bad("AdvertiseAddr = %q: want an IP address or empty", c.AdvertiseAddr)
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > math.MaxUint16 {
		bad("AdvertisePort = %d: want 0..65535", c.AdvertisePort)
	}
	for i, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			bad("Join[%d] = %q: want host:port", i, j)
		}
	}
	if c.Replicas != nil && (c.ReplicaInterval < time.Millisecond || c.ReplicaInterval > time.Minute) {
		bad("ReplicaInterval = %v: want 1ms..1m", c.ReplicaInterval)
	}
	if c.Label == "" || len(c.Label) > memberlist.LabelMaxSize {
		bad("Label = %q: want 1..%d bytes", c.Label, memberlist.LabelMaxSize)
	}
	if len(c.Keys) == 0 {
		bad("Keys: at least one key is required (the pool is always encrypted)")
	}
	if _, err := c.keys(); err != nil {
		bad("%v", err)
	}
	if len(c.ForwardAddr) > maxForwardAddrLen || (c.ForwardAddr != "" && !printable(c.ForwardAddr)) {
		bad("ForwardAddr = %q: want at most %d printable bytes", c.ForwardAddr, maxForwardAddrLen)
	}
	positive := func(name string, d time.Duration) {
		if d <= 0 {
			bad("%s = %v: want > 0", name, d)
		}
	}
	positive("RetryJoinInterval", c.RetryJoinInterval)
	positive("ProbeInterval", c.ProbeInterval)
	positive("ProbeTimeout", c.ProbeTimeout)
	if c.ProbeTimeout >= c.ProbeInterval {
		bad("ProbeTimeout = %v: want below ProbeInterval (%v): memberlist drops acks after the interval", c.ProbeTimeout, c.ProbeInterval)
	}
	positive("GossipInterval", c.GossipInterval)
	positive("PushPullInterval", c.PushPullInterval)
	positive("TCPTimeout", c.TCPTimeout)
	positive("GossipToTheDeadTime", c.GossipToTheDeadTime)
	positive("SyncInterval", c.SyncInterval)
	positive("SightingInterval", c.SightingInterval)
	positive("PullRetry", c.PullRetry)
	positive("OlderGenerationAfter", c.OlderGenerationAfter)
	positive("UpdateTimeout", c.UpdateTimeout)
	positive("LeaveTimeout", c.LeaveTimeout)
	positive("KeyOpTimeout", c.KeyOpTimeout)
	if c.DeadNodeReclaimTime < 0 {
		bad("DeadNodeReclaimTime = %v: want >= 0", c.DeadNodeReclaimTime)
	}
	if c.GossipNodes < 1 {
		bad("GossipNodes = %d: want >= 1", c.GossipNodes)
	}
	if c.SuspicionMult < 1 {
		bad("SuspicionMult = %d: want >= 1", c.SuspicionMult)
	}
	if c.MaxSummaryBytes < 1<<10 || c.MaxSummaryBytes > 16<<20 {
		bad("MaxSummaryBytes = %d: want 1 KiB..16 MiB", c.MaxSummaryBytes)
	}
	if c.SuspectAfterProbes < 1 {
		bad("SuspectAfterProbes = %d: want >= 1", c.SuspectAfterProbes)
	}
	if c.RTTWindow < 1 || c.RTTWindow > 256 {
		bad("RTTWindow = %d: want 1..256", c.RTTWindow)
	}
	if c.RTTMinSamples < 1 || c.RTTMinSamples > c.RTTWindow {
		bad("RTTMinSamples = %d: want 1..RTTWindow (%d)", c.RTTMinSamples, c.RTTWindow)
	}
	if c.Coordinate != nil && (c.Coordinate.Dimensionality < 1 || int(c.Coordinate.Dimensionality) > maxDims || c.Coordinate.LatencyFilterSize < 1) {
		bad("Coordinate: Dimensionality = %d (want 1..%d), LatencyFilterSize = %d (want >= 1)", c.Coordinate.Dimensionality, maxDims, c.Coordinate.LatencyFilterSize)
	}
	seen := map[[2]string]time.Duration{}
	for i, e := range c.StaticRTT {
		if !printable(e.A) || !printable(e.B) || e.A == e.B {
			bad("StaticRTT[%d] = %s-%s: want two different region names", i, e.A, e.B)
			continue
		}
		if e.RTT <= 0 || e.RTT > 10*time.Second {
			bad("StaticRTT[%d] (%s-%s) RTT = %v: want in (0, 10s]", i, e.A, e.B, e.RTT)
		}
		k := pairKey(e.A, e.B)
		if prev, dup := seen[k]; dup && prev != e.RTT {
			bad("StaticRTT[%d] (%s-%s) RTT = %v contradicts an earlier entry (%v)", i, e.A, e.B, e.RTT, prev)
		}
		seen[k] = e.RTT
	}
	return errors.Join(errs...)
}

func pairKey(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// keys decodes Keys.
func (c *Config) keys() ([][]byte, error) {
	out := make([][]byte, 0, len(c.Keys))
	for i, k := range c.Keys {
		b, err := decodeKey(k)
		if err != nil {
			//lint:ignore ST1005 it starts with the field's Go name, as Validate's messages do
			return nil, fmt.Errorf("Keys[%d]: %w", i, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// KeyBytes is the size of a gossip key: AES-256. Secrets shorter than 32
// bytes are refused everywhere in Meridian.
const KeyBytes = 32

// decodeKey reads a base64 gossip key of KeyBytes bytes.
func decodeKey(k string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(k))
	if err != nil {
		return nil, fmt.Errorf("not base64: %v", err)
	}
	if len(b) != KeyBytes {
		return nil, fmt.Errorf("%d bytes, want %d (AES-256; make one with: head -c 32 /dev/urandom | base64)", len(b), KeyBytes)
	}
	return b, nil
}

func printable(s string) bool {
	return s != "" && utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return r < 0x21 || r == 0x7f }) < 0
}
