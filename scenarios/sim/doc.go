// Package sim is Meridian's multi-region simulator: a discrete-event
// simulation, on a virtual clock, of a fleet of inference pods in several
// regions serving a trace or a synthetic workload, once per routing policy,
// so the policies can be compared side by side on the same traffic
// (`meridian sim`), at one load or swept over loads and seeds.
//
// # What is real and what is modelled
//
// The decisions are Meridian's own code, not a re-implementation: every
// region of every world has a real index.Index fed with the pods' cache
// events, a route.Registry whose Pods carry the router's own in-flight,
// outstanding-token and prefill-backlog accounting (Decider.Admit,
// Ticket.FirstByte, Ticket.Done), a gorgo.Model with its Calibrator fed the
// observed TTFTs per pod, and a route.Decider (Decide within a region,
// Place across regions, with its Speculation and Sessions) whose clock is
// the world's virtual clock. Regions publish real summary.Summary values
// built from their index every SummaryInterval; the other regions receive
// them half an RTT later and read remote candidates through
// gossip.RegionsView.Candidates (priced with the origin's cost model at
// each region's soonest pool, as the controller does), so remote
// estimates are as stale as in production; as the controller does, an origin adds the prefill it has
// forwarded that a summary cannot show yet (route.Forwarded), and releases
// it at the first byte, and charges each remote candidate its own
// backlog's growth since the summary was built (route.Trend); a region's
// summary reports its pods' backlog as the controller's does
// (route.BacklogTokens). Residency is a real residency.Policy (ResidencyPolicy for the
// default regions decides exactly as deploy/policies/example.yaml).
//
// Modelled: the network (a static RTT matrix; a forwarded request pays half
// an RTT each way, and its prompt and answer bytes count as egress) and the
// pods. A pod's engine (engine.go) is vLLM V1's scheduler with chunked
// prefill, not the router's cost model: each step batches a token of every
// running decode and up to 8,192 - decodes prefill tokens (first in, first
// served), and costs a fixed part, the prefill tokens' linear work, their
// attention (growing with their position) and the decodes' KV reads
// (growing with batch and context), with constants from published vLLM /
// NIM / TensorRT-LLM figures cited beside them. At most max_num_seqs
// requests run; the rest wait FIFO, as does a request whose blocks do not
// fit the KV cache (kvCache: running requests' blocks pinned, unreferenced
// blocks evicted LRU, tail of a chain first). Every change of a pod's cached
// set reaches its region's index as Register/Evict after a random
// EventDelayMin..EventDelayMax, in order per pod. The router believes each
// pod is what its profile says: a single-request benchmark of the engine
// fitted to gorgo's smooth model (enginePerf.routerProfile); ModelError
// makes every pod's engine off that belief by up to a fraction either way.
//
// # Policies
//
// Today's routers, blind to hardware: round_robin, least_loaded,
// session_affinity (rendezvous hash of the session id). The fair baselines,
// hardware-aware, each a picker of regional/route: weighted_round_robin,
// weighted_least_loaded, least_outstanding_tokens, bounded_affinity
// (consistent hashing with bounded loads) and precise_prefix (llm-d's
// precise prefix-cache scorer with its KV and queue scorers at its guide's
// weights, scraping every 50 ms); all of these run in the origin region,
// whatever residency says (their violations are counted). gorgo is GORGO's
// published policy as one central proxy over every pod of the regions
// residency allows (gorgo.go), a simulator baseline only. cache_local is
// Meridian's decision layer in the origin region (a request its origin may
// not serve, or whose origin's pods are down, goes to the nearest region
// that may); meridian is the whole of Meridian: Place compares the best
// local pod with the remote regions residency allows, and the receiving
// region re-checks residency and picks its pod. Its ablations turn one part
// off (AblationNames). upper_bound is a reference: one cache pool of the
// fleet's total size shared by every pod, routed least-loaded.
//
// # Workloads and load
//
// A Mooncake-format trace (ReadTrace; origin region and residency
// attributes assigned per conversation, keyed by its first two hash ids;
// with Window, each seed replays its own window of it), or a synthetic one:
// coding-agent sessions (closed loop), RAG-like shared documents, short
// prompts with little reuse, large shared documents homed in one region
// (shared-docs); under a scenario (skew, roaming, failover, long-rtt: see
// scenario.go). Load is labelled by prefill utilisation (load.go):
// arrivals are scaled so the workload's prefill work, its cached prefixes
// being what a pooled cache of the fleet's size would hold, is the asked-for
// fraction of the fleet's prefill capacity; a run reports the utilisation
// it achieved.
//
// # Report
//
// Per policy (Result): block and token hit rates and the fraction of the
// upper bound's, TTFT p50/p95/p99 and end-to-end p95 as the client sees
// them (network included), requests served outside their origin region and
// their egress (GB and $), residency violations, load dispersion (the mean
// over samples every SampleInterval of variance / mean of the per-pod count
// of requests queued or running) and achieved utilisation. Report.WriteJSON
// writes Rows: one JSON array with one object per policy holding exactly
// policy, hit_rate (blocks, 0..1), ttft_p50_ms, ttft_p95_ms, ttft_p99_ms,
// e2e_p95_ms, cross_region_requests, egress_gb, residency_violations and
// load_dispersion. A sweep (Sweep) aggregates each (load, policy) over its
// seeds: means, a 95% confidence interval of the mean TTFT p95, violations
// summed; SweepReport.WriteJSON writes {"runs": [...]}. Charts are SVG with
// both axes and a distinct colour, dash pattern and marker per policy;
// WriteHTML writes one self-contained page with the run's parameters,
// Meridian against the best fair and peer baselines, and every chart.
//
// # Invariants
//
//   - Deterministic: the same Config gives the same Report (but wall time),
//     whatever the number of worlds run in parallel.
//   - A world is single-threaded and owns everything in it; worlds share only
//     immutable inputs (the open-loop requests, the fleet, the residency
//     policy).
//   - The residency-safe policies (meridian and its ablations, cache_local,
//     gorgo, upper_bound) never serve a request in a region its residency
//     rule forbids.
//   - The event queue orders like a sorted list by (time, scheduling order);
//     the KV cache behaves like its naive reference (both property-tested);
//     the engine prefills first in, first out and never faster than a
//     request's own tokens (property-tested).
//
// Run and Sweep start at most Options.Parallel worlds at once (each built
// when a worker takes it) and one goroutine for the progress bar, and
// return when all have ended. The package imports index, gorgo, residency,
// regional/route (the decision core), regional/gossip, regional/summary and
// scenarios/enginesim (for the KV capacity of the hardware profiles), and
// must not import regional itself (the server), global, dr or cmd: a world
// decides with the controller's decision code but owns its own clock and
// network. Nothing imports it but cmd/meridian and the other scenarios
// (fleet and demo take its default regions and round-trip times, so every
// scenario uses the same distances).
package sim
