// Package route is the decision core of a region's controller: given a
// request's chain of block hashes, the region's block index, its pods with
// their load and health, and (for placement) cost-model candidates of the
// remote regions, it decides which pod of this region serves the request,
// or whether another region should, and explains why. It owns the pod
// registry and load accounting, session affinity, the short-lived
// speculation of just-computed prefixes and passive outlier detection:
// everything a decision reads, and nothing that moves bytes.
//
// # Pipeline
//
// Filters, then scorers, then a picker, each small and named in the
// configuration (Config):
//
//   - filters: alive (live in the index, with an endpoint), model (serves the requested model),
//     healthy (not ejected by outlier detection), bounded_load (no pod may take
//     more than BoundedLoadFactor x its fair share of in-flight requests, so a
//     hot shared prefix never piles everything onto one pod), new_session
//     (a session's first request goes to the least loaded pods; off by
//     default);
//   - scorers, all in milliseconds: prefix (the exact cached prefix from the
//     index, weighted by tier for the best candidates, shortens prefill),
//     queue (prefill tokens already routed to the pod and not yet past their
//     first byte: the router's own in-flight accounting, fresher than engine
//     metrics), running (a small cost per request in flight), kv_util (a
//     cost as the pod's scraped KV cache fills past 80%), affinity (a bonus
//     for the pod a session is pinned to, withdrawn for a "thick" session's
//     concurrent excess so it splits across pods);
//   - picker: the lowest expected time to first token (gorgo's model:
//     queue + prefill of the uncached tokens + overhead); candidates within
//     TieMs of the best are tied, and the tie goes to the highest
//     rendezvous hash of the request's session id (else its prompt, else its
//     request id) and the pod: with no prefix anywhere requests spread by
//     key, never pile on the first pod, and every replica of the region
//     decides alike.
//
// # Replicas
//
// Several controllers (replicas) serve one region, each with the full
// index. What their decisions must agree on they exchange (the controller
// carries it over the region's gossip): each replica's own in-flight
// accounting per pod (Registry.SetPeerLoads; Pod.InFlight counts this
// replica's requests and the others' last reports, so a late report keeps
// a pod looking busy, never idle), and the session pins
// (Sessions.ShareWithPeers, TakePins, NotePeer), so that a session's next
// turn finds its pod whichever replica it reaches. New sessions are placed
// alike by the deterministic ties.
//
// The pipeline costs little more than its lookup (BenchmarkDecide): what a
// decision needs of each pod's announcement (profile and model, as
// numbers; whether it has an endpoint) is worked out when the pod is
// announced and kept beside its load counters in one cache line; the
// per-pod filters run as one pass; the ttft picker takes pods a depth
// group at a time, deepest first (reading a group from the index only when
// its floor can beat the best so far), bounds each member from the cache
// line the filters read, reads and scores further only those that bound
// does not rule out, and estimates only those a tighter bound does not
// rule out of the best few or of the tie (within TieMs of the best, where
// the hash may pick any of them) (pricing.go), exactly as estimating
// every pod would decide; and DecideInto and PlaceInto reuse the caller's decision,
// allocating nothing.
//
// Baseline pickers (round_robin, least_loaded, session_hash) run behind the
// same filters, so operators can compare like with like, and so do the fair
// baselines, which know each pod's hardware: weighted_round_robin (stride
// scheduling by prefill speed), weighted_least_loaded and
// least_outstanding_tokens (in flight, or prompt tokens in flight, per unit
// of speed), bounded_affinity (consistent hashing with bounded loads,
// speed-weighted; its ring has a naive reference in the tests) and
// precise_prefix (llm-d's precise prefix-cache scorer with its KV and queue
// scorers and default weights; it reads the waiting queue the scraper sets
// with Pod.SetEngineQueue). The explanation of a decision (POST /v1/route) is
// produced by the same pipeline as the decision itself.
//
// Forwarded counts the prefill work a controller has sent to each remote
// region that the region's latest summary cannot show yet; Adjust adds it
// to the remote candidates before Place, so requests placed between two
// summaries do not all go to a region that looked idle when it last
// published. Trend does the same for what other origins and the region's
// own users sent there: it remembers this region's backlog over the last
// minute, and Trend.Adjust charges a remote candidate the growth of that
// backlog since the candidate's summary was built (a rise here is the best
// estimate of the unseen rise there; a fall is not credited, since moving
// a session moves its later turns with its cache).
//
// # Invariants
//
//   - A pod removed from the registry, dead in the index or without an
//     endpoint is never chosen.
//   - An ejected pod is never chosen while any healthy pod can take the
//     request; at most MaxEjectionPercent of the pods (at least one) are
//     ejected at once.
//   - Deciding and placing change no accounting: only Admit counts a request
//     (and its session) on a pod, until its ticket is done; only
//     Placement.Record counts a placement in the remote-share guardrail, and
//     only Forwarded.Add a forward.
//   - Decisions read snapshots (index, registry) and a given clock; they
//     never wait on I/O and never call time.Now themselves.
//
// # Imports
//
// route imports index (the block index), gorgo (the cost model) and nothing
// else of ours; it must not import net/http, Kafka or Prometheus packages
// (a root test checks its dependency list): the controller (package
// regional) owns sockets, metrics and time.
package route
