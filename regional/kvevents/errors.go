package kvevents

import (
	"errors"
	"fmt"
)

// Reason classifies a decode failure. Its values are stable and few, so they
// can label a metric (meridian_ingest_decode_errors_total{reason=...}).
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
)

// Reasons lists every Reason a Decoder can return, so a caller can create its
// metric series up front.
func Reasons() []Reason {
	return []Reason{ReasonTruncated, ReasonBadEnvelope, ReasonBadEvent, ReasonUnknownEvent,
		ReasonTooLarge, ReasonBadHash, ReasonBadFieldType, ReasonMissingField, ReasonTooDeep,
		ReasonBadMsgpack, ReasonTrailingBytes}
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
