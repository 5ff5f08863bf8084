// Package kvbridge carries KV-cache events from vLLM engines (and anything
// that publishes like them: SGLang, TRT-LLM, the engine simulator) over ZMQ
// to the region's Kafka topic, so that a real fleet feeds Meridian unchanged.
// Its one job: subscribe to the engines' PUB sockets, repair sequence gaps
// through their replay sockets, and produce every batch to
// meridian.kv-events.<region> keyed by pod (`meridian kv-bridge`).
//
// # Wire
//
// vLLM publishes multipart messages [topic, seq as 8 bytes big-endian,
// msgpack KVEventBatch] on a PUB socket; seq runs from 0 per process start
// and data-parallel rank, +1 per batch. Its ROUTER replay socket answers a
// request [empty, start_seq] with [empty, seq, payload] per buffered batch
// with seq >= start_seq and an end marker whose seq frame is eight 0xFF
// bytes; llm-d's simulator and TRT-LLM answer [topic, seq, payload]. Both
// shapes are accepted. The bridge connects to each engine's PUB endpoint (or,
// with bind, listens for engines that connect, as vLLM does when its endpoint
// names a host), subscribes (default: every topic), and names the pod from
// the configuration or from llm-d's topic convention kv@<pod>@<model>.
//
// # What reaches Kafka
//
// One message per batch: key = pod name; value = the payload exactly as the
// engine sent it; headers pod, model and hardware where known, and seq = the
// engine's seq (kvevents.HeaderSeq). No epoch header: the bridge cannot know
// an engine's process epoch, and an invented one would have to change when
// the bridge restarts, which would make the ingester clear every pod at each
// bridge deploy. Instead:
//
//   - an engine restart shows as seq going back (below the last forwarded on
//     a new connection, or below the previous one on the same connection),
//     or, when the new incarnation has already passed the last seq
//     forwarded, as a different batch at that seq in the replay buffer (the
//     bridge keeps a digest of the last payload it forwarded per stream);
//   - on a restart the bridge first writes a marker: a batch holding one
//     AllBlocksCleared for the stream's rank, with header kvbridge-marker =
//     "restart" and no seq, then the new incarnation's history from seq 0 as
//     far as the replay buffer holds it. The marker clears the rank in the
//     ingester even when seq did not go back; when it did, the ingester's own
//     rule (a rank's seq going backwards clears the pod) fires as well, so
//     both paths agree;
//   - the first time the bridge sees a stream it asks the replay buffer for
//     seq 0 onwards: if the buffer still holds seq 0, the whole history is
//     written after a marker ("join"), which makes the index exact whatever
//     the consumer held before; if not (a long-lived engine), forwarding
//     starts at the live batch and nothing is replayed, because a partial
//     history would make the ingester's seq rule clear the pod for a worse
//     state than it has.
//
// Payloads are decoded (regional/kvevents) to read the data-parallel rank
// and to count malformed ones, which are forwarded all the same: the
// ingester, which applies events, counts and skips them by reason, and the
// topic stays a faithful record of what the engines sent.
//
// # Invariants
//
//   - Per stream (pod, topic, rank) batches reach Kafka in the engine's seq
//     order, each at most once per bridge process, with the engine's bytes:
//     a replay fetches only the hole below the live batch in hand, so live
//     and replayed batches never overlap, and a batch a replay answer
//     repeats is dropped.
//   - Every seq the bridge knows it missed is either repaired from the
//     replay buffer or counted lost (meridian_kvbridge_gap_batches_lost_total).
//   - A marker precedes every batch of a new engine incarnation the bridge
//     detects.
//
// The gap, duplicate and restart logic is a single-threaded state machine
// per stream (stream.go) fed the live batches and a replay function; a
// property test drives it against a simulated engine. Goroutines: per
// endpoint one connection loop (its own reconnect loop with backoff; zmq4's
// synchronous Dial and racy auto-reconnect are not used, only its ZMTP
// connection layer) and one processor that owns the streams, asks for
// replays and writes to Kafka (kafka-go Writer, Hash balancer, RequireAll;
// TLS and SASL from the kafka section, as the controller's; failed writes
// are retried with backoff, preserving order). Close stops
// reading, forwards what was received, and waits for every goroutine.
//
// # Pods without a static list, and their announcements
//
// vLLM sends no PodUp, so a controller would know a bridged pod from its
// events but never its endpoint. The bridge announces every pod whose HTTP
// endpoint it knows (static pods with http_endpoint, and discovered pods)
// every announce_interval with a TTL of three intervals (epoch 0: it knows
// no process epoch, and an announcement without one clears nothing). With
// discovery (the regional/discovery section a controller reads under
// pods.discovery) it follows a headless Service or a file: each pod that
// joins is subscribed to at its ZMQ endpoints (the pod's address with
// kv_events_port and replay_port) under the discovered name and announced
// at once; a pod that leaves is unsubscribed from (what was received is
// still forwarded) and announced down (PodDown). Controllers believe a
// PodUp only for an allowed endpoint: give them the same discovery section
// (a discovered pod is allowed by construction) or allowed_endpoints
// covering the pods' addresses.
//
// # Known limits
//
//   - A gap is noticed, and repaired, when the next batch of the stream
//     arrives; an engine that goes quiet right after a gap leaves it open
//     until it publishes again.
//   - A restarted bridge does not know what its predecessor wrote: when the
//     engine's buffer no longer holds seq 0, batches published while no
//     bridge was running are lost without being counted.
//   - A Kafka write that times out may have succeeded; its retry then
//     duplicates batches, which the ingester applies twice (kafka-go has no
//     idempotent producer).
//
// It imports regional/kvevents, regional/kafkasec (the Kafka clients'
// TLS and SASL), regional/discovery and its own regional/kvbridge/zmtp of
// ours and nothing else of Meridian's; it must not import regional (the
// ingester), index, global or cmd: the topic is the only contract between
// the bridge and the controllers.
package kvbridge
