// Package enginesim is a stand-in for a vLLM, SGLang or TensorRT-LLM pod: an
// OpenAI-compatible HTTP server whose prefix cache, timing, metrics and
// KV-cache events behave like vLLM's, cheap enough that tests, the demo and
// the multi-region simulator run dozens of them on loopback (Open/Close, one
// goroutine per request plus one event publisher). Config.Engine picks
// whose wire form its events take and whose names its metrics have (vLLM:
// extra_keys salt; SGLang: cache_salt on each salted event, signed hashes,
// sglang:* metrics; TensorRT-LLM: no salt in its events, trtllm_* metrics):
// see Batch.KVBatch, EncodingFor; a mixed fleet runs from one binary.
//
// # What it reproduces (llm-d-inference-sim's observable contract, and vLLM's)
//
//   - POST /v1/completions and /v1/chat/completions, streaming as SSE
//     ("data: {...}" chunks, then "data: [DONE]"); prompts as text, as
//     chat messages (rendered and tokenized by regional/tokenize, exactly as
//     the router does), as `prompt_token_ids` or as a list of ints;
//     `usage.prompt_tokens_details.cached_tokens` is the prefix the cache
//     held when the request was admitted; `return_token_ids` echoes the
//     prompt's ids (vLLM's extension). GET /v1/models, /health, /metrics;
//     POST /reset_prefix_cache; POST/GET /admin/faults for failure injection.
//   - Prefix cache: only full blocks of BlockSize tokens are cached. Block i's
//     engine hash is the last 8 bytes (big-endian) of sha256(parent's 32
//     bytes || token ids || extra keys) with the parent of block 0 being
//     sha256(hash seed): deliberately not Meridian's index hash, as vLLM's
//     isn't. Blocks held by running requests are pinned; unreferenced cached
//     blocks sit in an LRU; a request frees its blocks tail first, so a
//     chain's tail is evicted before its head, as vLLM's free queue does. At
//     most (prompt tokens - 1) are served from cache (vLLM recomputes the
//     last token). Capacity counts every block a running request needs
//     (prompt, partial block and decode tokens); a request that cannot fit
//     waits at the head of the queue.
//   - Events: BlockStored when a request's prefill completes, for the full
//     blocks it computed that the cache did not already hold (with parent
//     hash, token ids, block size, medium "GPU", LoRA name); BlockRemoved on
//     eviction; AllBlocksCleared on /reset_prefix_cache. They are published
//     in vLLM batches ([ts, events, dp_rank]) when EventBatchSize events are
//     pending or EventFlushInterval after the first pending one, each batch
//     with a sequence number from 0, plus Meridian's PodUp at Open (with
//     the engine kind and the KV capacity), repeated every AnnounceInterval
//     with a TTL of AnnounceTTLFactor intervals (a controller that lost the
//     first learns the endpoint within one interval), and PodDown at Close,
//     all carrying the epoch of this process start.
//   - Timing: TTFT = queueing (at most MaxConcurrency requests run; the rest
//     wait FIFO) + PrefillOverhead + PrefillPerToken x uncached tokens; then
//     one token per DecodeInterval; all scaled by TimeScale and, under load,
//     by up to LoadFactor (llm-d-inference-sim's time-factor-under-load).
//     Hardware profiles give defaults (see Profiles for their sources).
//   - Metrics (the engine's names, from an injected registry): for vLLM
//     vllm:num_requests_running, vllm:num_requests_waiting,
//     vllm:kv_cache_usage_perc, vllm:prefix_cache_hits_total,
//     vllm:prefix_cache_queries_total, vllm:time_to_first_token_seconds; for
//     SGLang sglang:num_running_reqs, sglang:num_queue_reqs,
//     sglang:token_usage, sglang:cached_tokens_total, ...; for TensorRT-LLM
//     trtllm_num_requests_running, trtllm_num_requests_waiting,
//     trtllm_kv_cache_utilization, ...; plus meridian_enginesim_* counters
//     for published batches, publish errors and injected faults.
//
// # Invariants (tested against a naive reference)
//
//   - Replaying the published events in order into a set gives exactly the
//     blocks CachedBlocks reports.
//   - cached_tokens never exceeds what the cache held at admission; pinned
//     blocks are never evicted; the cache never holds more than its
//     capacity.
//   - Every request, finished, failed or cancelled at any point, releases
//     what it held.
//
// The decision core (cache, queue, timing) runs under one mutex and reads
// time only from the injected Clock, so tests drive it deterministically
// inside testing/synctest. It imports regional/tokenize, regional/kvevents
// and regional/kvbridge/zmtp of ours and nothing else of Meridian's; above
// all not regional, whose own tests run engine simulators as their pods.
package enginesim
