// Package index is the block index of one region: for a prompt's chain of
// block hashes it answers, in microseconds and without allocating, which live
// pods hold the longest cached prefix and how long it is.
//
// It imports nothing of ours, nor anything that pulls in net/http, Kafka or
// Prometheus (the root's deps_test.go checks both): gorgo, the summaries,
// the ingester and the decision pipeline all build on it. It starts no
// goroutines: the background sweep is driven by the caller (SweepStep, or
// RunSweeper in a goroutine it owns).
//
// # Chain hashing
//
// A prompt is cut into blocks of BlockSize tokens; only full blocks count.
// H_i = xxhash64(seed = H_{i-1}, little-endian bytes of block i's token ids),
// and H_{-1} = Namespace.Seed(), a hash of (model, LoRA name, cache salt, block
// size). Equal tokens after different prefixes, or under different
// namespaces, get different keys by construction; two distinct chains collide
// only if xxhash64 does (about 2^-64 per pair). 0 is never a key.
//
// # Layout
//
// Block hash -> pod bitmap (PodCapacity bits: 4 words at the default 256
// pods), in 256 shards picked by Fibonacci hashing (the top 8 bits of
// hash * 0x9E3779B97F4A7C15). Each shard is padded to whole cache lines and
// holds an open-addressing table (linear probing, load <= 3/4 plus 1/256
// while growing, backward-shift deletion, no tombstones) of 8-byte slots —
// a 32-bit fingerprint that also encodes the home position, and a 32-bit
// entry number — and a slab of entries (hash + bitmap) in chunks of 256. At
// 256 pods that is 40 bytes per block plus 10.7 to 21.3 bytes of slots, about
// 53-58 bytes per block in practice (BenchmarkMemory). A table grows without
// a pause: a private table of twice the size is filled a few slots per
// insertion and then published whole, so lookups never see it half built.
//
// Readers take no lock: a per-shard seqlock. Inserts and bit changes are
// single atomic stores that keep the table consistent at every instant;
// only deletions (which move slots and free entries for reuse) run in a
// write window that makes overlapping readers retry. What readers read of
// a shard (the seqlock, the table pointer) and what every insertion writes
// lie in different cache lines. Writers of a shard serialize on its mutex;
// before every 8 blocks of a batch take any, it prefetches the lines
// their insertions will write (each shard's writer line, each hash's home
// slot and the line after it, the slab entry each shard will hand out
// next), for writing where the CPU can, so their cache misses overlap.
//
// # Lookup
//
// Lookup exploits prefix closure — a pod that holds H_i holds H_0..H_{i-1} —
// by a binary search for each drop-off depth: O(K log N) probes for a chain of
// N blocks whose pods drop out at K distinct depths, not O(pods x N). Chains
// of 256 blocks or more run those searches side by side, in rounds whose
// probes are loaded together so their cache misses overlap. Results are
// ranked by matched blocks. Eviction can break closure (a middle block
// evicted while its descendants are still announced); the answer d for a pod
// is then a "drop point" — the pod holds H_{d-1} and not H_d — at or beyond
// the consecutive-scan answer c, so it over-reports only across such a hole,
// by at most (the last index the pod holds along the chain + 1) - c. On
// closure-preserving histories it equals the consecutive scan exactly (the
// property tests check both statements against a naive reference).
//
// A lookup also leaves a hint: the depths where pods dropped out, kept in a
// small direct-mapped table by the chain's first block. The next lookup of a
// chain starting with that block probes H_{d-1} and H_d of each hinted depth
// d in its first round (chains of any length then search in rounds): while
// the depths hold, that one round of cache misses settles every pod. A hint
// only chooses probe positions; the answer is made of what the probes read,
// so a stale or foreign hint costs probes, never correctness.
//
// LookupGroups answers the same a depth group at a time, deepest first, and
// only as far as it is asked (Groups.Next): a caller that needs the pods
// holding the longest prefixes first, and may stop there, does not pay for
// the rest. Its search mirrors the sequential one from the deep end; on
// closure-preserving histories its groups are Lookup's answer, otherwise
// each of its answers is a drop point with the same bound.
//
// # Pods
//
// A pod gets a slot (its bit) and a generation; PodID carries both. The alive
// mask is checked on every lookup, so a removed pod disappears at once. Its
// bits are cleared later by a bounded sweep (at most a given number of slab
// entries per step, one shard lock at a time); only when a sweep pass has been
// through every shard is the slot free again, and its next pod has a new
// generation: a new pod never inherits an old pod's blocks, and a stale PodID
// can neither read nor write.
//
// # Invariants
//
//  1. A pod removed before a lookup starts is never in its answer.
//  2. A reused slot never carries an earlier pod's blocks.
//  3. Registrations are reference-counted per (pod, tier): duplicate
//     announcements and their removals balance; evicting an absent block,
//     or a tier the pod does not hold it in, is a no-op.
//  4. On closure-preserving histories Lookup equals the naive consecutive
//     scan; otherwise it obeys the weaker property above.
//  5. Lookup allocates nothing when cap(dst) >= PodCapacity; nor does
//     Groups.Next when dst has room for the group.
//
// Tier detail (gpu, cpu, disk, external) lives off the hot path: the bitmap
// says only "held somewhere"; per-(block, pod) tier counts are kept in a side
// map only when they differ from "once, on GPU", and are read for one chosen
// pod (TierProfile).
package index
