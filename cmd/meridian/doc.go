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
//   - Only main calls os.Exit. Every command speaks one grammar (grammar.go,
//     `meridian help exit-codes`, `meridian help flags`): exit 0 on success,
//     1 for findings or a failed operation, 2 for a usage or configuration
//     error (usageError; urfave/cli's own flag and command errors are
//     mapped to it), 3 for a verification failure (audit verify finds
//     tampering, the demo sees a broken invariant). A flag name means one
//     thing in every command, and a secret the controller also reads comes
//     from the controller's environment variable.
//   - Every long-running command stops on SIGINT or SIGTERM through the
//     context, closing what it opened before returning.
//   - Secrets (admin tokens, the audit HMAC key) come from flags, files or
//     the environment; none is compiled in.
//
// It may import every package of ours and is the only one that may;
// nothing imports it.
package main
