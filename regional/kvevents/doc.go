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
//     vLLM's declaration order; map events may also carry locality (vLLM
//     #48281, TensorRT-LLM), mm_keys (TensorRT-LLM) and cache_salt (SGLang
//     #37482); session_id and ownership are ignored. Meridian's lifecycle
//     events PodUp (pod, endpoint, model, hardware, region, epoch, engine,
//     kv_blocks, ttl_ms) and PodDown (pod, epoch, reason) use the same two event
//     styles in the same envelope;
//   - SGLang >= 0.5.18 writes a {cache_salt[, session_id]} map at position
//     7, where vLLM has lora_name (BlockStoredWithMetadata): a string or
//     such a map is accepted there;
//   - a block hash is an unsigned or signed integer (the same 64 bits) or
//     bytes (the last 8 bytes big-endian, left-padded with zeros when
//     shorter); a token id is an integer that fits in uint32, a string
//     (TensorRT-LLM's EventTokenId = int | str; kept in StringTokens) or,
//     for a whole event, a [token, next token] pair (SGLang's DeepSeek V4
//     bigram pages; Pairs);
//   - a BlockStored with token ids must have a positive block_size and
//     block_size token ids per block hash.
//
// A malformed event (a field of the wrong type, a bad hash, a list over its
// limit, a block size or token count that cannot be right) is skipped and
// listed in Batch.Skipped with its reason; the rest of its batch decodes.
// Only a failure that leaves the event's end unknown, or of the envelope,
// fails the whole batch.
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
// LoRA name, the cache salt, the router block size). The salt is vLLM's,
// from block 0's extra keys, or SGLang's, from the event's cache_salt
// (either form): the same salted tokens index identically from every engine,
// and differently from unsalted ones. A Rekeyer, one per pod, keeps an engine-hash -> entry map (keyed by
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
//     block registers it again. The announcements of one engine block on
//     one medium are a set, not a counter: vLLM's kv_cache_report_mode=full
//     re-announces every reused block and removes it once, and a replayed
//     batch changes nothing. (When vLLM holds two copies under one hash and
//     evicts one, the block leaves the index early: an under-claim.)
//  3. A BlockStored whose parent is not held in any tier is dropped
//     (RekeyStats.UnknownParent): without the parent's tokens our chain
//     cannot continue. A BlockStored without token_ids (CPU offload) adds a
//     tier to blocks the pod already holds and is a no-op for others.
//  4. Blocks whose extra keys carry anything but the LoRA name and the cache
//     salt (multimodal items, prompt embeddings), blocks with TensorRT-LLM
//     mm_keys or string token ids, and blocks of a KV-cache group that is
//     not full attention (kv_cache_spec_kind sliding_window, mamba, ...)
//     are never registered, nor any block after them in the chain: a
//     token-only key would claim hits the engine cannot serve, and a
//     sliding-window or state group attests its window, never a prefix
//     (vLLM's hit needs the full-attention prefix; hybrid models are
//     predicted by their full-attention groups, an upper bound).
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
// the event and is counted, never guessed. Storage that is not the pod's
// own (Local: locality REMOTE, vLLM's FS/OBJ/STORAGE tiers without
// locality LOCAL, the shared external tier) skips the event and is counted:
// crediting the announcing pod with a store other pods share would be a
// guess.
package kvevents
