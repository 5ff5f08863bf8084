// Package audit is Meridian's tamper-evident audit log of routing decisions
// that cross a region boundary (and of residency denials), and of the
// privileged actions on the control plane (admin_action): one append-only,
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
// # Admin actions
//
// A policy apply, a failover trigger or recover, a membership change or a
// gossip key rotation step is recorded as a record of kind admin_action on
// the chain of the controller that handled it (Admin), chained and
// checkpointed like every other record. Its "cost" member holds an
// AdminDetail instead of a cost breakdown:
//
//	{"action":"failover_trigger","actor":"spiffe://meridian/client/alice","auth":"certificate",
//	 "outcome":"applied","args":{"force":"false","reason":"maintenance","state":"failed"}}
//
// actor is the client certificate's identity when the caller presented one
// of the cluster CA (auth "certificate"), else the admin token's name
// ("admin-token", auth "token"), or the controller itself for what it does
// on its own (auth "internal": automatic failover, membership
// reconciliation, its bootstrap policy). args name the target and the
// arguments (a policy's declared version and SHA-256, a member id, a key
// fingerprint), never key material or tokens. The other members: origin is
// the handling controller's region, region the targeted region,
// policy_version the policy in force there, request_id the Raft write's
// idempotency id, decision_id one id per action. Recording fails closed:
// the applied record is durable before the action takes effect, and an
// action whose record cannot be written is refused (NotRecordedError)
// without changing anything. A refused action has one record with outcome
// "refused" and the error; an action that fails after its applied record
// gets a second record, same decision_id, outcome "failed".
//
// # Invariants
//
//   - Append returns nil only after the record is written and fsync'd; any
//     other outcome is an *AppendError (or an *EntryError for bad input), and
//     the caller must not let the request cross regions (fail closed).
//   - Per controller, seq is 1, 2, 3, ... without gaps and record times never
//     decrease: a clock that steps back is clamped to the last record's
//     time, and counted (meridian_audit_clock_regressions_total, with the
//     step in meridian_audit_clock_regression_seconds) and logged.
//   - Segment files are named after the seq of their first record and never
//     rewritten. Only bytes that were never acknowledged are ever cut: a
//     batch whose write or fsync failed (if even that cut fails, the log
//     moves on to a new segment and Verify will point at the leftovers), and
//     an incomplete last line found by Open, kept aside in a .torn file.
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
// Query and Tail read through the Source interface: a directory
// (DirSource), a live Log (only durable records; Tail wakes on each commit),
// a controller over HTTP (HTTPSource, reading what Handler serves), or
// several of them (Multi), so that a fan-out over every controller is a
// merge of sources. Time-range queries seek with the sparse index and stop
// at the first record past the range, since times never decrease along a
// chain; NaiveQuery is the full-scan reference they are tested against.
//
// # Metrics
//
// meridian_audit_records_total, _bytes_total, _write_errors_total{op},
// _fsync_seconds, _batch_records, _segments_rotated_total,
// _checkpoints_total{result} and _queue_depth, on the Registerer in Deps.
//
// The package must not import the Raft tier (package global) or any other
// package of ours: what it needs from Raft is the CheckpointSink interface.
package audit
