package global

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
)

// Node is one controller's member of the global Raft group. It owns the Raft
// instance, its storage and transport, and the goroutines that watch
// leadership, report health and (on the leader) reconcile membership.
type Node struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	m       *metrics
	fsm     *fsm
	raft    *raft.Raft
	wal     *wal.WAL
	logs    raft.LogStore // the WAL behind Raft's log cache
	trans   *raft.NetworkTransport
	layer   raft.StreamLayer // the transport's network, also for reachability checks
	stable  *stableStore     // Raft's view of the WAL as its stable store
	httpc   *http.Client
	ownHTTP bool
	obs     *raft.Observer
	obsCh   chan raft.Observation

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
	killed atomic.Bool // Kill: no leadership transfer on the way out
	once   sync.Once
	done   chan struct{}
	err    error

	hadState bool // Raft state existed when the node opened
	openedAt time.Time
	openLast uint64      // the log's last index when the node opened
	caughtUp atomic.Bool // see CaughtUp; latches

	mu       sync.Mutex
	leaderCh chan struct{} // closed and replaced on every leader change
	stateCh  chan struct{} // closed and replaced on every state change

	leadMu     sync.Mutex // serialises starting and stopping the leader loop
	leadCancel context.CancelFunc
	leadDone   chan struct{} // nil when the leader loop is not running
}

// Health is this node's view of the Raft group, for /readyz detail and
// metrics. A stale node keeps serving its last committed State.
type Health struct {
	NodeID    string `json:"node_id"`
	Region    string `json:"region"`
	RaftState string `json:"raft_state"`
	// Leader is the leader's node id ("" when none is known).
	Leader     string `json:"leader,omitempty"`
	LeaderAddr string `json:"leader_addr,omitempty"`
	// LastContact is the time since the leader was last heard from: 0 on the
	// leader, -1 if never.
	LastContact time.Duration `json:"last_contact_ns"`
	// Stale is true when no leader was heard from within MaxStale: writes fail
	// and the state may be behind the cluster's.
	Stale         bool   `json:"stale"`
	Term          uint64 `json:"term"`
	AppliedIndex  uint64 `json:"applied_index"`
	CommitIndex   uint64 `json:"commit_index"`
	LastIndex     uint64 `json:"last_index"`
	StateIndex    uint64 `json:"state_index"`
	PolicyVersion uint64 `json:"policy_version"`
}

// Open starts the node: it opens (or creates) the Raft storage under
// cfg.DataDir, applies a pending lost-quorum recovery (DataDir/raft/peers.json,
// see doc.go), bootstraps or joins as configured, and starts Raft. Close
// releases everything.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("open global node: %w", err)
	}
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger,
		now:      cfg.Now,
		httpc:    cfg.HTTPClient,
		leaderCh: make(chan struct{}),
		stateCh:  make(chan struct{}),
		done:     make(chan struct{}),
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.log = n.log.With("component", "global", "node", cfg.NodeID)
	for _, use := range cfg.insecureUses() {
		n.log.Warn("INSECURE (insecure is set): " + use)
	}
	if n.now == nil {
		n.now = time.Now
	}
	if n.httpc == nil {
		n.httpc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second, TLSClientConfig: cfg.AdminTLS}}
		n.ownHTTP = true
	}
	n.m = newMetrics(cfg.Registerer, cfg.Region)
	n.fsm = newFSM(cfg.PolicyCompiler)
	n.fsm.observe = func(o op, res *Result, st *State) {
		n.m.observeCommand(o, res, st)
		if res.Changed && !res.Duplicate {
			n.signalStateChange()
		}
	}
	n.fsm.onRestore = n.signalStateChange

	if err := n.openRaft(); err != nil {
		n.release()
		return nil, err
	}
	n.m.setState(n.State()) // the gauges hold the restored state from the first scrape
	n.openedAt, n.openLast = time.Now(), n.raft.LastIndex()
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.obsCh = make(chan raft.Observation, 64)
	n.obs = raft.NewObserver(n.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(n.obs)
	n.wg.Add(2)
	go n.observeLoop()
	go n.healthLoop()
	if len(cfg.Join) > 0 && (!n.hadState || n.membershipStale()) {
		// A new node joins; a known one whose addresses changed (or whose
		// record this replica has not seen yet) joins again, which updates
		// its record and its Raft address and keeps its suffrage.
		n.wg.Add(1)
		go n.joinLoop()
	}
	n.log.Info("global node open", "raft_addr", n.trans.LocalAddr(), "admin_addr", cfg.AdminAddr, "bootstrap", cfg.Bootstrap)
	return n, nil
}

func (n *Node) raftConfig() *raft.Config {
	t := n.cfg.Timing
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.NodeID)
	rc.HeartbeatTimeout = t.HeartbeatTimeout
	rc.ElectionTimeout = t.ElectionTimeout
	rc.LeaderLeaseTimeout = t.LeaderLeaseTimeout
	rc.CommitTimeout = t.CommitTimeout
	rc.SnapshotInterval = t.SnapshotInterval
	rc.SnapshotThreshold = t.SnapshotThreshold
	rc.TrailingLogs = t.TrailingLogs
	rc.ShutdownOnRemove = false
	rc.NoLegacyTelemetry = true
	rc.Logger = newHCLog(n.log, "raft")
	return rc
}

func (n *Node) openRaft() error {
	raftDir := filepath.Join(n.cfg.DataDir, "raft")
	walDir := filepath.Join(raftDir, "wal")
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return fmt.Errorf("open global node: create %s: %w", walDir, err)
	}
	w, err := wal.Open(walDir, wal.WithLogger(newHCLog(n.log, "raft-wal")), wal.WithSegmentSize(n.cfg.WALSegmentSize))
	if err != nil {
		return fmt.Errorf("open global node: raft-wal in %s: %w", walDir, err)
	}
	n.wal, n.logs = w, w
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, n.cfg.SnapshotRetain, newHCLog(n.log, "raft-snapshot"))
	if err != nil {
		return fmt.Errorf("open global node: snapshot store in %s: %w", raftDir, err)
	}
	timeout := min(max(10*n.cfg.Timing.HeartbeatTimeout, time.Second), 10*time.Second)
	layer := n.cfg.StreamLayer
	if layer == nil {
		sl, err := newStreamLayer(n.cfg.RaftBind, n.cfg.RaftAdvertise, n.cfg.TLS, n.cfg.TLSClient, timeout, n.rejectedHandshake)
		if err != nil {
			return fmt.Errorf("open global node: %w", err)
		}
		layer = sl
	}
	n.layer = layer
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  layer,
		MaxPool: 3,
		Timeout: timeout,
		Logger:  newHCLog(n.log, "raft-net"),
		// No pipelined replication (1 RPC in flight per follower). With
		// raft v1.8.0's pipeline, a follower answering an append with a
		// failure ends the pipeline's reader while its sender may still
		// park on the pipeline's channel: replication to that follower
		// stops for good while heartbeats go on (no election heals it),
		// and the node's Shutdown never returns (TestLinearizable's
		// cluster close hung on it under CPU load). HashiCorp measured
		// pipelining to gain little at our rates (raft PR #541).
		MaxRPCsInFlight: 1,
	})
	logs := raft.LogStore(w)
	if cache, err := raft.NewLogCache(512, w); err == nil {
		logs = cache
	}
	rc := n.raftConfig()

	peersFile := filepath.Join(raftDir, "peers.json")
	if _, err := os.Stat(peersFile); err == nil {
		if err := recoverFromPeersFile(rc, logs, w, snaps, n.trans, peersFile); err != nil {
			return fmt.Errorf("open global node: %w", err)
		}
		n.log.Warn("recovered the raft configuration from peers.json; the file was renamed to peers.json.applied", "file", peersFile)
	}

	has, err := raft.HasExistingState(logs, w, snaps)
	if err != nil {
		return fmt.Errorf("open global node: check raft state: %w", err)
	}
	n.hadState = has
	if n.cfg.Bootstrap && !has {
		conf := raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter,
			ID:       rc.LocalID,
			Address:  n.trans.LocalAddr(),
		}}}
		if err := raft.BootstrapCluster(rc, logs, w, snaps, n.trans, conf); err != nil {
			return fmt.Errorf("open global node: bootstrap: %w", err)
		}
	}
	n.stable = &stableStore{s: w}
	r, err := raft.NewRaft(rc, n.fsm, logs, n.stable, snaps, n.trans)
	if err != nil {
		return fmt.Errorf("open global node: start raft: %w", err)
	}
	n.raft = r
	return nil
}

// rejectedHandshake counts and logs (at debug: a scan must not flood the
// log) an incoming Raft connection whose TLS handshake failed.
func (n *Node) rejectedHandshake(err error) {
	n.m.tlsRejected.Inc()
	n.log.Debug("raft connection refused", "err", err)
}

// release frees what openRaft acquired (after a failed Open, or on Close).
func (n *Node) release() error {
	var errs []error
	if n.raft != nil {
		if err := n.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("shut down raft: %w", err))
		}
	}
	if n.trans != nil {
		if err := n.trans.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft transport: %w", err))
		}
		n.trans.CloseStreams()
	}
	if n.stable != nil {
		n.stable.close() // a heartbeat still in flight must not write to a closed WAL
	}
	if n.wal != nil {
		if err := n.wal.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft-wal: %w", err))
		}
	}
	if n.ownHTTP {
		n.httpc.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// Close stops the node: a leader first hands leadership to another voter (so
// a rolling restart leaves no leaderless gap), then the leader loop, the
// background goroutines, Raft, its transport and storage stop. It is safe to
// call more than once; ctx bounds the wait (the shutdown goes on in the
// background if ctx ends first).
func (n *Node) Close(ctx context.Context) error {
	n.once.Do(func() {
		n.closed.Store(true)
		go func() {
			defer close(n.done)
			n.cancel()
			n.raft.DeregisterObserver(n.obs)
			n.stopLeading()
			n.wg.Wait()
			if n.raft.State() == raft.Leader && !n.killed.Load() {
				if err := n.raft.LeadershipTransfer().Error(); err != nil {
					n.log.Debug("no leadership transfer before close", "err", err)
				}
			}
			n.err = n.release()
			n.log.Info("global node closed")
		}()
	})
	select {
	case <-n.done:
		return n.err
	case <-ctx.Done():
		return fmt.Errorf("close global node: %w", ctx.Err())
	}
}

// Kill stops the node as a crash would (drills and tests): Raft stops
// without handing leadership over, so the others elect a leader only when
// its heartbeats stop. Its storage is closed as the process's exit would
// close it and can be opened again. Close after Kill does nothing.
func (n *Node) Kill() error {
	n.killed.Store(true)
	return n.Close(context.Background())
}

// State returns the latest committed state applied on this node. It never
// blocks, never returns nil and does not allocate: it is the request path's
// read.
func (n *Node) State() *State { return n.fsm.state.Load() }

// ID returns the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// RaftAddr returns the address other nodes reach this node's Raft at.
func (n *Node) RaftAddr() string { return string(n.trans.LocalAddr()) }

// IsLeader reports whether this node is the Raft leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the current leader's id, or "" when none is known.
func (n *Node) Leader() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// Health reports leadership, contact and indexes. It does not block on Raft.
func (n *Node) Health() Health {
	addr, id := n.raft.LeaderWithID()
	rs := n.raft.State()
	st := n.State()
	h := Health{
		NodeID:       n.cfg.NodeID,
		Region:       n.cfg.Region,
		RaftState:    rs.String(),
		Leader:       string(id),
		LeaderAddr:   string(addr),
		Term:         n.raft.CurrentTerm(),
		AppliedIndex: n.raft.AppliedIndex(),
		CommitIndex:  n.raft.CommitIndex(),
		LastIndex:    n.raft.LastIndex(),
		StateIndex:   st.index,
	}
	if p, ok := st.Policy(); ok {
		h.PolicyVersion = p.Version
	}
	switch {
	case rs == raft.Leader:
		h.LastContact = 0
	case n.raft.LastContact().IsZero():
		h.LastContact = -1
		h.Stale = true
	default:
		// Raft stamps contact with its own clock (time.Now): measure it
		// with that one, not with an injected wall clock.
		h.LastContact = time.Since(n.raft.LastContact())
		h.Stale = h.LastContact > n.cfg.MaxStale || id == ""
	}
	if rs == raft.Shutdown {
		h.Stale = true
	}
	return h
}

// CatchUpGrace is how long a node that hears from no leader after opening
// waits before CaughtUp takes what it restored as its state.
const CatchUpGrace = 30 * time.Second

// CaughtUp reports whether this node's state is known to be current. A
// node opens with its last snapshot as its state: the entries its log
// holds beyond it are applied only once a leader says they are committed,
// and what was committed while it was down arrives from the leader after
// that. Until then its state can lack members, region states and policy
// versions the others act on. It is caught up when it leads, or when it
// has heard from a leader and applied everything that leader told it was
// committed, at least every entry its log held when it opened. A node that
// finds no leader within CatchUpGrace (the quorum is lost) is taken as
// caught up on what it restored, and says so in its log; so is one
// whose log's tail at open was never committed, once it has applied what
// the leader commits. Once true it stays true.
func (n *Node) CaughtUp() bool {
	if n.caughtUp.Load() {
		return true
	}
	// Raft's applied index: configuration changes and a new leader's
	// no-op are committed entries the state machine never sees. It moves
	// when a batch is queued to the machine, a moment before State holds
	// it: the machine's own index must reach the last command committed.
	applied := n.raft.AppliedIndex()
	commit := n.raft.CommitIndex()
	switch {
	case n.raft.State() == raft.Leader:
	case n.Leader() != "" && commit > 0 && applied >= commit && applied >= n.openLast &&
		n.fsm.applied.Load() >= n.lastCommandAtOrBefore(commit):
	case time.Since(n.openedAt) > CatchUpGrace && n.Leader() == "":
		n.log.Warn("no raft leader since the node opened: serving on the state it restored, which may be behind the cluster's",
			"grace", CatchUpGrace, "applied_index", applied)
	case time.Since(n.openedAt) > CatchUpGrace && applied >= commit:
		// The tail its log held at open was never committed (a new leader
		// replaced it) and nothing has been written since.
	default:
		return false
	}
	if n.caughtUp.CompareAndSwap(false, true) {
		n.log.Info("raft state caught up", "applied_index", applied, "commit_index", commit, "log_index_at_open", n.openLast)
	}
	return true
}

// lastCommandAtOrBefore returns the index of the last entry at or before
// idx that the state machine applies (a command, not a configuration
// change or a no-op), looking back a bounded way; 0 when there is none
// there, or the log no longer holds it (a snapshot does, and restoring it
// applied it).
func (n *Node) lastCommandAtOrBefore(idx uint64) uint64 {
	for i := idx; i > 0 && idx-i < 256; i-- {
		var l raft.Log
		if err := n.logs.GetLog(i, &l); err != nil {
			return 0
		}
		if l.Type == raft.LogCommand {
			return i
		}
	}
	return 0
}

// InConfiguration reports whether id is a server of the latest Raft
// configuration this node knows (which, unlike State's members, includes
// the changes its log holds that it has not applied yet).
func (n *Node) InConfiguration(id string) bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id {
			return true
		}
	}
	return false
}

// LeaderChanged returns a channel closed at the next leader change seen by
// this node (for waiting without polling).
func (n *Node) LeaderChanged() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leaderCh
}

// StateChanged returns a channel closed at the next change of the local
// state (an applied command that changed it, or a snapshot restore). Load
// State() after it fires; changes in between are coalesced.
func (n *Node) StateChanged() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stateCh
}

func (n *Node) signalStateChange() {
	n.mu.Lock()
	close(n.stateCh)
	n.stateCh = make(chan struct{})
	n.mu.Unlock()
}

func (n *Node) signalLeaderChange() {
	n.mu.Lock()
	close(n.leaderCh)
	n.leaderCh = make(chan struct{})
	n.mu.Unlock()
}

func (n *Node) observeLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case o := <-n.obsCh:
			if lo, ok := o.Data.(raft.LeaderObservation); ok {
				n.m.leaderChanges.Inc()
				n.log.Debug("leader observed", "leader", lo.LeaderID)
				n.signalLeaderChange()
			}
			n.syncLeadership()
		}
	}
}

func (n *Node) healthLoop() {
	defer n.wg.Done()
	every := min(n.cfg.Timing.HeartbeatTimeout/2, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n.syncLeadership()
		n.updateGauges()
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) updateGauges() {
	h := n.Health()
	n.m.isLeader.Set(b2f(h.RaftState == raft.Leader.String()))
	n.m.stale.Set(b2f(h.Stale))
	n.m.lastContact.Set(max(h.LastContact, 0).Seconds())
	n.m.appliedIndex.Set(float64(h.AppliedIndex))
	n.m.setState(n.State())
}

// syncLeadership starts the leader loop when this node leads and stops it
// when it does not.
func (n *Node) syncLeadership() {
	n.leadMu.Lock()
	defer n.leadMu.Unlock()
	if n.closed.Load() {
		return
	}
	leader := n.raft.State() == raft.Leader
	switch {
	case leader && n.leadDone == nil:
		ctx, cancel := context.WithCancel(n.ctx)
		done := make(chan struct{})
		n.leadCancel, n.leadDone = cancel, done
		go func() {
			defer close(done)
			n.leaderLoop(ctx)
		}()
	case !leader && n.leadDone != nil:
		n.stopLeadingLocked()
	}
}

func (n *Node) stopLeading() {
	n.leadMu.Lock()
	defer n.leadMu.Unlock()
	n.stopLeadingLocked()
}

func (n *Node) stopLeadingLocked() {
	if n.leadDone == nil {
		return
	}
	n.leadCancel()
	<-n.leadDone
	n.leadCancel, n.leadDone = nil, nil
}

// leaderLoop runs while this node leads: a barrier (so the local state holds
// every committed entry), then membership reconciliation every
// ReconcileInterval.
func (n *Node) leaderLoop(ctx context.Context) {
	n.log.Info("leading the global tier")
	if err := n.raft.Barrier(n.cfg.HoldTimeout).Error(); err != nil {
		n.log.Warn("leader barrier failed", "err", err)
		return
	}
	t := time.NewTicker(n.cfg.ReconcileInterval)
	defer t.Stop()
	health := newMemberHealth(n.now())
	for {
		if err := n.reconcile(ctx, health); err != nil && ctx.Err() == nil {
			n.log.Warn("membership reconcile", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// membershipStale reports whether the local state lacks this node's member
// record or holds other addresses.
func (n *Node) membershipStale() bool {
	self := n.self()
	m, ok := n.State().Member(self.ID)
	return !ok || !m.sameAddrs(self)
}

func (n *Node) self() Member {
	return Member{ID: n.cfg.NodeID, Region: n.cfg.Region, RaftAddr: n.RaftAddr(), AdminAddr: n.cfg.AdminAddr}
}

// drainBody reads and closes a response body so the connection is reused.
func drainBody(b io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(b, 64<<10))
	_ = b.Close()
}
