// Package audit is Meridian's tamper-evident audit log of routing decisions
// that cross a region boundary (and of residency denials): one append-only,
// hash-chained JSON Lines log per controller, fsync'd in batches, rotated by
// size and age, indexed sparsely for time-range queries, and anchored by
// periodic checkpoints that the Raft tier replicates to every region.
//
// # Records and the chain
//
// A Record is written as one line of canonical JSON: a fixed field order, no
// maps with unordered keys (the caller's cost explanation is re-encoded with
// sorted keys and numbers kept as their literal text), no floats of our own,
// times as fixed-width RFC 3339 UTC with nanoseconds. The line is
//
//	{"v":1,"controller":...,"seq":N,...,"prev":"<hex>","hash":"<hex>"}
//
// where hash = SHA-256 of the same line without its ",\"hash\":..." member
// (the bytes up to "prev" and the closing brace). prev is the hash of record
// N-1 of the same controller (64 zeros for seq 1), across segment boundaries,
// so deleting, inserting, reordering or editing any record breaks the chain.
// Tenant and session ids are stored only as HMAC-SHA256 under a configured
// key (Hasher); prompts are never recorded.
//
// # Invariants
//
//   - Append returns nil only after the record is written and fsync'd; any
//     other outcome is an *AppendError (or an *EntryError for bad input), and
//     the caller must not let the request cross regions (fail closed).
//   - Per controller, seq is 1, 2, 3, ... without gaps and record times never
//     decrease (the log clamps a clock that steps back).
//   - Segment files are named after the seq of their first record and never
//     rewritten; the only repair is cutting an incomplete last line, which
//     was never acknowledged, and it is kept aside in a .torn file.
//   - The sparse index (.idx) is advisory: readers check every entry they use
//     against the segment and fall back to scanning; Verify ignores it.
//   - Verify reports each problem with its controller, segment file and line;
//     checkpoints are what make truncation of the tail and rewriting of a
//     whole chain detectable.
//
// # Layout
//
//	<dir>/<controller-id>/00000000000000000001.jsonl  records, seq 1..
//	<dir>/<controller-id>/00000000000000000001.idx    sparse index + seal
//
// Query and Tail read through the Source interface (a directory, a live Log,
// or a controller over HTTP via HTTPSource) so that a fan-out over every
// controller is a merge of sources.
//
// The package must not import the Raft tier (package global) or any other
// package of ours: what it needs from Raft is the CheckpointSink interface.
package audit
