// Package meridian is the root of Meridian, a multi-region, KV-cache-aware
// traffic controller for LLM inference. The root package holds no code; its
// tests enforce repository-wide rules: every package has a package comment
// (pkgdoc_test.go), and every package has an import rule it keeps
// (deps_test.go: a table with one rule per package; a new package must add
// its own). tools.go, never built, pins the module versions the packages
// use. The root imports nothing of ours, and nothing imports it.
//
// Data flows one way, and the imports follow it: the pure core (index,
// residency, gorgo) imports nothing of ours (gorgo at most index's types);
// the regional controller builds on the core and reads the global tier,
// which imports nothing of regional; the scenarios drive the controller;
// only the binary imports everything.
//
//	index           the block index of one region (imports nothing of ours)
//	residency       residency policy files, validation and evaluation (pure)
//	gorgo           the cost model: queue + prefill(uncached) + RTT
//	global          the Raft-replicated tier: policy, region state, failover
//	global/audit    the hash-chained audit log of cross-region decisions
//	regional        one region's controller: server, proxy, ingest, wiring
//	regional/...    route (the decision pipeline), tokenize, kvevents,
//	                summary, gossip, kvbridge
//	dr/...          disaster recovery: check (the DR manifest check of a
//	                deployment), drill (failover drills)
//	scenarios/...   engine simulator, multi-region simulator, fleet, demo
//	cmd/meridian    the one binary
package meridian
