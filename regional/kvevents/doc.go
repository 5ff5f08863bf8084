// Package kvevents is the codec of the KV-cache events Meridian carries on
// its per-region Kafka topic, and the re-keying of those events onto our own
// chain hashes. Its one job: bytes in, index operations out. It does no I/O
// and starts no goroutines; the ingester (Kafka), the engine simulator and the
// ZMQ bridge build on it. It imports only the index package of ours (for
// Namespace, Extend/ChainFrom and Tier) and must not import the rest of
// regional, global or cmd, nor anything that pulls in net/http, a Kafka
// client or Prometheus: the Kafka consumer and producer are its callers'
// (the root's deps_test.go checks both).
//
// # Wire format
//
// A message is one vLLM KVEventBatch in msgpack, decoded as vLLM writes it
// (see DESIGN.md "KV events" and the reference notes on vLLM's
// kv_events.py):
//   - the envelope is an array [ts, events, data_parallel_rank] (the rank may
//     be missing), or a map with those keys ("attn_dp_rank" is SGLang's
//     name for the rank); extra elements and unknown keys are ignored;
//   - each event is a positional array [tag, fields...] (vLLM before PR 42892)
//     or a map with "type" = tag and named fields, in any order (since it);
//     fields missing at the end of an array, or absent from a map, are
//     absent (Opt, nil slices); extra trailing elements and unknown keys are
//     ignored; an unknown tag skips that event only (Batch.Skipped);
//   - BlockStored has 11 fields, BlockRemoved 3, AllBlocksCleared none, in
//     vLLM's declaration order; Meridian's lifecycle events PodUp (pod,
//     endpoint, model, hardware, region, epoch, ttl_ms) and PodDown (pod, epoch,
//     reason) use the same two event styles in the same envelope;
//   - a block hash is an unsigned or signed integer (the same 64 bits) or
//     bytes (the last 8 bytes big-endian, left-padded with zeros when
//     shorter); token ids must fit in uint32.
//
// Decoding never panics and never allocates more than a fixed multiple of
// the message size: every count is checked against the bytes that remain and
// against DecoderConfig limits before anything is allocated. Failures are
// *DecodeError values with the byte offset and a Reason fit for a metric
// label. A Decoder reuses its buffers across messages.
//
// The encoder (Encoding.AppendBatch) writes the same formats: array or map
// events, array or map envelope, and unsigned, signed or bytes hashes. It is
// hand-written beside github.com/vmihailenco/msgpack because that library
// cannot choose these forms (trailing fields omitted or nil by vLLM version,
// the hash style per encoding): used value by value it would replace only the
// few append helpers, at three allocations and about six times the time per
// batch.
//
// # Re-keying
//
// Engine hashes are opaque ids; the index key is our chain hash
// (index.Extend) over the token ids, in the Namespace (pod model, the event's
// LoRA name, the cache salt from block 0's extra keys, the router block
// size). A Rekeyer, one per pod, keeps an engine-hash -> entry map (keyed by
// data-parallel rank, KV-cache group and engine hash) and emits Ops that the
// ingester applies to the index. The rules, which the naive reference in the
// tests restates:
//
//  1. The router block size R and the engine block size E must divide one
//     another. When E < R (k = R/E engine blocks per router block), an engine
//     block at position k-1 of a router block completes it; when E >= R each
//     engine block completes E/R router blocks.
//  2. A router block is held in a tier exactly when every engine block it
//     spans is held in that tier. So storing the last missing engine block
//     registers it, and removing any engine block that belongs to it evicts
//     it (the engine can no longer serve that full prefix); re-storing the
//     block registers it again. Each engine block's announcements are
//     counted per tier (vLLM can hold duplicate blocks with one hash; a
//     replay of the same batch therefore counts twice, so the ingester must
//     not feed a batch twice).
//  3. A BlockStored whose parent is not held in any tier is dropped
//     (RekeyStats.UnknownParent): without the parent's tokens our chain
//     cannot continue. A BlockStored without token_ids (CPU offload) adds a
//     tier to blocks the pod already holds and is a no-op for others.
//  4. Blocks whose extra keys carry anything but the LoRA name and the cache
//     salt (multimodal items, prompt embeddings) are never registered, nor
//     any block after them in the chain: a token-only key would claim hits
//     the engine cannot serve.
//  5. AllBlocksCleared clears the publishing rank: one OpClearPod when no
//     other rank holds anything, else evictions of that rank's blocks.
//     Lifecycle events are the ingester's; Reset forgets everything.
//  6. Memory is bounded by RekeyConfig.MaxEntries: at the cap, storing a new
//     block first forgets the least recently stored leaf (a block no tracked
//     block descends from; removed blocks are kept only while a descendant
//     needs them) and evicts its router blocks (RekeyStats.CapEvicted). A
//     forgotten block stored again is new to the Rekeyer: that event defines
//     it, whatever its first announcement said.
//
// Unknown media: TierOf documents the alias table; an unknown medium skips
// the event and is counted, never guessed.
package kvevents
