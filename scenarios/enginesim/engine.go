package enginesim

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/tokenize"
	"github.com/meridian-llm/meridian/scenarios/prefixcache"
)

// Engine is one simulated vLLM pod. Open starts it; Close stops it.
type Engine struct {
	cfg     Config
	log     *slog.Logger
	clock   Clock
	model   *tokenize.Model
	chain   hashChain
	m       *metrics
	reg     *prometheus.Registry
	faults  *faultState
	name    string
	epoch   uint64
	loras   map[string]bool
	created int64 // unix seconds, for response objects
	reqIDs  atomic.Uint64

	mu      sync.Mutex
	cache   *prefixCache
	waiting []*request
	running int
	stalled int // requests hanging in an injected stall
	// prefillFree[i] is when prefill slot i finishes the work queued on it
	// (see Timing.PrefillSlots); nil when prefills are unlimited.
	prefillFree []time.Time
	changed     chan struct{} // closed and replaced at every scheduler change

	pipe     *eventPipe
	ownedPub io.Closer // the Kafka publisher when the engine built it

	announces    atomic.Int64  // PodUps emitted
	stopAnnounce chan struct{} // closed to stop the announcer
	announceDone chan struct{} // closed when it stopped

	// Network side, set by Open.
	ln       net.Listener
	scheme   string // of URL: http, or https with TLSCert
	srv      *http.Server
	endpoint string
	baseCtx  context.Context
	cancel   context.CancelFunc
	srvDone  chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// request is one generation request inside the scheduler.
type request struct {
	h          holding
	admitted   chan struct{} // closed at admission
	state      reqState
	loadFactor float64
	arrived    time.Time
}

type reqState uint8

const (
	reqQueued reqState = iota
	reqRunning
	reqDone
)

// Stats is a snapshot of the engine's scheduler and cache.
type Stats struct {
	Running, Waiting int
	// Stalled counts requests hanging in an injected stall (not yet queued).
	Stalled int
	// UsedBlocks counts blocks occupied (cached or reserved); CachedBlocks
	// those findable by hash; Capacity the total.
	UsedBlocks, CachedBlocks, Capacity int
	// KVUsage is vllm:kv_cache_usage_perc.
	KVUsage float64
}

// newEngine builds an engine without network or goroutines.
func newEngine(cfg Config, name string) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e := &Engine{cfg: cfg, name: name, log: cfg.Logger, clock: cfg.Clock, reg: cfg.Registry, changed: make(chan struct{})}
	if n := cfg.Timing.PrefillSlots; n > 0 {
		e.prefillFree = make([]time.Time, n)
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.clock == nil {
		e.clock = RealClock{}
	}
	if e.reg == nil {
		e.reg = prometheus.NewRegistry()
	}
	var err error
	if e.model, err = tokenize.NewModel(cfg.Tokenizer); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	seed := cfg.HashSeed
	if seed == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		seed = hex.EncodeToString(b[:])
	}
	e.chain = newHashChain(seed)
	if e.m, err = newMetrics(e.reg, cfg.Model, cfg.Engine); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	e.faults = newFaultState(cfg.Faults, cfg.Seed)
	e.epoch = cfg.Epoch
	if e.epoch == 0 {
		e.epoch = uint64(e.clock.Now().UnixNano())
	}
	e.created = e.clock.Now().Unix()
	e.loras = make(map[string]bool, len(cfg.LoRAs))
	for _, l := range cfg.LoRAs {
		e.loras[l] = true
	}
	e.cache = newPrefixCache(cfg.BlockSize, cfg.CacheBlocks, e.emitLocked)
	return e, nil
}

// startPipe creates the event pipe with pub and starts its goroutine.
func (e *Engine) startPipe(pub Publisher) {
	e.pipe = newEventPipe(e.name, e.epoch, e.cfg, pub, e.clock, e.log, e.m)
	go e.pipe.run()
}

// Open starts a simulated pod: it listens on cfg.Addr, announces PodUp and
// serves until Close.
func Open(cfg Config) (*Engine, error) {
	d := cfg.withDefaults()
	ln, err := net.Listen("tcp", d.Addr)
	if err != nil {
		return nil, fmt.Errorf("open engine: listen %s: %w", d.Addr, err)
	}
	name := cfg.Name
	if name == "" {
		name = "enginesim-" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	e, err := newEngine(cfg, name)
	if err != nil {
		ln.Close()
		return nil, err
	}
	e.ln, e.scheme = ln, "http"
	if cfg.TLSCert != "" {
		kp, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("open engine: TLSCert/TLSKey: %w", err)
		}
		e.ln, e.scheme = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}), "https"
	}
	e.endpoint = cfg.Endpoint
	if e.endpoint == "" {
		e.endpoint = e.URL()
	}
	pub := cfg.Publisher
	if cfg.Kafka != nil {
		kp, err := NewKafkaPublisher(*e.cfg.Kafka, e.podInfo())
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("open engine: %w", err)
		}
		pub, e.ownedPub = kp, kp
		if uses := e.cfg.Kafka.Security.InsecureUses("kafka", e.cfg.Kafka.Brokers); len(uses) > 0 {
			e.log.Warn("INSECURE: the engine's Kafka link is insecure; anyone on the path can read or forge its events", "insecure", uses)
		}
	}
	if pub == nil {
		pub = discardPublisher{}
	}
	e.startPipe(pub)
	e.announce()
	e.stopAnnounce, e.announceDone = make(chan struct{}), make(chan struct{})
	go e.announceLoop()

	e.baseCtx, e.cancel = context.WithCancel(context.Background())
	e.srv = &http.Server{
		Handler:           e.Handler(),
		BaseContext:       func(net.Listener) context.Context { return e.baseCtx },
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelWarn),
	}
	e.srvDone = make(chan struct{})
	go func() {
		defer close(e.srvDone)
		if err := e.srv.Serve(e.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error("engine server stopped", "err", err)
		}
	}()
	e.log.Info("engine simulator up", "pod", e.name, "endpoint", e.endpoint, "model", e.cfg.Model,
		"hardware", e.cfg.Hardware, "epoch", e.epoch)
	return e, nil
}

// Close stops the pod: in-flight requests are cancelled (their clients see
// the connection end), stalls are released, PodDown is published after the
// last event and the event pipe is flushed, bounded by ctx. Safe to call
// twice; later calls return the first result.
func (e *Engine) Close(ctx context.Context) error {
	e.closeOnce.Do(func() {
		var errs []error
		if e.srv != nil {
			e.cancel()
			e.faults.releaseStalls()
			if err := e.srv.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("shut down engine server: %w", err))
				_ = e.srv.Close()
			}
			<-e.srvDone
		}
		e.stopAnnouncing()
		if e.pipe != nil {
			e.mu.Lock()
			e.emitLocked(Event{Kind: PodDown, Pod: e.podInfo()})
			e.mu.Unlock()
			if err := e.pipe.close(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if e.ownedPub != nil {
			if err := e.ownedPub.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close kv event publisher: %w", err))
			}
		}
		e.closeErr = errors.Join(errs...)
		e.log.Info("engine simulator down", "pod", e.name, "epoch", e.epoch)
	})
	return e.closeErr
}

// Kill stops the pod as SIGKILL would: its listener and every connection
// close at once (clients see the connection end, new ones are refused) and
// it publishes nothing more — no PodDown. Events already handed to the
// publisher are flushed, bounded by ctx. Close after Kill does nothing.
func (e *Engine) Kill(ctx context.Context) error {
	e.closeOnce.Do(func() {
		var errs []error
		if e.srv != nil {
			e.cancel()
			e.faults.releaseStalls()
			_ = e.srv.Close()
			<-e.srvDone
		}
		e.stopAnnouncing()
		if e.pipe != nil {
			if err := e.pipe.close(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if e.ownedPub != nil {
			if err := e.ownedPub.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close kv event publisher: %w", err))
			}
		}
		e.closeErr = errors.Join(errs...)
		e.log.Info("engine simulator killed", "pod", e.name, "epoch", e.epoch)
	})
	return e.closeErr
}

// Run opens an engine with cfg, serves until ctx ends, then closes it
// (allowing 10 s for in-flight work and the last events).
func Run(ctx context.Context, cfg Config) error {
	e, err := Open(cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.Close(cctx)
}

// announce emits the pod's PodUp: with a TTL when it is repeated.
func (e *Engine) announce() {
	info := e.podInfo()
	if e.cfg.AnnounceInterval > 0 {
		info.TTL = AnnounceTTLFactor * e.cfg.AnnounceInterval
	}
	e.mu.Lock()
	e.emitLocked(Event{Kind: PodUp, Pod: info})
	e.mu.Unlock()
	e.announces.Add(1)
}

// announceLoop repeats the PodUp every AnnounceInterval until
// stopAnnouncing.
func (e *Engine) announceLoop() {
	defer close(e.announceDone)
	if e.cfg.AnnounceInterval <= 0 {
		return
	}
	for {
		t := e.clock.NewTimer(e.cfg.AnnounceInterval)
		select {
		case <-e.stopAnnounce:
			t.Stop()
			return
		case <-t.C():
		}
		e.announce()
	}
}

// stopAnnouncing stops the announcer (before a PodDown, or on a kill) and
// waits for it.
func (e *Engine) stopAnnouncing() {
	if e.stopAnnounce == nil {
		return
	}
	close(e.stopAnnounce)
	<-e.announceDone
}

// Announcements returns how many PodUps the pod has emitted.
func (e *Engine) Announcements() int64 { return e.announces.Load() }

func (e *Engine) podInfo() PodInfo {
	return PodInfo{Name: e.name, Endpoint: e.endpoint, Model: e.cfg.Model, Hardware: e.cfg.Hardware,
		Region: e.cfg.Region, Epoch: e.epoch, Reason: "shutdown", Engine: e.cfg.Engine, KVBlocks: uint64(e.cfg.CacheBlocks)}
}

// URL returns the base URL of the OpenAI-compatible API.
func (e *Engine) URL() string { return e.scheme + "://" + e.ln.Addr().String() }

// Name returns the pod name.
func (e *Engine) Name() string { return e.name }

// Epoch returns this process start's epoch.
func (e *Engine) Epoch() uint64 { return e.epoch }

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() Config { return e.cfg }

// Registry returns the registry /metrics serves.
func (e *Engine) Registry() *prometheus.Registry { return e.reg }

// CachedBlocks returns exactly what the prefix cache holds, sorted by hash.
func (e *Engine) CachedBlocks() []CachedBlock {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cache.snapshot()
}

// Stats returns the scheduler's and the cache's current state.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.statsLocked()
}

func (e *Engine) statsLocked() Stats {
	return Stats{Running: e.running, Waiting: len(e.waiting), Stalled: e.stalled, UsedBlocks: e.cache.Used(), CachedBlocks: e.cache.Len(),
		Capacity: e.cache.Capacity(), KVUsage: e.cache.Usage()}
}

// ResetPrefixCache empties the prefix cache and emits AllBlocksCleared.
func (e *Engine) ResetPrefixCache() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cache.reset()
	e.changedLocked()
}

// SetFaults replaces the injected faults.
func (e *Engine) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("set faults: %w", err)
	}
	e.faults.set(f)
	return nil
}

// Faults returns the injected faults (with "next N" counters as consumed).
func (e *Engine) Faults() Faults { return e.faults.get() }

// ReleaseStalls ends every stall in progress.
func (e *Engine) ReleaseStalls() { e.faults.releaseStalls() }

// emitLocked sends one event down the pipe (called with e.mu held, so
// events keep the order of the cache changes).
func (e *Engine) emitLocked(ev Event) {
	e.m.events.WithLabelValues(ev.Kind.String()).Inc()
	if e.pipe != nil {
		e.pipe.add(ev)
	}
}

// changedLocked wakes whoever waits for a scheduler change and refreshes the
// gauges.
func (e *Engine) changedLocked() {
	e.m.running.Set(float64(e.running))
	e.m.waiting.Set(float64(len(e.waiting)))
	e.m.kvUsage.Set(e.cache.Usage())
	close(e.changed)
	e.changed = make(chan struct{})
}

// waitUntil blocks until cond holds on the engine's state or ctx ends; cond
// runs with e.mu held.
func (e *Engine) waitUntil(ctx context.Context, cond func(Stats) bool) error {
	for {
		e.mu.Lock()
		ok, ch := cond(e.statsLocked()), e.changed
		e.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stallBegin and stallEnd count requests in an injected stall.
func (e *Engine) stallBegin() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stalled++
	e.changedLocked()
}

func (e *Engine) stallEnd() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stalled--
	e.changedLocked()
}

// submit queues r and admits what fits.
func (e *Engine) submit(r *request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.waiting = append(e.waiting, r)
	e.admitLocked()
	e.changedLocked()
}

// admitLocked admits waiting requests in FIFO order while a slot is free
// and the head fits in the cache.
func (e *Engine) admitLocked() {
	for len(e.waiting) > 0 && e.running < e.cfg.MaxConcurrency {
		r := e.waiting[0]
		if !e.cache.admit(&r.h) {
			return
		}
		e.waiting = e.waiting[1:]
		e.running++
		r.state = reqRunning
		r.loadFactor = 1
		if lf := e.cfg.Timing.LoadFactor; lf > 1 && e.cfg.MaxConcurrency > 1 {
			r.loadFactor = 1 + (lf-1)*float64(e.running-1)/float64(e.cfg.MaxConcurrency-1)
		}
		e.m.cacheQueries.Add(float64(len(r.h.tokens)))
		e.m.cacheHits.Add(float64(r.h.Hit * e.cfg.BlockSize))
		close(r.admitted)
	}
}

// prefillDone caches r's computed blocks.
func (e *Engine) prefillDone(r *request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.state != reqRunning {
		return
	}
	e.cache.prefillDone(&r.h)
	e.changedLocked()
}

// finish releases whatever r holds, wherever it is; safe to call twice.
func (e *Engine) finish(r *request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch r.state {
	case reqQueued:
		if i := slices.Index(e.waiting, r); i >= 0 {
			e.waiting = slices.Delete(e.waiting, i, i+1)
		}
	case reqRunning:
		e.cache.release(&r.h)
		e.running--
	case reqDone:
		return
	}
	r.state = reqDone
	e.admitLocked()
	e.changedLocked()
}

// reservePrefill books compute time on the prefill slot that frees first
// and returns how long the request waits for it (0 when prefills are
// unlimited). A request cancelled while waiting keeps its booking, as a
// chunked prefill that has started keeps the GPU busy.
func (e *Engine) reservePrefill(compute time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.prefillFree == nil {
		return 0
	}
	now := e.clock.Now()
	slot := 0
	for i, t := range e.prefillFree {
		if t.Before(e.prefillFree[slot]) {
			slot = i
		}
	}
	start := e.prefillFree[slot]
	if start.Before(now) {
		start = now
	}
	e.prefillFree[slot] = start.Add(compute)
	return start.Sub(now)
}

// genRequest is a prompt ready for the scheduler.
type genRequest struct {
	tokens    []uint32
	lora      string
	salt      string
	maxTokens int
}

// genResult is what a finished (or interrupted) generation reports.
type genResult struct {
	cachedTokens int           // prompt tokens served from cache at admission
	ttft         time.Duration // arrival to first token
	tokens       int           // output tokens produced
}

// errStop is returned by an emit callback to end a generation early without
// it being an error of the engine (a dying connection).
var errStop = errors.New("generation stopped")

// scaled returns d scaled by the time scale and a load factor.
func (e *Engine) scaled(d time.Duration, load float64) time.Duration {
	return time.Duration(float64(d) * e.cfg.TimeScale * load)
}

// sleep waits d on the engine's clock, or until ctx ends.
func (e *Engine) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := e.clock.NewTimer(d)
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// generate runs one request's timeline: queueing, admission (cache hit
// decided here), prefill (uncached tokens only), then one output token per
// decode interval. emit, when not nil, is called as each output token is
// produced (index from 0); without it the decode time is waited in one go.
// Whatever happens the request's cache holdings are released on return.
func (e *Engine) generate(ctx context.Context, g genRequest, emit func(i int, res genResult) error) (genResult, error) {
	var res genResult
	nblocks := len(g.tokens) / e.cfg.BlockSize
	r := &request{
		h: holding{
			Holding:   prefixcache.Holding[blockInfo]{Pinned: make([]*prefixcache.Block[blockInfo], 0, nblocks)},
			tokens:    g.tokens,
			hashes:    e.chain.appendHashes(make([]uint64, 0, nblocks), g.tokens, e.cfg.BlockSize, g.lora, g.salt),
			lora:      g.lora,
			salt:      g.salt,
			maxTokens: g.maxTokens,
		},
		admitted: make(chan struct{}),
		arrived:  e.clock.Now(),
	}
	e.submit(r)
	defer e.finish(r)
	select {
	case <-r.admitted:
	case <-ctx.Done():
		return res, ctx.Err()
	}
	res.cachedTokens = r.h.Hit * e.cfg.BlockSize
	t := e.cfg.Timing
	uncached := len(g.tokens) - res.cachedTokens
	compute := e.scaled(time.Duration(uncached)*t.PrefillPerToken, r.loadFactor)
	wait := e.reservePrefill(compute)
	if err := e.sleep(ctx, wait+compute+e.scaled(t.PrefillOverhead, r.loadFactor)); err != nil {
		return res, err
	}
	e.prefillDone(r)
	res.ttft = e.clock.Now().Sub(r.arrived)
	e.m.ttft.Observe(res.ttft.Seconds())
	e.m.promptToks.Add(float64(len(g.tokens)))
	interval := e.scaled(t.DecodeInterval, r.loadFactor)
	if emit == nil {
		if err := e.sleep(ctx, time.Duration(g.maxTokens-1)*interval); err != nil {
			return res, err
		}
		res.tokens = g.maxTokens
	} else {
		for i := range g.maxTokens {
			if i > 0 {
				if err := e.sleep(ctx, interval); err != nil {
					return res, err
				}
			}
			res.tokens = i + 1
			if err := emit(i, res); err != nil {
				return res, err
			}
		}
	}
	e.m.genToks.Add(float64(res.tokens))
	e.m.e2e.Observe(e.clock.Now().Sub(r.arrived).Seconds())
	e.m.success.WithLabelValues("length").Inc()
	return res, nil
}
