package enginesim

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// Timing is the latency model of one pod. A zero field takes the hardware
// profile's value.
type Timing struct {
	// PrefillOverhead is the fixed part of time to first token (scheduling,
	// one forward pass). Unit: duration.
	PrefillOverhead time.Duration
	// PrefillPerToken is the prefill time per uncached prompt token.
	PrefillPerToken time.Duration
	// DecodeInterval is the time between output tokens.
	DecodeInterval time.Duration
	// LoadFactor (>= 1) scales prefill and decode times linearly from 1 with
	// one request running up to LoadFactor with MaxConcurrency running; 1
	// turns it off (llm-d-inference-sim's time-factor-under-load).
	LoadFactor float64
	// PrefillSlots is how many requests prefill at once, each at the full
	// per-token rate; further prefills wait in FIFO order for a slot.
	// Prefill is compute-bound, so concurrent prefills share the GPU: with
	// the default 1, a request's prefill starts only when the prefill work
	// admitted before it is done, and its time to first token includes that
	// backlog (vLLM's chunked prefill behaves much like this). The fixed
	// PrefillOverhead is not serialized. Negative: unlimited (every admitted
	// request prefills at once, at full speed). 0 takes the default, 1.
	PrefillSlots int
}

// Profile is a hardware profile: the defaults of one pod serving a
// 70B-class FP8 model with tensor parallelism 2.
type Profile struct {
	Name           string
	Timing         Timing
	CacheBlocks    int // KV-cache capacity in 16-token blocks
	MaxConcurrency int // vLLM max_num_seqs
	Source         string
}

// Profiles returns the built-in hardware profiles, keyed by lower-case name.
//
// How the numbers were derived (nominal figures, not measurements):
//   - H100 anchors everything. The seed's example (2K-token prompt, 70B FP8
//     on H100): TTFT ~80 ms on a hit, ~800 ms on a miss, so prefill costs
//     (800-80)/2000 = 0.36 ms per uncached token and ~75 ms is the fixed
//     part (a hit still recomputes up to one block). Decode reads the
//     weights once per step: 70 GB / (2 x 3.35 TB/s HBM3) = 10.4 ms, ~25 ms
//     with batching, attention and scheduling overheads at moderate load.
//   - H200 has the same FP8 compute as H100 (1,979 dense TFLOPS), so the same
//     prefill rate; decode and the fixed part scale with memory bandwidth
//     (4.8 vs 3.35 TB/s): 25 x 3.35/4.8 = 17.4 ms and 75 x 3.35/4.8 = 52 ms.
//   - B200: 4,500 vs 1,979 dense FP8 TFLOPS for prefill, 0.36 x
//     1979/4500 = 0.158 ms per token; 8 TB/s for decode, 25 x 3.35/8 =
//     10.5 ms, and a fixed part of 75 x 3.35/8 = 31 ms.
//   - KV capacity per pod (TP 2): Llama-3-70B keeps 80 layers x 8 KV heads x
//     128 dims x 2 (K and V) x 1 byte (FP8 KV) = 160 KiB per token, 80 KiB per
//     GPU, 1.25 MiB per GPU per 16-token block; free memory per GPU is 90% of
//     HBM minus 35 GB of weights: H100 (80 GB) 37 GB -> 28,226 blocks; H200
//     (141 GB) 91.9 GB -> 70,112 blocks; B200 (192 GB) 137.8 GB -> 105,133
//     blocks.
//   - MaxConcurrency 256 is vLLM's default max_num_seqs.
func Profiles() map[string]Profile {
	return map[string]Profile{
		"h100": {
			Name:           "h100",
			Timing:         Timing{PrefillOverhead: 75 * time.Millisecond, PrefillPerToken: 360 * time.Microsecond, DecodeInterval: 25 * time.Millisecond, LoadFactor: 1},
			CacheBlocks:    28226,
			MaxConcurrency: 256,
			Source:         "seed: 2K tokens 70B FP8 on H100, ~80 ms hit vs ~800 ms miss; HBM3 3.35 TB/s",
		},
		"h200": {
			Name:           "h200",
			Timing:         Timing{PrefillOverhead: 52 * time.Millisecond, PrefillPerToken: 360 * time.Microsecond, DecodeInterval: 17400 * time.Microsecond, LoadFactor: 1},
			CacheBlocks:    70112,
			MaxConcurrency: 256,
			Source:         "H100 anchor; same FP8 compute; HBM3e 4.8 TB/s, 141 GB",
		},
		"b200": {
			Name:           "b200",
			Timing:         Timing{PrefillOverhead: 31 * time.Millisecond, PrefillPerToken: 158 * time.Microsecond, DecodeInterval: 10500 * time.Microsecond, LoadFactor: 1},
			CacheBlocks:    105133,
			MaxConcurrency: 256,
			Source:         "H100 anchor; 4.5 PFLOPS dense FP8; HBM3e 8 TB/s, 192 GB",
		},
	}
}

// profileNames returns the profile names, sorted.
func profileNames() []string {
	var names []string
	for n := range Profiles() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// KafkaConfig makes the engine publish its events to Kafka itself (it then
// owns and closes the writer).
type KafkaConfig struct {
	// Brokers are host:port seed addresses. Required.
	Brokers []string
	// Topic; default "meridian.kv-events.<Region>".
	Topic string
	// BatchTimeout is the kafka-go Writer's linger; default 2ms (kafka-go's
	// own default of 1s would delay every event batch by a second).
	BatchTimeout time.Duration
	// WriteTimeout bounds one write; default 10s.
	WriteTimeout time.Duration
	// Security is TLS to the brokers and a SASL user (kafkasec.Config: the
	// kafka.tls and kafka.sasl sections of a controller's configuration).
	// Brokers beyond loopback need TLS unless Insecure.
	Security kafkasec.Config
	// Insecure accepts plaintext to brokers beyond loopback,
	// insecure_skip_verify and PLAIN without TLS (logged at Open).
	Insecure bool
}

// Config configures one simulated pod. Zero values take the defaults given.
type Config struct {
	// Addr is the listen address; default "127.0.0.1:0" (an ephemeral port).
	Addr string
	// Name is the pod name: the Kafka key of its events and the name in its
	// lifecycle events. Default "enginesim-<port>".
	Name string
	// Endpoint is the base URL announced in PodUp; default
	// http(s)://<listen addr>.
	Endpoint string
	// TLSCert and TLSKey are PEM files: with them the pod serves https, as
	// an inference pod behind TLS does (the router then scrapes and proxies
	// to it with its pods.tls CA). Both or neither.
	TLSCert, TLSKey string
	// Region is announced in PodUp and names the default Kafka topic.
	Region string
	// Model is the served model name; default "meridian/sim-70b".
	Model string
	// Engine is the engine the pod imitates on the wire: "vllm" (default),
	// "sglang" or "trtllm" (see EncodingFor, Batch.KVBatch and the metrics'
	// names). The prefix cache, timing and API are the same for all three.
	Engine string
	// LoRAs are adapter names also served; a request naming one uses it.
	LoRAs []string
	// Tokenizer is how prompts become token ids: give the router the same.
	// Default tokenize.DefaultConfig() (cl100k_base, ChatML).
	Tokenizer tokenize.Config
	// Hardware is the profile name (see Profiles); default "h100".
	Hardware string
	// Timing overrides the profile's timing field by field.
	Timing Timing
	// TimeScale multiplies every modelled duration (0.01 runs 100x faster);
	// default 1.
	TimeScale float64
	// CacheBlocks is the KV-cache capacity in blocks; default the profile's.
	CacheBlocks int
	// BlockSize is tokens per block; default 16 (vLLM's default).
	BlockSize int
	// HashSeed seeds the engine hash chain (vLLM's PYTHONHASHSEED). Empty: a
	// random seed per Open, so hashes change on restart, as vLLM's do when
	// PYTHONHASHSEED is unset.
	HashSeed string
	// MaxConcurrency is the number of requests running at once (vLLM
	// max_num_seqs); default the profile's.
	MaxConcurrency int
	// MaxModelLen bounds prompt plus output tokens; default 131072.
	MaxModelLen int
	// DefaultMaxTokens is the output length when a request gives none;
	// default 16.
	DefaultMaxTokens int
	// MaxBodyBytes bounds a request body; default 64 MiB.
	MaxBodyBytes int64
	// EventBatchSize publishes a batch once this many events are pending;
	// default 16 (llm-d-inference-sim's default).
	EventBatchSize int
	// EventFlushInterval publishes pending events at most this long after
	// the first of them; default 20ms (about one vLLM engine step). Not
	// scaled by TimeScale.
	EventFlushInterval time.Duration
	// AnnounceInterval is how often the pod repeats its PodUp (same epoch,
	// with a TTL of AnnounceTTLFactor intervals), so that a controller that
	// lost the first one (a topic rebuilt without it) learns the pod's
	// endpoint within one interval. Default 10s; negative: announce once,
	// at Open, without a TTL (as pods did before). Not scaled by TimeScale.
	AnnounceInterval time.Duration
	// MaxPendingEvents bounds events held while the publisher fails; beyond
	// it they are dropped and counted, and the batch sequence skips one so
	// consumers see a gap. Default 100000.
	MaxPendingEvents int
	// DataParallelRank is written in every batch; default 0.
	DataParallelRank int
	// Epoch identifies this process start in PodUp/PodDown and batch
	// headers; 0 = the clock's time in nanoseconds at Open.
	Epoch uint64
	// Faults are the failures injected from the start (see Faults).
	Faults Faults
	// Seed seeds fault rates and output text; default 1.
	Seed uint64
	// AdminToken, when set, is required as "Authorization: Bearer <token>"
	// on /admin/* and /reset_prefix_cache.
	AdminToken string

	// Kafka, when set, publishes events to Kafka (the engine owns the
	// writer). At most one of Kafka and Publisher.
	Kafka *KafkaConfig
	// Publisher receives event batches; the caller owns it. Nil (and no
	// Kafka): events are counted and dropped.
	Publisher Publisher
	// Registry receives the metrics and is served on /metrics; nil = a
	// private registry per engine (never the global one).
	Registry *prometheus.Registry
	// Logger; nil = discard.
	Logger *slog.Logger
	// Clock; nil = the real clock.
	Clock Clock
}

// AnnounceTTLFactor is the TTL of a repeated PodUp in announce intervals:
// a controller drops the pod only after three announcements in a row are
// missing (and the pod does not answer).
const AnnounceTTLFactor = 3

// DefaultConfig returns a loopback h100 pod with an ephemeral port. Timing,
// CacheBlocks and MaxConcurrency are left zero, to be taken from the
// Hardware profile when the engine opens: setting Hardware alone changes
// them.
func DefaultConfig() Config {
	return Config{
		Addr:               "127.0.0.1:0",
		Model:              "meridian/sim-70b",
		Tokenizer:          tokenize.DefaultConfig(),
		Hardware:           "h100",
		TimeScale:          1,
		BlockSize:          16,
		MaxModelLen:        131072,
		DefaultMaxTokens:   16,
		MaxBodyBytes:       64 << 20,
		EventBatchSize:     16,
		EventFlushInterval: 20 * time.Millisecond,
		AnnounceInterval:   10 * time.Second,
		MaxPendingEvents:   100000,
		Seed:               1,
	}
}

// withDefaults fills zero fields from DefaultConfig and the hardware profile.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Hardware == "" {
		c.Hardware = d.Hardware
	}
	c.Hardware = strings.ToLower(c.Hardware)
	p, ok := Profiles()[c.Hardware]
	if !ok {
		return c // Validate reports it
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.Timing.PrefillOverhead, p.Timing.PrefillOverhead)
	setDur(&c.Timing.PrefillPerToken, p.Timing.PrefillPerToken)
	setDur(&c.Timing.DecodeInterval, p.Timing.DecodeInterval)
	setDur(&c.EventFlushInterval, d.EventFlushInterval)
	setDur(&c.AnnounceInterval, d.AnnounceInterval)
	if c.Timing.PrefillSlots == 0 {
		c.Timing.PrefillSlots = 1
	}
	if c.Timing.LoadFactor == 0 {
		c.Timing.LoadFactor = p.Timing.LoadFactor
	}
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&c.CacheBlocks, p.CacheBlocks)
	setInt(&c.MaxConcurrency, p.MaxConcurrency)
	setInt(&c.BlockSize, d.BlockSize)
	setInt(&c.MaxModelLen, d.MaxModelLen)
	setInt(&c.DefaultMaxTokens, d.DefaultMaxTokens)
	setInt(&c.EventBatchSize, d.EventBatchSize)
	setInt(&c.MaxPendingEvents, d.MaxPendingEvents)
	if c.Addr == "" {
		c.Addr = d.Addr
	}
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.Engine == "" {
		c.Engine = kvevents.EngineVLLM
	}
	if c.Tokenizer.Encoding == "" {
		c.Tokenizer.Encoding = d.Tokenizer.Encoding
	}
	if c.TimeScale == 0 {
		c.TimeScale = d.TimeScale
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.Seed == 0 {
		c.Seed = d.Seed
	}
	if c.Kafka != nil {
		k := *c.Kafka
		if k.Topic == "" && c.Region != "" {
			k.Topic = kvevents.TopicFor(c.Region)
		}
		if k.BatchTimeout == 0 {
			k.BatchTimeout = 2 * time.Millisecond
		}
		if k.WriteTimeout == 0 {
			k.WriteTimeout = 10 * time.Second
		}
		c.Kafka = &k
	}
	return c
}

// Validate reports the first invalid field of c after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	if _, ok := Profiles()[c.Hardware]; !ok {
		return fmt.Errorf("enginesim config: Hardware %q: unknown profile (have %s)", c.Hardware, strings.Join(profileNames(), ", "))
	}
	switch {
	case c.TimeScale < 0:
		return fmt.Errorf("enginesim config: TimeScale %v: must be > 0", c.TimeScale)
	case c.Timing.PrefillOverhead < 0:
		return fmt.Errorf("enginesim config: Timing.PrefillOverhead %v: must be >= 0", c.Timing.PrefillOverhead)
	case c.Timing.PrefillPerToken < 0:
		return fmt.Errorf("enginesim config: Timing.PrefillPerToken %v: must be >= 0", c.Timing.PrefillPerToken)
	case c.Timing.DecodeInterval < 0:
		return fmt.Errorf("enginesim config: Timing.DecodeInterval %v: must be >= 0", c.Timing.DecodeInterval)
	case c.Timing.LoadFactor < 1:
		return fmt.Errorf("enginesim config: Timing.LoadFactor %v: must be >= 1", c.Timing.LoadFactor)
	case c.BlockSize < 1:
		return fmt.Errorf("enginesim config: BlockSize %d: must be >= 1", c.BlockSize)
	case c.CacheBlocks < 1:
		return fmt.Errorf("enginesim config: CacheBlocks %d: must be >= 1", c.CacheBlocks)
	case c.MaxConcurrency < 1:
		return fmt.Errorf("enginesim config: MaxConcurrency %d: must be >= 1", c.MaxConcurrency)
	case c.MaxModelLen < 2:
		return fmt.Errorf("enginesim config: MaxModelLen %d: must be >= 2", c.MaxModelLen)
	case c.DefaultMaxTokens < 1:
		return fmt.Errorf("enginesim config: DefaultMaxTokens %d: must be >= 1", c.DefaultMaxTokens)
	case c.MaxBodyBytes < 1:
		return fmt.Errorf("enginesim config: MaxBodyBytes %d: must be >= 1", c.MaxBodyBytes)
	case c.EventBatchSize < 1:
		return fmt.Errorf("enginesim config: EventBatchSize %d: must be >= 1", c.EventBatchSize)
	case c.EventFlushInterval < 0:
		return fmt.Errorf("enginesim config: EventFlushInterval %v: must be > 0", c.EventFlushInterval)
	case c.MaxPendingEvents < c.EventBatchSize:
		return fmt.Errorf("enginesim config: MaxPendingEvents %d: must be >= EventBatchSize (%d)", c.MaxPendingEvents, c.EventBatchSize)
	case !slices.Contains(kvevents.Engines(), c.Engine):
		return fmt.Errorf("enginesim config: Engine %q: want one of %s", c.Engine, strings.Join(kvevents.Engines(), ", "))
	case c.DataParallelRank < 0:
		return fmt.Errorf("enginesim config: DataParallelRank %d: must be >= 0", c.DataParallelRank)
	case c.Kafka != nil && c.Publisher != nil:
		return errors.New("enginesim config: Kafka and Publisher: set at most one")
	case c.Kafka != nil && len(c.Kafka.Brokers) == 0:
		return errors.New("enginesim config: Kafka.Brokers: empty")
	case c.Kafka != nil && c.Kafka.Topic == "": // no Region to name the default
		return errors.New("enginesim config: Region: required to name the default Kafka topic (or set Kafka.Topic)")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return fmt.Errorf("enginesim config: TLSCert %q and TLSKey %q: set both or neither", c.TLSCert, c.TLSKey)
	}
	if c.Kafka != nil {
		if err := c.Kafka.Security.Validate("kafka", c.Kafka.Brokers, c.Kafka.Insecure); err != nil {
			return fmt.Errorf("enginesim config: %w", err)
		}
	}
	for i, l := range c.LoRAs {
		if l == "" || l == c.Model {
			return fmt.Errorf("enginesim config: LoRAs[%d] %q: must be non-empty and differ from Model", i, l)
		}
	}
	if err := c.Faults.validate(); err != nil {
		return fmt.Errorf("enginesim config: Faults: %w", err)
	}
	if err := c.Tokenizer.Validate(); err != nil {
		return fmt.Errorf("enginesim config: Tokenizer: %w", err)
	}
	return nil
}
