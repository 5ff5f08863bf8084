// Package regional is one region's controller: everything around the
// routing decision that touches the network, the broker or the clock. It
// serves the HTTP API (the OpenAI-compatible streaming proxy, POST
// /v1/route for the decision alone, /v1/models, health, readiness and
// metrics); ingests the region's KV events from Kafka into the block index
// and the pod registry; scrapes the pods' vLLM metrics (a secondary load
// signal: the router's own in-flight accounting is fresher); wires the
// region to the others (residency and region states from the Raft control
// plane of package global, the audit log of global/audit, this region's
// summary and the others' over regional/gossip, forwarding to a remote
// region's controller); and owns the controller's lifecycle (Config, Deps,
// Open, Close, Run).
//
// # Replicas
//
// A region runs one or several controllers (replicas), all serving: each
// ingests the region's topic into its own full index (its own consumer
// group) and has its own Raft identity and audit chain. What their
// decisions must agree on they exchange over the gossip pool, every
// gossip.replica_interval (replicas.go): each one's in-flight requests and
// pending prefill per pod (added to the others' accounting; a late report
// keeps a pod busy, never idle; a report stands until the replica's next
// one, or until it leaves the pool) and the session pins each made, so that a session's next turn finds its
// pod whichever replica it reaches; ties between pods are broken by a hash
// of the session, so new sessions are placed alike. One replica per region
// publishes the region's summary (the first by id of those publishing; the
// next takes over when it stops), and each advertises its forward address
// only once its index has caught up (it is ready only then). Shutdown is the graceful stop (SIGTERM): /readyz 503 at once,
// requests still taken for shutdown.drain_delay, then the listener closes,
// requests in flight finish within shutdown.grace (those still unanswered
// then get a retryable 503 shutting_down), gossip is left and Raft
// leadership handed over. Kill stops as a crash would (drills, tests).
//
// The decision pipeline itself (filters, scorers and picker within the
// region, placement across regions, session affinity, speculation, outlier
// ejection) lives in regional/route, a pure package driven by explicit
// inputs and a clock, which imports no net/http, Kafka or Prometheus. This
// package feeds it snapshots and acts on its answer.
//
// # Invariants
//
//   - No request is served in a region its residency rule forbids. With a
//     control plane (the Raft tier, or a policy file alone) each request is
//     decided on one ControlView, a policy and region states from the same
//     commit; without a usable policy nothing is served (503). A denial is
//     answered 451 residency_denied naming the rule. A request forwarded in
//     is believed only with the controllers' hop token, is evaluated again
//     with its origin region, and is served here or nowhere: a request
//     crosses a region boundary at most once. A controller without a
//     control plane serves its own region only and refuses forwarded
//     requests.
//   - A request crosses to another region only after its audit record is
//     durable: if the append fails it is served here when this region may
//     serve it, and refused otherwise. Without an audit log nothing is
//     forwarded. Denials, requests forwarded in and fallbacks are recorded
//     too (a failure there is counted and logged: nothing crossed).
//   - Every privileged action through the admin API (the Raft tier's
//     writes: policy apply, failover, membership; gossip key rotation) and
//     what the Raft leader does on its own is an admin_action record in
//     this controller's audit log, written before it takes effect, with
//     the caller's certificate identity or the admin token as its actor;
//     one that cannot be recorded is refused (503 audit_unavailable).
//     Raft therefore requires an audit log (audit.dir).
//   - The request path never waits on Raft, Kafka or gossip: it reads the
//     index, the registry, the ControlView and gossip's RegionsView, all
//     snapshots swapped atomically. A dead broker makes the index stale, a
//     lost quorum keeps the last committed policy and region states; either
//     way a controller that has caught up with its topic stays ready, and
//     /readyz says what is stale.
//   - Ingestion is idempotent per (partition, offset); a malformed message
//     is counted by reason, logged once per reason per minute and skipped,
//     never stopping ingestion.
//   - Open starts every goroutine the controller has and Close stops them
//     all: it shuts the HTTP server down first (requests in flight finish
//     until the context ends), cancels ingestion, sweeping, scraping and
//     the other background loops, closes gossip, the audit log (its last
//     checkpoint goes to Raft) and the Raft node, and waits for every
//     goroutine. Close is safe to call twice; the tests check for leaked
//     goroutines.
//   - Metrics go to the registry given in Deps (a new one by default),
//     never the default one, so several regions run in one process.
//   - A configuration reload (Controller.Reload: SIGHUP, or a watched file
//     whose content changed; reload.go) is all or nothing: every part that
//     can change live is read and checked before any changes, and one that
//     does not load leaves the running configuration as it was. A policy
//     or API keys change is an admin_action record before it takes effect.
//
// # Console
//
// Every controller with an admin listener serves a read-only console at
// /ui on it (regional/console; console.go here adapts the controller's
// state): the page is static, its JSON (/ui/api/state) needs the admin
// token, as the rest of the admin API does. The console samples the
// controller's own metrics into a bounded ring and is told of each audit
// record the request path writes and of each region state change.
//
// It may import index, gorgo, residency, global, global/audit and its own
// sub-packages route, tokenize, kvevents, summary, gossip, auth,
// discovery and console. It must not import regional/kvbridge (a separate process that shares only the Kafka
// topic), dr, scenarios, cmd or any test-scaffolding package; global must
// not import it. Only the scenarios and cmd import it (tests aside).
package regional
