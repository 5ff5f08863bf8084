package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// errLoRAAndSalt: an array event cannot hold both a LoRA name and SGLang's
// cache_salt, which share position 7 (no engine sends both).
var errLoRAAndSalt = errors.New("BlockStored: lora_name and cache_salt share one position in array events")

// EventStyle is how events are laid out on the wire.
type EventStyle uint8

const (
	// EventsArray is vLLM before PR 42892: [tag, field1, field2, ...], with
	// trailing fields that have a default (extra_keys and later; BlockRemoved's
	// group_idx) omitted while they are absent.
	EventsArray EventStyle = iota
	// EventsMap is vLLM since PR 42892: {"type": tag, field: value, ...},
	// fields that have a default omitted while they are absent.
	EventsMap
)

// EnvelopeStyle is how the batch itself is laid out.
type EnvelopeStyle uint8

const (
	// EnvelopeArray is [ts, events, data_parallel_rank], what every vLLM
	// release writes; the rank is omitted when absent.
	EnvelopeArray EnvelopeStyle = iota
	// EnvelopeMap is {"ts", "events", "data_parallel_rank"}, seen in one
	// vLLM main snapshot.
	EnvelopeMap
)

// HashStyle is how block hashes are written.
type HashStyle uint8

const (
	// HashUint writes the hash as an unsigned integer (vLLM's default,
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
	HashUint HashStyle = iota
	// HashInt writes the same 64 bits as a signed integer (older builds that
	// used Python's builtin hash).
	HashInt
	// HashBytes writes the 8 bytes big-endian as msgpack bin
	// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 with a 64-bit hash).
	HashBytes
)

// Encoding chooses the wire layout. The zero Encoding is what vLLM before PR
// 42892 writes: array envelope, array events, unsigned hashes.
type Encoding struct {
	Events   EventStyle
	Envelope EnvelopeStyle
	Hashes   HashStyle
}

// AppendBatch appends b encoded as one msgpack message to dst. Integers take
// their shortest msgpack form and ts is always a float64, as msgspec writes
// them; ExtraKeys values are written as they are (an empty Raw as nil). It
// fails only on an event of a type it does not know (or nil).
func (e Encoding) AppendBatch(dst []byte, b *Batch) ([]byte, error) {
	n := 2
	if b.DataParallelRank.Valid {
		n = 3
	}
	if e.Envelope == EnvelopeMap {
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "ts")
	} else {
		dst = appendArrayHeader(dst, n)
	}
	dst = appendFloat64(dst, b.TS)
	if e.Envelope == EnvelopeMap {
		dst = appendStr(dst, "events")
	}
	dst = appendArrayHeader(dst, len(b.Events))
	for i, ev := range b.Events {
		var err error
		if dst, err = e.appendEvent(dst, ev); err != nil {
			return dst, fmt.Errorf("encode kv event batch: event %d: %w", i, err)
		}
	}
	if b.DataParallelRank.Valid {
		if e.Envelope == EnvelopeMap {
			dst = appendStr(dst, "data_parallel_rank")
		}
		dst = appendInt(dst, b.DataParallelRank.V)
	}
	return dst, nil
}

// fieldWriter writes one event's fields in either style.
type fieldWriter struct {
	dst   []byte
	isMap bool
}

func (w *fieldWriter) key(f fieldID) {
	if w.isMap {
		w.dst = appendStr(w.dst, fieldNames[f])
	}
}

func (e Encoding) appendEvent(dst []byte, ev Event) ([]byte, error) {
	w := fieldWriter{dst: dst, isMap: e.Events == EventsMap}
	header := func(tag string, n int) {
		if w.isMap {
			w.dst = appendMapHeader(w.dst, n+1)
			w.dst = appendStr(w.dst, "type")
		} else {
			w.dst = appendArrayHeader(w.dst, n+1)
		}
		w.dst = appendStr(w.dst, tag)
	}
	switch ev := ev.(type) {
	case *BlockStored:
		present := [6]bool{ev.ExtraKeys != nil, ev.GroupIdx.Valid, ev.KVCacheSpecKind.Valid, ev.KVCacheSpecSlidingWindow.Valid,
			ev.Locality.Valid, ev.MMKeys != nil}
		n := 7 + countTrailing(present[:], w.isMap)
		if ev.CacheSalt.Valid && w.isMap {
			n++
		}
		if ev.CacheSalt.Valid && !w.isMap && ev.LoRAName.Valid {
			return w.dst, errLoRAAndSalt
		}
		header(TagBlockStored, n)
		w.key(fBlockHashes)
		w.dst = e.appendHashes(w.dst, ev.BlockHashes)
		w.key(fParent)
		if ev.ParentBlockHash.Valid {
			w.dst = e.appendHash(w.dst, ev.ParentBlockHash.V)
		} else {
			w.dst = append(w.dst, mpNil)
		}
		w.key(fTokenIDs)
		w.dst = appendTokens(w.dst, ev)
		w.key(fBlockSize)
		w.dst = appendInt(w.dst, ev.BlockSize)
		w.key(fLoRAID)
		w.dst = appendOpt(w.dst, ev.LoRAID, appendInt)
		w.key(fMedium)
		w.dst = appendOpt(w.dst, ev.Medium, appendStr)
		w.key(fLoRAName)
		if ev.CacheSalt.Valid && !w.isMap {
			// SGLang's BlockStoredWithMetadata: {cache_salt} at lora_name's place.
			w.dst = appendStr(appendMapHeader(w.dst, 1), "cache_salt")
			w.dst = appendStr(w.dst, ev.CacheSalt.V)
		} else {
			w.dst = appendOpt(w.dst, ev.LoRAName, appendStr)
		}
		w.rawList(fExtraKeys, ev.ExtraKeys, n > 7)
		optField(&w, fGroupIdx, ev.GroupIdx, n > 8, appendInt)
		optField(&w, fSpecKind, ev.KVCacheSpecKind, n > 9, appendStr)
		optField(&w, fSlidingWindow, ev.KVCacheSpecSlidingWindow, n > 10, appendInt)
		optField(&w, fLocality, ev.Locality, n > 11, appendStr)
		w.rawList(fMMKeys, ev.MMKeys, n > 12)
		if ev.CacheSalt.Valid && w.isMap {
			w.key(fCacheSalt)
			w.dst = appendStr(w.dst, ev.CacheSalt.V)
		}
	case *BlockRemoved:
		n := 2 + countTrailing([]bool{ev.GroupIdx.Valid, ev.Locality.Valid}, w.isMap)
		header(TagBlockRemoved, n)
		w.key(fBlockHashes)
		w.dst = e.appendHashes(w.dst, ev.BlockHashes)
		w.key(fMedium)
		w.dst = appendOpt(w.dst, ev.Medium, appendStr)
		optField(&w, fGroupIdx, ev.GroupIdx, n > 2, appendInt)
		optField(&w, fLocality, ev.Locality, n > 3, appendStr)
	case *AllBlocksCleared:
		header(TagAllBlocksCleared, 0)
	case *PodUp:
		n := 6 + countTrailing([]bool{ev.Engine != "", ev.KVBlocks != 0, ev.TTL > 0}, w.isMap)
		header(TagPodUp, n)
		for _, f := range []struct {
			id fieldID
			v  string
		}{{fPod, ev.Pod}, {fEndpoint, ev.Endpoint}, {fModel, ev.Model}, {fHardware, ev.Hardware}, {fRegion, ev.Region}} {
			w.key(f.id)
			w.dst = appendStr(w.dst, f.v)
		}
		w.key(fEpoch)
		w.dst = appendUint(w.dst, ev.Epoch)
		if (w.isMap && ev.Engine != "") || (!w.isMap && n > 6) {
			w.key(fEngine)
			w.dst = appendStr(w.dst, ev.Engine)
		}
		if (w.isMap && ev.KVBlocks != 0) || (!w.isMap && n > 7) {
			w.key(fKVBlocks)
			w.dst = appendUint(w.dst, ev.KVBlocks)
		}
		if (w.isMap && ev.TTL > 0) || (!w.isMap && n > 8) {
			w.key(fTTL)
			w.dst = appendUint(w.dst, uint64(max(ev.TTL.Milliseconds(), 1)))
		}
	case *PodDown:
		header(TagPodDown, 3)
		w.key(fPod)
		w.dst = appendStr(w.dst, ev.Pod)
		w.key(fEpoch)
		w.dst = appendUint(w.dst, ev.Epoch)
		w.key(fReason)
		w.dst = appendStr(w.dst, ev.Reason)
	default:
		return w.dst, fmt.Errorf("unknown event type %T", ev)
	}
	return w.dst, nil
}

// rawList writes a list of raw values (extra_keys, mm_keys): in a map only
// when present, in an array when inArray says the array reaches it (as nil
// if absent).
func (w *fieldWriter) rawList(f fieldID, rs []Raw, inArray bool) {
	switch {
	case rs != nil && (w.isMap || inArray):
		w.key(f)
		w.dst = appendArrayHeader(w.dst, len(rs))
		for _, r := range rs {
			if len(r) == 0 {
				w.dst = append(w.dst, mpNil)
			} else {
				w.dst = append(w.dst, r...)
			}
		}
	case !w.isMap && inArray:
		w.dst = append(w.dst, mpNil)
	}
}

// appendTokens writes token_ids as the engine did: integers, strings at the
// positions of StringTokens, or [token, next] pairs.
func appendTokens(dst []byte, ev *BlockStored) []byte {
	dst = appendArrayHeader(dst, len(ev.TokenIDs))
	strs := ev.StringTokens
	for i, t := range ev.TokenIDs {
		switch {
		case ev.Pairs:
			next := ev.PairNext
			if i+1 < len(ev.TokenIDs) {
				next = ev.TokenIDs[i+1]
			}
			dst = appendUint(appendUint(append(dst, 0x92), uint64(t)), uint64(next))
		case len(strs) > 0 && strs[0].Pos == i:
			dst = appendStr(dst, strs[0].Value)
			strs = strs[1:]
		default:
			dst = appendUint(dst, uint64(t))
		}
	}
	return dst
}

// countTrailing returns how many optional trailing fields are written: in a
// map each present one; in an array all up to the last present one (the
// absent ones before it as nil).
func countTrailing(present []bool, isMap bool) int {
	n := 0
	for i, p := range present {
		if p {
			if isMap {
				n++
			} else {
				n = i + 1
			}
		}
	}
	return n
}

// optField writes an optional trailing field with put: in a map only when
// present, in an array when inArray says the array reaches it (as nil if
// absent).
func optField[T any](w *fieldWriter, f fieldID, v Opt[T], inArray bool, put func([]byte, T) []byte) {
	switch {
	case w.isMap && v.Valid:
		w.key(f)
		w.dst = put(w.dst, v.V)
	case !w.isMap && inArray:
		w.dst = appendOpt(w.dst, v, put)
	}
}

func (e Encoding) appendHashes(dst []byte, hs []uint64) []byte {
	dst = appendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = e.appendHash(dst, h)
	}
	return dst
}

func (e Encoding) appendHash(dst []byte, h uint64) []byte {
	switch e.Hashes {
	case HashInt:
		return appendInt(dst, int64(h))
	case HashBytes:
		dst = append(dst, mpBin8, 8)
		return binary.BigEndian.AppendUint64(dst, h)
	}
	return appendUint(dst, h)
}

// appendOpt appends v with put, or nil when it is absent.
func appendOpt[T any](dst []byte, v Opt[T], put func([]byte, T) []byte) []byte {
	if !v.Valid {
		return append(dst, mpNil)
	}
	return put(dst, v.V)
}

// RawStrings encodes ss as one msgpack value for BlockStored.ExtraKeys: an
// array of strings (a block's LoRA name, cache salt, ...), or nil when ss is
// empty, which is what vLLM writes for a block without extra keys.
func RawStrings(ss []string) Raw {
	if len(ss) == 0 {
		return Raw{mpNil}
	}
	n := 5
	for _, s := range ss {
		n += 5 + len(s)
	}
	b := appendArrayHeader(make([]byte, 0, n), len(ss))
	for _, s := range ss {
		b = appendStr(b, s)
	}
	return b
}

func appendArrayHeader(dst []byte, n int) []byte {
	return appendLen(dst, n, 0x90, mpArray16, mpArray32)
}

func appendMapHeader(dst []byte, n int) []byte {
	return appendLen(dst, n, 0x80, mpMap16, mpMap32)
}

// appendLen appends the header of a container of n elements: fix|n up to
// 15, else the 16- or 32-bit form.
func appendLen(dst []byte, n int, fix, c16, c32 byte) []byte {
	switch {
	case n <= 15:
		return append(dst, fix|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, c16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, c32), uint32(n))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n <= 31:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, mpStr8, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, mpStr16), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, mpStr32), uint32(n))
	}
	return append(dst, s...)
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, mpFloat64), math.Float64bits(f))
}

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, mpUint8, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, mpUint16), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, mpUint32), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, mpUint64), v)
}

func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(dst, uint64(v))
	}
	switch {
	case v >= -32:
		return append(dst, byte(int8(v)))
	case v >= math.MinInt8:
		return append(dst, mpInt8, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, mpInt16), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, mpInt32), uint32(int32(v)))
	}
	return binary.BigEndian.AppendUint64(append(dst, mpInt64), uint64(v))
}
