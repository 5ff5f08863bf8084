package gossip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/coordinate"

	"github.com/meridian-llm/meridian/regional/summary"
)

// Errors returned by Publish.
var (
	ErrStaleGeneration = errors.New("summary generation not above the last published one")
	ErrWrongRegion     = errors.New("summary is of another region")
	ErrTooLarge        = errors.New("summary exceeds MaxSummaryBytes")
	ErrClosed          = errors.New("gossip node closed")
)

// Node is one controller's membership of the WAN pool: it advertises its
// region's digest, serves its summary to controllers that ask, keeps the
// latest summary of every other region, measures RTT, and publishes all of
// it as an immutable RegionsView.
//
// Locking: n.mu guards the peer and region tables. memberlist calls the
// event delegate while holding its own node lock, so n.mu is never held
// while calling into memberlist.
type Node struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	m       *metrics
	ml      *memberlist.Memberlist
	tracker *streamTracker
	coord   *coordinate.Client
	dims    int
	static  map[string]time.Duration // region -> configured RTT from this region
	addr    string                   // advertised host:port

	meta       atomic.Pointer[[]byte] // digest bytes served as node meta
	localState atomic.Pointer[[]byte] // push/pull payload
	view       atomic.Pointer[RegionsView]

	mu          sync.Mutex
	forwardAddr string // advertised in the digest (SetForwardAddr)
	peers       map[string]*peer
	regions     map[string]*held
	ages        map[string]reported // by region: an age message before its body
	pending     map[string]pull
	heard       map[string]*heard // by controller: its last sightings
	own         *published
	metaDirty   bool
	lastUpdate  time.Time // of the digest (UpdateNode), at most once per SyncInterval
	lastJoin    time.Time
	lastSeen    time.Time       // sightings last sent (once per SightingInterval)
	warned      map[string]bool // log-once keys

	keyring *memberlist.Keyring
	keyMu   sync.Mutex // serialises keyring operations; guards keySeen*
	// keySeen remembers the outcome of the last seenKeyOps operations other
	// controllers sent (a repeat is answered, not re-applied).
	keySeen      map[uint64]string
	keySeenOrder []uint64
	keyOps       chan keyOpMsg             // from NotifyMsg to keyWorker
	keyWaits     map[uint64]chan keyAckMsg // under mu: operations waiting for answers
	keySends     sync.WaitGroup            // key operation sends in flight

	joins  sync.WaitGroup // Join goroutines (Close waits for them)
	kick   chan struct{}
	sends  chan sendJob
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
	closed    atomic.Bool
	killed    atomic.Bool // Kill: shut down without leaving the pool
}

type peer struct {
	name     string
	node     memberlist.Node // Name, Addr, Port: enough for SendReliable
	digest   Digest
	digestOK bool
	dead     bool
	seen     time.Time     // joined, or last direct ping answer
	genAt    time.Time     // when its digest's summary generation last changed
	skew     time.Duration // its wall clock minus ours, from its last age message
	skewOK   bool
	samples  []time.Duration
	next     int // ring position in samples
	coord    *coordinate.Coordinate
}

type held struct {
	s          *summary.Summary
	hash       uint64
	receivedAt time.Time     // on this controller's clock
	sentAge    time.Duration // the sender's age of it when sent (0: not reported)
	via        string
}

// age is how old the summary is at now: the sender's age when it sent it
// plus the time since it arrived, both durations (no remote wall clock).
func (h *held) age(now time.Time) time.Duration { return max(now.Sub(h.receivedAt), 0) + h.sentAge }

// reported is an age message waiting for its body (the two travel as
// separate messages, in either order).
type reported struct {
	m  ageMsg
	at time.Time
}

type pull struct {
	gen  uint64
	at   time.Time
	peer string // asked last
}

type published struct {
	s    *summary.Summary
	body []byte
	msg  []byte // msgSummary framing of body
	hash uint64
	at   time.Time // when it was published, on this controller's clock
}

type sendJob struct {
	to      memberlist.Node
	msg     []byte
	summary bool
}

const senders = 2

// Open creates the node, binds its port and, if cfg.Join names seeds, joins
// them before returning (bounded by ctx). A failed join is not an error: it
// is logged and retried every RetryJoinInterval while no other controller is
// known. The node runs until Close; ctx only bounds Open.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	keys, fromFile, err := cfg.loadKeyring()
	if err != nil {
		return nil, fmt.Errorf("open gossip: %w", err)
	}
	keyring, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		return nil, fmt.Errorf("open gossip: keyring: %w", err)
	}
	ccfg := coordinate.DefaultConfig()
	if cfg.Coordinate != nil {
		c := *cfg.Coordinate
		ccfg = &c
	}
	coord, err := coordinate.NewClient(ccfg)
	if err != nil {
		return nil, fmt.Errorf("open gossip: coordinate client: %w", err)
	}
	n := &Node{
		cfg:     cfg,
		log:     cfg.Logger,
		now:     cfg.Now,
		m:       newMetrics(cfg.Registerer),
		coord:   coord,
		dims:    int(ccfg.Dimensionality),
		static:  map[string]time.Duration{},
		peers:   map[string]*peer{},
		regions: map[string]*held{},
		ages:    map[string]reported{},
		pending: map[string]pull{},
		heard:   map[string]*heard{},
		warned:  map[string]bool{},
		kick:    make(chan struct{}, 1),
		sends:   make(chan sendJob, 64),

		keyring:  keyring,
		keySeen:  map[uint64]string{},
		keyOps:   make(chan keyOpMsg, 16),
		keyWaits: map[uint64]chan keyAckMsg{},
	}
	if n.log == nil {
		n.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	n.log = n.log.With("component", "gossip", "node", cfg.NodeName) // the caller's logger names the region
	if n.now == nil {
		n.now = time.Now
	}
	if fromFile {
		n.log.Info("gossip keyring read from its file (Keys are not used)", "file", cfg.KeyringFile, "keys", len(keys))
	} else if err := n.persistKeyring(); err != nil {
		return nil, fmt.Errorf("open gossip: write KeyringFile: %w", err)
	}
	for _, e := range cfg.StaticRTT {
		switch cfg.Region {
		case e.A:
			n.static[e.B] = e.RTT
		case e.B:
			n.static[e.A] = e.RTT
		}
	}
	n.forwardAddr = cfg.ForwardAddr
	if err := n.setOwn(nil); err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.rebuildLocked()
	n.mu.Unlock()

	stdlog := newStdLogger(n.log)
	nt, err := newNetTransport(cfg.BindAddr, cfg.BindPort, stdlog)
	if err != nil {
		return nil, fmt.Errorf("open gossip: %w", err)
	}
	n.tracker = newStreamTracker(nt)
	var tr memberlist.NodeAwareTransport = n.tracker
	if cfg.WrapTransport != nil {
		tr = cfg.WrapTransport(tr)
	}
	port := nt.GetAutoBindPort()
	mc := memberlist.DefaultWANConfig()
	mc.Name = cfg.NodeName
	mc.Transport = tr
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = port
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = port
	if cfg.AdvertisePort != 0 {
		mc.AdvertisePort = cfg.AdvertisePort
	}
	mc.Label = cfg.Label
	mc.Keyring = keyring
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	mc.EnableCompression = cfg.Compression
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.GossipInterval = cfg.GossipInterval
	mc.GossipNodes = cfg.GossipNodes
	mc.PushPullInterval = cfg.PushPullInterval
	mc.TCPTimeout = cfg.TCPTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.GossipToTheDeadTime = cfg.GossipToTheDeadTime
	mc.DeadNodeReclaimTime = cfg.DeadNodeReclaimTime
	mc.Delegate = (*delegate)(n)
	mc.Events = (*events)(n)
	mc.Ping = (*pings)(n)
	mc.Logger = stdlog
	ip, aport, err := tr.FinalAdvertiseAddr(mc.AdvertiseAddr, mc.AdvertisePort)
	if err != nil {
		_ = tr.Shutdown()
		return nil, fmt.Errorf("open gossip: advertise address: %w", err)
	}
	n.addr = net.JoinHostPort(ip.String(), strconv.Itoa(aport))
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown()
		return nil, fmt.Errorf("open gossip: %w", err)
	}
	n.ml = ml
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(2 + senders)
	go n.run()
	go n.keyWorker()
	for range senders {
		go n.sender()
	}
	if cfg.Replicas != nil {
		n.wg.Add(1)
		go n.replicaLoop()
	}
	if len(cfg.Join) > 0 {
		if _, err := n.Join(ctx, cfg.Join); err != nil && ctx.Err() != nil {
			_ = n.Close()
			return nil, fmt.Errorf("open gossip: join: %w", ctx.Err())
		}
	}
	return n, nil
}

// newNetTransport binds UDP and TCP on one port, retrying when an ephemeral
// port turns out to be taken for one of the two protocols.
func newNetTransport(addr string, port int, l *log.Logger) (*memberlist.NetTransport, error) {
	var lastErr error
	for range 10 {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{addr}, BindPort: port, Logger: l})
		if err == nil {
			return nt, nil
		}
		lastErr = err
		if port != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("bind %s: %w", net.JoinHostPort(addr, strconv.Itoa(port)), lastErr)
}

// Join contacts the given controllers ("host:port") and merges their state;
// it returns how many answered. Bounded by ctx.
func (n *Node) Join(ctx context.Context, addrs []string) (int, error) {
	if n.closed.Load() {
		return 0, ErrClosed
	}
	type result struct {
		k   int
		err error
	}
	ch := make(chan result, 1)
	n.mu.Lock()
	if n.closed.Load() {
		n.mu.Unlock()
		return 0, ErrClosed
	}
	n.lastJoin = n.now()
	n.joins.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.joins.Done()
		k, err := n.ml.Join(addrs)
		ch <- result{k, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			n.log.Warn("join failed; will retry while alone", "seeds", addrs, "err", r.err)
			return r.k, fmt.Errorf("join %v: %w", addrs, r.err)
		}
		n.log.Info("joined", "seeds", addrs, "answered", r.k)
		n.poke()
		return r.k, nil
	case <-ctx.Done():
		// The join goroutine ends when its dials do: Close aborts them.
		return 0, ctx.Err()
	}
}

// Addr is the address other controllers join this one at.
func (n *Node) Addr() string { return n.addr }

// View returns the current snapshot. It never blocks and never returns nil.
func (n *Node) View() *RegionsView { return n.view.Load() }

// Publish makes s this controller's summary of its region: its digest is
// re-advertised and controllers holding an older generation will fetch it.
// s must be of this region and of a generation above the last published
// (summary.NextGeneration).
func (n *Node) Publish(s *summary.Summary) error {
	if n.closed.Load() {
		return ErrClosed
	}
	if s.Region != n.cfg.Region {
		return fmt.Errorf("publish summary: %w: %q, this node is in %q", ErrWrongRegion, s.Region, n.cfg.Region)
	}
	if err := n.setOwn(s); err != nil {
		return fmt.Errorf("publish summary: %w", err)
	}
	n.poke()
	return nil
}

// SetForwardAddr changes the forwarding address this controller
// advertises ("": none, so no other region forwards requests to it): a
// controller advertises it once it can serve (its index caught up) and
// withdraws it when it begins to stop.
func (n *Node) SetForwardAddr(addr string) error {
	if len(addr) > maxForwardAddrLen {
		return fmt.Errorf("set forward address: %d bytes, max %d", len(addr), maxForwardAddrLen)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.forwardAddr == addr {
		return nil
	}
	n.forwardAddr = addr
	if err := n.digestLocked(); err != nil {
		return fmt.Errorf("set forward address: %w", err)
	}
	n.poke()
	return nil
}

// setOwn installs the node's own summary (nil: none yet) and its digest.
func (n *Node) setOwn(s *summary.Summary) error {
	var p *published
	if s != nil {
		body, err := s.MarshalBinary()
		if err != nil {
			return err
		}
		if len(body) > n.cfg.MaxSummaryBytes {
			return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(body), n.cfg.MaxSummaryBytes)
		}
		p = &published{s: s, body: body, msg: encodeSummaryMsg(body), hash: bodyHash(body), at: n.now()}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if s != nil && n.own != nil && s.Generation <= n.own.s.Generation {
		return fmt.Errorf("%w: %d, last %d", ErrStaleGeneration, s.Generation, n.own.s.Generation)
	}
	old := n.own
	n.own = p
	if err := n.digestLocked(); err != nil {
		n.own = old
		return err
	}
	var body []byte
	if p != nil {
		body = p.body
	}
	st := encodeLocalState(body)
	n.localState.Store(&st)
	return nil
}

// digestLocked encodes the digest of the own summary and forwarding
// address as the node meta, to be re-advertised.
func (n *Node) digestLocked() error {
	d := Digest{Region: n.cfg.Region, ForwardAddr: n.forwardAddr}
	if p := n.own; p != nil {
		t := p.s.Totals()
		d.Generation, d.BodyHash, d.BodyLen = p.s.Generation, p.hash, uint32(len(p.body))
		d.Pods, d.Running, d.Slots = uint32(t.Pods), uint32(t.Running), uint32(t.Slots)
		d.Pending, d.FreeKV = uint64(t.PendingPrefillTokens), uint64(t.FreeKVBlocks)
	}
	meta, err := d.encode()
	if err != nil {
		return err
	}
	n.meta.Store(&meta)
	n.metaDirty = true
	return nil
}

func (n *Node) poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// run is the node's worker: digest updates, pulls, liveness, the view and
// the sightings sent to the other controllers.
func (n *Node) run() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.kick:
		case <-t.C:
		}
		n.sync()
	}
}

func (n *Node) sync() {
	n.mu.Lock()
	now := n.now()
	dirty := n.metaDirty && now.Sub(n.lastUpdate) >= n.cfg.SyncInterval
	if dirty {
		n.metaDirty, n.lastUpdate = false, now
	}
	n.mu.Unlock()
	if dirty {
		if err := n.ml.UpdateNode(n.cfg.UpdateTimeout); err != nil {
			n.log.Debug("digest update not yet broadcast", "err", err)
		}
	}
	n.maybeRejoin()
	for _, j := range n.pulls() {
		n.enqueue(j)
	}
	n.mu.Lock()
	n.rebuildLocked()
	n.mu.Unlock()
	n.sendSightings()
}

// maybeRejoin rejoins, every RetryJoinInterval while the node is isolated
// from every other region, through every address it knows: the seeds, the
// controllers it has seen, and Rejoin's. A controller that lost everyone
// (a long partition after which both sides declared each other dead and
// stopped gossiping to the dead), or restarted with seeds that point only
// at itself, finds its way back.
func (n *Node) maybeRejoin() {
	n.mu.Lock()
	isolated := n.isolatedLocked()
	due := n.now().Sub(n.lastJoin) >= n.cfg.RetryJoinInterval
	n.mu.Unlock()
	if !isolated || !due {
		return
	}
	n.mu.Lock()
	n.lastJoin = n.now() // also when there is nowhere to join: retry after the interval
	n.mu.Unlock()
	addrs := n.rejoinAddrs()
	if len(addrs) == 0 {
		n.warnOnce("isolated-nowhere", "isolated from every other region, and no address to rejoin through")
		return
	}
	n.m.rejoins.Inc()
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RetryJoinInterval)
	defer cancel()
	if k, err := n.Join(ctx, addrs); err == nil {
		n.log.Info("rejoined the pool after being isolated from every other region", "through", addrs, "answered", k)
	}
}

// rejoinAddrs is every address to rejoin through, this node's own
// excluded: the seeds, the controllers seen, then Rejoin's.
func (n *Node) rejoinAddrs() []string {
	var extra []string
	if n.cfg.Rejoin != nil {
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RetryJoinInterval)
		extra = n.cfg.Rejoin(ctx)
		cancel()
	}
	seen := map[string]bool{n.addr: true}
	var out []string
	for _, list := range [][]string{n.cfg.Join, n.Peers(), extra} {
		for _, a := range list {
			if a != "" && !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}

// isolatedLocked reports whether no controller of another region is alive
// for this node (declared dead or never seen; a suspect one still counts:
// memberlist has not given up on it).
//
// A pool of one region (its replicas, and no other region ever seen or
// expected by OtherRegions) is not isolated: there is no other region to
// be isolated from. A node that has seen no controller at all is (its seeds
// may not have been up yet).
func (n *Node) isolatedLocked() bool {
	other := false
	for _, p := range n.peers {
		if p.digestOK && p.digest.Region != n.cfg.Region {
			if !p.dead {
				return false
			}
			other = true
		}
	}
	return other || len(n.peers) == 0 || (n.cfg.OtherRegions != nil && n.cfg.OtherRegions())
}

// Isolated reports whether this controller is isolated from every other
// region: no controller of another region is alive for it. Cross-region
// work (forwarding, summaries, failover evidence) cannot be done then; it
// keeps rejoining.
func (n *Node) Isolated() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.isolatedLocked()
}

// Peers returns the gossip addresses of the other controllers this node
// has seen, alive or dead, sorted: a controller rejoins through them, and
// may keep them across restarts.
func (n *Node) Peers() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, p := range n.peers {
		if p.node.Addr != nil && p.node.Port != 0 {
			out = append(out, net.JoinHostPort(net.IP(p.node.Addr).String(), strconv.Itoa(int(p.node.Port))))
		}
	}
	slices.Sort(out)
	return out
}

// pulls returns the requests for newer summaries to send: for each remote
// region whose controllers advertise a newer generation (or the same one
// with a greater body hash) than the one held, or any other once the held
// one is OlderGenerationAfter old, ask the one advertising the newest,
// unless a request for it is younger than PullRetry.
func (n *Node) pulls() []sendJob {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	suspectAfter := n.suspectAfterLocked()
	type choice struct {
		gen, hash uint64
		peers     []*peer // controllers advertising (gen, hash)
	}
	best := map[string]*choice{}
	for _, p := range n.peers {
		if p.dead || !p.digestOK || p.digest.Region == n.cfg.Region || p.digest.Generation == 0 {
			continue
		}
		c := best[p.digest.Region]
		switch {
		case c == nil || newer(p.digest.Generation, p.digest.BodyHash, c.gen, c.hash):
			best[p.digest.Region] = &choice{gen: p.digest.Generation, hash: p.digest.BodyHash, peers: []*peer{p}}
		case p.digest.Generation == c.gen && p.digest.BodyHash == c.hash:
			c.peers = append(c.peers, p)
		}
	}
	var jobs []sendJob
	for region, c := range best {
		if h := n.regions[region]; h != nil && !newer(c.gen, c.hash, h.s.Generation, h.hash) {
			// Not newer: nothing to fetch, unless the held one is old and
			// the region now advertises another (a lower generation after
			// its controllers restarted without theirs).
			if (c.gen == h.s.Generation && c.hash == h.hash) || h.age(now) < n.cfg.OlderGenerationAfter {
				continue
			}
		}
		q, asked := n.pending[region]
		if asked && q.gen >= c.gen && now.Sub(q.at) < n.cfg.PullRetry {
			continue
		}
		// Ask a reachable controller, and on a retry another one if there is.
		slices.SortFunc(c.peers, func(a, b *peer) int { return strings.Compare(a.name, b.name) })
		pick := c.peers[0]
		for _, p := range c.peers {
			reachable := now.Sub(p.seen) <= suspectAfter
			if reachable && (!asked || p.name != q.peer || len(c.peers) == 1) {
				pick = p
				break
			}
		}
		n.pending[region] = pull{gen: c.gen, at: now, peer: pick.name}
		w := want{From: n.cfg.NodeName, Region: region, Generation: c.gen}
		jobs = append(jobs, sendJob{to: pick.node, msg: w.encode()})
		n.m.pulls.Inc()
	}
	return jobs
}

// newer orders summaries by generation, then body hash (so two controllers
// of a region that built different summaries of one generation converge).
func newer(gen, hash, thanGen, thanHash uint64) bool {
	return gen > thanGen || (gen == thanGen && hash > thanHash)
}

func (n *Node) enqueue(j sendJob) {
	select {
	case n.sends <- j:
	default:
		n.log.Debug("send queue full; dropping (the peer will ask again)", "to", j.to.Name)
	}
}

func (n *Node) sender() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case j := <-n.sends:
			to := j.to
			if err := n.ml.SendReliable(&to, j.msg); err != nil {
				n.log.Debug("send failed", "to", to.Name, "err", err)
				continue
			}
			if j.summary {
				n.m.sentBytes.Add(float64(len(j.msg) - msgHeaderLen))
			}
		}
	}
}

// receive considers a summary body from another controller. It returns an
// error for a body it rejects (counted by reason); a body that is not newer
// than the one held is ignored. A body already held (push/pull resends the
// same one every exchange) is recognised by its hash and ignored before it
// is decoded.
func (n *Node) receive(body []byte, via string) error {
	n.m.receivedBytes.Add(float64(len(body)))
	if len(body) > n.cfg.MaxSummaryBytes {
		n.m.rejected.WithLabelValues("oversize").Inc()
		n.warnOnce("oversize", "summary body over MaxSummaryBytes rejected", "via", via, "bytes", len(body), "limit", n.cfg.MaxSummaryBytes)
		return fmt.Errorf("receive summary: %w: %d bytes, limit %d", ErrTooLarge, len(body), n.cfg.MaxSummaryBytes)
	}
	hash := bodyHash(body)
	if n.holdsBody(hash) {
		return nil
	}
	s, err := summary.Decode(body)
	if err != nil {
		reason := "field"
		var de *summary.DecodeError
		if errors.As(err, &de) {
			reason = de.Reason()
		}
		n.m.rejected.WithLabelValues(reason).Inc()
		n.warnOnce("decode:"+reason, "summary body rejected", "via", via, "err", err)
		return fmt.Errorf("receive summary: %w", err)
	}
	if s.Region == n.cfg.Region {
		return nil // a controller of our own region: we have the exact index
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	if h := n.regions[s.Region]; h != nil && !newer(s.Generation, hash, h.s.Generation, h.hash) {
		if h.age(now) < n.cfg.OlderGenerationAfter {
			// An older generation than the one held: a replay, or a
			// controller whose generations went back. Counted, logged, and
			// taken once the held one is old enough to mean the region's
			// controllers restarted without their generation.
			n.m.rejected.WithLabelValues("older_generation").Inc()
			n.warnOnceLocked("older:"+s.Region, "summary of an older generation than the one held dropped",
				"of", s.Region, "generation", s.Generation, "held", h.s.Generation, "via", via)
			return nil
		}
		n.log.Warn("taking a summary of an older generation: the one held is old, its region's controllers restarted",
			"of", s.Region, "generation", s.Generation, "held", h.s.Generation, "held_age", h.age(now))
	}
	h := &held{s: s, hash: hash, receivedAt: now, via: via}
	if r, ok := n.ages[s.Region]; ok && r.m.Hash == hash {
		h.sentAge = r.m.Age // the body follows its age message at once
		delete(n.ages, s.Region)
	}
	n.regions[s.Region] = h
	if q, ok := n.pending[s.Region]; ok && q.gen <= s.Generation {
		delete(n.pending, s.Region)
	}
	n.m.accepted.Inc()
	n.log.Debug("summary accepted", "of", s.Region, "generation", s.Generation, "bytes", len(body), "via", via)
	n.rebuildLocked()
	return nil
}

// holdsBody reports whether hash is the body hash of a summary held: a
// remote region's, or this controller's own.
func (n *Node) holdsBody(hash uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.own != nil && n.own.hash == hash {
		return true
	}
	for _, h := range n.regions {
		if h.hash == hash {
			return true
		}
	}
	return false
}

// answer serves a pull request with this controller's summary.
func (n *Node) answer(w want) {
	n.mu.Lock()
	p := n.peers[w.From]
	known := p != nil && !p.dead
	var to memberlist.Node
	if known {
		to = p.node
	}
	own := n.own
	n.mu.Unlock()
	switch {
	case !known:
		n.log.Debug("pull from an unknown or dead controller ignored", "from", w.From)
	case w.Region != n.cfg.Region || own == nil || own.s.Generation < w.Generation:
		n.log.Debug("pull for a summary this controller does not have", "from", w.From, "remote_region", w.Region, "generation", w.Generation)
	default:
		age := ageMsg{From: n.cfg.NodeName, Region: n.cfg.Region, Generation: own.s.Generation, Hash: own.hash,
			Age: max(n.now().Sub(own.at), 0), SentAt: n.now().UnixNano()}
		n.enqueue(sendJob{to: to, msg: age.encode()})
		n.enqueue(sendJob{to: to, msg: own.msg, summary: true})
	}
}

func (n *Node) warnOnce(key, msg string, args ...any) {
	n.mu.Lock()
	seen := n.warned[key]
	n.warned[key] = true
	n.mu.Unlock()
	if !seen {
		n.log.Warn(msg+" (logged once per kind)", args...)
	}
}

// warnOnceLocked is warnOnce with n.mu held.
func (n *Node) warnOnceLocked(key, msg string, args ...any) {
	if !n.warned[key] {
		n.warned[key] = true
		n.log.Warn(msg+" (logged once per kind)", args...)
	}
}

// noteAge takes an age message: the age of the summary it names (held
// already, or arriving next), and the sender's clock skew against ours,
// its wall time when it sent plus half the round trip against our wall
// time on receipt.
func (n *Node) noteAge(m ageMsg) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	if p := n.peers[m.From]; p != nil && !p.dead && m.SentAt != 0 {
		transit := time.Duration(0)
		if len(p.samples) > 0 {
			transit = median(slices.Clone(p.samples)) / 2
		}
		p.skew, p.skewOK = time.Unix(0, m.SentAt).Add(transit).Sub(now), true
	}
	if h := n.regions[m.Region]; h != nil && h.hash == m.Hash {
		h.sentAge = m.Age
		n.rebuildLocked()
		return
	}
	n.ages[m.Region] = reported{m: m, at: now}
}

// Close leaves the pool and stops the node; safe to call twice.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed.Store(true)
		n.mu.Unlock()
		n.cancel()
		n.tracker.abort()
		n.wg.Wait()
		n.joins.Wait()
		n.keySends.Wait()
		if !n.killed.Load() {
			if err := n.ml.Leave(n.cfg.LeaveTimeout); err != nil {
				n.log.Warn("leave not broadcast", "err", err)
			}
		}
		n.closeErr = n.ml.Shutdown()
		if n.closeErr != nil {
			n.closeErr = fmt.Errorf("close gossip: %w", n.closeErr)
		}
	})
	return n.closeErr
}

// Kill stops the node as a crash would (drills and tests): it does not
// leave the pool, so the other controllers find it dead by probing. Close
// after Kill does nothing.
func (n *Node) Kill() error {
	n.killed.Store(true)
	return n.Close()
}

// peerLocked returns the entry of a controller, creating it.
func (n *Node) peerLocked(name string) *peer {
	p := n.peers[name]
	if p == nil {
		p = &peer{name: name, samples: make([]time.Duration, 0, n.cfg.RTTWindow)}
		n.peers[name] = p
	}
	return p
}

// bodyHash identifies an encoded summary (advertised in the digest, and the
// tie-break between two bodies of one generation).
func bodyHash(body []byte) uint64 { return xxhash.Sum64(body) }
