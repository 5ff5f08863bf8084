// Package global is the Raft-replicated control tier shared by the regional
// controllers: the active residency policy and its history, region states
// (active, draining, failed, recovering) with who changed them, when and why,
// failover targets, audit checkpoints and the member list. Its one job is to
// make every controller see the same committed control state while never
// putting Raft on the request path.
//
// # Invariants
//
//   - The request path reads Node.State(): an immutable *State swapped
//     atomically after each applied command. The read never blocks and does
//     not allocate; State.RegionState and State.Routable do not allocate.
//   - Losing quorum degrades freshness, not availability: a node keeps serving
//     its last committed State and reports Health.Stale (and the gauge
//     meridian_global_stale) once no leader was heard from for MaxStale.
//   - The state machine is deterministic: a command carries its request id,
//     its time (stamped by the controller that accepted it, never by the state
//     machine) and everything else it needs. Retention limits are constants
//     (PolicyHistoryKept, PolicyDocsKept, CheckpointsKept, DedupWindow), not
//     configuration, so every replica prunes alike.
//   - Commands are idempotent: the latest DedupWindow request ids are
//     remembered with their results (and snapshotted), so a write retried
//     after an unknown outcome (leadership lost, timeout) is applied once and
//     the retry gets the first result.
//   - Policy documents are opaque here: they are checked by the injected
//     Config.PolicyValidator before they are proposed (on the accepting node
//     and again on the leader), never inside the state machine, so a
//     validator change cannot make replicas diverge.
//
// It must not import the other packages of Meridian except its own
// sub-packages (global/audit, for the checkpoint types and the records of
// privileged actions; global/identity, for the certificate identity of an
// admin API caller): above all not
// regional, which reads this tier and never the reverse (the controller
// hands in what the state machine needs, such as Config.PolicyValidator and
// the observations of the automatic failover). regional, dr/drill,
// scenarios/demo and cmd import it.
//
// # Raft
//
// hashicorp/raft v1.8.0 with raft-wal v0.4.1 as log and stable store (behind
// a 512-entry log cache) in DataDir/raft/wal and file snapshots in
// DataDir/raft/snapshots; the TCP transport wrapped in mutual TLS
// (Config.TLS serves, Config.TLSClient dials; identity.Source provides
// both): an accepted connection must present a certificate of the cluster CA
// and finish its handshake within the transport timeout, or it is dropped
// (and counted) before Raft reads a byte of it. Plain TCP is allowed on a
// loopback bind address (tests) or with Config.Insecure, which Open logs as
// a warning; so are http:// admin URLs. Node ids are stable
// controller ids, never addresses. One node bootstraps a new cluster
// (Config.Bootstrap); the others Join through any member's admin API: the
// leader records the member (its region and admin URL) in the state and adds
// it as a non-voter, and promotes caught-up non-voters to voters while there
// are fewer than Config.Voters (3 or 5). The other controllers stay
// non-voters: they replicate and serve reads but do not vote.
//
// Timing presets: LANTiming (hashicorp/raft's defaults: heartbeat and
// election 1s, lease 500ms) and WANTiming for voters regions apart
// (heartbeat, election and lease 1.5s, commit 100ms: a crashed leader is
// replaced in about 3 s, and three heartbeats in a row must fail at 250 ms
// RTT before a follower gives up; WANTiming says why). Put the voters in 3 or 5 roughly equidistant
// regions; a write costs the leader's fsync plus the RTT to the nearest
// majority.
//
// # Writes and reads
//
// Writes may be sent to any controller: a follower forwards the encoded
// command to the leader's admin API (POST /v1/global/apply, marked with the
// X-Meridian-Forwarded header so it is never forwarded twice). While there is
// no leader, or it changes, the write is retried with the same request id
// until Config.HoldTimeout (default 7s), then fails with ErrNoLeader (outcome
// unknown: retry with the same id). A forwarded write returns once the
// accepting node has applied it too (read your writes there). After each
// write the leader appends a barrier, so followers learn the new commit index
// at once instead of at the next commit timeout: a failover reaches every
// router within a round trip. Reads come from the local state
// (stale by at most the replication lag, bounded by MaxStale while
// Health.Stale is false); Node.StateChanged signals each change; ?consistent=1
// on the admin API reads on the leader after a Raft barrier, which is
// linearizable. Close hands leadership to another voter first.
//
// # Encodings
//
// Commands are JSON objects with a version field:
//
//	{"v":1,"op":"region.set","rid":"<request id>","at":<unix ns>,"actor":"operator:alice",
//	 "region":{"region":"eu-west-1","state":"failed","reason":"...","expect":"active","automatic":false}}
//
// with op one of policy.apply (body "policy": name, declared version, reason,
// base64 document, and unless_active: a document identical to the active
// policy adds no version; controllers that predate it ignore it and add
// one, so upgrade every controller before applying policies), region.set, region.targets, audit.checkpoint,
// member.upsert and member.remove, and exactly one body. A replica rejects a
// command of an unknown version deterministically (a rejection changes no
// state and is remembered with the request id). Snapshots are one JSON
// document {"v":1, "index", "applied", "policy_history", "regions", "targets",
// "checkpoints", "members", "dedup"}, with every list sorted, so equal states
// give equal bytes ("applied", the index of the last command applied, is
// optional: a snapshot without it reads as "index"). A change of either encoding bumps its version; all
// controllers must run a version that reads the new one before any writes it.
//
// # Privileged actions on record
//
// Every change an operator or the node itself makes to the replicated
// state (policy apply, failover trigger and recover, failover targets,
// membership join, removal, the leader's own record and promotions, a
// checkpoint posted to the admin API) is an admin_action record in
// Config.Audit, the controller's audit log (see global/audit), on the
// chain of the node that accepted it, with the actor (RequestActor: the
// caller's certificate identity, else the admin token; "controller:<id>"
// for the node's own changes). The record is written before the change is
// proposed, and a change that cannot be recorded is refused
// (ErrAuditUnavailable, 503 audit_unavailable): a state change without a
// record is what the audit log exists to rule out, and it could not be
// taken back, while a refused change can simply be retried once the log is
// writable. A request forwarded to the leader is recorded once, where it
// was accepted; over TLS a forwarded request is believed only with a
// member controller's certificate (Node.hopOf). The audit log's own
// checkpoints (AppendCheckpoint) are not recorded.
//
// # Failover
//
// Trigger fails a region over (RegionFailed; with drain, RegionDraining),
// Recover makes it active again; only active regions are routable. The
// automatic failover (Node.RunAutoFailover) runs the Decider on the leader:
// a deterministic function of the committed state, explicit observations
// (each region's own report of its serving pods and that report's age, and
// every other region's view of it: the freshest such report its
// controllers hold) and the time. Only evidence that a region's pods
// cannot serve fails it: its own current report counting fewer than
// MinHealthyPods or, when the leader holds no current report of it, a
// majority of the other regions holding current reports that do. A region
// that cannot be heard from (controllers unreachable, report older than
// ReportMaxAge, here and at most other regions) is left as it is: a
// partition is not a failure, and the leader's view alone never fails a
// region. A region
// unhealthy for Grace is failed (never the last routable one); an
// automatically failed region that is healthy again is recovering, and active
// after HoldDown. Decisions commit as compare-and-set, so an operator's
// concurrent change wins. Regions failed or drained by an operator recover
// only by hand.
//
// # Recovering from a lost quorum
//
// When a majority of voters is lost for good, the survivors cannot elect a
// leader and keep serving their last state. To recover:
//
//  1. Stop every surviving controller.
//  2. On each of them write the same DataDir/raft/peers.json listing the
//     survivors (WritePeersFile, or by hand in hashicorp/raft's format:
//     [{"id":"ctrl-a","address":"10.0.0.5:7400","non_voter":false}]).
//  3. Start them. Open applies the file with raft.RecoverCluster (which
//     commits every entry in the local log, so writes that were in flight may
//     become committed), renames it to peers.json.applied, and the survivors
//     elect a leader among themselves.
//  4. Join replacement controllers as usual.
//
// A node that ends up the only voter can be recovered alone the same way.
package global
