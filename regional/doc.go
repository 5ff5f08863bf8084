// Package regional is one region's controller: it ingests the region's KV
// events from Kafka into the block index, keeps the region's pods with their
// load and health, decides where each request goes, and serves the
// OpenAI-compatible API as a streaming proxy (and the decision alone, for use
// behind an existing gateway).
//
// # Decision pipeline
//
// Filters, then scorers, then a picker, each small and named in the
// configuration (route.Config):
//
//   - filters: alive (live in the index), model (serves the requested model),
//     healthy (not ejected by outlier detection), bounded_load (no pod may take
//     more than BoundedLoadFactor x its fair share of in-flight requests, so a
//     hot shared prefix never piles everything onto one pod);
//   - scorers, all in milliseconds: prefix (the exact cached prefix from the
//     index, weighted by tier for the best candidates, shortens prefill),
//     queue (prefill tokens already routed to the pod and not yet past their
//     first byte: the router's own in-flight accounting, fresher than engine
//     metrics), running (a small cost per request in flight), kv_util (a
//     cost as the pod's scraped KV cache fills past 80%), affinity (a bonus
//     for the pod a session is pinned to, withdrawn for a "thick" session's
//     concurrent excess so it splits across pods);
//   - picker: the lowest expected time to first token (gorgo's model:
//     queue + prefill of the uncached tokens + overhead); ties rotate, so with
//     no prefix anywhere requests spread by load, never pile on the first pod.
//
// Baseline policies (round_robin, least_loaded, session_hash) run through
// the same filters, so operators can compare like with like.
//
// # Invariants
//
//   - A pod removed from the registry or dead in the index is never chosen.
//   - An ejected pod is never chosen while any healthy pod can take the
//     request; at most MaxEjectionPercent of the pods (at least one) are
//     ejected at once.
//   - The request path reads snapshots (index, registry) and never waits on
//     Kafka.
package regional
