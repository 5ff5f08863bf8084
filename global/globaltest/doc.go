// Package globaltest runs clusters of global nodes in one test process: real
// Raft TCP transports and admin HTTP servers on 127.0.0.1 ephemeral ports,
// over a Network that can partition nodes (refusing new connections across
// the cut and closing the ones that cross it), kill and restart them, and
// wait for a leader or for a condition.
//
// Invariants:
//   - Nothing is faked above the network: each node is opened by
//     global.Open as in production (with the faster TestTiming), on its own
//     data directory, so a test sees real elections, replication and leader
//     forwarding.
//   - A connection leaves every set that tracks it when it closes, so a
//     partition closes exactly the connections that cross the cut; the
//     test's own admin clients bypass the Network and are never cut.
//   - NewCluster registers Close with the test, so every node, server and
//     goroutine it started is gone when the test ends. Waits are for a
//     condition (polled, or signalled by a leader change) until a
//     deadline, never a fixed sleep.
//
// It is test scaffolding: only tests import it (global's external tests,
// regional's and cmd's), never production code. It imports global and
// nothing else of ours.
package globaltest
