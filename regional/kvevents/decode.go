package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// DecoderConfig bounds what one message may make a Decoder hold. Every limit
// is checked before the memory is taken, so a hostile message costs at most
// O(MaxMessageBytes) memory and time.
type DecoderConfig struct {
	// MaxMessageBytes is the largest message accepted, in bytes. Default 16 MiB
	// (Kafka's default message limit is 1 MiB; a vLLM step with a 128k-token
	// prefill is about 0.5 MiB).
	MaxMessageBytes int
	// MaxEvents is the most events one batch may hold. Default 65536.
	MaxEvents int
	// MaxBlocksPerEvent caps block_hashes and extra_keys of one event.
	// Default 65536 (1M tokens at 16 tokens per block).
	MaxBlocksPerEvent int
	// MaxTokensPerEvent caps token_ids of one event. Default 4194304.
	MaxTokensPerEvent int
	// MaxStringBytes caps any string field (tag, medium, LoRA name, pod name,
	// endpoint...). Default 4096.
	MaxStringBytes int
	// MaxHashBytes caps a block hash sent as bytes. Default 64 (vLLM sends 32
	// for SHA-256, 16 for XXH3-128).
	MaxHashBytes int
	// MaxDepth caps the nesting of values the decoder skips or keeps raw
	// (unknown fields, extra_keys). Default 32.
	MaxDepth int
}

// DefaultDecoderConfig returns the defaults documented on DecoderConfig.
func DefaultDecoderConfig() DecoderConfig {
	return DecoderConfig{
		MaxMessageBytes:   16 << 20,
		MaxEvents:         1 << 16,
		MaxBlocksPerEvent: 1 << 16,
		MaxTokensPerEvent: 1 << 22,
		MaxStringBytes:    4096,
		MaxHashBytes:      64,
		MaxDepth:          32,
	}
}

// ErrInvalidConfig is wrapped by every Validate error of this package.
var ErrInvalidConfig = errors.New("invalid kvevents config")

// Validate names the first field that is out of range.
func (c DecoderConfig) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"MaxMessageBytes", c.MaxMessageBytes}, {"MaxEvents", c.MaxEvents},
		{"MaxBlocksPerEvent", c.MaxBlocksPerEvent}, {"MaxTokensPerEvent", c.MaxTokensPerEvent},
		{"MaxStringBytes", c.MaxStringBytes}, {"MaxHashBytes", c.MaxHashBytes}, {"MaxDepth", c.MaxDepth},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%w: DecoderConfig.%s = %d, want > 0", ErrInvalidConfig, f.name, f.v)
		}
	}
	if c.MaxMessageBytes > 1<<30 {
		return fmt.Errorf("%w: DecoderConfig.MaxMessageBytes = %d, want <= 1 GiB", ErrInvalidConfig, c.MaxMessageBytes)
	}
	return nil
}

// Decoder decodes vLLM KVEventBatch messages. It reuses its buffers: the
// *Batch and everything it points to stay valid only until the next call. A
// Decoder is not safe for concurrent use; use one per goroutine. It retains
// buffers sized to the largest message it has decoded (bounded by its
// config).
type Decoder struct {
	cfg DecoderConfig
	r   reader

	batch   Batch
	events  []Event
	skipped []Skipped
	stored  []BlockStored
	removed []BlockRemoved
	podUp   []PodUp
	podDown []PodDown
	hashes  []uint64
	tokens  []uint32
	raws    []Raw
	rawBuf  []byte
	strToks []StringToken
	intern  map[string]string
	// curTag is the tag of the event being decoded (nil until read), for
	// Skipped.
	curTag []byte
}

// maxInterned bounds the decoder's string table (medium, kind, LoRA and pod
// names repeat; anything past the bound is allocated per use).
const (
	maxInterned    = 4096
	maxInternedLen = 128
)

// NewDecoder returns a Decoder with cfg, which must be valid.
func NewDecoder(cfg DecoderConfig) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Decoder{cfg: cfg, intern: make(map[string]string)}, nil
}

// Config returns the decoder's limits.
func (d *Decoder) Config() DecoderConfig { return d.cfg }

// Decode decodes msg, which must hold exactly one batch.
func (d *Decoder) Decode(msg []byte) (*Batch, error) {
	if len(msg) > d.cfg.MaxMessageBytes {
		return nil, &DecodeError{Offset: 0, Reason: ReasonTooLarge,
			Detail: fmt.Sprintf("message of %d bytes, limit %d", len(msg), d.cfg.MaxMessageBytes)}
	}
	b, n, err := d.DecodePrefix(msg)
	if err != nil {
		return nil, err
	}
	if n != len(msg) {
		return nil, &DecodeError{Offset: n, Reason: ReasonTrailingBytes,
			Detail: fmt.Sprintf("%d bytes follow the batch", len(msg)-n)}
	}
	return b, nil
}

// DecodePrefix decodes the batch at the start of p and returns it with the
// number of bytes it took; p may hold more (a file of concatenated batches).
// The batch may take at most MaxMessageBytes.
func (d *Decoder) DecodePrefix(p []byte) (*Batch, int, error) {
	d.reset()
	d.r = reader{b: p}
	if len(p) > d.cfg.MaxMessageBytes {
		d.r = reader{b: p[:d.cfg.MaxMessageBytes], limited: true}
	}
	if err := d.envelope(); err != nil {
		return nil, 0, err
	}
	d.batch.Events = d.events
	d.batch.Skipped = d.skipped
	return &d.batch, d.r.i, nil
}

func (d *Decoder) reset() {
	clear(d.events) // drop references into the previous batch's buffers
	d.batch = Batch{}
	d.events = d.events[:0]
	d.skipped = d.skipped[:0]
	d.stored = d.stored[:0]
	d.removed = d.removed[:0]
	d.podUp = d.podUp[:0]
	d.podDown = d.podDown[:0]
	d.hashes = d.hashes[:0]
	d.tokens = d.tokens[:0]
	d.raws = d.raws[:0]
	d.rawBuf = d.rawBuf[:0]
	clear(d.strToks)
	d.strToks = d.strToks[:0]
}

func (d *Decoder) envelope() error {
	r := &d.r
	start := r.i
	isMap, n, err := r.container("batch")
	if err != nil {
		if ReasonOf(err) == ReasonBadFieldType {
			return r.fail(start, ReasonBadEnvelope, "batch: want array [ts, events, data_parallel_rank] or map, found %s", typeName(r.b[start]))
		}
		return err
	}
	if isMap {
		return d.envelopeMap(start, n)
	}
	if n < 2 {
		return r.fail(start, ReasonBadEnvelope, "batch array has %d elements, want at least 2 (ts, events)", n)
	}
	if d.batch.TS, err = d.ts(); err != nil {
		return err
	}
	if err := d.eventList(); err != nil {
		return err
	}
	if n >= 3 {
		if d.batch.DataParallelRank, err = d.rank(); err != nil {
			return err
		}
	}
	return d.skipValues(n - 3)
}

func (d *Decoder) envelopeMap(start, n int) error {
	r := &d.r
	sawEvents := false
	for k := 0; k < n; k++ {
		keyOff := r.i
		key, _, err := r.bytes("batch key", d.cfg.MaxStringBytes)
		if err != nil {
			if ReasonOf(err) == ReasonBadFieldType {
				return r.fail(keyOff, ReasonBadEnvelope, "batch map key is not a string")
			}
			return err
		}
		switch string(key) {
		case "ts":
			if d.batch.TS, err = d.ts(); err != nil {
				return err
			}
		case "events":
			if sawEvents {
				return r.fail(keyOff, ReasonBadEnvelope, "batch map has two events keys")
			}
			sawEvents = true
			if err := d.eventList(); err != nil {
				return err
			}
		case "data_parallel_rank", "attn_dp_rank":
			if d.batch.DataParallelRank, err = d.rank(); err != nil {
				return err
			}
		default:
			if err := r.skip(d.cfg.MaxDepth); err != nil {
				return err
			}
		}
	}
	if !sawEvents {
		return r.fail(start, ReasonBadEnvelope, "batch map has no events key")
	}
	return nil
}

func (d *Decoder) ts() (float64, error) {
	off := d.r.i
	v, err := d.r.number("ts")
	if ReasonOf(err) == ReasonBadFieldType {
		return 0, d.r.fail(off, ReasonBadEnvelope, "ts: %s", err.(*DecodeError).Detail)
	}
	return v, err
}

func (d *Decoder) rank() (Opt[int64], error) {
	if d.r.nextNil() {
		return Opt[int64]{}, nil
	}
	off := d.r.i
	v, err := d.r.int64("data_parallel_rank")
	if ReasonOf(err) == ReasonBadFieldType {
		return Opt[int64]{}, d.r.fail(off, ReasonBadEnvelope, "data_parallel_rank: %s", err.(*DecodeError).Detail)
	}
	return Some(v), err
}

func (d *Decoder) eventList() error {
	r := &d.r
	start := r.i
	isMap, n, err := r.container("events")
	if err != nil || isMap {
		if err == nil || ReasonOf(err) == ReasonBadFieldType {
			return r.fail(start, ReasonBadEnvelope, "events: want array, found %s", typeName(r.b[start]))
		}
		return err
	}
	if n > d.cfg.MaxEvents {
		return r.fail(start, ReasonTooLarge, "events: %d events, limit %d", n, d.cfg.MaxEvents)
	}
	for k := 0; k < n; k++ {
		evStart := r.i
		err := d.event(k)
		if err == nil {
			continue
		}
		// Per-event isolation: an event whose extent is still well-formed
		// msgpack is skipped and listed; one whose end cannot be found
		// fails the batch (nothing after it can be framed).
		switch ReasonOf(err) {
		case ReasonTruncated, ReasonBadMsgpack, ReasonTooDeep:
			return err // the end of the event cannot be found
		}
		r.i = evStart
		if serr := r.skip(d.cfg.MaxDepth); serr != nil {
			return serr
		}
		d.skipBad(k, evStart, err)
	}
	return nil
}

// skipBad lists event idx, at off, as malformed with err's reason.
func (d *Decoder) skipBad(idx, off int, err error) {
	s := Skipped{Index: idx, Offset: off, Tag: d.tagString(), Reason: ReasonOf(err), ErrOffset: off}
	if de, ok := err.(*DecodeError); ok {
		s.Detail, s.ErrOffset = de.Detail, de.Offset
	}
	if s.Reason == "" {
		s.Reason, s.Detail = ReasonBadEvent, err.Error()
	}
	d.skipped = append(d.skipped, s)
}

// tagString is the current event's tag for Skipped (at most 64 bytes).
func (d *Decoder) tagString() string {
	tag := d.curTag
	if len(tag) > 64 {
		tag = tag[:64]
	}
	return d.str(tag)
}

func (d *Decoder) event(idx int) error {
	r := &d.r
	d.curTag = nil
	start := r.i
	isMap, n, err := r.container("event")
	if err != nil {
		if ReasonOf(err) == ReasonBadFieldType {
			return r.fail(start, ReasonBadEvent, "event %d: want array [tag, fields...] or map with \"type\", found %s", idx, typeName(r.b[start]))
		}
		return err
	}
	if isMap {
		return d.eventMap(idx, start, n)
	}
	if n == 0 {
		return r.fail(start, ReasonBadEvent, "event %d: empty array, want [tag, fields...]", idx)
	}
	tagOff := r.i
	tag, err := d.tag(idx)
	if err != nil {
		return err
	}
	d.curTag = tag
	kind := kindOfTag(tag)
	if kind == 0 {
		d.skipUnknown(idx, start)
		return d.skipValues(n - 1)
	}
	f := fieldsOf(kind)
	var u union
	for _, fi := range f[:min(n-1, len(f))] {
		if err := d.field(&u, fi); err != nil {
			return err
		}
	}
	if err := d.skipValues(n - 1 - len(f)); err != nil {
		return err
	}
	return d.emit(kind, &u, tagOff)
}

func (d *Decoder) tag(idx int) ([]byte, error) {
	off := d.r.i
	tag, _, err := d.r.bytes("event tag", d.cfg.MaxStringBytes)
	if ReasonOf(err) == ReasonBadFieldType {
		return nil, d.r.fail(off, ReasonBadEvent, "event %d: tag is not a string", idx)
	}
	return tag, err
}

// skipValues skips the next n values (none when n <= 0).
func (d *Decoder) skipValues(n int) (err error) {
	for ; n > 0 && err == nil; n-- {
		err = d.r.skip(d.cfg.MaxDepth)
	}
	return err
}

// eventKeyError is the error of reading a map key of event idx: a key that
// is not a string makes the event bad. Called only on failure, it leaves the
// key reads of eventMap's two passes inline.
func eventKeyError(err error, idx int) error {
	if ReasonOf(err) == ReasonBadFieldType {
		de := err.(*DecodeError)
		return &DecodeError{Offset: de.Offset, Reason: ReasonBadEvent, Detail: fmt.Sprintf("event %d: map key is not a string", idx)}
	}
	return err
}

func (d *Decoder) skipUnknown(idx, off int) {
	d.skipped = append(d.skipped, Skipped{Index: idx, Offset: off, Tag: d.tagString(), Reason: ReasonUnknownEvent, ErrOffset: off})
}

func (d *Decoder) eventMap(idx, start, n int) error {
	r := &d.r
	// Find "type" first: key order is not part of the contract. It is
	// usually the first key (msgspec writes the tag first), which saves a scan.
	var tag []byte
	found := false
	scan := r.i
	for k := 0; k < n && !found; k++ {
		key, _, err := r.bytes("event key", d.cfg.MaxStringBytes)
		if err != nil {
			return eventKeyError(err, idx)
		}
		if string(key) == "type" {
			if tag, err = d.tag(idx); err != nil {
				return err
			}
			d.curTag = tag
			found = true
			if k == 0 {
				scan = r.i // fields follow the tag: no second pass over it
				n--
			}
			break
		}
		if err := r.skip(d.cfg.MaxDepth); err != nil {
			return err
		}
	}
	if !found {
		return r.fail(start, ReasonBadEvent, "event %d: map has no \"type\" key", idx)
	}
	kind := kindOfTag(tag)
	r.i = scan
	var u union
	for k := 0; k < n; k++ {
		key, _, err := r.bytes("event key", d.cfg.MaxStringBytes)
		if err != nil {
			return eventKeyError(err, idx)
		}
		fi := fieldNone
		if kind != 0 {
			fi = fieldByName(kind, key)
		}
		if fi == fieldNone {
			if err := r.skip(d.cfg.MaxDepth); err != nil {
				return err
			}
			continue
		}
		if err := d.field(&u, fi); err != nil {
			return err
		}
	}
	if kind == 0 {
		d.skipUnknown(idx, start)
		return nil
	}
	return d.emit(kind, &u, start)
}

// maxTTLMs bounds a PodUp's ttl_ms (a year): beyond it the value is
// nonsense, and its Duration would overflow.
const maxTTLMs = 365 * 24 * 3600 * 1000

// field ids, shared by every event kind.
type fieldID uint8

const (
	fieldNone fieldID = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fPod
	fEndpoint
	fModel
	fHardware
	fRegion
	fEpoch
	fReason
	fLocality
	fMMKeys
	fCacheSalt
	fMetadata
	fEngine
	fKVBlocks
	fTTL
	numFields
)

// The positional field orders. BlockStored's first 11 are vLLM's
// declaration order; position 7 (lora_name) may hold SGLang's {cache_salt}
// metadata map instead. locality and mm_keys follow in TensorRT-LLM's
// order (no engine writes them positionally: they came after vLLM's map
// events; Meridian's encoder does, so every field has a position). PodUp's
// engine and kv_blocks came after its first six.
var (
	storedFields  = []fieldID{fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow, fLocality, fMMKeys}
	removedFields = []fieldID{fBlockHashes, fMedium, fGroupIdx, fLocality}
	podUpFields   = []fieldID{fPod, fEndpoint, fModel, fHardware, fRegion, fEpoch, fEngine, fKVBlocks, fTTL}
	podDownFields = []fieldID{fPod, fEpoch, fReason}
)

// namedFields is, per kind, the set (bit f) of fields a map event may name:
// the positional ones, and for BlockStored SGLang's top-level cache_salt and
// a metadata map as a map-encoded BlockStoredWithMetadata would name it.
var namedFields = func() (m [KindPodDown + 1]uint64) {
	for k := KindBlockStored; k <= KindPodDown; k++ {
		for _, f := range fieldsOf(k) {
			m[k] |= 1 << f
		}
	}
	m[KindBlockStored] |= 1<<fCacheSalt | 1<<fMetadata
	return m
}()

// fieldsOf is the positional field order of kind.
func fieldsOf(k Kind) []fieldID {
	switch k {
	case KindBlockStored:
		return storedFields
	case KindBlockRemoved:
		return removedFields
	case KindPodUp:
		return podUpFields
	case KindPodDown:
		return podDownFields
	}
	return nil
}

var fieldNames = [...]string{
	fBlockHashes: "block_hashes", fParent: "parent_block_hash", fTokenIDs: "token_ids",
	fBlockSize: "block_size", fLoRAID: "lora_id", fMedium: "medium", fLoRAName: "lora_name",
	fExtraKeys: "extra_keys", fGroupIdx: "group_idx", fSpecKind: "kv_cache_spec_kind",
	fSlidingWindow: "kv_cache_spec_sliding_window", fPod: "pod", fEndpoint: "endpoint",
	fModel: "model", fHardware: "hardware", fRegion: "region", fEpoch: "epoch", fReason: "reason",
	fLocality: "locality", fMMKeys: "mm_keys", fCacheSalt: "cache_salt", fMetadata: "metadata",
	fEngine: "engine", fKVBlocks: "kv_blocks", fTTL: "ttl_ms",
}

// fieldIDs maps a field name to its id.
var fieldIDs = func() map[string]fieldID {
	m := make(map[string]fieldID, len(fieldNames))
	for f, name := range fieldNames {
		if name != "" {
			m[name] = fieldID(f)
		}
	}
	return m
}()

// fieldByName returns the field of kind called name; fieldNone for a field the
// kind does not have (ignored, as vLLM's decoders ignore unknown fields, e.g.
// session_id and ownership).
func fieldByName(kind Kind, name []byte) fieldID {
	f, ok := fieldIDs[string(name)]
	if !ok || namedFields[kind]&(1<<f) == 0 {
		return fieldNone
	}
	return f
}

// union holds the fields of any event kind while it is decoded.
type union struct {
	hashes    []uint64
	parent    Opt[uint64]
	tokens    []uint32
	blockSize int64
	loraID    Opt[int64]
	medium    Opt[string]
	loraName  Opt[string]
	extra     []Raw
	group     Opt[int64]
	specKind  Opt[string]
	window    Opt[int64]
	pod       string
	endpoint  string
	model     string
	hardware  string
	region    string
	epoch     uint64
	reason    string
	locality  Opt[string]
	mmKeys    []Raw
	salt      Opt[string]
	strToks   []StringToken
	pairs     bool
	pairNext  uint32
	engine    string
	kvBlocks  uint64
	ttlMs     uint64
}

func (d *Decoder) field(u *union, f fieldID) error {
	r := &d.r
	name := fieldNames[f]
	var err error
	switch f {
	case fBlockHashes:
		u.hashes, err = d.hashList(name)
	case fParent:
		if !r.nextNil() {
			var h uint64
			h, err = d.hash(name)
			u.parent = Some(h)
		}
	case fTokenIDs:
		err = d.tokenList(u)
	case fBlockSize:
		if !r.nextNil() {
			u.blockSize, err = r.int64(name)
		}
	case fLoRAID:
		u.loraID, err = d.optInt(name)
	case fMedium:
		u.medium, err = d.optStr(name)
	case fLoRAName:
		if d.nextIsMap() {
			err = d.metadata(u)
		} else if u.loraName, err = d.optStr(name); ReasonOf(err) == ReasonBadFieldType {
			err = r.fail(err.(*DecodeError).Offset, ReasonBadFieldType, "lora_name: want string, nil or SGLang's metadata map, found %s",
				typeName(r.b[err.(*DecodeError).Offset]))
		}
	case fMetadata:
		err = d.metadata(u)
	case fCacheSalt:
		u.salt, err = d.optStr(name)
	case fLocality:
		u.locality, err = d.optStr(name)
	case fMMKeys:
		u.mmKeys, err = d.rawList(name)
	case fEngine:
		u.engine, err = d.reqStr(name)
	case fKVBlocks:
		u.kvBlocks, err = d.uint(name)
	case fExtraKeys:
		u.extra, err = d.rawList(name)
	case fGroupIdx:
		u.group, err = d.optInt(name)
	case fSpecKind:
		u.specKind, err = d.optStr(name)
	case fSlidingWindow:
		u.window, err = d.optInt(name)
	case fPod:
		u.pod, err = d.reqStr(name)
	case fEndpoint:
		u.endpoint, err = d.reqStr(name)
	case fModel:
		u.model, err = d.reqStr(name)
	case fHardware:
		u.hardware, err = d.reqStr(name)
	case fRegion:
		u.region, err = d.reqStr(name)
	case fReason:
		u.reason, err = d.reqStr(name)
	case fTTL:
		if !r.nextNil() {
			off := r.i
			var v uint64
			var signed bool
			v, signed, err = r.intBits(name)
			if err == nil && (signed && int64(v) < 0 || v > maxTTLMs) {
				err = r.fail(off, ReasonBadFieldType, "ttl_ms: %d out of range", int64(v))
			}
			u.ttlMs = v
		}
	case fEpoch:
		u.epoch, err = d.uint(name)
	default:
		err = r.skip(d.cfg.MaxDepth)
	}
	return err
}

func (d *Decoder) emit(kind Kind, u *union, off int) error {
	switch kind {
	case KindBlockStored:
		if len(u.tokens) > 0 {
			if u.blockSize <= 0 || u.blockSize > maxBlockSize {
				return d.r.fail(off, ReasonBadBlockSize, "BlockStored: block_size %d with %d token ids, want 1..%d", u.blockSize, len(u.tokens), maxBlockSize)
			}
			if int64(len(u.tokens)) != int64(len(u.hashes))*u.blockSize {
				return d.r.fail(off, ReasonBadTokenCount, "BlockStored: %d token ids for %d blocks of %d", len(u.tokens), len(u.hashes), u.blockSize)
			}
		}
		if u.mmKeys != nil && len(u.mmKeys) != len(u.hashes) {
			return d.r.fail(off, ReasonBadTokenCount, "BlockStored: mm_keys has %d entries for %d blocks", len(u.mmKeys), len(u.hashes))
		}
		d.stored = append(d.stored, BlockStored{
			BlockHashes: u.hashes, ParentBlockHash: u.parent, TokenIDs: u.tokens, BlockSize: u.blockSize,
			LoRAID: u.loraID, Medium: u.medium, LoRAName: u.loraName, ExtraKeys: u.extra,
			GroupIdx: u.group, KVCacheSpecKind: u.specKind, KVCacheSpecSlidingWindow: u.window,
			Locality: u.locality, CacheSalt: u.salt, MMKeys: u.mmKeys, StringTokens: u.strToks,
			Pairs: u.pairs, PairNext: u.pairNext,
		})
		d.events = append(d.events, &d.stored[len(d.stored)-1])
	case KindBlockRemoved:
		d.removed = append(d.removed, BlockRemoved{BlockHashes: u.hashes, Medium: u.medium, GroupIdx: u.group, Locality: u.locality})
		d.events = append(d.events, &d.removed[len(d.removed)-1])
	case KindAllBlocksCleared:
		d.events = append(d.events, &AllBlocksCleared{})
	case KindPodUp:
		if u.pod == "" {
			return d.r.fail(off, ReasonMissingField, "PodUp without a pod name")
		}
		d.podUp = append(d.podUp, PodUp{Pod: u.pod, Endpoint: u.endpoint, Model: u.model,
			Hardware: u.hardware, Region: u.region, Epoch: u.epoch, Engine: u.engine, KVBlocks: u.kvBlocks,
			TTL: time.Duration(u.ttlMs) * time.Millisecond})
		d.events = append(d.events, &d.podUp[len(d.podUp)-1])
	case KindPodDown:
		if u.pod == "" {
			return d.r.fail(off, ReasonMissingField, "PodDown without a pod name")
		}
		d.podDown = append(d.podDown, PodDown{Pod: u.pod, Epoch: u.epoch, Reason: u.reason})
		d.events = append(d.events, &d.podDown[len(d.podDown)-1])
	}
	return nil
}

// hash reads one block hash: u64, i64 (same bits) or bytes (the last 8 bytes
// big-endian, left-padded with zeros when shorter), as llm-d's
// getHashAsUint64 does.
func (d *Decoder) hash(what string) (uint64, error) {
	r := &d.r
	if r.i < len(r.b) {
		c := r.b[r.i]
		if c <= 0x7f {
			r.i++
			return uint64(c), nil
		}
		if c == mpUint64 && len(r.b)-r.i >= 9 {
			r.i++
			return r.u64(), nil
		}
	}
	start := r.i
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case mpBin8, mpBin16, mpBin32, mpStr8, mpStr16, mpStr32:
	default:
		if c >= 0xa0 && c <= 0xbf {
			break
		}
		v, _, err := r.intBits(what)
		if ReasonOf(err) == ReasonBadFieldType {
			return 0, r.fail(start, ReasonBadHash, "%s: want integer or bytes, found %s", what, typeName(c))
		}
		return v, err
	}
	p, isStr, err := r.bytes(what, d.cfg.MaxHashBytes)
	if err != nil {
		if ReasonOf(err) == ReasonTooLarge {
			return 0, r.fail(start, ReasonBadHash, "%s: %s", what, err.(*DecodeError).Detail)
		}
		return 0, err
	}
	if isStr {
		return 0, r.fail(start, ReasonBadHash, "%s: want integer or bytes, found string", what)
	}
	var v uint64
	if len(p) > 8 {
		p = p[len(p)-8:]
	}
	for _, b := range p {
		v = v<<8 | uint64(b)
	}
	return v, nil
}

// list reads the header of a list field, which may be nil (absent): its
// length, at most limit (of unit, for the error), and whether it is present.
func (d *Decoder) list(what, unit string, limit int) (n int, present bool, err error) {
	r := &d.r
	if r.nextNil() {
		return 0, false, nil
	}
	start := r.i
	if n, err = r.array(what); err != nil {
		return 0, false, err
	}
	if n > limit {
		return 0, false, r.fail(start, ReasonTooLarge, "%s: %d %s, limit %d", what, n, unit, limit)
	}
	return n, true, nil
}

func (d *Decoder) hashList(what string) ([]uint64, error) {
	n, _, err := d.list(what, "hashes", d.cfg.MaxBlocksPerEvent)
	if n == 0 || err != nil {
		return nil, err
	}
	s := len(d.hashes)
	for k := 0; k < n; k++ {
		h, err := d.hash(what)
		if err != nil {
			return nil, err
		}
		d.hashes = append(d.hashes, h)
	}
	return d.hashes[s:len(d.hashes):len(d.hashes)], nil
}

// tokenList reads token_ids into u: integers (the fast path), and the two
// other forms engines send: strings (TensorRT-LLM) and [token, next] pairs
// (SGLang's bigram keys).
func (d *Decoder) tokenList(u *union) error {
	// A map event that repeats token_ids keeps the last list, as it keeps
	// the last of any field, and that list's strings and pairs: none of
	// an earlier list's may describe positions of this one.
	u.tokens, u.strToks, u.pairs, u.pairNext = nil, nil, false, 0
	n, _, err := d.list("token_ids", "tokens", d.cfg.MaxTokensPerEvent)
	if n == 0 || err != nil {
		return err
	}
	r := &d.r
	s := len(d.tokens)
	d.tokens = append(d.tokens, make([]uint32, n)...)
	out := d.tokens[s : s+n : s+n]
	strStart := len(d.strToks)
	pairs := 0
	b := r.b
	i := r.i
	for k := range out {
		// Fast path, without branches on the integer width (vLLM's token ids
		// mix fixint, uint8, uint16 and uint32 unpredictably): read 4 bytes
		// after the type byte and shift off what the type does not use.
		if len(b)-i >= 5 {
			c := b[i]
			if adv := tokenAdvance[c]; adv != 0 {
				v := binary.BigEndian.Uint32(b[i+1:])
				out[k] = v>>tokenShift[c] | tokenFix[c]
				i += int(adv)
				continue
			}
		}
		r.i = i
		off := i
		switch {
		case i < len(b) && typeName(b[i]) == "string":
			p, _, err := r.bytes("token id", d.cfg.MaxStringBytes)
			if err != nil {
				return err
			}
			d.strToks = append(d.strToks, StringToken{Pos: k, Value: string(p)})
		case i < len(b) && b[i] == 0x92: // fixarray(2): a [token, next] pair
			if pairs != k {
				return r.fail(off, ReasonBadTokenPairs, "token_ids: a pair at %d after plain token ids", k)
			}
			r.i++
			first, err := d.tokenID()
			if err != nil {
				return err
			}
			if k > 0 && first != u.pairNext {
				return r.fail(off, ReasonBadTokenPairs, "token_ids: pair %d starts with %d, the previous pair ended with %d", k, first, u.pairNext)
			}
			if u.pairNext, err = d.tokenID(); err != nil {
				return err
			}
			out[k] = first
			pairs++
		default:
			v, err := d.tokenID()
			if err != nil {
				return err
			}
			out[k] = v
		}
		i = r.i
	}
	r.i = i
	if pairs > 0 && pairs != n {
		return r.fail(r.i, ReasonBadTokenPairs, "token_ids: %d pairs among %d token ids", pairs, n)
	}
	u.tokens, u.pairs = out, pairs > 0
	if len(d.strToks) > strStart {
		u.strToks = d.strToks[strStart:len(d.strToks):len(d.strToks)]
	}
	return nil
}

// tokenID reads one integer token id, which must fit in uint32.
func (d *Decoder) tokenID() (uint32, error) {
	r := &d.r
	off := r.i
	v, signed, err := r.intBits("token id")
	if err != nil {
		return 0, err
	}
	if (signed && int64(v) < 0) || v > 0xffffffff {
		if signed {
			return 0, r.fail(off, ReasonBadFieldType, "token id %d out of range [0, 2^32)", int64(v))
		}
		return 0, r.fail(off, ReasonBadFieldType, "token id %d out of range [0, 2^32)", v)
	}
	return uint32(v), nil
}

// nextIsMap reports whether the next value is a map.
func (d *Decoder) nextIsMap() bool {
	r := &d.r
	if r.i >= len(r.b) {
		return false
	}
	c := r.b[r.i]
	return (c >= 0x80 && c <= 0x8f) || c == mpMap16 || c == mpMap32
}

// metadata reads SGLang's BlockStoredMetadata map ({cache_salt[, session_id]}):
// cache_salt goes to u.salt; other keys are ignored. Nil is absent.
func (d *Decoder) metadata(u *union) error {
	r := &d.r
	if r.nextNil() {
		return nil
	}
	start := r.i
	isMap, n, err := r.container("metadata")
	if err != nil {
		return err
	}
	if !isMap {
		return r.fail(start, ReasonBadFieldType, "metadata: want map, found array")
	}
	for k := 0; k < n; k++ {
		key, err := d.strBytes("metadata key")
		if err != nil {
			return err
		}
		if string(key) == "cache_salt" {
			if u.salt, err = d.optStr("cache_salt"); err != nil {
				return err
			}
			continue
		}
		if err := r.skip(d.cfg.MaxDepth); err != nil {
			return err
		}
	}
	return nil
}

// uint reads a non-negative integer (nil reads as 0).
func (d *Decoder) uint(what string) (uint64, error) {
	r := &d.r
	if r.nextNil() {
		return 0, nil
	}
	off := r.i
	v, signed, err := r.intBits(what)
	if err == nil && signed && int64(v) < 0 {
		return 0, r.fail(off, ReasonBadFieldType, "%s: negative %d", what, int64(v))
	}
	return v, err
}

// rawList reads a list field whose elements are kept as raw msgpack values
// (extra_keys, mm_keys): nil when absent.
func (d *Decoder) rawList(what string) ([]Raw, error) {
	n, present, err := d.list(what, "entries", d.cfg.MaxBlocksPerEvent)
	if !present || err != nil {
		return nil, err
	}
	if n == 0 {
		return emptyRaws, nil
	}
	r := &d.r
	s := len(d.raws)
	for k := 0; k < n; k++ {
		vs := r.i
		if err := r.skip(d.cfg.MaxDepth); err != nil {
			return nil, err
		}
		bs := len(d.rawBuf)
		d.rawBuf = append(d.rawBuf, r.b[vs:r.i]...)
		d.raws = append(d.raws, Raw(d.rawBuf[bs:len(d.rawBuf):len(d.rawBuf)]))
	}
	return d.raws[s:len(d.raws):len(d.raws)], nil
}

// emptyRaws is a present, empty extra_keys list (not nil, which means absent).
var emptyRaws = []Raw{}

func (d *Decoder) optInt(what string) (Opt[int64], error) {
	if d.r.nextNil() {
		return Opt[int64]{}, nil
	}
	v, err := d.r.int64(what)
	return Some(v), err
}

func (d *Decoder) optStr(what string) (Opt[string], error) {
	if d.r.nextNil() {
		return Opt[string]{}, nil
	}
	p, err := d.strBytes(what)
	if err != nil {
		return Opt[string]{}, err
	}
	return Some(d.str(p)), nil
}

// reqStr reads a string field that has no absent state: nil reads as "".
func (d *Decoder) reqStr(what string) (string, error) {
	s, err := d.optStr(what)
	return s.V, err
}

func (d *Decoder) strBytes(what string) ([]byte, error) {
	off := d.r.i
	p, isStr, err := d.r.bytes(what, d.cfg.MaxStringBytes)
	if err == nil && !isStr {
		return nil, d.r.fail(off, ReasonBadFieldType, "%s: want string, found bytes", what)
	}
	return p, err
}

// str returns p as a string, interned when short so that repeated values
// (medium, kind, LoRA and pod names) do not allocate.
func (d *Decoder) str(p []byte) string {
	if len(p) == 0 {
		return ""
	}
	if len(p) > maxInternedLen {
		return string(p)
	}
	if s, ok := d.intern[string(p)]; ok {
		return s
	}
	s := string(p)
	if len(d.intern) < maxInterned {
		d.intern[s] = s
	}
	return s
}

// Lookup tables of the token fast path, by type byte: bytes taken (0: not a
// non-negative integer of at most 32 bits), right shift of the 4 bytes after
// the type byte, and the value of a positive fixint.
var tokenAdvance, tokenShift, tokenFix = func() (adv, shift [256]uint8, fix [256]uint32) {
	for c := 0; c <= 0x7f; c++ {
		adv[c], shift[c], fix[c] = 1, 32, uint32(c)
	}
	adv[mpUint8], shift[mpUint8] = 2, 24
	adv[mpUint16], shift[mpUint16] = 3, 16
	adv[mpUint32], shift[mpUint32] = 5, 0
	return
}()
