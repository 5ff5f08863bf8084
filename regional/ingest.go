package regional

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

// IngestConfig configures the Kafka ingestion of one region's KV events.
type IngestConfig struct {
	// Brokers are Kafka seed addresses (host:port). Required.
	Brokers []string `yaml:"brokers"`
	// Topic; default "meridian.kv-events.<Region>".
	Topic string `yaml:"topic"`
	// Region this controller serves. Required. In a controller config it
	// is the controller's region (not a key of the kafka section).
	Region string `yaml:"-"`
	// GroupID of this controller's consumer group. Default
	// "meridian-<Region>-<ControllerID>-<start time>": a group of its own
	// per process start, because the index lives in memory and must be
	// rebuilt from the topic's retained history (StartOffset earliest) each
	// time; within a process, commits let a restarted consumer resume and
	// the offsets already applied are skipped, so replays change nothing.
	GroupID string `yaml:"group_id"`
	// ControllerID and BlockSize come from the controller config's
	// controller_id and block_size.
	ControllerID string `yaml:"-"`
	// BlockSize is the router's block size in tokens. Default 64.
	BlockSize int `yaml:"-"`
	// DefaultModel names the model of pods whose events carry no model (no
	// PodUp seen, no model header).
	DefaultModel string `yaml:"default_model"`
	// MaxEntriesPerPod bounds each pod's engine-hash map (see
	// kvevents.RekeyConfig.MaxEntries: about 80 to 130 bytes each). Default 1<<18,
	// above the KV capacity of a B200 pod in 16-token blocks (105k).
	MaxEntriesPerPod int `yaml:"max_entries_per_pod"`
	// KVBlocksPerPod is the KV-cache capacity, in engine blocks, assumed for
	// a pod that announces none (PodUp kv_blocks, the kv-blocks header or
	// pods.static kv_blocks): its re-keyer is sized for it up front instead
	// of growing as the cache fills. Default 0 (grow).
	KVBlocksPerPod int `yaml:"kv_blocks_per_pod"`
	// CommitInterval batches offset commits. Default 200ms.
	CommitInterval time.Duration `yaml:"commit_interval"`
	// MaxWait bounds how long the broker holds a fetch while it has no
	// data for it (kafka-go asks for three quarters of it). Default 100ms.
	// The consumer waits fetchRoundTrip (5s) longer for the answer before
	// it gives up on the connection.
	MaxWait time.Duration `yaml:"max_wait"`
	// FetchMaxBytes bounds one fetch response (kafka-go's MaxBytes). It
	// must exceed the largest message (the bridge's max_message_bytes,
	// default 1 MiB), which a broker may truncate to fit. Default 2 MiB: a
	// few dozen engine batches per fetch. Larger fetches cost the broker
	// and the consumer more per byte (a fetch of each partition in flight
	// no longer fits in the cache while it is copied: 4 MiB took the
	// in-process broker of BenchmarkIngestKafka 1.8x the CPU of 2 MiB) and
	// delay the first message of a partition by the whole fetch.
	FetchMaxBytes int `yaml:"fetch_max_bytes"`
	// ReadAheadBytes bounds the values of the messages the consumer has
	// read and decoded but not yet applied. A decoded engine batch holds
	// about 3.9 times its message's bytes, so a full read-ahead holds about
	// 5 times this while the consumer is behind (160 MiB at the default);
	// a consumer that keeps up holds a few messages. Default 0: 16 x
	// fetch_max_bytes (32 MiB). Set, it must be >= fetch_max_bytes. See
	// readAheadFetches for what reading ahead gains.
	ReadAheadBytes int `yaml:"read_ahead_bytes"`
	// Backoff bounds the reconnect delay after a broker failure.
	// Defaults 100ms and 5s.
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
	// ProbeInterval between metadata calls to the brokers, so that
	// "connected" says whether the brokers answer, whether or not events
	// flow. Default 2s.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// Security is the section's tls and sasl keys (see kafkasec.Config):
	// TLS to the brokers (their CA, a client certificate) and a SASL user
	// (SCRAM or PLAIN) whose password is in a file or the environment.
	// Brokers beyond loopback need tls unless Insecure.
	Security kafkasec.Config `yaml:",inline"`
	// Insecure accepts plaintext to brokers beyond loopback,
	// insecure_skip_verify and PLAIN without TLS: the Kafka-only opt-out
	// (kafka.insecure), also implied by the controller's insecure. Logged
	// at every start and exported as meridian_insecure_listeners.
	Insecure bool `yaml:"insecure"`
}

// DefaultIngestConfig returns the defaults documented on IngestConfig.
func DefaultIngestConfig() IngestConfig {
	return IngestConfig{BlockSize: 64, MaxEntriesPerPod: 1 << 18, CommitInterval: 200 * time.Millisecond,
		MaxWait: 100 * time.Millisecond, FetchMaxBytes: 2 << 20, BackoffMin: 100 * time.Millisecond, BackoffMax: 5 * time.Second,
		ProbeInterval: 2 * time.Second}
}

// readAhead is ReadAheadBytes with its default applied.
func (c IngestConfig) readAhead() int64 {
	if c.ReadAheadBytes > 0 {
		return int64(c.ReadAheadBytes)
	}
	return readAheadFetches * int64(c.FetchMaxBytes)
}

// Validate names the first field that is wrong.
func (c IngestConfig) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("ingest config: brokers: at least one broker address is required")
	case c.Region == "":
		return errors.New("ingest config: region is required")
	case c.BlockSize <= 0:
		return fmt.Errorf("ingest config: block_size = %d: want > 0", c.BlockSize)
	case c.MaxEntriesPerPod <= 0:
		return fmt.Errorf("ingest config: max_entries_per_pod = %d: want > 0", c.MaxEntriesPerPod)
	case c.KVBlocksPerPod < 0:
		return fmt.Errorf("ingest config: kv_blocks_per_pod = %d: want >= 0", c.KVBlocksPerPod)
	case c.CommitInterval <= 0 || c.MaxWait <= 0:
		return fmt.Errorf("ingest config: commit_interval and max_wait must be > 0")
	case c.FetchMaxBytes < 64<<10:
		return fmt.Errorf("ingest config: fetch_max_bytes = %d: want >= 65536 (above the largest message)", c.FetchMaxBytes)
	case c.ReadAheadBytes != 0 && c.ReadAheadBytes < c.FetchMaxBytes:
		return fmt.Errorf("ingest config: read_ahead_bytes = %d: want 0 (16 x fetch_max_bytes) or >= fetch_max_bytes (%d)", c.ReadAheadBytes, c.FetchMaxBytes)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("ingest config: backoff_min = %v, backoff_max = %v: want 0 < min <= max", c.BackoffMin, c.BackoffMax)
	case c.ProbeInterval <= 0:
		return fmt.Errorf("ingest config: probe_interval = %v: want > 0", c.ProbeInterval)
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("ingest config: brokers: %q is not host:port", b)
		}
	}
	if err := c.Security.Validate("kafka", c.Brokers, c.Insecure); err != nil {
		return fmt.Errorf("ingest config: %w", err)
	}
	return nil
}

// Message is what the ingester needs of one Kafka message; Apply takes it so
// the event logic is tested without a broker.
type Message struct {
	Partition     int
	Offset        int64
	HighWaterMark int64
	Key           []byte
	Headers       []kafka.Header
	Value         []byte
	Time          time.Time
}

// Ingester applies the region's KV events to the index and the pod registry.
// Apply is the single-threaded core; Run owns the Kafka consumer.
type Ingester struct {
	cfg  IngestConfig
	sec  *kafkasec.Client // TLS and SASL of every connection to the brokers
	idx  *index.Index
	reg  *route.Registry
	log  *slog.Logger
	now  func() time.Time
	dec  *kvevents.Decoder // Apply's; the consumer's fetch goroutine has its own
	m    *ingestMetrics
	warn *kvevents.WarnLimiter
	gate func(key string, u *kvevents.PodUp, mac string) string

	decCfg kvevents.DecoderConfig // of every decoder

	// rejectedPods: the (pod, reason) pairs whose refused PodUp was logged,
	// so each is logged once (bounded: past maxRejectedLogged, rate-limited).
	rejectedPods map[string]bool

	mu      sync.Mutex // guards the state below against Stats readers
	pods    map[string]*podStream
	retired kvevents.RekeyStats // of re-keyers no longer in pods
	// discovered are the pods that discovery currently finds.
	discovered map[string]bool
	// leases are the announcements with a TTL (ExpirePods).
	leases map[string]*lease
	// applied maps a partition to the highest offset re-keyed: messages at
	// or below it are replays. indexed is the highest whose index writes
	// are done (Applied, CaughtUp): the consumer's index stage applies
	// them after the re-keyer (indexJob).
	applied map[int]int64
	indexed map[int]int64
	ops     []kvevents.Op

	// idxMu is held while one message's index writes are applied and while
	// a pod is cleared (clearPod), so that a write queued before a clear
	// never lands after it (podStream.clears). Taken after mu, never
	// before it.
	idxMu sync.Mutex
	// syncMu and syncJob are Apply's: it re-keys and applies the index
	// writes itself.
	syncMu  sync.Mutex
	syncJob indexJob

	notify chan struct{} // closed and replaced after every Apply

	caughtUp  atomic.Bool
	connected atomic.Bool
	lastErr   atomic.Pointer[string] // why the brokers last failed, explained; nil once they answer
	// Broker and topic resets (the partition's end fell below what was
	// applied, or the cluster id changed): rebuilding maps each reset
	// partition to the end offset to reach; groupGen names a fresh consumer
	// group; restart asks the consumer to start over in it.
	rebuilding map[int]int64
	// marks are the last message applied per partition, anchors the marks
	// the previous probe took, verified against the log by the next one
	// (ingest_rewrite.go): a log rewritten past what was applied.
	marks      map[int]markSrc
	anchors    map[int]logMark
	resetAt    time.Time
	groupGen   int
	clusterID  string
	restart    chan struct{}
	lastFetch  atomic.Int64 // unix nanos of the last message fetched
	lagMsgs    atomic.Int64
	startHWM   map[int]int64 // high-water marks when the consumer started (catch-up target)
	startReady bool
}

// podStream is the per-pod ingestion state.
type podStream struct {
	rekey  *kvevents.Rekeyer
	model  string
	epoch  uint64
	seqs   map[int64]uint64 // last batch sequence number per data-parallel rank
	lastAt time.Time
	// partition is the topic partition its last message came from (a
	// pod's messages are keyed by its name: one partition).
	partition int
	// clears counts the clears of the pod's blocks (clearPod): index
	// writes re-keyed before one are dropped, not applied after it.
	// Guarded by idxMu.
	clears uint64
}

// IngestDeps is what an Ingester is given.
type IngestDeps struct {
	Index *index.Index    // required
	Pods  *route.Registry // required; it must wrap Index
	// Logger; nil discards.
	Logger *slog.Logger
	// Metrics registers the ingestion metrics; required.
	Metrics prometheus.Registerer
	// Clock; nil: time.Now.
	Clock func() time.Time
	// Announcements decides whether a PodUp, in a message with the given
	// key and announce-MAC header, is believed: "" yes, else the reason it
	// is not. Nil: the default PodsConfig's gate (loopback endpoints only).
	Announcements func(key string, u *kvevents.PodUp, mac string) string
}

// NewIngester builds the ingester.
func NewIngester(cfg IngestConfig, deps IngestDeps) (*Ingester, error) {
	if cfg.Topic == "" {
		cfg.Topic = kvevents.TopicFor(cfg.Region)
	}
	if deps.Index == nil || deps.Pods == nil || deps.Metrics == nil {
		return nil, errors.New("ingest: an index, a pod registry and a metrics registerer are required")
	}
	idx, reg, log, now := deps.Index, deps.Pods, deps.Logger, deps.Clock
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	gate := deps.Announcements
	if gate == nil {
		gate = newPodGate(PodsConfig{}).check
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.GroupID == "" {
		cfg.GroupID = "meridian-" + cfg.Region + "-" + cfg.ControllerID + "-" + strconv.FormatInt(now().UnixNano(), 36)
	}
	sec, err := cfg.Security.Open("kafka", nil)
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	decCfg := kvevents.DefaultDecoderConfig()
	dec, err := kvevents.NewDecoder(decCfg)
	if err != nil {
		return nil, err
	}
	g := &Ingester{cfg: cfg, sec: sec, idx: idx, reg: reg, log: log, now: now, dec: dec, decCfg: decCfg, gate: gate,
		pods: map[string]*podStream{}, discovered: map[string]bool{}, leases: map[string]*lease{}, applied: map[int]int64{}, indexed: map[int]int64{}, notify: make(chan struct{}),
		rejectedPods: map[string]bool{}, rebuilding: map[int]int64{}, marks: map[int]markSrc{}, anchors: map[int]logMark{},
		restart: make(chan struct{}, 1)}
	g.warn = kvevents.NewWarnLimiter(log, time.Minute, now)
	g.m, err = newIngestMetrics(deps.Metrics, g)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Config returns the effective configuration (with defaults filled in).
func (g *Ingester) Config() IngestConfig { return g.cfg }

// CaughtUp reports whether the ingester has applied everything the topic held
// when it started: until then the index is incomplete and /readyz says so.
func (g *Ingester) CaughtUp() bool { return g.caughtUp.Load() }

// Connected reports whether the last fetch from the broker succeeded.
func (g *Ingester) Connected() bool { return g.connected.Load() }

// LastError is why the brokers last failed (a refused SASL user, an
// untrusted certificate, an unreachable broker), with what to check; ""
// once they answer again.
func (g *Ingester) LastError() string {
	if p := g.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Security describes how the brokers are reached ("tls+scram-sha-512 as
// meridian"), never with the password.
func (g *Ingester) Security() string { return g.sec.String() }

// brokerUp records that the brokers answered.
func (g *Ingester) brokerUp() {
	g.connected.Store(true)
	g.lastErr.Store(nil)
}

// brokerDown records a failure to reach the brokers, counted by kind, and
// returns it explained.
func (g *Ingester) brokerDown(err error) error {
	g.connected.Store(false)
	g.m.brokerErrors.WithLabelValues(g.sec.Kind(err)).Inc()
	err = g.sec.Explain(err)
	msg := err.Error()
	g.lastErr.Store(&msg)
	return err
}

// Staleness is the time since the last message was fetched (0 if never).
func (g *Ingester) Staleness() time.Duration {
	t := g.lastFetch.Load()
	if t == 0 {
		return 0
	}
	return g.now().Sub(time.Unix(0, t))
}

// Lag is the number of messages behind the high-water mark, from the last
// message fetched.
func (g *Ingester) Lag() int64 { return g.lagMsgs.Load() }

// Apply applies one message. It is idempotent per (partition, offset): a
// message at or below the highest offset applied for its partition is
// skipped, so redeliveries after a consumer restart or a rebalance leave the
// index exactly as it was. A malformed message is counted by reason, logged
// once per reason per minute, and skipped; it never stops ingestion.
func (g *Ingester) Apply(msg Message) {
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	g.apply(msg, -1, nil, &g.syncJob)
	g.runJob(&g.syncJob)
}

// indexJob is the index writes of one message, in order, made by apply
// (the re-keyer's stage) and applied by runJob: in Apply right after, in
// the consumer by its index stage while the next message is re-keyed.
// Every message has one, empty if it writes nothing (a replay, a malformed
// message), so that the index stage sees them all in order: it records
// their offsets as applied (Applied, WaitFor, CaughtUp mean "in the index")
// and commits them after.
type indexJob struct {
	ops    []jobOp
	hashes []uint64
	// record: the message's offset is recorded as applied once its writes
	// are in the index, unless a reset came in between (gen is the group
	// generation after apply).
	record    bool
	partition int
	offset    int64
	gen       int
}

// jobOp is one index write of an indexJob: hashes[start:end] of the job.
type jobOp struct {
	kind       kvevents.OpKind
	tier       index.Tier
	pod        index.PodID
	name       string
	ps         *podStream // its clears when the op was made: a clear since drops it
	clears     uint64
	start, end int
}

func (j *indexJob) reset() {
	clear(j.ops) // drop the podStream pointers
	j.ops, j.hashes = j.ops[:0], j.hashes[:0]
	j.record = false
}

// runJob applies j's index writes (but those of pods cleared since they
// were made), then records its offset as applied and wakes WaitFor.
func (g *Ingester) runJob(j *indexJob) {
	if len(j.ops) > 0 {
		g.idxMu.Lock()
		for _, op := range j.ops {
			if op.ps != nil && op.ps.clears != op.clears {
				continue // the pod was cleared after this was re-keyed
			}
			var err error
			hs := j.hashes[op.start:op.end:op.end]
			switch op.kind {
			case kvevents.OpRegister:
				err = g.idx.Register(op.pod, op.tier, hs)
			case kvevents.OpEvict:
				err = g.idx.Evict(op.pod, op.tier, hs)
			case kvevents.OpClearPod:
				err = g.idx.ClearPod(op.pod)
			}
			// A pod removed since the op was made (PodDown, discovery,
			// expiry) is unknown now: its blocks went with it.
			if err != nil && !errors.Is(err, index.ErrUnknownPod) {
				g.warn.Warn("index", "index rejected an operation", "pod", op.name, "op", op.kind.String(), "err", err)
			}
		}
		g.idxMu.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if j.record && j.gen == g.groupGen {
		g.indexed[j.partition] = j.offset
		g.checkCaughtUpLocked()
		if end, ok := g.rebuilding[j.partition]; ok && j.offset >= end-1 {
			delete(g.rebuilding, j.partition)
			if len(g.rebuilding) == 0 {
				g.log.Info("ingestion caught up with the reset topic", "topic", g.cfg.Topic, "after", g.now().Sub(g.resetAt))
			}
		}
	}
	close(g.notify)
	g.notify = make(chan struct{})
}

// decoded is a message's value decoded ahead of apply (by the consumer's
// fetch goroutine): the batch, valid until its decoder is given back, or
// the decoding error.
type decoded struct {
	batch *kvevents.Batch
	err   error
}

// apply re-keys msg, fetched by the consumer of group generation gen (-1:
// not from a consumer), its value decoded already (pre) or not (nil), and
// puts its index writes in j (for runJob). A message fetched before a reset
// that reaches here after it is dropped (skipped "superseded"): the reset
// forgot the partition's offsets, so it would apply as new, and the fresh
// group's re-read of the messages before it would then be skipped as
// replays.
func (g *Ingester) apply(msg Message, gen int, pre *decoded, j *indexJob) {
	j.reset()
	g.mu.Lock()
	defer g.mu.Unlock()
	defer func() { j.gen = g.groupGen }()
	if gen >= 0 && gen != g.groupGen {
		g.m.skipped.WithLabelValues("superseded").Inc()
		return
	}
	if last, ok := g.applied[msg.Partition]; ok && msg.Offset <= last {
		if msg.HighWaterMark <= 0 || msg.HighWaterMark > last {
			g.m.skipped.WithLabelValues("replay").Inc()
			return
		}
		// The partition ends before what was applied: it was reset (a
		// broker that lost its data, a topic created again). This message
		// is new, not a replay.
		g.resetLocked([]int{msg.Partition}, map[int]int64{msg.Partition: msg.HighWaterMark}, "offset_regression")
	}
	g.applied[msg.Partition] = msg.Offset
	j.record, j.partition, j.offset = true, msg.Partition, msg.Offset
	if _, ok := g.anchors[msg.Partition]; !ok {
		g.marks[msg.Partition] = markSrc{mark: markOf(msg.Offset, msg.Key, msg.Value, msg.Time)}
		g.anchors[msg.Partition] = g.marks[msg.Partition].mark // the first, until a probe verifies it
	} else if pre != nil {
		// The consumer's message is its own: its mark is computed if a
		// probe takes it as the next anchor, not for every message.
		g.marks[msg.Partition] = markSrc{mark: logMark{offset: msg.Offset}, key: msg.Key, value: msg.Value, at: msg.Time, lazy: true}
	} else {
		g.marks[msg.Partition] = markSrc{mark: markOf(msg.Offset, msg.Key, msg.Value, msg.Time)}
	}

	name := string(msg.Key)
	if name == "" {
		name = header(msg.Headers, kvevents.HeaderPod)
	}
	if name == "" {
		g.reject("no_pod_key", fmt.Errorf("message at partition %d offset %d has no key and no pod header", msg.Partition, msg.Offset))
		return
	}
	var batch *kvevents.Batch
	var err error
	if pre != nil {
		batch, err = pre.batch, pre.err
	} else {
		batch, err = g.dec.Decode(msg.Value)
	}
	if err != nil {
		g.reject(string(kvevents.ReasonOf(err)), fmt.Errorf("pod %s, partition %d offset %d: %w", name, msg.Partition, msg.Offset, err))
		return
	}
	for _, s := range batch.Skipped {
		// One malformed (or unknown) event is skipped; the rest apply.
		g.m.decodeErrors.WithLabelValues(string(s.Reason)).Inc()
		g.warn.Warn(string(s.Reason), "skipped kv event", "pod", name, "tag", s.Tag, "index", s.Index, "reason", s.Reason, "detail", s.Detail)
	}
	ps := g.stream(name, msg.Headers)
	if ps == nil {
		return
	}
	rank := batch.Rank()
	if g.checkRestartLocked(name, ps, rank, msg.Headers) {
		g.m.skipped.WithLabelValues("duplicate_seq").Inc()
		return
	}
	ps.lastAt, ps.partition = g.now(), msg.Partition
	evs := batch.Events
	for len(evs) > 0 {
		switch e := evs[0].(type) {
		case *kvevents.PodUp:
			g.m.events.WithLabelValues(e.Kind().String()).Inc()
			evs = evs[1:]
			if why := g.gate(name, e, header(msg.Headers, kvevents.HeaderAnnounceMAC)); why != "" {
				g.rejectPodUp(name, e, why)
				continue
			}
			g.podUp(e, ps)
		case *kvevents.PodDown:
			g.m.events.WithLabelValues(e.Kind().String()).Inc()
			evs = evs[1:]
			g.podDown(e)
			ps = nil
		default:
			// A run of block events up to the next lifecycle event, re-keyed
			// in one call: the index gets their ops merged.
			n := 1
			for n < len(evs) && !lifecycle(evs[n]) {
				n++
			}
			g.m.countEvents(evs[:n])
			if ps == nil { // events after a PodDown in the same batch
				if ps = g.stream(name, msg.Headers); ps == nil {
					return // counted and logged by stream
				}
			}
			if g.ops, err = ps.rekey.ApplyEventsGuarded(g.ops[:0], rank, evs[:n]); err != nil {
				// A defect, not bad input: the process lives on, the pod's
				// blocks leave the index (the OpClearPod in g.ops) and
				// are learnt again from its next events.
				g.m.decodeErrors.WithLabelValues("rekeyer_panic").Inc()
				args := []any{"pod", name, "partition", msg.Partition, "offset", msg.Offset, "err", err}
				var rp *kvevents.RekeyPanic
				if errors.As(err, &rp) {
					args = append(args, "stack", string(rp.Stack))
				}
				g.log.Error("re-keying a message's KV events failed: the pod's cache state is dropped and learnt again", args...)
			}
			g.queueOps(name, ps, g.ops, j)
			evs = evs[n:]
		}
	}
}

// lifecycle reports whether ev is a PodUp or PodDown (the ingester's, not
// a re-keyer's).
func lifecycle(ev kvevents.Event) bool {
	switch ev.(type) {
	case *kvevents.PodUp, *kvevents.PodDown:
		return true
	}
	return false
}

func (g *Ingester) reject(reason string, err error) {
	if reason == "" {
		reason = "other"
	}
	g.m.decodeErrors.WithLabelValues(reason).Inc()
	g.warn.Warn(reason, "skipped malformed kv event message", "reason", reason, "err", err)
}

// maxRejectedLogged bounds the (pod, reason) pairs remembered for logging
// refused announcements once each.
const maxRejectedLogged = 1024

// rejectPodUp counts and logs (once per pod and reason) a PodUp that is not
// believed: its pod, its endpoint and its epoch change nothing.
func (g *Ingester) rejectPodUp(key string, u *kvevents.PodUp, why string) {
	g.m.podUpRejected.WithLabelValues(why).Inc()
	args := []any{"key", key, "pod", u.Pod, "endpoint", u.Endpoint, "reason", why}
	id := why + "\x00" + key
	switch {
	case g.rejectedPods[id]:
	case len(g.rejectedPods) < maxRejectedLogged:
		g.rejectedPods[id] = true
		g.log.Warn("pod announcement refused: its endpoint will not receive requests", args...)
	default:
		g.warn.Warn("podup_rejected", "pod announcement refused: its endpoint will not receive requests", args...)
	}
}

// stream returns the pod's ingestion state, creating it (and registering the
// pod, if unknown) on first sight.
func (g *Ingester) stream(name string, hs []kafka.Header) *podStream {
	if ps, ok := g.pods[name]; ok {
		return ps
	}
	model := header(hs, kvevents.HeaderModel)
	if model == "" {
		model = g.cfg.DefaultModel
	}
	if model == "" {
		g.reject("no_model", fmt.Errorf("pod %s: events carry no model header, no PodUp was seen and no default model is configured", name))
		return nil
	}
	rk, err := g.newRekeyer(model)
	if err != nil {
		g.reject("bad_config", err)
		return nil
	}
	kvBlocks, _ := headerU64(hs, kvevents.HeaderKVBlocks)
	if p, ok := g.reg.Get(name); ok {
		kvBlocks = max(kvBlocks, uint64(p.Info().KVBlocks))
	} else {
		// Events without a PodUp (a vLLM fleet through the ZMQ bridge): the
		// pod is known from its events; its endpoint comes from static
		// configuration or a later PodUp.
		info := route.PodInfo{Name: name, Model: model, Profile: header(hs, kvevents.HeaderHardware),
			Engine: header(hs, kvevents.HeaderEngine), KVBlocks: int(min(kvBlocks, math.MaxInt32))}
		if _, _, err := g.reg.Upsert(info); err != nil {
			g.reject("registry_full", fmt.Errorf("pod %s: %w", name, err))
			return nil
		}
	}
	g.reserve(rk, kvBlocks)
	ps := &podStream{rekey: rk, model: model, seqs: map[int64]uint64{}}
	g.pods[name] = ps
	return ps
}

// checkRestartLocked clears a pod whose producer restarted — a new epoch in
// the headers, a batch sequence number of a data-parallel rank that went
// back to 0 (vLLM numbers each rank's batches from 0 per process start), or a
// bridge's restart marker — and reports whether the batch is a duplicate to
// skip: a sequence number at or below the last one seen for its rank (in the
// same epoch), as a producer's retried write delivers.
func (g *Ingester) checkRestartLocked(name string, ps *podStream, rank int64, hs []kafka.Header) (duplicate bool) {
	epoch, hasEpoch := headerU64(hs, kvevents.HeaderEpoch)
	seq, hasSeq := headerU64(hs, kvevents.HeaderSeq)
	restarted := false
	if hasEpoch {
		if ps.epoch != 0 && epoch != ps.epoch {
			if epoch < ps.epoch {
				return true // a replay from an older incarnation: the newer one is known
			}
			restarted = true
		}
		ps.epoch = epoch
	}
	if header(hs, kvevents.HeaderMarker) != "" {
		delete(ps.seqs, rank) // the bridge's restart marker: seq starts afresh
	}
	if restarted {
		clear(ps.seqs)
	}
	if hasSeq {
		if last, ok := ps.seqs[rank]; ok && seq <= last {
			if hasEpoch || seq != 0 {
				return true
			}
			restarted = true // vLLM's seq starts again at 0 when the engine restarts
			clear(ps.seqs)
		}
		ps.seqs[rank] = seq
	}
	if restarted {
		g.clearPod(name, ps, "restart")
	}
	return false
}

// clearPod forgets the pod's blocks: its re-keyer's, and the index's,
// with the writes re-keyed before and not yet applied (ps.clears).
func (g *Ingester) clearPod(name string, ps *podStream, why string) {
	g.m.restarts.WithLabelValues(why).Inc()
	g.ops = ps.rekey.Reset(g.ops[:0])
	g.idxMu.Lock()
	ps.clears++
	if p, ok := g.reg.Get(name); ok {
		_ = g.idx.ClearPod(p.ID)
	}
	g.idxMu.Unlock()
	g.log.Info("cleared pod blocks", "pod", name, "why", why)
}

func (g *Ingester) podUp(e *kvevents.PodUp, ps *podStream) {
	info := route.PodInfo{Name: e.Pod, Endpoint: e.Endpoint, Model: e.Model, Profile: e.Hardware, Epoch: e.Epoch,
		Engine: e.Engine, KVBlocks: int(min(e.KVBlocks, math.MaxInt32))}
	if old, ok := g.reg.Get(e.Pod); ok && old.Info().Static {
		o := old.Info()
		info.Static = true
		if info.Endpoint == "" {
			info.Endpoint = o.Endpoint
		}
		if info.Engine == "" {
			info.Engine = o.Engine
		}
		if info.KVBlocks == 0 {
			info.KVBlocks = o.KVBlocks
		}
	}
	p, restarted, err := g.reg.Upsert(info)
	if err != nil {
		g.reject("registry_full", fmt.Errorf("pod up %s: %w", e.Pod, err))
		return
	}
	g.renewLocked(p, e.TTL)
	if ps != nil {
		if e.Model != "" && e.Model != ps.model {
			// The namespace of its chains changed: start the pod afresh.
			ps.model = e.Model
			if rk, err := g.newRekeyer(e.Model); err == nil {
				g.retired = g.retired.Add(ps.rekey.Stats())
				ps.rekey = rk
			}
			restarted = true
		}
		g.reserve(ps.rekey, uint64(info.KVBlocks))
		if restarted || (ps.epoch != 0 && e.Epoch > ps.epoch) {
			g.clearPod(e.Pod, ps, "pod_up_new_epoch")
		}
		if e.Epoch > ps.epoch {
			ps.epoch = e.Epoch
		}
	}
}

func (g *Ingester) podDown(e *kvevents.PodDown) {
	p, ok := g.reg.Get(e.Pod)
	if ok && e.Epoch != 0 && p.Info().Epoch != 0 && e.Epoch < p.Info().Epoch {
		return // the end of an older incarnation, replayed
	}
	if ok && (p.Info().Static || g.discovered[e.Pod]) {
		// A statically configured pod, or one discovery still finds, stays
		// known (discovery says when it leaves); its blocks are gone.
		if ps := g.pods[e.Pod]; ps != nil {
			g.clearPod(e.Pod, ps, "pod_down")
		}
		return
	}
	g.forgetPodLocked(e.Pod)
}

// forgetPodLocked removes a pod from the registry (and the index: its
// blocks are swept) and drops its ingestion state and lease, keeping its
// re-keyer's counts.
func (g *Ingester) forgetPodLocked(name string) {
	g.reg.Remove(name)
	if ps := g.pods[name]; ps != nil {
		g.retired = g.retired.Add(ps.rekey.Stats())
	}
	delete(g.pods, name)
	delete(g.leases, name)
}

// queueOps puts the re-keyer's ops for pod name in j (their hashes
// copied: the re-keyer reuses them).
func (g *Ingester) queueOps(name string, ps *podStream, ops []kvevents.Op, j *indexJob) {
	if len(ops) == 0 {
		return
	}
	p, ok := g.reg.Get(name)
	if !ok {
		return
	}
	for _, op := range ops {
		start := len(j.hashes)
		j.hashes = append(j.hashes, op.Hashes...)
		j.ops = append(j.ops, jobOp{kind: op.Kind, tier: op.Tier, pod: p.ID, name: name, ps: ps, clears: ps.clears,
			start: start, end: len(j.hashes)})
		switch op.Kind {
		case kvevents.OpRegister:
			g.m.blocksStored.Add(float64(len(op.Hashes)))
		case kvevents.OpEvict:
			g.m.blocksRemoved.Add(float64(len(op.Hashes)))
		}
	}
}

// WaitFor blocks until cond holds (checked now and after every message's
// index writes are applied) or ctx ends.
func (g *Ingester) WaitFor(ctx context.Context, cond func() bool) error {
	for {
		g.mu.Lock()
		ch := g.notify
		g.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Applied returns the highest offset applied per partition: whose index
// writes are in the index.
func (g *Ingester) Applied() map[int]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.indexed)
}

// rekeyed returns the highest offset re-keyed per partition (the replay
// check's; at or past Applied).
func (g *Ingester) rekeyed() map[int]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.applied)
}

// SetStartOffsets records the high-water marks of the topic's partitions at
// start: the ingester is caught up once it has applied up to them.
func (g *Ingester) SetStartOffsets(hwm map[int]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.startHWM, g.startReady = hwm, true
	g.checkCaughtUpLocked()
}

func (g *Ingester) checkCaughtUpLocked() {
	if g.caughtUp.Load() || !g.startReady {
		return
	}
	for p, h := range g.startHWM {
		if h <= 0 {
			continue
		}
		if off, ok := g.indexed[p]; !ok || off < h-1 {
			return
		}
	}
	g.caughtUp.Store(true)
	g.log.Info("ingestion caught up with the topic", "topic", g.cfg.Topic, "partitions", len(g.startHWM))
}

// resetLocked forgets the applied offsets of partitions that were reset
// (or of every partition, for a new cluster) so that their new messages
// apply, records the end offsets to reach, and has the consumer start over
// in a fresh group (the old group's commits point past the new ends). The
// index and the pods' re-keyers stay: engines keep their caches through a
// broker's loss, and their next events evict and store by the same engine
// hashes.
func (g *Ingester) resetLocked(partitions []int, ends map[int]int64, cause string) {
	for _, p := range partitions {
		delete(g.applied, p)
		delete(g.indexed, p)
		delete(g.marks, p)
		delete(g.anchors, p)
		g.rebuilding[p] = ends[p]
	}
	g.resetAt = g.now()
	g.groupGen++
	g.m.resets.WithLabelValues(cause).Inc()
	g.log.Warn("kafka partitions were reset: applying their new messages", "topic", g.cfg.Topic, "cause", cause,
		"partitions", partitions, "group", g.groupID())
	select {
	case g.restart <- struct{}{}:
	default:
	}
}

// groupID is the consumer group: the configured or default one, with a
// suffix after each reset.
func (g *Ingester) groupID() string {
	if g.groupGen == 0 {
		return g.cfg.GroupID
	}
	return g.cfg.GroupID + "-r" + strconv.Itoa(g.groupGen)
}

// checkEnds compares the topic's end offsets and cluster id, as the probe
// read them, with what was applied before it asked (before): an end at or
// below an offset applied then, or another cluster, means a reset. Offsets
// applied while the probe's answer was on its way are newer than the ends
// it read, and are not compared with them.
func (g *Ingester) checkEnds(clusterID string, ends, before map[int]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if clusterID != "" && g.clusterID != "" && clusterID != g.clusterID {
		g.clusterID = clusterID
		var all []int
		for p := range g.applied {
			all = append(all, p)
		}
		slices.Sort(all)
		g.resetLocked(all, ends, "cluster_changed")
		return
	}
	if clusterID != "" {
		g.clusterID = clusterID
	}
	var reset []int
	for p, end := range ends {
		last, ok := before[p]
		if cur, still := g.applied[p]; ok && still && cur >= last && last >= end {
			reset = append(reset, p)
		}
	}
	if len(reset) > 0 {
		slices.Sort(reset)
		g.resetLocked(reset, ends, "offset_regression")
	}
}

// Rebuilding reports the partitions being re-read after a reset and the
// end offset each must reach (empty when none).
func (g *Ingester) Rebuilding() map[int]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.rebuilding)
}

// PodEventAge returns, per pod, the time since its last event.
func (g *Ingester) PodEventAge() map[string]time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	out := make(map[string]time.Duration, len(g.pods))
	for name, ps := range g.pods {
		if !ps.lastAt.IsZero() {
			out[name] = now.Sub(ps.lastAt)
		}
	}
	return out
}

// Run consumes the topic until ctx is done: fetch, apply, commit (at least
// once). When the broker goes away it reconnects with exponential backoff;
// the index keeps serving meanwhile and Staleness grows.
//
// Beside the consumer, a probe asks the brokers for the topic's metadata
// every ProbeInterval: Connected reports whether the last fetch or probe
// succeeded, so it turns true when the brokers answer again, not when the
// next event arrives.
func (g *Ingester) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	pctx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.probe(pctx)
	}()
	backoff := g.cfg.BackoffMin
	for {
		err := g.consume(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errRestart) {
			backoff = g.cfg.BackoffMin
			continue
		}
		err = g.brokerDown(err)
		g.m.reconnects.Inc()
		g.warn.Warn("consume", "kafka consumer failed; reconnecting", "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, g.cfg.BackoffMax)
	}
}

// probe calls the brokers' metadata every ProbeInterval until ctx is done
// and records whether they answered.
func (g *Ingester) probe(ctx context.Context) {
	tr := g.sec.Transport("", 5*time.Second)
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(g.cfg.Brokers...), Timeout: 5 * time.Second, Transport: tr}
	t := time.NewTicker(g.cfg.ProbeInterval)
	defer t.Stop()
	for {
		before := g.rekeyed()
		clusterID, ends, err := g.endOffsets(ctx, c)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			g.warn.Warn("probe", "kafka brokers do not answer", "err", g.brokerDown(err), "kafka", g.sec)
		} else {
			g.brokerUp()
			g.checkEnds(clusterID, ends, before)
			g.checkAnchors(ctx, c, ends)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// errRestart: the consumer stopped to start over in a fresh group after a
// reset.
var errRestart = errors.New("consumer restarts after a reset")

// consume runs one consumer until it fails or ctx is done.
func (g *Ingester) consume(ctx context.Context) error {
	if !g.startReady {
		hwm, err := g.highWaterMarks(ctx)
		if err != nil {
			return fmt.Errorf("read high-water marks: %w", err)
		}
		g.SetStartOffsets(hwm)
	}
	// A reset (resetLocked) restarts the consumer in a fresh group.
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-g.restart:
			cancel()
		case <-ctx.Done():
		}
	}()
	g.mu.Lock()
	group, gen := g.groupID(), g.groupGen
	g.mu.Unlock()
	dialer := g.sec.Dialer(5 * time.Second)
	dialer.DialFunc = lenientDial(fetchRoundTrip)
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        g.cfg.Brokers,
		GroupID:        group,
		Topic:          g.cfg.Topic,
		MinBytes:       1,
		MaxBytes:       g.cfg.FetchMaxBytes,
		MaxWait:        g.cfg.MaxWait,
		StartOffset:    kafka.FirstOffset,
		CommitInterval: g.cfg.CommitInterval,
		Dialer:         dialer,
		// Group session and rebalance timeouts short enough that a
		// restarted consumer takes over quickly.
		SessionTimeout:         10 * time.Second,
		RebalanceTimeout:       10 * time.Second,
		HeartbeatInterval:      time.Second,
		JoinGroupBackoff:       200 * time.Millisecond,
		PartitionWatchInterval: 5 * time.Second,
		WatchPartitionChanges:  true,
		ReadBackoffMin:         50 * time.Millisecond,
		ReadBackoffMax:         time.Second,
		MaxAttempts:            3,
		ErrorLogger:            kafkaErrorLogger(g.warn, g.log),
	})
	defer r.Close()
	fetched := g.fetchAhead(ctx, r)
	defer func() {
		cancel()
		for range fetched { // until the fetch goroutine has stopped
		}
	}()
	staged, free, commitErr, stop := g.indexStage(func(m kafka.Message) error { return r.CommitMessages(ctx, m) })
	defer stop()
	for {
		var f fetchedMsg
		select {
		case f = <-fetched:
		case err := <-commitErr:
			if ctx.Err() != nil && outer.Err() == nil {
				return errRestart
			}
			return fmt.Errorf("commit: %w", err)
		}
		m := f.msg
		if err := f.fetchErr; err != nil {
			if ctx.Err() != nil && outer.Err() == nil {
				return errRestart
			}
			return err
		}
		g.brokerUp()
		g.lastFetch.Store(g.now().UnixNano())
		g.lagMsgs.Store(max(m.HighWaterMark-m.Offset-1, 0))
		j := <-free
		g.apply(Message{Partition: m.Partition, Offset: m.Offset, HighWaterMark: m.HighWaterMark,
			Key: m.Key, Headers: m.Headers, Value: m.Value, Time: m.Time}, gen, &f.decoded, j)
		f.done()
		staged <- stagedMsg{job: j, msg: m}
	}
}

// stageDepth is how many re-keyed messages may wait for the index stage.
const stageDepth = 4

// stagedMsg is a re-keyed message on its way to the index stage.
type stagedMsg struct {
	job *indexJob
	msg kafka.Message
}

// indexStage starts the consumer's index stage: the goroutine that applies
// the index writes of each re-keyed message sent on staged, in order, while
// the consumer re-keys the next ones, and then commits the message (so a
// commit never runs ahead of the index). The consumer re-keys with one
// core and writes the index with the other: the index writes were a fifth
// of its CPU. Each job goes back on free once
// applied. The first commit error is sent on commitErr (later messages are
// still applied, not committed). stop waits until every message sent has
// been applied: the re-keyers' state is already past them, and a replay
// would be skipped.
func (g *Ingester) indexStage(commit func(kafka.Message) error) (staged chan<- stagedMsg, free <-chan *indexJob, commitErr <-chan error, stop func()) {
	in := make(chan stagedMsg, stageDepth)
	jobs := make(chan *indexJob, stageDepth+1)
	for range stageDepth + 1 {
		jobs <- &indexJob{}
	}
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		failed := false
		for s := range in {
			g.runJob(s.job)
			jobs <- s.job
			if failed {
				continue
			}
			if err := commit(s.msg); err != nil {
				failed = true
				errc <- err
			}
		}
	}()
	return in, jobs, errc, func() {
		close(in)
		<-done
	}
}

// spareDecoders is how many decoders the fetch goroutine keeps for reuse
// once their messages are applied; it makes more when it is further ahead.
const spareDecoders = 8

// fetchedMsg is a message the fetch goroutine handed over, with its value
// decoded, or the error that stopped it (fetchErr, the last one sent).
// done gives its decoder back once the message is applied.
type fetchedMsg struct {
	msg kafka.Message
	decoded
	fetchErr error
	done     func()
}

// fetchAhead starts the goroutine that fetches r's messages and decodes
// their values, up to the read-ahead bound (see readAheadFetches) ahead
// of apply, off the goroutine that applies
// them in order (decoding a message does not depend on the ones before
// it). It sends them, in order, on the channel it returns, then the error
// that stops it (ctx done, or the reader's), and closes the channel when it
// has stopped.
func (g *Ingester) fetchAhead(ctx context.Context, r *kafka.Reader) <-chan fetchedMsg {
	spare := make(chan *kvevents.Decoder, spareDecoders)
	budget := newReadBudget(g.cfg.readAhead())
	out := make(chan fetchedMsg, readAheadMsgs)
	go func() {
		defer close(out)
		for {
			m, err := r.FetchMessage(ctx)
			if err == nil {
				err = budget.acquire(ctx, int64(len(m.Value)))
			}
			if err != nil {
				out <- fetchedMsg{fetchErr: err}
				return
			}
			var d *kvevents.Decoder
			select {
			case d = <-spare:
			default:
				if d, err = kvevents.NewDecoder(g.decCfg); err != nil {
					panic(err) // the configuration NewIngester validated
				}
			}
			n := int64(len(m.Value))
			f := fetchedMsg{msg: m, done: func() {
				select {
				case spare <- d:
				default: // enough spares: this one goes to the GC
				}
				budget.release(n)
			}}
			f.batch, f.err = d.Decode(m.Value)
			select {
			case out <- f:
			case <-ctx.Done():
				out <- fetchedMsg{fetchErr: ctx.Err()}
				return
			}
		}
	}()
	return out
}

// highWaterMarks asks the broker for the current end offset of every
// partition of the topic.
func (g *Ingester) highWaterMarks(ctx context.Context) (map[int]int64, error) {
	tr := g.sec.Transport("", 5*time.Second)
	defer tr.CloseIdleConnections()
	_, ends, err := g.endOffsets(ctx, &kafka.Client{Addr: kafka.TCP(g.cfg.Brokers...), Timeout: 10 * time.Second, Transport: tr})
	return ends, err
}

// endOffsets asks the brokers for their cluster id and the end offset (the
// high-water mark) of every partition of the topic.
func (g *Ingester) endOffsets(ctx context.Context, c *kafka.Client) (string, map[int]int64, error) {
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{g.cfg.Topic}})
	if err != nil {
		return "", nil, err
	}
	out := map[int]int64{}
	for _, t := range md.Topics {
		if t.Name != g.cfg.Topic {
			continue
		}
		if t.Error != nil {
			if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				return md.ClusterID, out, nil // nothing published yet
			}
			return "", nil, t.Error
		}
		req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
		for _, p := range t.Partitions {
			req.Topics[g.cfg.Topic] = append(req.Topics[g.cfg.Topic], kafka.LastOffsetOf(p.ID))
		}
		res, err := c.ListOffsets(ctx, req)
		if err != nil {
			return "", nil, err
		}
		for _, po := range res.Topics[g.cfg.Topic] {
			if po.Error != nil {
				return "", nil, po.Error
			}
			out[po.Partition] = po.LastOffset
		}
	}
	return md.ClusterID, out, nil
}

func header(hs []kafka.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func headerU64(hs []kafka.Header, key string) (uint64, bool) {
	for _, h := range hs {
		if h.Key == key && len(h.Value) == 8 {
			return binary.BigEndian.Uint64(h.Value), true
		}
	}
	return 0, false
}

type ingestMetrics struct {
	events *prometheus.CounterVec
	// byKind are events' counters by Kind, resolved once: vLLM publishes
	// one BlockStored or BlockRemoved per engine block.
	byKind        [kvevents.KindPodDown + 1]prometheus.Counter
	blocksStored  prometheus.Counter
	blocksRemoved prometheus.Counter
	decodeErrors  *prometheus.CounterVec
	skipped       *prometheus.CounterVec
	restarts      *prometheus.CounterVec
	reconnects    prometheus.Counter
	brokerErrors  *prometheus.CounterVec
	podUpRejected *prometheus.CounterVec
	resets        *prometheus.CounterVec
	discovered    *prometheus.CounterVec
	podExpiry     *prometheus.CounterVec
}

func newIngestMetrics(r prometheus.Registerer, g *Ingester) (*ingestMetrics, error) {
	m := &ingestMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_events_total",
			Help: "KV events applied, by type."}, []string{"type"}),
		blocksStored: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_ingest_blocks_stored_total",
			Help: "Router blocks registered in the index."}),
		blocksRemoved: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_ingest_blocks_removed_total",
			Help: "Router blocks evicted from the index."}),
		decodeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_decode_errors_total",
			Help: "Messages or events skipped as malformed, by reason."}, []string{"reason"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_messages_skipped_total",
			Help: "Messages skipped without error, by reason (replay: offset already applied; duplicate_seq: batch already applied; superseded: fetched before a reset, applied after it)."}, []string{"reason"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_pod_clears_total",
			Help: "Pods whose blocks were cleared, by cause (engine restart, pod down)."}, []string{"cause"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_ingest_reconnects_total",
			Help: "Kafka consumer reconnects after a failure."}),
		brokerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_broker_errors_total",
			Help: "Failures to reach the Kafka brokers (consumer and metadata probe), by kind: auth (SASL refused), tls (handshake: untrusted or misnamed certificate), other."}, []string{"kind"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_resets_total",
			Help: "Kafka resets detected, by cause (offset_regression: a partition ending below what was applied; cluster_changed: another cluster id; rewritten: another message at an offset applied before, the partition having grown past it again): the partitions are re-read from their new start."}, []string{"cause"}),
		discovered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_discovered_pods_total",
			Help: "Pods that discovery (pods.discovery) registered (joined, including changed) or removed (left)."}, []string{"change"}),
		podExpiry: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_pod_expiry_total",
			Help: "Pods whose announcement ran out (PodUp ttl_ms) while they did not answer: lapsed (no more requests), removed (a further TTL later), restored (announced or answering again)."}, []string{"phase"}),
		podUpRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_ingest_podup_rejected_total",
			Help: "Pod announcements not believed, by reason (key_mismatch, bad_endpoint, endpoint_not_allowed, bad_mac, plaintext_endpoint)."}, []string{"reason"}),
	}
	for _, reason := range kvevents.Reasons() {
		m.decodeErrors.WithLabelValues(string(reason))
	}
	for _, reason := range podUpRejections {
		m.podUpRejected.WithLabelValues(reason)
	}
	for _, phase := range []string{"lapsed", "removed", "restored"} {
		m.podExpiry.WithLabelValues(phase)
	}
	for _, cause := range []string{"offset_regression", "cluster_changed", "rewritten"} {
		m.resets.WithLabelValues(cause)
	}
	for _, k := range []kvevents.Kind{kvevents.KindBlockStored, kvevents.KindBlockRemoved, kvevents.KindAllBlocksCleared, kvevents.KindPodUp, kvevents.KindPodDown} {
		m.byKind[k] = m.events.WithLabelValues(k.String())
	}
	for _, reason := range []string{"replay", "duplicate_seq", "superseded"} {
		m.skipped.WithLabelValues(reason)
	}
	for _, cause := range []string{"restart", "pod_up_new_epoch", "pod_down", "rewritten"} {
		m.restarts.WithLabelValues(cause)
	}
	for _, kind := range kafkasec.Kinds() {
		m.brokerErrors.WithLabelValues(kind)
	}
	gauges := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_ingest_consumer_lag_messages",
			Help: "Messages behind the high-water mark, as of the last fetch."}, func() float64 { return float64(g.Lag()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_ingest_staleness_seconds",
			Help: "Seconds since the last message was fetched (grows while the broker is unreachable)."},
			func() float64 { return g.Staleness().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_ingest_connected",
			Help: "1 while the brokers answer (the last fetch or metadata probe succeeded), 0 otherwise."}, func() float64 { return b2f(g.Connected()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_ingest_caught_up",
			Help: "1 once the index holds everything the topic held at start."}, func() float64 { return b2f(g.CaughtUp()) }),
		&podAgeCollector{g: g, desc: prometheus.NewDesc("meridian_ingest_last_event_age_seconds",
			"Seconds since the last KV event of each pod.", []string{"pod"}, nil)},
	}
	gauges = append(gauges, &rekeyCollector{g: g, desc: prometheus.NewDesc("meridian_ingest_rekey_skipped_total",
		"Engine blocks and events the re-keyers did not index, by reason (see kvevents.RekeyStats).", []string{"reason"}, nil)})
	for _, c := range append([]prometheus.Collector{m.events, m.blocksStored, m.blocksRemoved, m.decodeErrors, m.skipped, m.restarts, m.reconnects, m.brokerErrors, m.podUpRejected, m.resets, m.discovered, m.podExpiry}, gauges...) {
		if err := r.Register(c); err != nil {
			return nil, fmt.Errorf("register ingest metrics: %w", err)
		}
	}
	return m, nil
}

// countEvents counts a run of events by kind, one Add per kind.
func (m *ingestMetrics) countEvents(evs []kvevents.Event) {
	var n [len(m.byKind)]int
	for _, ev := range evs {
		if k := ev.Kind(); int(k) < len(n) && m.byKind[k] != nil {
			n[k]++
		} else {
			m.events.WithLabelValues(k.String()).Inc()
		}
	}
	for k, c := range n {
		if c > 0 {
			m.byKind[k].Add(float64(c))
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

type podAgeCollector struct {
	g    *Ingester
	desc *prometheus.Desc
}

func (c *podAgeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *podAgeCollector) Collect(ch chan<- prometheus.Metric) {
	for pod, age := range c.g.PodEventAge() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, math.Max(age.Seconds(), 0), pod)
	}
}

// newRekeyer is a pod's re-keyer for model at the router's block size.
func (g *Ingester) newRekeyer(model string) (*kvevents.Rekeyer, error) {
	rcfg := kvevents.DefaultRekeyConfig()
	rcfg.Model, rcfg.BlockSize, rcfg.MaxEntries = model, g.cfg.BlockSize, g.cfg.MaxEntriesPerPod
	return kvevents.NewRekeyer(rcfg)
}
