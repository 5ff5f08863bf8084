// Package gorgo is Meridian's cost model: for each place a request could be
// served — a pod of the local region, or a remote region — it estimates the
// time to first token, and it picks the cheapest place with guardrails, and
// says why.
//
// In the spirit of GORGO (arXiv 2602.11688), every term is in milliseconds:
//
//	TTFT(c) = w_queue * queue(c) + prefill(c) + overhead(c) + w_rtt * RTT(c) + w_egress * egress(c)
//
//	queue(c)    = pending prefill tokens ahead of us at c x rate(c)     (FIFO prefill)
//	            + slot wait when c already runs MaxConcurrency requests
//	prefill(c)  = u x rate(c) x (1 + (cached + u/2) / AttnTokens)
//	              u = prompt tokens - cached tokens at c  (attention: linear when AttnTokens is 0)
//	RTT(c)      = 0 at home; the measured (or configured) round trip to c's region
//	egress(c)   = bytes leaving the region x $/GB x (ms a dollar is worth)
//
// When remote regions are among the candidates, each one also pays
// w_cold x the prefill at c of the tokens it computes beyond the warmest
// candidate's: work the fleet would redo by sending the request where its
// prefix is not, which delays the requests behind it
// (Config.ColdWorkWeight). A faster pod computing as many tokens pays
// nothing. Within a region it is off.
//
// rate(c) is the prefill time per token of c's hardware profile (measured
// by the operator: Config.Profiles, else DefaultProfiles), times the pod's
// correction when a Calibrator has learnt one from observed TTFTs: the
// fit pooled over the profile's pods, times the pod's own departure from
// it where its own fit proves one. The Calibrator moves a rate only within a band, by bounded
// steps, with outliers rejected and in proportion to its confidence, so
// noise or load cannot send traffic somewhere (GORGO's autotune blew up to
// 77 ms/token for one replica; see Calibrator).
//
// The load signal is the router's own count of in-flight prefill tokens, not
// the engines' metrics: GORGO found engine metrics 10-30 s stale, and that
// counting only uncached queued tokens hid load; callers pass raw pending
// prefill work.
//
// # Guardrails (GORGO's failure modes)
//
//   - A remote candidate wins only if it beats the best local one by
//     ForwardMarginMs and by ForwardMarginFrac of the local estimate: noise in
//     remote estimates must not cause forwarding (GORGO was worst at p95 with
//     short prompts and little reuse).
//   - A remote region may take at most MaxRemoteShare of this region's
//     traffic over a sliding window (ShareTracker): latency-only decisions
//     must not pull everything to one place (GORGO's reward hacking sent
//     100% to the nearest replica and end-to-end p95 got 4.8x worse).
//   - Remote cache estimates come from summaries that age: full weight until
//     FreshFor, linearly less until IgnoreAfter, then ignored.
//
// Residency is not this package's job: callers filter candidates to the
// allowed regions before any cost is computed, and Choose never sees a
// forbidden one.
//
// The package is pure (no I/O, no goroutines, time only as given) and
// imports nothing of ours (its rule would allow index's types, nothing
// else), nor anything that pulls in net/http, Kafka or Prometheus (the
// root's deps_test.go checks both).
package gorgo
