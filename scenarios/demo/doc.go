// Package demo is `meridian demo` and `make demo`: a whole multi-region
// Meridian system in one process on loopback (scenarios/fleet: a
// Kafka-protocol broker, engine simulators, three controllers forming the
// Raft and gossip clusters, the example residency policy, audit logs),
// driven by a traffic generator and shown live.
//
// The generator runs multi-turn sessions from every region: each turn
// re-sends the whole history behind a system prompt shared by every session
// of its application, streamed, so time to first token is measured on the
// client. Tenants include an EU health tenant whose PHI enters in US regions
// and must be served in the EU, public traffic from the EU that may be served
// in the US, sessions that sometimes enter at another region (where their
// history is not cached), and a few embargoed tenants the policy refuses.
// After FailoverAfter one region is failed over through the Raft tier, probes
// measure how long until every request that may be served elsewhere is, and
// the region is recovered FailoverFor later.
//
// Invariants checked on every answer, not assumed: a request is never served
// outside the regions the residency policy allows for its tenant, data class
// and the region it entered at (the policy is evaluated here with package
// residency and compared with X-Meridian-Region: Result.ResidencyViolations
// must be 0); at the end every controller's audit log is sealed and verified
// against the audit checkpoints committed in Raft.
//
// The live view is a table on the terminal (redrawn with ANSI escapes on a
// terminal, periodic plain lines otherwise) and a read-only status page
// (HTML and JavaScript embedded with go:embed, polling a JSON endpoint).
//
// Requests and the failover go through the system's public interfaces (the
// controllers' HTTP API, the admin API's failover calls); region states,
// audit records and checkpoints are read from the controllers in process.
// The package imports what it drives or checks against (regional,
// residency, global for its admin client and region states, global/audit
// for verification) and the other scenarios (fleet, enginesim, sim); it
// must not import dr. Nothing but cmd imports it.
package demo
