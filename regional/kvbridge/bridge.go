package kvbridge

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/regional/discovery"
	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvbridge/zmtp"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// HeaderMarker is set, to "restart" or "join", on the AllBlocksCleared
// batches the bridge writes itself (they carry no seq header).
const HeaderMarker = kvevents.HeaderMarker

// Stats are the bridge's totals since Open.
type Stats struct {
	Received  uint64 // live batches received from PUB sockets
	Forwarded uint64 // engine batches acknowledged by Kafka (live and replayed)
	Replayed  uint64 // ... of which came from a replay socket
	Markers   uint64 // AllBlocksCleared markers acknowledged by Kafka
	Counts           // the streams' counts, summed
	Dropped   uint64 // batches not forwarded: bad frames, no pod name, too many streams, too large
	Malformed uint64 // payloads that failed to decode (forwarded all the same)

	Connects      uint64 // ZMQ connections established
	Reconnects    uint64 // ... after an earlier one of the same endpoint was lost
	ConnectErrors uint64
	ProduceErrors uint64 // Kafka writes that failed (and were retried)
	Announcements uint64 // PodUp announcements acknowledged by Kafka
	PodsDown      uint64 // PodDown announcements (discovered pods that left) acknowledged
	Connections   int    // live ZMQ connections now
	Pending       int    // batches received and not yet acknowledged by Kafka or dropped (the lag)
}

// Counts are what a stream's gap, duplicate and restart logic counts (per
// stream in StreamStats, summed in Stats).
type Counts struct {
	Duplicates     uint64 // batches a replay answer repeated (dropped)
	GapsDetected   uint64 // runs of seqs not received live
	GapsRecovered  uint64 // ... fully repaired by replay
	GapsLost       uint64 // ... not fully repaired
	BatchesLost    uint64 // seqs in those runs that no replay provided
	Restarts       uint64 // new engine incarnations seen
	JoinsFull      uint64 // first sight with the whole history replayed from seq 0
	JoinsPartial   uint64 // first sight without it (forwarding starts at the live batch)
	ReplayRequests uint64
	ReplayFailures uint64 // requests that failed (connect, timeout, malformed reply)
	NoReplay       uint64 // repairs not attempted: the pod has no replay endpoint
}

func (c *Counts) add(o Counts) {
	c.Duplicates += o.Duplicates
	c.GapsDetected += o.GapsDetected
	c.GapsRecovered += o.GapsRecovered
	c.GapsLost += o.GapsLost
	c.BatchesLost += o.BatchesLost
	c.Restarts += o.Restarts
	c.JoinsFull += o.JoinsFull
	c.JoinsPartial += o.JoinsPartial
	c.ReplayRequests += o.ReplayRequests
	c.ReplayFailures += o.ReplayFailures
	c.NoReplay += o.NoReplay
}

// StreamStats describe one stream (pod, topic, data-parallel rank).
type StreamStats struct {
	Pod     string
	Topic   string
	Rank    int64
	LastSeq uint64 // seq of the last batch forwarded
	// Forwarded and Replayed mean what they do in Stats, counted when the
	// batch is handed to the Kafka writer rather than when Kafka
	// acknowledges it: engine batches forwarded (live and replayed), and
	// those of them that came from the replay socket.
	Forwarded uint64
	Replayed  uint64
	Counts
}

// Bridge subscribes to engines' ZMQ PUB sockets and produces their batches
// to the region's Kafka topic. Open starts it; Close stops it.
type Bridge struct {
	cfg  Config
	log  *slog.Logger
	now  func() time.Time
	m    *metrics
	w    *kafka.Writer
	tr   *kafka.Transport
	sec  *kafkasec.Client
	warn *kvevents.WarnLimiter

	srcMu   sync.Mutex
	sources []*source
	// announced are the pods the bridge announces, by name: static pods
	// with an HTTP endpoint and discovered ones (under srcMu).
	announced map[string]PodConfig

	disc       discovery.Source // nil without Discovery
	discovered []discovery.Pod  // the last snapshot applied (the discovery goroutine's)
	bgCtx      context.Context
	stopBg     context.CancelFunc
	bg         sync.WaitGroup // discovery and the announcer

	readCtx  context.Context
	stopRead context.CancelFunc
	procCtx  context.Context
	stopProc context.CancelFunc
	procs    sync.WaitGroup

	pending atomic.Int64 // received, not yet acknowledged or dropped
	conns   atomic.Int64

	mu      sync.Mutex
	stats   Stats
	changed chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// source is one ZMQ endpoint (one rank of one PodConfig): its connection
// goroutines feed one processor goroutine, which owns the streams.
type source struct {
	b      *Bridge
	pod    PodConfig
	rank   int
	ep     endpoint
	replay *replayClient
	ln     net.Listener // Bind
	in     chan item
	ctx    context.Context // its connections' lifetime
	cancel context.CancelFunc
	rwg    sync.WaitGroup // the connection goroutines
	gen    atomic.Uint64  // connection generations
	dec    *kvevents.Decoder

	streams map[streamKey]*stream // processor's

	mu   sync.Mutex
	snap map[streamKey]StreamStats
}

// item is one live message and when it arrived.
type item struct {
	gen    uint64
	frames [][]byte
	at     time.Time
}

// Open validates cfg, binds the Bind endpoints and starts connecting.
func Open(cfg Config) (*Bridge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	b := &Bridge{cfg: cfg, log: cfg.Logger, now: cfg.Now, changed: make(chan struct{}), announced: map[string]PodConfig{}}
	b.warn = kvevents.NewWarnLimiter(b.log, time.Minute, b.now)
	var err error
	if b.sec, err = cfg.Kafka.Open("kafka", nil); err != nil {
		return nil, fmt.Errorf("open kv bridge: %w", err)
	}
	if b.m, err = newMetrics(cfg.Registerer, b); err != nil {
		return nil, err
	}
	for _, p := range cfg.Pods {
		srcs, err := b.newSources(p)
		if err != nil {
			b.closeListeners()
			return nil, err
		}
		b.sources = append(b.sources, srcs...)
		if p.HTTPEndpoint != "" {
			b.announced[p.Name] = p
		}
	}
	if cfg.Discovery.Enabled() {
		if b.disc, err = discovery.New(cfg.Discovery, discovery.Deps{Logger: b.log.With("component", "discovery"),
			Registerer: cfg.Registerer, Now: cfg.Now}); err != nil {
			b.closeListeners()
			return nil, fmt.Errorf("open kv bridge: discovery: %w", err)
		}
	}
	b.tr = b.sec.Transport("meridian-kvbridge", cfg.DialTimeout)
	b.w = &kafka.Writer{
		Addr:                   kafka.TCP(cfg.Brokers...),
		Topic:                  cfg.Topic,
		Balancer:               &kafka.Hash{},
		RequiredAcks:           kafka.RequireAll,
		BatchTimeout:           cfg.BatchTimeout,
		BatchBytes:             cfg.MaxMessageBytes + 64<<10, // room for key and headers
		BatchSize:              cfg.MaxWriteBatch,
		WriteTimeout:           cfg.WriteTimeout,
		MaxAttempts:            3,
		WriteBackoffMin:        cfg.BackoffMin,
		WriteBackoffMax:        cfg.BackoffMax,
		AllowAutoTopicCreation: true,
		Transport:              b.tr,
	}
	b.readCtx, b.stopRead = context.WithCancel(context.Background())
	b.procCtx, b.stopProc = context.WithCancel(context.Background())
	b.bgCtx, b.stopBg = context.WithCancel(context.Background())
	for _, s := range b.sources {
		b.start(s)
	}
	if uses := cfg.Kafka.InsecureUses("kafka", cfg.Brokers); len(uses) > 0 {
		b.log.Warn("INSECURE: this kv bridge runs with insecure: true; anyone on the path to the brokers can read or forge the events", "insecure", uses)
	}
	if b.disc != nil {
		b.bg.Add(1)
		go func() {
			defer b.bg.Done()
			_ = b.disc.Run(b.bgCtx, b.applyDiscovered)
		}()
	}
	if cfg.AnnounceInterval > 0 {
		b.bg.Add(1)
		go b.announceLoop()
	}
	b.log.Info("kv bridge started", "topic", cfg.Topic, "sources", len(b.sources), "kafka", b.sec, "discovery", b.disc != nil)
	return b, nil
}

// newSources builds the sources of one pod (one per data-parallel rank),
// binding their listeners; they start with start.
func (b *Bridge) newSources(p PodConfig) ([]*source, error) {
	if p.DataParallelSize < 1 {
		p.DataParallelSize = 1
	}
	var out []*source
	for r := range p.DataParallelSize {
		ep, err := parseEndpoint(p.Endpoint, r, p.Bind)
		if err != nil {
			return nil, fmt.Errorf("open kv bridge: pod %s: %w", p.Name, err)
		}
		dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
		if err != nil {
			return nil, err
		}
		s := &source{b: b, pod: p, rank: r, ep: ep, in: make(chan item, b.cfg.QueueSize), dec: dec,
			streams: map[streamKey]*stream{}, snap: map[streamKey]StreamStats{}}
		if p.ReplayEndpoint != "" {
			if rep, err := parseEndpoint(p.ReplayEndpoint, r, false); err == nil {
				s.replay = &replayClient{ep: rep, timeout: b.cfg.ReplayTimeout}
			}
		}
		if ep.bind {
			if s.ln, err = ep.Listen(); err != nil {
				for _, o := range out {
					if o.ln != nil {
						o.ln.Close()
					}
				}
				return nil, fmt.Errorf("open kv bridge: bind %s: %w", ep, err)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// start runs a source's connection goroutine(s) and its processor.
func (b *Bridge) start(s *source) {
	s.ctx, s.cancel = context.WithCancel(b.readCtx)
	s.rwg.Add(1)
	if s.ln != nil {
		go s.acceptLoop(s.ctx)
	} else {
		go s.dialLoop(s.ctx)
	}
	b.procs.Add(1)
	go s.process(b.procCtx)
}

// stop ends a source that is no longer in b.sources: its connections
// close, and its processor forwards what was received, then ends.
func (s *source) stop() {
	s.cancel()
	if s.ln != nil {
		s.ln.Close()
	}
	s.rwg.Wait()
	close(s.in)
}

// snapshotSources returns the current sources.
func (b *Bridge) snapshotSources() []*source {
	b.srcMu.Lock()
	defer b.srcMu.Unlock()
	return slices.Clone(b.sources)
}

// Run opens a bridge, serves until ctx ends, then closes it, allowing 10s
// to forward what was received. With MetricsAddr it also serves /metrics,
// /healthz, /readyz and /streams there (cfg.Registerer must then be nil or a
// prometheus.Gatherer too).
func Run(ctx context.Context, cfg Config) error {
	var gatherer prometheus.Gatherer
	if cfg.MetricsAddr != "" {
		switch r := cfg.Registerer.(type) {
		case nil:
			reg := prometheus.NewRegistry()
			cfg.Registerer, gatherer = reg, reg
		case prometheus.Gatherer:
			gatherer = r
		default:
			return errors.New("run kv bridge: metrics_addr needs a Registerer that is also a Gatherer")
		}
	}
	var ln net.Listener
	if cfg.MetricsAddr != "" {
		var err error
		if ln, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return fmt.Errorf("run kv bridge: metrics listener: %w", err)
		}
	}
	b, err := Open(cfg)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return err
	}
	var srv *http.Server
	srvDone := make(chan struct{})
	if ln != nil {
		srv = &http.Server{Handler: b.handler(gatherer), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			defer close(srvDone)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.log.Error("kv bridge: metrics server stopped", "err", err)
			}
		}()
		b.log.Info("kv bridge: serving /metrics", "addr", ln.Addr().String())
	} else {
		close(srvDone)
	}
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	if srv != nil {
		if err := srv.Shutdown(cctx); err != nil {
			errs = append(errs, fmt.Errorf("run kv bridge: metrics server: %w", err))
		}
	}
	<-srvDone
	errs = append(errs, b.Close(cctx))
	return errors.Join(errs...)
}

// handler serves /metrics, /healthz (200: the process serves), /readyz (200
// while at least one engine connection is up, else 503) and /streams
// (JSON totals and per-stream state).
func (b *Bridge) handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := b.Stats()
		if st.Connections == 0 {
			http.Error(w, "no engine connected", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ok: %d connections, %d pending\n", st.Connections, st.Pending)
	})
	mux.HandleFunc("GET /streams", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"stats": b.Stats(), "streams": b.Streams()})
	})
	return mux
}

// Close stops reading from the engines, forwards what was already received
// (until ctx ends; then it is dropped), closes the Kafka writer and waits for
// every goroutine. Safe to call twice; later calls return the first result.
func (b *Bridge) Close(ctx context.Context) error {
	b.closeOnce.Do(func() {
		var errs []error
		b.stopBg() // discovery and the announcer: the sources stop changing
		b.bg.Wait()
		b.stopRead()
		b.closeListeners()
		for _, s := range b.snapshotSources() {
			s.rwg.Wait()
			close(s.in)
		}
		done := make(chan struct{})
		go func() { b.procs.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			b.stopProc()
			<-done
			errs = append(errs, fmt.Errorf("close kv bridge: forwarding what was received: %w", ctx.Err()))
		}
		b.stopProc()
		if err := b.w.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close kv bridge: kafka writer: %w", err))
		}
		b.tr.CloseIdleConnections()
		b.closeErr = errors.Join(errs...)
		b.log.Info("kv bridge stopped")
	})
	return b.closeErr
}

func (b *Bridge) closeListeners() {
	for _, s := range b.snapshotSources() {
		if s.ln != nil {
			s.ln.Close()
		}
	}
}

// Addrs returns, per source, the endpoint it dials or listens on (a bound
// port 0 resolved), in configuration order (ranks expanded).
func (b *Bridge) Addrs() []string {
	sources := b.snapshotSources()
	out := make([]string, len(sources))
	for i, s := range sources {
		if s.ln != nil {
			out[i] = zmtp.EndpointOf(s.ln)
		} else {
			out[i] = s.ep.String()
		}
	}
	return out
}

// Stats returns the totals.
func (b *Bridge) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statsLocked()
}

func (b *Bridge) statsLocked() Stats {
	s := b.stats
	s.Connections = int(b.conns.Load())
	s.Pending = int(b.pending.Load())
	return s
}

// Streams returns the state of every stream seen, sorted by pod, topic and
// rank.
func (b *Bridge) Streams() []StreamStats {
	var out []StreamStats
	for _, s := range b.snapshotSources() {
		s.mu.Lock()
		for _, st := range s.snap {
			out = append(out, st)
		}
		s.mu.Unlock()
	}
	slices.SortFunc(out, func(a, c StreamStats) int {
		if n := strings.Compare(a.Pod, c.Pod); n != 0 {
			return n
		}
		if n := strings.Compare(a.Topic, c.Topic); n != 0 {
			return n
		}
		return int(a.Rank - c.Rank)
	})
	return out
}

// WaitFor blocks until cond holds for the stats (checked now and after
// every change) or ctx ends.
func (b *Bridge) WaitFor(ctx context.Context, cond func(Stats) bool) error {
	for {
		b.mu.Lock()
		ok, ch := cond(b.statsLocked()), b.changed
		b.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for kv bridge: %w (stats %+v)", ctx.Err(), b.Stats())
		}
	}
}

// update changes the stats and wakes WaitFor.
func (b *Bridge) update(f func(*Stats)) {
	b.mu.Lock()
	f(&b.stats)
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// dialLoop is a dialing source's connection goroutine: connect, read until
// the connection fails, back off, again, until ctx ends. zmq4's own Dial is
// synchronous and its automatic reconnect races, so the loop is ours.
func (s *source) dialLoop(ctx context.Context) {
	defer s.rwg.Done()
	cfg := s.b.cfg
	backoff := cfg.BackoffMin
	had := false
	for {
		nc, conn, err := dialZMTP(ctx, s.ep, zmq4.Sub, cfg.DialTimeout)
		if err == nil {
			if err = subscribe(conn, s.pod.Subscribe); err != nil {
				nc.Close()
			}
		}
		if ctx.Err() != nil {
			if err == nil {
				nc.Close()
			}
			return
		}
		if err != nil {
			s.b.m.connectErrors.Inc()
			s.b.update(func(st *Stats) { st.ConnectErrors++ })
			s.b.warn.Warn("connect:"+s.ep.String(), "kv bridge: cannot connect to engine; retrying",
				"endpoint", s.ep.String(), "err", err, "retry_in", backoff)
		} else {
			if had {
				s.b.m.reconnects.Inc()
				s.b.update(func(st *Stats) { st.Reconnects++ })
			}
			had = true
			if s.read(ctx, nc, conn) {
				backoff = cfg.BackoffMin
			}
			if ctx.Err() != nil {
				return
			}
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, cfg.BackoffMax)
	}
}

// acceptLoop is a binding source's: every engine that connects gets a
// connection goroutine.
func (s *source) acceptLoop(ctx context.Context) {
	defer s.rwg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.b.warn.Warn("accept:"+s.ep.String(), "kv bridge: accept", "endpoint", s.ep.String(), "err", err)
			continue
		}
		s.rwg.Add(1)
		go func() {
			defer s.rwg.Done()
			defer nc.Close()
			stop := context.AfterFunc(ctx, func() { nc.Close() })
			defer stop()
			conn, _, err := zmtp.Open(nc, zmq4.Sub, true, s.b.cfg.DialTimeout, readBuffer, 0)
			if err == nil {
				err = subscribe(conn, s.pod.Subscribe)
			}
			if err != nil {
				s.b.m.connectErrors.Inc()
				s.b.update(func(st *Stats) { st.ConnectErrors++ })
				s.b.warn.Warn("handshake:"+s.ep.String(), "kv bridge: engine connection failed", "peer", nc.RemoteAddr().String(), "err", err)
				return
			}
			s.read(ctx, nc, conn)
		}()
	}
}

// read queues one connection's messages for the processor until the
// connection fails or ctx ends; it reports whether any message came.
func (s *source) read(ctx context.Context, nc net.Conn, conn *zmq4.Conn) bool {
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	gen := s.gen.Add(1)
	s.b.conns.Add(1)
	s.b.update(func(st *Stats) { st.Connects++ })
	s.b.log.Info("kv bridge: connected", "endpoint", s.ep.String(), "peer", nc.RemoteAddr().String(), "generation", gen)
	defer func() {
		s.b.conns.Add(-1)
		s.b.update(func(*Stats) {})
	}()
	got := false
	for {
		msg, err := conn.RecvMsg()
		if err != nil {
			if ctx.Err() == nil {
				s.b.log.Warn("kv bridge: connection lost", "endpoint", s.ep.String(), "err", err)
			}
			return got
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		got = true
		s.b.pending.Add(1)
		s.b.m.received.WithLabelValues("live").Inc()
		select {
		case s.in <- item{gen: gen, frames: msg.Frames, at: s.b.now()}:
		case <-ctx.Done():
			s.b.pending.Add(-1)
			return got
		}
	}
}

// outMsg is one Kafka message and what it stands for.
type outMsg struct {
	msg    kafka.Message
	at     time.Time
	marker string // the marker's why; "" for an engine batch
	replay bool
	// announce is "up" or "down" for the bridge's own PodUp and PodDown.
	announce string
}

// process is a source's processor goroutine: it takes the queued messages
// in order, runs each stream's state machine (which may ask the replay
// socket), and writes the result to Kafka, until the queue is closed and
// drained or ctx ends.
func (s *source) process(ctx context.Context) {
	defer s.b.procs.Done()
	var items []item
	var out []outMsg
	var acts []action
	for {
		items = items[:0]
		select {
		case it, ok := <-s.in:
			if !ok {
				return
			}
			items = append(items, it)
		case <-ctx.Done():
			return
		}
	drain:
		for len(items) < s.b.cfg.MaxWriteBatch {
			select {
			case it, ok := <-s.in:
				if !ok {
					break drain
				}
				items = append(items, it)
			default:
				break drain
			}
		}
		var c chunk
		out = out[:0]
		for _, it := range items {
			out, acts = s.handle(ctx, it, out, acts[:0], &c)
		}
		s.b.m.record(c.t)
		s.b.update(func(st *Stats) {
			st.Received += uint64(len(items))
			st.Counts.add(c.t.Counts)
			st.Malformed += c.malformed
			st.Dropped += c.dropped
		})
		s.b.produce(ctx, out)
		s.b.pending.Add(-int64(len(items)))
		s.b.update(func(*Stats) {})
	}
}

// chunk counts what the processor did with one batch of queued messages.
type chunk struct {
	t         tally
	dropped   uint64
	malformed uint64
}

func (c *chunk) drop(m *metrics, reason string) {
	c.dropped++
	m.dropped.WithLabelValues(reason).Inc()
}

// handle runs one live message through its stream and appends the Kafka
// messages to write.
func (s *source) handle(ctx context.Context, it item, out []outMsg, acts []action, c *chunk) ([]outMsg, []action) {
	f := it.frames
	if len(f) != 3 || len(f[1]) != 8 {
		s.b.warn.Warn("frames", "kv bridge: dropped a message that is not [topic, seq, payload]",
			"endpoint", s.ep.String(), "frames", len(f))
		c.drop(s.b.m, "bad_frames")
		return out, acts
	}
	topic, seq, payload := string(f[0]), binary.BigEndian.Uint64(f[1]), f[2]
	pod, model := s.pod.Name, s.pod.Model
	if pod == "" || model == "" {
		tp, tm, ok := parseTopic(topic)
		if pod == "" {
			if !ok {
				s.b.warn.Warn("no_pod", "kv bridge: dropped a batch: no pod name configured and the topic is not kv@<pod>@<model>",
					"endpoint", s.ep.String(), "topic", topic)
				c.drop(s.b.m, "no_pod")
				return out, acts
			}
			pod = tp
		}
		if model == "" && ok {
			model = tm
		}
	}
	rank := int64(s.rank)
	if !s.b.cfg.SkipValidation {
		batch, err := s.dec.Decode(payload)
		if err != nil {
			reason := kvevents.ReasonOf(err)
			s.b.m.malformed.WithLabelValues(string(reason)).Inc()
			s.b.warn.Warn("malformed:"+string(reason), "kv bridge: malformed batch (forwarded; the ingester skips it)",
				"pod", pod, "seq", seq, "err", err)
			c.malformed++
		} else {
			rank = batch.Rank()
			for _, sk := range batch.Skipped {
				if sk.Malformed() {
					// One bad event: the ingester skips it and applies the rest.
					s.b.m.malformedEvents.WithLabelValues(string(sk.Reason)).Inc()
					s.b.warn.Warn("malformed event:"+string(sk.Reason), "kv bridge: malformed event (forwarded; the ingester skips it)",
						"pod", pod, "seq", seq, "index", sk.Index, "tag", sk.Tag, "detail", sk.Detail)
				}
			}
		}
	}
	key := streamKey{pod: pod, topic: topic, rank: rank}
	st := s.streams[key]
	if st == nil {
		if len(s.streams) >= s.b.cfg.MaxStreams {
			s.b.warn.Warn("too_many_streams", "kv bridge: dropped a batch of a new stream: max_streams reached",
				"endpoint", s.ep.String(), "max_streams", s.b.cfg.MaxStreams, "pod", pod, "topic", topic)
			c.drop(s.b.m, "too_many_streams")
			return out, acts
		}
		st = &stream{}
		s.streams[key] = st
	}
	var replay replayFunc
	if s.replay != nil {
		replay = func(from, upto uint64) (replayResult, bool) {
			res, err := s.replay.replay(ctx, from, upto)
			if err != nil {
				if ctx.Err() == nil {
					s.b.warn.Warn("replay:"+s.replay.ep.String(), "kv bridge: replay failed", "pod", pod, "from", from, "err", err)
				}
				return replayResult{}, false
			}
			if res.any && res.first > from {
				s.b.log.Info("kv bridge: the engine's replay buffer no longer holds what was asked",
					"pod", pod, "topic", topic, "rank", rank, "asked_from", from, "first_held", res.first)
			}
			return res, true
		}
	}
	before := st.total
	acts = st.handle(acts, &c.t, it.gen, seq, payload, replay)
	if d := st.total.Restarts - before.Restarts; d > 0 {
		s.b.log.Warn("kv bridge: engine restart detected", "pod", pod, "topic", topic, "rank", rank, "seq", seq)
	}
	if d := st.total.BatchesLost - before.BatchesLost; d > 0 {
		s.b.log.Warn("kv bridge: batches lost", "pod", pod, "topic", topic, "rank", rank, "lost", d, "at_seq", seq)
	}
	for _, a := range acts {
		out = append(out, s.message(key, model, rank, a, it.at))
	}
	s.mu.Lock()
	s.snap[key] = StreamStats{Pod: pod, Topic: topic, Rank: rank, LastSeq: st.last,
		Forwarded: st.total.Forwarded, Replayed: st.total.Replayed, Counts: st.total.Counts}
	s.mu.Unlock()
	return out, acts
}

// message builds the Kafka message of an action: key = pod name, headers
// pod, model and hardware where known, seq (the engine's) on engine batches,
// HeaderMarker on markers.
func (s *source) message(key streamKey, model string, rank int64, a action, at time.Time) outMsg {
	hs := make([]kafka.Header, 0, 4)
	hs = append(hs, kafka.Header{Key: kvevents.HeaderPod, Value: []byte(key.pod)})
	if model != "" {
		hs = append(hs, kafka.Header{Key: kvevents.HeaderModel, Value: []byte(model)})
	}
	if s.pod.Hardware != "" {
		hs = append(hs, kafka.Header{Key: kvevents.HeaderHardware, Value: []byte(s.pod.Hardware)})
	}
	if s.pod.Engine != "" {
		hs = append(hs, kafka.Header{Key: kvevents.HeaderEngine, Value: []byte(s.pod.Engine)})
	}
	if s.pod.KVBlocks > 0 {
		hs = append(hs, kafka.Header{Key: kvevents.HeaderKVBlocks, Value: binary.BigEndian.AppendUint64(nil, uint64(s.pod.KVBlocks))})
	}
	o := outMsg{at: at, replay: a.replayed}
	switch a.kind {
	case actForward:
		hs = append(hs, kafka.Header{Key: kvevents.HeaderSeq, Value: binary.BigEndian.AppendUint64(nil, a.seq)})
		o.msg = kafka.Message{Key: []byte(key.pod), Value: a.payload, Headers: hs}
	case actMarker:
		hs = append(hs, kafka.Header{Key: HeaderMarker, Value: []byte(a.why)})
		o.marker = a.why
		o.msg = kafka.Message{Key: []byte(key.pod), Value: markerPayload(s.b.now(), rank), Headers: hs}
	}
	return o
}

// markerPayload is a vLLM batch holding one AllBlocksCleared for rank.
func markerPayload(now time.Time, rank int64) []byte {
	b, err := kvevents.Encoding{}.AppendBatch(nil, &kvevents.Batch{TS: float64(now.UnixNano()) / 1e9,
		Events: []kvevents.Event{&kvevents.AllBlocksCleared{}}, DataParallelRank: kvevents.Some(rank)})
	if err != nil {
		panic(fmt.Sprintf("encode marker: %v", err)) // a fixed, valid batch
	}
	return b
}

// produce writes out to Kafka in order, retrying failed messages with
// backoff until they are written or ctx ends. A message over
// MaxMessageBytes, or refused by the broker as too large, is dropped and
// counted: no retry can make it fit.
func (b *Bridge) produce(ctx context.Context, out []outMsg) {
	pending := make([]outMsg, 0, len(out))
	for _, o := range out {
		if int64(len(o.msg.Value)) > b.cfg.MaxMessageBytes {
			b.tooLarge(o, fmt.Errorf("%d bytes, max_message_bytes %d", len(o.msg.Value), b.cfg.MaxMessageBytes))
			continue
		}
		pending = append(pending, o)
	}
	backoff := b.cfg.BackoffMin
	for len(pending) > 0 {
		msgs := make([]kafka.Message, len(pending))
		for i, o := range pending {
			msgs[i] = o.msg
		}
		err := b.w.WriteMessages(ctx, msgs...)
		if err == nil {
			b.written(pending)
			return
		}
		if ctx.Err() != nil {
			return
		}
		var werrs kafka.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == len(pending) {
			var ok, retry []outMsg
			for i, e := range werrs {
				switch {
				case e == nil:
					ok = append(ok, pending[i])
				case errors.Is(e, kafka.MessageSizeTooLarge):
					b.tooLarge(pending[i], e)
				default:
					retry = append(retry, pending[i])
				}
			}
			b.written(ok)
			pending = retry
			if len(pending) == 0 {
				return
			}
		}
		kind := "write"
		if k := b.sec.Kind(err); k == kafkasec.KindAuth || k == kafkasec.KindTLS {
			kind = k
		}
		b.m.produceErrors.WithLabelValues(kind).Inc()
		b.update(func(st *Stats) { st.ProduceErrors++ })
		b.warn.Warn("produce", "kv bridge: kafka write failed; retrying", "topic", b.cfg.Topic,
			"messages", len(pending), "err", b.sec.Explain(err), "retry_in", backoff)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, b.cfg.BackoffMax)
	}
}

func (b *Bridge) tooLarge(o outMsg, err error) {
	b.m.produceErrors.WithLabelValues("too_large").Inc()
	b.m.dropped.WithLabelValues("too_large").Inc()
	b.update(func(st *Stats) { st.Dropped++ })
	b.warn.Warn("too_large", "kv bridge: dropped a batch too large for Kafka", "pod", string(o.msg.Key), "err", err)
}

// written accounts for acknowledged messages.
func (b *Bridge) written(ok []outMsg) {
	if len(ok) == 0 {
		return
	}
	now := b.now()
	var fwd, rep, mark uint64
	var ups, downs uint64
	for _, o := range ok {
		switch {
		case o.announce == "up":
			ups++
		case o.announce == "down":
			downs++
		case o.marker != "":
			mark++
			b.m.markers.WithLabelValues(o.marker).Inc()
		default:
			fwd++
			if o.replay {
				rep++
			}
			b.m.latency.Observe(now.Sub(o.at).Seconds())
		}
	}
	b.m.forwarded.Add(float64(fwd))
	b.m.announcements.WithLabelValues("up").Add(float64(ups))
	b.m.announcements.WithLabelValues("down").Add(float64(downs))
	b.update(func(st *Stats) {
		st.Forwarded += fwd
		st.Replayed += rep
		st.Markers += mark
		st.Announcements += ups
		st.PodsDown += downs
	})
}

// sleep waits d, or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
