// Package meridian is the root of Meridian, a multi-region, KV-cache-aware
// traffic controller for LLM inference. The root package holds no code; its
// tests enforce repository-wide rules: every package has a package comment and
// imports only in the allowed direction (see deps_test.go).
//
// The layout is flat and domain-named:
//
//	index      the block index of one region (imports nothing of ours)
//	regional   one region's controller: ingest, decision layer, HTTP API
//	global     the Raft-replicated tier: policy, region state, failover, audit
//	residency  residency policy files, validation and evaluation (pure)
//	gorgo      the cost model: queue + prefill(uncached) + RTT
//	dr         disaster recovery: dr/check (manifest check), dr/drill (failover drills)
//	scenarios  workloads, engine simulator, multi-region simulator
//	cmd/meridian  the one binary
package meridian
