package kvevents

import (
	"errors"
	"fmt"
)

// Reason classifies a decode failure. Its values are stable and few, so they
// can label a metric (meridian_ingest_decode_errors_total{reason=...}).
//
// A failure inside one event whose extent is still well-formed msgpack
// (a field of the wrong type, a bad hash, a list over its limit, a block
// size or token count that cannot be right) skips that event only: it is
// listed in Batch.Skipped with its reason and the rest of the batch
// decodes. A failure of the envelope, or one that leaves the event's end
// unknown (truncated, bad_msgpack, too_deep), fails the whole batch.
type Reason string

// The decode failure reasons.
const (
	// ReasonTruncated: the message ends inside a value.
	ReasonTruncated Reason = "truncated"
	// ReasonBadEnvelope: the batch is not an array [ts, events, rank] or a map,
	// or its ts, events or rank has the wrong type.
	ReasonBadEnvelope Reason = "bad_envelope"
	// ReasonBadEvent: an event is not an array or map, or has no string tag.
	ReasonBadEvent Reason = "bad_event"
	// ReasonUnknownEvent: an event's tag is not one we know. Not an error of
	// the batch: such events are listed in Batch.Skipped.
	ReasonUnknownEvent Reason = "unknown_event"
	// ReasonTooLarge: the message, a list or a string exceeds a DecoderConfig
	// limit.
	ReasonTooLarge Reason = "too_large"
	// ReasonBadHash: a block hash is not an integer or a byte string of at
	// most MaxHashBytes bytes.
	ReasonBadHash Reason = "bad_hash"
	// ReasonBadFieldType: a field has the wrong msgpack type or is out of range
	// (e.g. a negative token id).
	ReasonBadFieldType Reason = "bad_field_type"
	// ReasonMissingField: a lifecycle event lacks its pod name.
	ReasonMissingField Reason = "missing_field"
	// ReasonTooDeep: unknown values nest deeper than DecoderConfig.MaxDepth.
	ReasonTooDeep Reason = "too_deep"
	// ReasonBadMsgpack: a byte that starts no msgpack value (0xc1), or an ext
	// type where none is allowed.
	ReasonBadMsgpack Reason = "bad_msgpack"
	// ReasonTrailingBytes: bytes follow the batch in a message that must hold
	// exactly one.
	ReasonTrailingBytes Reason = "trailing_bytes"
	// ReasonBadBlockSize: a BlockStored with token ids has a block_size that
	// is not positive (or above 65536).
	ReasonBadBlockSize Reason = "bad_block_size"
	// ReasonBadTokenCount: a BlockStored's token_ids is not block_size
	// tokens per block hash (or its mm_keys not one entry per block).
	ReasonBadTokenCount Reason = "bad_token_count"
	// ReasonBadTokenPairs: token_ids mixes [token, next] pairs with plain
	// ids, or its pairs do not chain (pair i's second token is not pair
	// i+1's first).
	ReasonBadTokenPairs Reason = "bad_token_pairs"
)

// Reasons lists every Reason a Decoder can return, so a caller can create its
// metric series up front.
func Reasons() []Reason {
	return []Reason{ReasonTruncated, ReasonBadEnvelope, ReasonBadEvent, ReasonUnknownEvent,
		ReasonTooLarge, ReasonBadHash, ReasonBadFieldType, ReasonMissingField, ReasonTooDeep,
		ReasonBadMsgpack, ReasonTrailingBytes, ReasonBadBlockSize, ReasonBadTokenCount, ReasonBadTokenPairs}
}

// DecodeError is the error of every failed decode: where and why.
type DecodeError struct {
	Offset int    // byte offset into the message of the value at fault
	Reason Reason // the metric label
	Detail string // what was found, for a human
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode kv event batch: %s at byte %d: %s", e.Reason, e.Offset, e.Detail)
}

// ReasonOf returns the Reason of a *DecodeError anywhere in err's chain, or ""
// when err is not a decode error.
func ReasonOf(err error) Reason {
	if err == nil {
		return ""
	}
	if de, ok := err.(*DecodeError); ok {
		return de.Reason
	}
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Reason
	}
	return ""
}
