package kvevents

import (
	"strings"
	"time"

	"github.com/meridian-llm/meridian/index"
)

// Kind names an event type. Its String is the wire tag.
type Kind uint8

// The event kinds: vLLM's three, then Meridian's own lifecycle events.
const (
	KindBlockStored Kind = iota + 1
	KindBlockRemoved
	KindAllBlocksCleared
	KindPodUp
	KindPodDown
)

// Wire tags, as vLLM (msgspec tag=True: the class name) and Meridian write them.
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
	TagPodUp            = "PodUp"
	TagPodDown          = "PodDown"
)

func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return TagBlockStored
	case KindBlockRemoved:
		return TagBlockRemoved
	case KindAllBlocksCleared:
		return TagAllBlocksCleared
	case KindPodUp:
		return TagPodUp
	case KindPodDown:
		return TagPodDown
	}
	return "unknown"
}

func kindOfTag(tag []byte) Kind {
	switch string(tag) {
	case TagBlockStored:
		return KindBlockStored
	case TagBlockRemoved:
		return KindBlockRemoved
	case TagAllBlocksCleared:
		return KindAllBlocksCleared
	case TagPodUp:
		return KindPodUp
	case TagPodDown:
		return KindPodDown
	}
	return 0
}

// Opt is a value that may be absent: msgpack nil, or a missing trailing or
// omitted field. The zero Opt is absent.
type Opt[T any] struct {
	V     T
	Valid bool
}

// Some returns a present Opt holding v.
func Some[T any](v T) Opt[T] { return Opt[T]{V: v, Valid: true} }

// Raw is one msgpack-encoded value kept as its bytes, for fields whose content
// is opaque and version-dependent (vLLM's per-block extra_keys).
type Raw []byte

// Batch is one vLLM KVEventBatch (one Kafka message value, one ZMQ payload).
type Batch struct {
	// TS is the producer's time.time() in seconds.
	TS float64
	// Events in order. A Batch from Decoder.Decode holds pointers into the
	// decoder's buffers: they stay valid until its next Decode.
	Events []Event
	// DataParallelRank is the vLLM data-parallel rank of the publisher (SGLang:
	// attn_dp_rank); absent means rank 0.
	DataParallelRank Opt[int64]
	// Skipped lists events the decoder passed over: an unknown tag (a
	// newer producer; ReasonUnknownEvent) or a malformed event (any other
	// reason); the rest of the batch is still valid. The encoder ignores it.
	Skipped []Skipped
}

// Rank returns the data-parallel rank, 0 when absent.
func (b *Batch) Rank() int64 {
	if b.DataParallelRank.Valid {
		return b.DataParallelRank.V
	}
	return 0
}

// Skipped describes an event the decoder passed over.
type Skipped struct {
	Index  int    // position in the events array
	Offset int    // byte offset of the event in the message
	Tag    string // its tag, as sent (truncated to 64 bytes); "" if unread
	Reason Reason // ReasonUnknownEvent, or why the event is malformed
	// Detail says what was wrong, for a human (empty for unknown events);
	// ErrOffset is the byte offset of the value at fault.
	Detail    string
	ErrOffset int
}

// Malformed reports whether the event was skipped as malformed (and not as
// an unknown, newer event type).
func (s Skipped) Malformed() bool { return s.Reason != ReasonUnknownEvent }

// Event is one of *BlockStored, *BlockRemoved, *AllBlocksCleared, *PodUp or
// *PodDown.
type Event interface {
	Kind() Kind
	isEvent()
}

// BlockStored announces that the engine now holds full blocks. Fields are in
// vLLM's declaration order (the positional wire order).
type BlockStored struct {
	BlockHashes     []uint64    // engine hashes, one per block; empty lists decode as nil
	ParentBlockHash Opt[uint64] // absent: the first block of a sequence
	TokenIDs        []uint32    // tokens of all blocks, concatenated; empty for CPU offload
	BlockSize       int64       // engine tokens per block
	LoRAID          Opt[int64]  // deprecated by vLLM in favour of LoRAName
	Medium          Opt[string] // see TierOf
	LoRAName        Opt[string]
	// ExtraKeys has one msgpack value per block (nil, or a tuple of LoRA name,
	// multimodal (id, offset) pairs, cache salt on block 0, prompt-embeds
	// digest); nil when the field is absent.
	ExtraKeys                []Raw
	GroupIdx                 Opt[int64] // KV-cache group (hybrid models)
	KVCacheSpecKind          Opt[string]
	KVCacheSpecSlidingWindow Opt[int64]
	// Locality is "LOCAL" or "REMOTE": where the storage of the medium is,
	// relative to the publishing engine (vLLM #48281, for its FS and OBJ
	// tiers; TensorRT-LLM's streaming events); absent: unspecified.
	Locality Opt[string]
	// CacheSalt is the request's cache salt as SGLang sends it: in a
	// {cache_salt} metadata map where vLLM has lora_name (SGLang >= 0.5.18,
	// PR 30827), or as a key of a map event (PR 37482). vLLM sends its salt
	// in ExtraKeys instead.
	CacheSalt Opt[string]
	// MMKeys has one msgpack value per block: TensorRT-LLM's multimodal keys
	// (a list of {type: mm_key, hash, start_offset[, uuid]} maps); nil when
	// the field is absent.
	MMKeys []Raw
	// StringTokens are the token ids sent as strings (TensorRT-LLM's
	// EventTokenId is int | str): their positions in TokenIDs, which holds 0
	// there. A block holding one is not text Meridian can match.
	StringTokens []StringToken
	// Pairs says token_ids came as [token, next token] pairs, SGLang's bigram
	// keys (DeepSeek V4): TokenIDs holds the first token of each pair, and
	// PairNext the second of the last pair (the token after the event's
	// blocks). The pairs of one event always chain (pair i's second is pair
	// i+1's first); an event whose pairs do not is malformed.
	Pairs    bool
	PairNext uint32
}

// StringToken is a token id sent as a string.
type StringToken struct {
	Pos   int    // index in TokenIDs
	Value string // as sent
}

// BlockRemoved announces that the engine evicted blocks from Medium.
type BlockRemoved struct {
	BlockHashes []uint64
	Medium      Opt[string]
	GroupIdx    Opt[int64]
	Locality    Opt[string] // as on BlockStored
}

// AllBlocksCleared announces a prefix-cache reset of the publishing rank.
type AllBlocksCleared struct{}

// PodUp is Meridian's announcement that a pod started serving (with a new
// Epoch after every engine restart, so a consumer can tell a restart from a
// replayed announcement).
type PodUp struct {
	Pod      string // pod name, the Kafka key of its events
	Endpoint string // base URL of its OpenAI-compatible API, e.g. http://10.0.0.7:8000
	Model    string // served model name
	Hardware string // hardware profile name, e.g. "h100"
	Region   string
	Epoch    uint64 // increases on every engine start
	// Engine is the engine kind, "vllm", "sglang" or "trtllm" (the metric
	// names the scraper reads); empty: unknown (vLLM's names).
	Engine string
	// KVBlocks is the pod's KV-cache capacity in engine blocks, GPU plus
	// offload tiers; 0: unknown. It sizes the pod's re-keyer.
	KVBlocks uint64
	// TTL is how long the announcement holds: the pod repeats it well
	// within the TTL while it serves, and a consumer may drop a pod that
	// neither repeated it in time nor answers (wire: ttl_ms, a trailing
	// field older consumers ignore). 0: until a PodDown.
	TTL time.Duration
}

// The engine kinds a PodUp (or a pod's configuration) names.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineTRTLLM = "trtllm"
)

// Engines lists the engine kinds.
func Engines() []string { return []string{EngineVLLM, EngineSGLang, EngineTRTLLM} }

// PodDown is Meridian's announcement that a pod stopped serving.
type PodDown struct {
	Pod    string
	Epoch  uint64 // the epoch that ended
	Reason string // free text, e.g. "shutdown", "drain"
}

// Kind implements Event.
func (*BlockStored) Kind() Kind { return KindBlockStored }

// Kind implements Event.
func (*BlockRemoved) Kind() Kind { return KindBlockRemoved }

// Kind implements Event.
func (*AllBlocksCleared) Kind() Kind { return KindAllBlocksCleared }

// Kind implements Event.
func (*PodUp) Kind() Kind { return KindPodUp }

// Kind implements Event.
func (*PodDown) Kind() Kind { return KindPodDown }

func (*BlockStored) isEvent()      {}
func (*BlockRemoved) isEvent()     {}
func (*AllBlocksCleared) isEvent() {}
func (*PodUp) isEvent()            {}
func (*PodDown) isEvent()          {}

// TierOf maps a medium to the index tier with vLLM's and SGLang's aliases,
// matched case-insensitively:
//
//	absent (nil), GPU, DEVICE                 -> gpu
//	CPU, CPU_PINNED, CPU_TIER1                -> cpu
//	CPU_TIER2, DISK, NVME, STORAGE, FS        -> disk
//	EXTERNAL, NETWORK, REMOTE, SHARED, OBJ    -> external
//
// Anything else returns ok false. An unknown medium is not a decode error (the
// medium is an open set that engines extend, and the decoder keeps the string
// as sent); the Rekeyer skips such events and counts them
// (RekeyStats.UnknownMedium) rather than guess a tier, because filing an
// unknown medium as gpu would over-claim the fastest tier. Operators can add
// aliases with RekeyConfig.Media. Whether a tier is the pod's own is
// Local's question, not TierOf's.
func TierOf(medium Opt[string]) (t index.Tier, ok bool) {
	if !medium.Valid {
		return index.TierGPU, true
	}
	if t, ok := tierOfUpper(medium.V); ok {
		return t, true
	}
	return tierOfUpper(strings.ToUpper(medium.V))
}

func tierOfUpper(m string) (index.Tier, bool) {
	switch m {
	case "GPU", "DEVICE":
		return index.TierGPU, true
	case "CPU", "CPU_PINNED", "CPU_TIER1":
		return index.TierCPU, true
	case "CPU_TIER2", "DISK", "NVME", "STORAGE", "FS":
		return index.TierDisk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED", "OBJ":
		return index.TierExternal, true
	}
	return 0, false
}

// Local reports whether blocks an engine announces on medium, with the
// given locality, are the publishing pod's own cache. Meridian credits a
// pod only with what it owns: a block in shared or remote storage can be
// loaded by every pod that mounts that storage, and which pods those are is
// known to no event, so crediting the announcing pod alone would be a guess
// (and a region-level tier would need exactly that knowledge). Such events
// are skipped and counted (RekeyStats.NonLocal), as Dynamo does (its
// #11571 fails closed on non-local events).
//
//	locality REMOTE (or anything but LOCAL)      -> not local
//	locality LOCAL                               -> local
//	absent: FS, OBJ, STORAGE                     -> not local (vLLM never
//	    infers locality, and its file-system and object tiers are shared
//	    stores as often as a local disk: llm-d's FS connector is shared)
//	absent: the external tier (EXTERNAL, NETWORK,
//	    REMOTE, SHARED: SGLang's L4 "shared / remote pool")  -> not local
//	absent: anything else                        -> local
//
// A medium the operator maps with RekeyConfig.Media is taken as local
// unless its locality says otherwise.
func Local(medium, locality Opt[string]) bool {
	if locality.Valid {
		return strings.EqualFold(locality.V, "LOCAL")
	}
	if !medium.Valid {
		return true
	}
	m := medium.V
	switch strings.ToUpper(m) {
	case "FS", "OBJ", "STORAGE":
		return false
	}
	t, ok := TierOf(medium)
	return !ok || t != index.TierExternal
}
