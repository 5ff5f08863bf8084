// Command meridian is the one binary of Meridian: the regional controller
// (controller), the operator CLI (policy, failover, audit, dr, route,
// events), the KV-event bridge (kv-bridge), the engine simulator
// (engine-sim), the multi-region simulator (sim), a development Kafka
// broker (kafka-dev) and the demo.
//
// Its one job is wiring: main only builds the CLI app, wires a
// signal-cancelled context and maps errors to exit codes; each subcommand
// lives in its own file, turns flags, environment and files into a
// package's configuration, and calls into that package (regional.Run,
// demo.Run, sim.Execute, global's and audit's clients, ...) to do the work.
//
// Invariants:
//   - Only main calls os.Exit. The exit status is 0 on success, 2 for a
//     usage error (usageError: a bad flag, argument or configuration), 3
//     when audit verify finds problems or the demo sees a broken invariant,
//     and 1 for any other failure (dr check's blocking findings and an
//     invalid policy file included).
//   - Every long-running command stops on SIGINT or SIGTERM through the
//     context, closing what it opened before returning.
//   - Secrets (admin tokens, the audit HMAC key) come from flags, files or
//     the environment; none is compiled in.
//
// It may import every package of ours and is the only one that may;
// nothing imports it.
package main
