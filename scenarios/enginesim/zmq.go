package enginesim

// The engine simulator's ZMQ transport: vLLM's ZmqEventPublisher
// (vllm/distributed/kv_events.py) as observed on the wire.
//
// It is built on go-zeromq/zmq4's ZMTP connection layer (zmq4.Open: greeting,
// NULL handshake, socket-type check, framing; through regional/kvbridge/zmtp,
// which the bridge shares, so both ends parse endpoints and offset
// data-parallel ranks alike), with the socket logic written here, because zmq4 v0.17.0's PUB socket cannot be shut down: its Close
// leaves the writer goroutine (pubMWriter.run) waiting forever, one per
// socket, and it has one queue for all subscribers instead of libzmq's
// per-subscriber high-water mark. Here every goroutine ends at Close, a slow
// subscriber only loses its own messages (a seq gap it can repair through
// the replay socket), and Close lingers until queued messages are written.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/meridian-llm/meridian/regional/kvbridge/zmtp"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// The buffers of a connection (zmtp.Open): a PUB or ROUTER reads small
// subscriptions and requests, and writes batches, flushed per queue drained.
const (
	readBuffer  = 16 << 10
	writeBuffer = 64 << 10
)

// ZMQConfig configures a ZMQPublisher. Zero values take the defaults given.
type ZMQConfig struct {
	// Endpoint of the PUB socket; default "tcp://*:5557" (vLLM's). vLLM's
	// heuristic decides the direction: the socket binds when the endpoint
	// contains "*" or "::" or is ipc://, and connects otherwise (to a
	// subscriber that binds, e.g. `meridian kv-bridge` with bind: true).
	// Mode overrides the heuristic. inproc:// is not supported (it only
	// exists inside one libzmq context).
	Endpoint string
	// Mode is "" (vLLM's heuristic), "bind" or "connect". Tests bind an
	// ephemeral loopback port with Endpoint "tcp://127.0.0.1:0" and Mode
	// "bind", then read Addr.
	Mode string
	// ReplayEndpoint of the ROUTER socket that answers replay requests; it
	// always binds. Empty: no replay socket (vLLM's default).
	ReplayEndpoint string
	// BufferSteps is how many past batches the replay socket can serve;
	// default 10000 (vLLM's buffer_steps).
	BufferSteps int
	// HWM bounds the messages queued for one subscriber; beyond it that
	// subscriber's messages are dropped (it sees a seq gap). Default 100000
	// (vLLM's hwm).
	HWM int
	// Topic is frame 0 of every message. Default "kv@<pod>@<Model>" with the
	// batch's pod name (llm-d's convention kv@<pod-addr>@<model>, with the
	// pod's name as its address so that a subscriber keying by topic uses
	// the same name as the engine's lifecycle events).
	Topic string
	// Model names the default topic; default DefaultConfig().Model.
	Model string
	// DataParallelRank offsets both endpoints as vLLM does for rank r > 0:
	// tcp port + r, ipc path + "_dp<r>". Default 0.
	DataParallelRank int
	// Encoding of the payloads; the zero value is vLLM's before PR 42892
	// (array envelope, array events, integer hashes).
	Encoding kvevents.Encoding
	// DropEvery, when > 0, drops every DropEvery-th batch on the PUB side
	// (it still enters the replay buffer): an injected fault that gives
	// subscribers seq gaps to repair. SetDropEvery changes it at run time.
	DropEvery int
	// VLLMOnly publishes only vLLM's own event kinds, as a real vLLM engine
	// does: no PodUp or PodDown (a batch of lifecycle events alone goes
	// out empty, so seqs stay contiguous). For tests of what the bridge
	// announces in their place.
	VLLMOnly bool
	// Linger bounds how long Close waits for queued messages to be written;
	// default 1s (0 is replaced by the default; negative: do not wait).
	Linger time.Duration
	// DialTimeout bounds one connect and ZMTP handshake (connect mode and
	// every accepted connection's handshake); default 5s.
	DialTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the retry delay of connect mode;
	// defaults 100ms and 5s.
	ReconnectMin, ReconnectMax time.Duration
	// Logger; nil = discard.
	Logger *slog.Logger
}

func (c ZMQConfig) withDefaults() ZMQConfig {
	if c.Endpoint == "" {
		c.Endpoint = "tcp://*:5557"
	}
	if c.BufferSteps == 0 {
		c.BufferSteps = 10000
	}
	if c.HWM == 0 {
		c.HWM = 100000
	}
	if c.Model == "" {
		c.Model = DefaultConfig().Model
	}
	if c.Linger == 0 {
		c.Linger = time.Second
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field of c after defaults are applied.
func (c ZMQConfig) Validate() error {
	c = c.withDefaults()
	if _, err := zmtp.Parse(c.Endpoint, c.DataParallelRank); err != nil {
		return fmt.Errorf("enginesim zmq config: Endpoint: %w", err)
	}
	if c.Mode != "" && c.Mode != "bind" && c.Mode != "connect" {
		return fmt.Errorf("enginesim zmq config: Mode %q: want \"\", \"bind\" or \"connect\"", c.Mode)
	}
	if c.ReplayEndpoint != "" {
		if _, err := zmtp.Parse(c.ReplayEndpoint, c.DataParallelRank); err != nil {
			return fmt.Errorf("enginesim zmq config: ReplayEndpoint: %w", err)
		}
	}
	switch {
	case c.BufferSteps < 1:
		return fmt.Errorf("enginesim zmq config: BufferSteps %d: must be >= 1", c.BufferSteps)
	case c.HWM < 1:
		return fmt.Errorf("enginesim zmq config: HWM %d: must be >= 1", c.HWM)
	case c.DataParallelRank < 0:
		return fmt.Errorf("enginesim zmq config: DataParallelRank %d: must be >= 0", c.DataParallelRank)
	case c.DropEvery < 0:
		return fmt.Errorf("enginesim zmq config: DropEvery %d: must be >= 0", c.DropEvery)
	case c.DialTimeout < 0:
		return fmt.Errorf("enginesim zmq config: DialTimeout %v: must be > 0", c.DialTimeout)
	case c.ReconnectMin <= 0 || c.ReconnectMax < c.ReconnectMin:
		return fmt.Errorf("enginesim zmq config: ReconnectMin %v, ReconnectMax %v: want 0 < min <= max", c.ReconnectMin, c.ReconnectMax)
	}
	return nil
}

// ZMQStats is a snapshot of a ZMQPublisher.
type ZMQStats struct {
	// Published counts batches given to Publish; LastSeq is the last one's
	// seq (valid when Published > 0).
	Published uint64
	LastSeq   uint64
	// FaultDropped counts batches withheld by DropEvery; HWMDropped counts
	// messages dropped for a subscriber over its high-water mark.
	FaultDropped uint64
	HWMDropped   uint64
	// Subscribers counts connected peers that have sent a subscription;
	// Subscriptions their topic prefixes.
	Subscribers   int
	Subscriptions int
	// ReplayRequests counts replay requests answered; ReplayBatches the
	// batches sent in those answers.
	ReplayRequests uint64
	ReplayBatches  uint64
}

// ZMQPublisher publishes the engine's event batches as vLLM does over ZMQ:
// multipart messages [topic, seq as 8 bytes big-endian, msgpack payload] on
// a PUB socket, seq being the batch's (from 0 per engine start, +1 per
// batch), and a ROUTER replay socket that answers a request [empty,
// start_seq] with [empty, seq, payload] for every buffered batch with seq >=
// start_seq, then [empty, 0xFF x 8, empty]. Plug it in as Config.Publisher;
// the caller closes it after the engine. Safe for concurrent use.
type ZMQPublisher struct {
	cfg    ZMQConfig
	log    *slog.Logger
	pubEP  zmtp.Endpoint
	ctx    context.Context // ends every connection (after Close's linger)
	cancel context.CancelFunc
	quit   context.Context // ends dialing and accepting (at Close)
	stopQ  context.CancelFunc
	wg     sync.WaitGroup

	pubLn    net.Listener // bind mode
	replayLn net.Listener // nil without a replay socket

	mu        sync.Mutex
	peers     map[*pubPeer]struct{}
	replays   map[net.Conn]struct{}
	ring      []ringEntry // circular, len BufferSteps once full
	ringNext  int
	topic     []byte
	dropEvery int
	dropBase  uint64 // Published when DropEvery was last set
	stats     ZMQStats
	changed   chan struct{}
	closed    bool

	closeOnce sync.Once
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

// NewZMQPublisher binds (or connects) the PUB socket and binds the replay
// socket. Close it.
func NewZMQPublisher(cfg ZMQConfig) (*ZMQPublisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	pubEP, _ := zmtp.Parse(cfg.Endpoint, cfg.DataParallelRank)
	bind := zmtp.VLLMBinds(cfg.Endpoint)
	switch cfg.Mode {
	case "bind":
		bind = true
	case "connect":
		bind = false
	}
	ctx, cancel := context.WithCancel(context.Background())
	quit, stopQ := context.WithCancel(ctx)
	p := &ZMQPublisher{cfg: cfg, log: cfg.Logger, pubEP: pubEP, ctx: ctx, cancel: cancel, quit: quit, stopQ: stopQ,
		peers: map[*pubPeer]struct{}{}, replays: map[net.Conn]struct{}{}, dropEvery: cfg.DropEvery,
		changed: make(chan struct{})}
	if cfg.Topic != "" {
		p.topic = []byte(cfg.Topic)
	}
	if bind {
		ln, err := pubEP.Listen()
		if err != nil {
			cancel()
			return nil, fmt.Errorf("open zmq publisher: bind %s: %w", cfg.Endpoint, err)
		}
		p.pubLn = ln
	}
	if cfg.ReplayEndpoint != "" {
		rep, _ := zmtp.Parse(cfg.ReplayEndpoint, cfg.DataParallelRank)
		ln, err := rep.Listen()
		if err != nil {
			if p.pubLn != nil {
				p.pubLn.Close()
			}
			cancel()
			return nil, fmt.Errorf("open zmq publisher: bind replay %s: %w", cfg.ReplayEndpoint, err)
		}
		p.replayLn = ln
		p.wg.Add(1)
		go p.acceptReplay()
	}
	p.wg.Add(1)
	if p.pubLn != nil {
		go p.acceptSubscribers()
	} else {
		go p.connectLoop()
	}
	return p, nil
}

// Addr is the PUB endpoint subscribers dial (tcp://host:port with the bound
// port, or the ipc path); in connect mode, the endpoint it connects to.
func (p *ZMQPublisher) Addr() string {
	if p.pubLn == nil {
		return p.pubEP.String()
	}
	return zmtp.EndpointOf(p.pubLn)
}

// ReplayAddr is the replay endpoint clients dial; "" without one.
func (p *ZMQPublisher) ReplayAddr() string {
	if p.replayLn == nil {
		return ""
	}
	return zmtp.EndpointOf(p.replayLn)
}

// SetDropEvery changes the DropEvery fault (0 turns it off). The count of
// batches restarts.
func (p *ZMQPublisher) SetDropEvery(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropEvery = max(n, 0)
	p.dropBase = p.stats.Published
}

// Stats returns a snapshot of the publisher's counters.
func (p *ZMQPublisher) Stats() ZMQStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statsLocked()
}

func (p *ZMQPublisher) statsLocked() ZMQStats {
	s := p.stats
	s.Subscribers, s.Subscriptions = 0, 0
	for peer := range p.peers {
		if n := peer.subscriptions(); n > 0 {
			s.Subscribers++
			s.Subscriptions += n
		}
	}
	return s
}

// WaitFor blocks until cond holds for the publisher's stats (checked now and
// after every change: publish, subscription, replay) or ctx ends.
func (p *ZMQPublisher) WaitFor(ctx context.Context, cond func(ZMQStats) bool) error {
	for {
		p.mu.Lock()
		ok, ch := cond(p.statsLocked()), p.changed
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for zmq publisher: %w (stats %+v)", ctx.Err(), p.Stats())
		}
	}
}

func (p *ZMQPublisher) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Publish implements Publisher: it encodes b, keeps it for replay and queues
// it for every subscriber whose subscription matches the topic. It never
// blocks on the network and never fails on it (PUB semantics: a subscriber
// that cannot keep up loses messages); it fails only when the batch cannot
// be encoded or the publisher is closed.
func (p *ZMQPublisher) Publish(_ context.Context, b Batch) error {
	kb := b.KVBatch()
	if p.cfg.VLLMOnly {
		kb.Events = slices.DeleteFunc(kb.Events, func(ev kvevents.Event) bool {
			k := ev.Kind()
			return k == kvevents.KindPodUp || k == kvevents.KindPodDown
		})
	}
	payload, err := p.cfg.Encoding.AppendBatch(nil, &kb)
	if err != nil {
		return fmt.Errorf("publish kv events over zmq: %w", err)
	}
	seq := binary.BigEndian.AppendUint64(nil, b.Seq)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("publish kv events over zmq: publisher closed")
	}
	if p.topic == nil {
		p.topic = []byte("kv@" + b.Pod + "@" + p.cfg.Model)
	}
	// Into the replay buffer first, so a subscriber that sees seq s and asks
	// for what came before finds everything up to s.
	e := ringEntry{seq: b.Seq, payload: payload}
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, e)
	} else {
		p.ring[p.ringNext] = e
		p.ringNext = (p.ringNext + 1) % len(p.ring)
	}
	p.stats.Published++
	p.stats.LastSeq = b.Seq
	defer p.changedLocked()
	if n := p.dropEvery; n > 0 && (p.stats.Published-p.dropBase)%uint64(n) == 0 {
		p.stats.FaultDropped++
		return nil
	}
	frames := [][]byte{p.topic, seq, payload}
	topic := string(p.topic)
	for peer := range p.peers {
		if peer.matches(topic) && !peer.enqueue(frames, p.cfg.HWM) {
			p.stats.HWMDropped++
		}
	}
	return nil
}

// replayFrom returns the buffered batches with seq >= start, oldest first.
func (p *ZMQPublisher) replayFrom(start uint64) []ringEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ringEntry, 0, len(p.ring))
	for i := range p.ring {
		e := p.ring[(p.ringNext+i)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// Close stops both sockets: subscribers get what is queued for them (up to
// Linger), then every connection is closed and every goroutine has ended.
// Safe to call twice.
func (p *ZMQPublisher) Close() error {
	p.closeOnce.Do(func() {
		p.stopQ()
		p.mu.Lock()
		p.closed = true
		for peer := range p.peers {
			peer.stop(p.cfg.Linger)
		}
		for c := range p.replays {
			c.Close()
		}
		p.mu.Unlock()
		if p.pubLn != nil {
			p.pubLn.Close()
		}
		if p.replayLn != nil {
			p.replayLn.Close()
		}
		// Peers flush, bounded by Linger; the context then ends the dialer
		// and whatever is still running.
		done := make(chan struct{})
		go func() { p.wg.Wait(); close(done) }()
		if p.cfg.Linger > 0 {
			t := time.NewTimer(p.cfg.Linger)
			select {
			case <-done:
			case <-t.C:
			}
			t.Stop()
		}
		p.cancel() // closes every connection still open (context.AfterFunc)
		<-done
	})
	return nil
}

// acceptSubscribers accepts SUB connections until the listener closes.
func (p *ZMQPublisher) acceptSubscribers() {
	defer p.wg.Done()
	for {
		nc, err := p.pubLn.Accept()
		if err != nil {
			if p.quit.Err() == nil && !errors.Is(err, net.ErrClosed) {
				p.log.Warn("zmq publisher: accept", "err", err)
				continue
			}
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.servePeer(nc, true)
		}()
	}
}

// connectLoop is connect mode: dial the subscriber, serve it until the
// connection fails, retry with backoff until Close.
func (p *ZMQPublisher) connectLoop() {
	defer p.wg.Done()
	backoff := p.cfg.ReconnectMin
	for p.quit.Err() == nil {
		d := net.Dialer{Timeout: p.cfg.DialTimeout}
		nc, err := d.DialContext(p.quit, p.pubEP.Network, p.pubEP.Addr)
		if err == nil {
			backoff = p.cfg.ReconnectMin
			p.servePeer(nc, false)
		} else if p.quit.Err() == nil {
			p.log.Debug("zmq publisher: connect", "endpoint", p.cfg.Endpoint, "err", err, "retry_in", backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-p.quit.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, p.cfg.ReconnectMax)
	}
}

// servePeer runs one subscriber connection: the handshake, a writer
// goroutine draining its queue, and this goroutine reading its
// subscriptions. It returns when the connection is gone.
func (p *ZMQPublisher) servePeer(nc net.Conn, server bool) {
	defer nc.Close()
	stop := context.AfterFunc(p.ctx, func() { nc.Close() })
	defer stop()
	conn, bc, err := zmtp.Open(nc, zmq4.Pub, server, p.cfg.DialTimeout, readBuffer, writeBuffer)
	if err != nil {
		p.log.Debug("zmq publisher: handshake", "peer", nc.RemoteAddr(), "err", err)
		return
	}
	peer := newPubPeer(nc, conn, bc)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.peers[peer] = struct{}{}
	p.mu.Unlock()
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		peer.writeLoop()
	}()
	for {
		msg, err := conn.RecvMsg()
		if err != nil {
			break
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue // PINGs are answered by zmq4; nothing else matters to a PUB
		}
		f := msg.Frames[0]
		switch f[0] {
		case 1:
			peer.subscribe(string(f[1:]))
		case 0:
			peer.unsubscribe(string(f[1:]))
		default:
			continue
		}
		p.mu.Lock()
		p.changedLocked()
		p.mu.Unlock()
	}
	peer.stop(0)
	nc.Close()
	<-writerDone
	p.mu.Lock()
	delete(p.peers, peer)
	p.changedLocked()
	p.mu.Unlock()
}

// pubPeer is one subscriber: its subscriptions and its outgoing queue.
type pubPeer struct {
	nc   net.Conn
	conn *zmq4.Conn
	bc   *zmtp.BufConn

	mu       sync.Mutex
	prefixes []string
	queue    [][][]byte
	stopping bool
	linger   time.Duration
	wake     chan struct{}
}

func newPubPeer(nc net.Conn, conn *zmq4.Conn, bc *zmtp.BufConn) *pubPeer {
	return &pubPeer{nc: nc, conn: conn, bc: bc, wake: make(chan struct{}, 1)}
}

func (pp *pubPeer) subscribe(prefix string) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.prefixes = append(pp.prefixes, prefix)
}

func (pp *pubPeer) unsubscribe(prefix string) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for i, s := range pp.prefixes {
		if s == prefix {
			pp.prefixes = append(pp.prefixes[:i], pp.prefixes[i+1:]...)
			return
		}
	}
}

func (pp *pubPeer) subscriptions() int {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return len(pp.prefixes)
}

func (pp *pubPeer) matches(topic string) bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, s := range pp.prefixes {
		if strings.HasPrefix(topic, s) {
			return true
		}
	}
	return false
}

// enqueue queues a message; false when the queue is at hwm (dropped).
func (pp *pubPeer) enqueue(frames [][]byte, hwm int) bool {
	pp.mu.Lock()
	if pp.stopping || len(pp.queue) >= hwm {
		pp.mu.Unlock()
		return false
	}
	pp.queue = append(pp.queue, frames)
	pp.mu.Unlock()
	select {
	case pp.wake <- struct{}{}:
	default:
	}
	return true
}

// stop makes the writer write what is queued, within linger, then end.
func (pp *pubPeer) stop(linger time.Duration) {
	pp.mu.Lock()
	if !pp.stopping {
		pp.stopping, pp.linger = true, linger
	}
	pp.mu.Unlock()
	select {
	case pp.wake <- struct{}{}:
	default:
	}
}

func (pp *pubPeer) writeLoop() {
	for {
		<-pp.wake
		pp.mu.Lock()
		q, stopping, linger := pp.queue, pp.stopping, pp.linger
		pp.queue = nil
		pp.mu.Unlock()
		if stopping {
			if linger <= 0 {
				pp.nc.Close()
				return
			}
			_ = pp.nc.SetWriteDeadline(time.Now().Add(linger))
		}
		var err error
		for _, frames := range q {
			if err = pp.conn.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
				break
			}
		}
		if err == nil {
			err = pp.bc.Flush()
		}
		if err != nil {
			pp.nc.Close()
			pp.drain()
			return
		}
		if stopping {
			pp.mu.Lock()
			more := len(pp.queue) > 0
			pp.mu.Unlock()
			if !more {
				pp.nc.Close() // flushed: the reader ends on the closed connection
				return
			}
			select {
			case pp.wake <- struct{}{}:
			default:
			}
		}
	}
}

// drain empties the queue of a dead peer and refuses further messages.
func (pp *pubPeer) drain() {
	pp.mu.Lock()
	pp.queue, pp.stopping = nil, true
	pp.mu.Unlock()
}

// acceptReplay accepts replay clients until the listener closes.
func (p *ZMQPublisher) acceptReplay() {
	defer p.wg.Done()
	for {
		nc, err := p.replayLn.Accept()
		if err != nil {
			if p.quit.Err() == nil && !errors.Is(err, net.ErrClosed) {
				p.log.Warn("zmq publisher: accept replay", "err", err)
				continue
			}
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			nc.Close()
			return
		}
		p.replays[nc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serveReplay(nc)
			p.mu.Lock()
			delete(p.replays, nc)
			p.mu.Unlock()
		}()
	}
}

// serveReplay answers one client's requests as vLLM's ROUTER does: a
// request is [client id, empty, start_seq]; at the connection level the id
// frame is the connection itself, so the frames read are [empty, start_seq].
// Anything else is logged and ignored.
func (p *ZMQPublisher) serveReplay(nc net.Conn) {
	defer nc.Close()
	conn, bc, err := zmtp.Open(nc, zmq4.Router, true, p.cfg.DialTimeout, readBuffer, writeBuffer)
	if err != nil {
		p.log.Debug("zmq replay: handshake", "peer", nc.RemoteAddr(), "err", err)
		return
	}
	for {
		msg, err := conn.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if len(msg.Frames) != 2 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
			p.log.Warn("zmq replay: ignored a malformed request", "frames", len(msg.Frames))
			continue
		}
		start := binary.BigEndian.Uint64(msg.Frames[1])
		entries := p.replayFrom(start)
		for _, e := range entries {
			if err := conn.SendMsg(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, e.seq), e.payload)); err != nil {
				return
			}
		}
		if err := conn.SendMsg(zmq4.NewMsgFrom([]byte{}, zmtp.EndSeq, []byte{})); err != nil {
			return
		}
		if err := bc.Flush(); err != nil {
			return
		}
		p.mu.Lock()
		p.stats.ReplayRequests++
		p.stats.ReplayBatches += uint64(len(entries))
		p.changedLocked()
		p.mu.Unlock()
	}
}
