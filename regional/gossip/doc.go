// Package gossip is the cross-region knowledge layer of a controller: a WAN
// memberlist pool of the controllers of every region (one member per
// controller, named by its id), over which each region's summary travels,
// liveness is detected and inter-region RTT is measured. The request path
// reads the result — per remote region its latest summary, age, live
// controllers and RTT — from an immutable RegionsView swapped atomically
// (Node.View), never waiting on the network.
//
// # What travels where (memberlist's limits)
//
//   - Node meta (<= 512 bytes, or memberlist panics; checked when encoded):
//     a Digest — region, summary generation, body hash and length, load and
//     capacity totals, forwarding address. It rides on every alive message;
//     Publish re-advertises it (UpdateNode, at most once per SyncInterval).
//   - Summary bodies (64 KiB by default) never go through the broadcast
//     queue (packets of ~1.4 KB; a larger message is never sent). A
//     controller whose view of a region is older than what one of that
//     region's controllers advertises asks that controller (a small pull
//     request over TCP, SendReliable), which answers with the body over TCP.
//     Requests are retried after PullRetry.
//   - Push/pull (every PushPullInterval, and on join) carries each
//     controller's own body as the backstop (LocalState/MergeRemoteState).
//   - Ping acks carry the Vivaldi coordinate (PingDelegate).
//   - Between the controllers of one region (its replicas), every
//     ReplicaInterval, an opaque payload of the controller's
//     (Config.Replicas, replicas.go: regional's in-flight accounting and
//     session pins): over UDP when it fits a packet and may be lost, over
//     TCP otherwise. Controllers of other regions never get it; a replica
//     that leaves or is declared dead is reported gone.
//   - To every controller, every SyncInterval, the sender's sightings of
//     the other regions (sightings.go): per region, the generation, pod
//     count and age of the summary it holds and whether the region is
//     Live for it; over UDP when they fit a packet, TCP otherwise. The
//     view lists every controller's last sightings (RegionsView.Sightings):
//     the Raft leader's automatic failover counts them region by region, so
//     a region cut off from the leader only is judged by the regions that
//     still hear it, never by the leader's view alone.
//
// Every body is versioned and checksummed (summary.Decode); a bad or
// oversize one is rejected, counted by reason and logged once per kind. For
// each remote region the node keeps the summary with the highest generation
// (ties: the higher body hash), from whichever of its controllers.
//
// # Liveness and RTT
//
// A controller memberlist declares dead (or that left) is dead; one that has
// not answered a direct ping for SuspectAfterProbes probe rounds is suspect
// (memberlist does not report its own suspicion to delegates). A region
// with no alive controller is not Live and is no candidate.
//
// RTT to a region is the median over its alive controllers (Consul's
// GetDatacentersByDistance) of each controller's RTT: the median of its last
// RTTWindow direct ping samples once there are RTTMinSamples, else its
// Vivaldi distance (serf/coordinate, fed from the same pings; peer
// coordinates are validated before use, as DistanceTo panics on a
// dimensionality mismatch). Direct samples come first because WAN RTTs
// violate the triangle inequality (Vivaldi cannot embed 65/75/220 ms), and
// every controller pings every other one directly anyway; Vivaldi covers a
// controller with too few samples yet. The static matrix from Config is the
// fallback when nothing is measured, and replaces measurements with
// StaticRTTOverride.
//
// # Trust
//
// The pool is always encrypted (AES-256-GCM keyring; keys of 32 bytes, no
// shorter) and labelled. memberlist is not Byzantine fault tolerant: a key
// holder can forge anything. Summaries only steer cost estimates; residency
// is decided elsewhere (Raft) and re-checked by the receiving region.
//
// Keys rotate at run time, as in Consul (keyring.go): InstallKey, UseKey
// and RemoveKey apply to this controller and are sent, over the pool
// itself, to every live controller, which applies them idempotently and
// answers; the caller gets every controller's outcome and key
// fingerprints. KeysHandler serves them as the admin API
// (/v1/gossip/keys{,/install,/use,/remove}) for `meridian gossip keys`;
// GuardedKeysHandler lets the controller record each change in its audit
// log before it takes effect, and refuse it when it cannot (KeyOpGuard);
// KeyringFile keeps the keyring across restarts. Keys never appear in
// answers, logs or metrics, only fingerprints.
//
// The package imports regional/summary and gorgo (for candidates) and
// nothing else of ours. It must not import regional, global or residency:
// it carries estimates and liveness, while residency and region state are
// decided by the Raft tier and the controller. Its goroutines (memberlist's,
// a worker, a key worker, two senders, and one per Join in flight) run from
// Open to Close.
package gossip
