package global

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// Timing holds the Raft timeouts. Use LANTiming inside one region or on
// loopback, WANTiming when voters are regions apart.
type Timing struct {
	// HeartbeatTimeout: a follower without contact from the leader for this
	// long starts an election. LAN 1s, WAN 1.5s.
	HeartbeatTimeout time.Duration
	// ElectionTimeout: a candidate without a winner for this long starts a
	// new election. Must be >= HeartbeatTimeout. LAN 1s, WAN 1.5s.
	ElectionTimeout time.Duration
	// LeaderLeaseTimeout: a leader without contact with a quorum for this
	// long steps down. Must be <= HeartbeatTimeout. LAN 500ms, WAN 1.5s.
	LeaderLeaseTimeout time.Duration
	// CommitTimeout: the longest a follower waits to learn a commit index
	// without new entries. LAN 50ms, WAN 100ms.
	CommitTimeout time.Duration
	// SnapshotInterval: how often the log is checked for a snapshot. 120s.
	SnapshotInterval time.Duration
	// SnapshotThreshold: log entries since the last snapshot before one is
	// taken. 8192.
	SnapshotThreshold uint64
	// TrailingLogs: entries kept after a snapshot, so a lagging follower can
	// catch up without installing a snapshot. 10240.
	TrailingLogs uint64
}

// LANTiming is hashicorp/raft's default timing, for voters in one region or
// on loopback.
func LANTiming() Timing {
	return Timing{
		HeartbeatTimeout:   time.Second,
		ElectionTimeout:    time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		SnapshotInterval:   120 * time.Second,
		SnapshotThreshold:  8192,
		TrailingLogs:       10240,
	}
}

// WANTiming is for voters regions apart (inter-voter RTT up to ~250 ms):
// heartbeat, election and lease 1.5s, commit 100ms. A leader lost in a crash
// is replaced, and a failover written meanwhile commits, in about 2.6 s (4 s
// at worst) plus a few round trips: well within HoldTimeout. The request
// path does not notice either way, as it reads the local state.
//
// Why 1.5s. hashicorp/raft's follower checks for contact at random
// intervals of 1-2 HeartbeatTimeouts and campaigns once it has heard
// nothing for one, so a crashed leader is noticed after 1 to 3 of them
// (about 1.75 on average); pre-vote, vote and the first commit add three
// round trips. Measured on loopback (BenchmarkLeaderReplicaFailover, 3
// regions x 2 replicas, a loaded 2-core machine), kill to a committed
// failover write: median 2.2 s with 1 s, 2.6 s (4.0 s worst) with 1.5 s,
// 3.5 s with 2 s, 9.2 s (13.8 s worst) with the 5 s this preset had, which
// missed the 5 s a failover may take and HoldTimeout (7 s).
//
// Against that, the leader heartbeats each follower every 0.1-0.2
// HeartbeatTimeout plus a round trip: with 1.5s, every 150-300 ms plus up
// to 250 ms, so a follower (or a leader checking its lease) gives up only
// once about three contacts in a row have failed, more than one TCP
// retransmission (RTO ~ RTT + 200 ms) costs; 1.5s is also ten times the
// example deployment's worst RTT (135 ms). A lone follower cut off for that
// long does not depose a leader the others still hear (pre-vote and leader
// stickiness), and the lease equal to the heartbeat timeout keeps a leader
// from stepping down sooner than its followers would replace it.
// LANTiming's 1s would leave two contacts of margin at 250 ms RTT. Voters
// starved of CPU for a second or more, or links slower than 250 ms, need a
// longer timing (raft.election_timeout in a controller's configuration).
func WANTiming() Timing {
	t := LANTiming()
	t.HeartbeatTimeout = 1500 * time.Millisecond
	t.ElectionTimeout = 1500 * time.Millisecond
	t.LeaderLeaseTimeout = 1500 * time.Millisecond
	t.CommitTimeout = 100 * time.Millisecond
	return t
}

// Config configures one node of the global tier.
type Config struct {
	// NodeID is the stable Raft server id of this controller (never an
	// address). Required.
	NodeID string
	// Region is the region this controller serves. Required.
	Region string
	// DataDir holds raft/wal (the log), raft/snapshots and, for a lost-quorum
	// recovery, raft/peers.json. Required; created if missing.
	DataDir string

	// RaftBind is the TCP address the Raft transport listens on. Default
	// "127.0.0.1:7400"; port 0 picks a free port.
	RaftBind string
	// RaftAdvertise is the address other nodes dial; default: the bound
	// address (which must then not be unspecified).
	RaftAdvertise string
	// TLS, if set, makes the Raft transport mutual TLS. It serves accepted
	// connections: it must hold this node's certificate (Certificates,
	// GetCertificate or GetConfigForClient) and the CA peers chain to
	// (ClientCAs, or GetConfigForClient, as identity.Source.ServerConfig
	// does); the transport always requires and verifies a client
	// certificate (tls.RequireAndVerifyClientCert), whatever ClientAuth
	// says. Wrap it in identity.RequireControllers so that only controller
	// certificates of the CA (not an operator's or a gateway's) may speak
	// Raft. Unless TLSClient is set it also dials peers, and must then
	// present a certificate and verify them (RootCAs). A peer that does not
	// complete the handshake within the transport timeout is dropped.
	// Default: plain TCP, allowed only on a loopback RaftBind or with
	// Insecure.
	TLS *tls.Config
	// TLSClient, if set, is the config used to dial peers (with TLS): it
	// must present this node's certificate (Certificates or
	// GetClientCertificate) and verify the peer (RootCAs, or
	// VerifyConnection, as identity.Source.ClientConfig does). An empty
	// ServerName is set to the host of the dialled address. Default: TLS.
	TLSClient *tls.Config
	// Insecure allows plain TCP Raft on a non-loopback RaftBind and http://
	// admin URLs (AdminAddr, Join) of non-loopback hosts: anyone who can
	// reach the port could then rewrite the replicated state, and the admin
	// token crosses the network in clear. Open logs a warning when it is
	// used. Default false.
	Insecure bool
	// StreamLayer, if set, replaces RaftBind/RaftAdvertise/TLS: Raft uses it
	// as its network (tests use it to partition nodes).
	StreamLayer raft.StreamLayer

	// AdminAddr is the advertised base URL of this controller's admin API
	// ("http://10.0.0.5:8081"); the other nodes forward writes to it when this
	// node leads. Required.
	AdminAddr string
	// AdminToken is the bearer token of the admin API, shared by the cluster
	// (forwarded requests carry it). Required.
	AdminToken string
	// HTTPClient is used to forward requests to the leader and to join; it
	// must carry the TLS settings of the admin API if it uses https. Default: a
	// client of its own (using AdminTLS), closed with the node.
	HTTPClient *http.Client
	// AdminTLS is the TLS config of the node's own HTTP client when
	// HTTPClient is nil: the CA the other controllers' admin APIs chain to
	// and, for a mutual admin listener, this node's certificate
	// (identity.Source.ClientConfig). Required with https:// admin URLs when
	// HTTPClient is nil.
	AdminTLS *tls.Config

	// Bootstrap makes this node create a new cluster with itself as the only
	// voter if it has no Raft state yet. Exactly one node of a new cluster
	// bootstraps; the others Join.
	Bootstrap bool
	// Join lists admin URLs of existing members; a node with no Raft state
	// asks them (in turn, until one accepts) to add it.
	Join []string
	// Voters is how many voters the leader keeps: 1 (a single node), 3 or 5.
	// Joining nodes are added as non-voters and promoted, once caught up,
	// while there are fewer voters, spread across regions (see
	// VotersPerRegion and voters.go). Default 3.
	Voters int
	// VotersPerRegion caps the voters one region holds when the cluster
	// spans three regions or more (with two regions the cap is at least 2:
	// three voters, two and one; with one region it is Voters). Default 1:
	// losing a region, or any one controller, loses at most one voter.
	VotersPerRegion int
	// VoterDownAfter: a voter that has not answered the leader's health
	// checks for this long is replaced by a caught-up member (of its region
	// when it has one), promoted first, then demoted. It keeps its seat
	// while no member can take it. Default 10s: longer than a rolling
	// restart's stop and start of one controller.
	VoterDownAfter time.Duration
	// RemoveDownAfter: a member that has not answered for this long is
	// removed from the Raft configuration and the member list (a
	// controller that comes back joins again). 0: never. Default 24h.
	// Every change of membership the leader makes (promote, demote,
	// remove) is recorded in Audit before it is made.
	RemoveDownAfter time.Duration

	// Timing is the Raft timing. Default LANTiming().
	Timing Timing
	// HoldTimeout bounds how long a write waits for a leader (retrying with
	// the same request id across leader changes) before it fails with
	// ErrNoLeader. Default 7s.
	HoldTimeout time.Duration
	// MaxStale: a follower without contact from a leader for longer than this
	// reports Health.Stale. Default 3x HeartbeatTimeout.
	MaxStale time.Duration
	// ReconcileInterval is how often the leader checks membership (own
	// record, promotion of caught-up non-voters). Default 1s.
	ReconcileInterval time.Duration
	// PromoteMaxLag is how far (in log entries) a non-voter may trail the
	// leader's commit index to be promoted. Default 64.
	PromoteMaxLag uint64
	// SnapshotRetain is the number of snapshots kept on disk. Default 2.
	SnapshotRetain int
	// WALSegmentSize is the size of a raft-wal segment file in bytes. Default
	// 64 MiB (raft-wal's default); tests use less.
	WALSegmentSize int

	// PolicyValidator checks a policy document before it is proposed (on the
	// accepting node and again on the leader) and returns the version the
	// document declares. name is the file name, for messages. nil accepts any
	// non-empty document (the integrator wires the residency package in).
	PolicyValidator func(name string, doc []byte) (version string, err error)
	// PolicyCompiler turns the active document into what the router
	// evaluates; its result travels in the same State snapshot
	// (State.CompiledPolicy). A result with an ID() string method names
	// the policy in State.PolicyVersionString. nil: no compiled form.
	PolicyCompiler func(doc []byte) (any, error)
	// Stranded names the traffic the compiled policy would leave with no
	// region to go to if the regions down reports were down (the
	// integrator wires residency.Policy.Stranded in). A failover that
	// strands traffic that was not stranded before is refused unless
	// forced, naming it. nil: no such check.
	Stranded func(compiled any, down func(region string) bool) []string
	// Liveness reports a controller's liveness as this node sees it
	// (the integrator wires gossip in: alive, suspect, dead), for the
	// failover status; ok false when it knows nothing of it. nil: not
	// reported.
	Liveness func(controllerID string) (state string, ok bool)

	// Audit is where the node records the privileged actions it handles
	// (the controller's audit log, a *audit.Log): policy applies,
	// failovers, failover targets, membership changes and checkpoints
	// posted to the admin API, as admin_action records. Recording fails
	// closed: an action whose record cannot be written is refused. nil:
	// nothing is recorded (tests of the tier alone; a controller always
	// sets it).
	Audit AuditLog

	// Registerer receives the metrics; nil: metrics are not exported.
	Registerer prometheus.Registerer
	// Logger for the node and Raft; nil: discard.
	Logger *slog.Logger
	// Now is the clock used to stamp commands and measure staleness; nil:
	// time.Now.
	Now func() time.Time
}

// DefaultConfig returns a Config with every optional field at its default.
// NodeID, Region, DataDir, AdminAddr and AdminToken must still be set.
func DefaultConfig() Config {
	t := LANTiming()
	return Config{
		RaftBind:          "127.0.0.1:7400",
		Voters:            3,
		VotersPerRegion:   1,
		VoterDownAfter:    10 * time.Second,
		RemoveDownAfter:   24 * time.Hour,
		Timing:            t,
		HoldTimeout:       7 * time.Second,
		MaxStale:          3 * t.HeartbeatTimeout,
		ReconcileInterval: time.Second,
		PromoteMaxLag:     64,
		SnapshotRetain:    2,
		WALSegmentSize:    64 << 20,
	}
}

// Validate checks the configuration; errors name the field and the value.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if rej := validID("NodeID", c.NodeID); rej != nil {
		bad("global config: NodeID: %s", rej.Message)
	}
	if rej := validRegion(c.Region); rej != nil {
		bad("global config: Region: %s", rej.Message)
	}
	if c.DataDir == "" {
		bad("global config: DataDir must be set")
	}
	if c.StreamLayer == nil && c.RaftBind == "" {
		bad("global config: RaftBind must be set (or StreamLayer)")
	}
	if c.StreamLayer == nil && c.RaftBind != "" {
		host, _, err := net.SplitHostPort(c.RaftBind)
		switch {
		case err != nil:
			bad("global config: RaftBind %q: want host:port", c.RaftBind)
		case c.TLS == nil && !c.Insecure && !loopbackHost(host):
			bad("global config: RaftBind %q is not a loopback address and TLS is not set: anyone who reaches the port could rewrite the replicated state; set TLS (mutual) or, knowingly, Insecure", c.RaftBind)
		}
	}
	if c.StreamLayer == nil && c.TLS != nil {
		for _, e := range checkRaftTLS(c.TLS, c.TLSClient) {
			bad("global config: %s", e)
		}
	}
	if c.TLSClient != nil && c.TLS == nil {
		bad("global config: TLSClient is set but TLS is not: set both (the transport is mutual TLS)")
	}
	https := false
	checkAdminURL := func(field, raw string) {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("global config: %s %q must be an http:// or https:// base URL", field, raw)
			return
		}
		https = https || u.Scheme == "https"
		if u.Scheme == "http" && !c.Insecure && !loopbackHost(u.Hostname()) {
			bad("global config: %s %q is plain http to a non-loopback host: the admin token would cross the network in clear; use https or, knowingly, Insecure", field, raw)
		}
	}
	checkAdminURL("AdminAddr", c.AdminAddr)
	if c.AdminToken == "" {
		bad("global config: AdminToken must be set (the admin API is always authenticated)")
	}
	for i, j := range c.Join {
		checkAdminURL(fmt.Sprintf("Join[%d]", i), j)
	}
	if https && c.HTTPClient == nil && c.AdminTLS == nil {
		bad("global config: https admin URLs need AdminTLS (or an HTTPClient carrying the admin TLS settings)")
	}
	if c.Bootstrap && len(c.Join) > 0 {
		bad("global config: Bootstrap and Join are exclusive (one node bootstraps, the others join)")
	}
	switch c.Voters {
	case 1, 3, 5:
	default:
		bad("global config: Voters = %d: must be 1, 3 or 5", c.Voters)
	}
	if c.VotersPerRegion < 1 || c.VotersPerRegion > 5 {
		bad("global config: VotersPerRegion = %d: must be 1..5", c.VotersPerRegion)
	}
	if c.VoterDownAfter <= 0 {
		bad("global config: VoterDownAfter = %v: must be > 0", c.VoterDownAfter)
	}
	if c.RemoveDownAfter < 0 || (c.RemoveDownAfter > 0 && c.RemoveDownAfter < c.VoterDownAfter) {
		bad("global config: RemoveDownAfter = %v: must be 0 (never) or at least VoterDownAfter (%v)", c.RemoveDownAfter, c.VoterDownAfter)
	}
	t := c.Timing
	if t.HeartbeatTimeout < 5*time.Millisecond {
		bad("global config: Timing.HeartbeatTimeout = %v: must be at least 5ms", t.HeartbeatTimeout)
	}
	if t.ElectionTimeout < t.HeartbeatTimeout {
		bad("global config: Timing.ElectionTimeout = %v: must be >= HeartbeatTimeout (%v)", t.ElectionTimeout, t.HeartbeatTimeout)
	}
	if t.LeaderLeaseTimeout < 5*time.Millisecond || t.LeaderLeaseTimeout > t.HeartbeatTimeout {
		bad("global config: Timing.LeaderLeaseTimeout = %v: must be between 5ms and HeartbeatTimeout (%v)", t.LeaderLeaseTimeout, t.HeartbeatTimeout)
	}
	if t.CommitTimeout < time.Millisecond {
		bad("global config: Timing.CommitTimeout = %v: must be at least 1ms", t.CommitTimeout)
	}
	if t.SnapshotInterval < 5*time.Millisecond {
		bad("global config: Timing.SnapshotInterval = %v: must be at least 5ms", t.SnapshotInterval)
	}
	if t.SnapshotThreshold == 0 {
		bad("global config: Timing.SnapshotThreshold must be > 0")
	}
	if c.HoldTimeout <= 0 {
		bad("global config: HoldTimeout = %v: must be > 0", c.HoldTimeout)
	}
	if c.MaxStale <= 0 {
		bad("global config: MaxStale = %v: must be > 0", c.MaxStale)
	}
	if c.ReconcileInterval <= 0 {
		bad("global config: ReconcileInterval = %v: must be > 0", c.ReconcileInterval)
	}
	if c.SnapshotRetain < 1 {
		bad("global config: SnapshotRetain = %d: must be >= 1", c.SnapshotRetain)
	}
	if c.WALSegmentSize < 64<<10 {
		bad("global config: WALSegmentSize = %d: must be at least 64 KiB", c.WALSegmentSize)
	}
	return errors.Join(errs...)
}

// insecureUses describes what Insecure allows in this configuration:
// plain Raft on a non-loopback address, plain http admin URLs of
// non-loopback hosts.
func (c *Config) insecureUses() []string {
	var out []string
	if c.StreamLayer == nil && c.TLS == nil {
		if host, _, err := net.SplitHostPort(c.RaftBind); err == nil && !loopbackHost(host) {
			out = append(out, fmt.Sprintf("the raft transport on %s is plain TCP: anyone who reaches it can rewrite the replicated state", c.RaftBind))
		}
	}
	for _, raw := range append([]string{c.AdminAddr}, c.Join...) {
		if u, err := url.Parse(raw); err == nil && u.Scheme == "http" && !loopbackHost(u.Hostname()) {
			out = append(out, fmt.Sprintf("admin URL %s is plain http: the admin token crosses the network in clear", raw))
		}
	}
	return out
}

// loopbackHost reports whether host (of a bind address or URL) is a
// loopback address or localhost; "" (every interface) is not.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkRaftTLS checks that the transport's TLS can be mutual: the server
// side has a certificate and a CA to verify clients with, the client side
// presents a certificate and verifies the server.
func checkRaftTLS(srv, cli *tls.Config) []string {
	var out []string
	if len(srv.Certificates) == 0 && srv.GetCertificate == nil && srv.GetConfigForClient == nil {
		out = append(out, "TLS has no certificate (Certificates, GetCertificate or GetConfigForClient)")
	}
	if srv.ClientCAs == nil && srv.GetConfigForClient == nil {
		out = append(out, "TLS has no ClientCAs: Raft peers must present a certificate of the cluster CA (mutual TLS)")
	}
	field := "TLSClient"
	if cli == nil {
		cli, field = srv, "TLS"
	}
	if len(cli.Certificates) == 0 && cli.GetClientCertificate == nil {
		out = append(out, field+" presents no client certificate (Certificates or GetClientCertificate): peers require one")
	}
	if cli.InsecureSkipVerify && cli.VerifyConnection == nil && cli.VerifyPeerCertificate == nil {
		out = append(out, field+" skips server verification without a VerifyConnection of its own")
	}
	if !cli.InsecureSkipVerify && cli.RootCAs == nil {
		out = append(out, field+" has no RootCAs: peers would be verified against the system roots, not the cluster CA")
	}
	return out
}
