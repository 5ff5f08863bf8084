// Package sim is Meridian's multi-region simulator: a discrete-event
// simulation, on a virtual clock, of a fleet of inference pods in several
// regions serving a trace or a synthetic workload, once per routing policy,
// so the policies can be compared side by side on the same traffic
// (`meridian sim`).
//
// # What is real and what is modelled
//
// The decisions are Meridian's own code, not a re-implementation: every
// region of every world has a real index.Index fed with the pods' cache
// events, a route.Registry whose Pods carry the router's own in-flight
// and prefill-backlog accounting (Pod.Admit, Ticket.FirstByte, Ticket.Done),
// a gorgo.Model with its Calibrator fed the observed TTFTs, and a
// route.Decider (Decide within a region, Place across regions, with its
// Speculation and Sessions) whose clock is the world's virtual clock.
// Regions publish real summary.Summary values built from their index every
// SummaryInterval; the other regions receive them half an RTT later and read
// remote candidates through gossip.RegionsView.Candidates, so remote
// estimates are as stale as in production. Residency is a real
// residency.Policy (ResidencyPolicy for the default regions decides exactly
// as deploy/policies/example.yaml).
//
// Modelled: the network (a static RTT matrix; a forwarded request pays half
// an RTT each way, and its prompt and answer bytes count as egress) and the
// pods, as scenarios/enginesim models a vLLM pod, with its hardware
// profiles' numbers: at most MaxConcurrency requests run, the rest wait
// FIFO, as does a request whose blocks do not fit the KV cache; prefill is
// one shared FIFO per pod (a prefill starts when the prefill work admitted
// before it is done), then the fixed overhead, then one token per decode
// interval; the KV cache (kvCache) pins running requests' blocks and evicts
// unreferenced blocks LRU, tail of a chain first. Every change of a pod's
// cached set reaches its region's index as Register/Evict after a random
// EventDelayMin..EventDelayMax, in order per pod, as the ingester would
// apply the engine's KV events.
//
// # Policies
//
// round_robin, least_loaded and session_affinity (rendezvous hash of the
// session id) are today's routers: the Decider's baseline policies with no
// filter but liveness, in the origin region, blind to residency (their
// violations are counted). cache_local is Meridian's decision layer in the
// origin region (a request its origin may not serve goes to the nearest
// region that may). meridian is the whole of Meridian: Place compares the
// best local pod with the remote regions residency allows, the receiving
// region re-checks residency and picks its pod. upper_bound is a reference:
// one cache pool of the fleet's total size shared by every pod, routed
// least-loaded (in the origin region, or the nearest allowed).
//
// # Workloads
//
// A Mooncake-format trace (ReadTrace; origin region and residency
// attributes assigned per conversation, keyed by its first two hash ids),
// or a synthetic one: coding-agent sessions (closed loop), RAG-like shared
// documents, short prompts with little reuse; see the generators' comments.
//
// # Report
//
// Per policy (Result): block and token hit rates and the fraction of the
// upper bound's, TTFT p50/p95/p99 and end-to-end p95 as the client sees
// them (network included), requests served outside their origin region and
// their egress (GB and $), residency violations, and load dispersion (the
// mean over samples every SampleInterval of variance / mean of the per-pod
// count of requests queued or running). Report.WriteJSON writes Rows: one
// JSON array with one object per policy holding exactly policy, hit_rate
// (blocks, 0..1), ttft_p50_ms, ttft_p95_ms, ttft_p99_ms, e2e_p95_ms,
// cross_region_requests, egress_gb, residency_violations and
// load_dispersion; WriteCharts writes SVG charts (TTFT CDF, hit rate, load
// dispersion) and report.json with every figure.
//
// # Invariants
//
//   - Deterministic: the same Config gives the same Report (but wall time),
//     whatever the number of worlds run in parallel.
//   - A world is single-threaded and owns everything in it; worlds share only
//     immutable inputs (the open-loop requests, the residency policy).
//   - Meridian's policies (cache_local, meridian, and upper_bound) never
//     serve a request in a region its residency rule forbids.
//   - The event queue orders like a sorted list by (time, scheduling order);
//     the KV cache behaves like its naive reference (both property-tested).
//
// Run starts one goroutine per world (at most Options.Parallel at once)
// and one for the progress bar, and returns when all have ended. The
// package imports index, gorgo, residency, regional/route (the decision
// core), regional/gossip, regional/summary and scenarios/enginesim (for the
// hardware profiles), and must not import regional itself (the server),
// global, dr or cmd: a world decides with the controller's decision code
// but owns its own clock and network. Nothing imports it but cmd/meridian
// and the other scenarios (fleet and demo take its default regions and
// round-trip times, so every scenario uses the same distances).
package sim
