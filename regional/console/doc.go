// Package console is a controller's read-only operator console at /ui:
// one HTML page with its style and script inline, embedded in the binary
// (no build step, nothing loaded from elsewhere: its Content-Security-Policy
// allows its own script, by hash, and fetches to its own origin only), and
// the JSON it polls, GET /ui/api/state.
//
// It shows the region and its pods, the request rate, prefix cache hit rate
// and time to first token over the last 15 minutes, Raft and gossip health,
// residency compliance (crossings and denials by rule, the violations the
// controller caught), recent cross-region decisions and denials, and
// failover events.
//
// The time series are sampled on a ticker (Run, every Config.Interval)
// from the controller's own metrics registry, the series /metrics exports,
// into a Ring of fixed size (Window/Interval points), so memory is bounded
// however long the controller runs. What the controller knows now (pods,
// regions, Raft, gossip) is read from its snapshots when the state is
// asked for (Config.Live); decisions and region state changes are handed
// to the console as they are recorded (Record, RecordFailover) and the
// last 50 of each are kept.
//
// The controller serves the console on its admin listener, where an
// operator already authenticates: the page itself holds no data, and the
// JSON needs the admin API's bearer token (Handler's auth), which the page
// asks for and keeps in the browser tab's session storage.
//
// It imports nothing of ours (regional adapts its state to the types
// here); only regional imports it.
package console
