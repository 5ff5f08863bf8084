// Package summary is the compact, approximate description of what a region's
// pods cache, as gossiped to the other regions: a filter over a hash-sampled
// subset of the region's block hashes, its load and free capacity per
// hardware profile, a generation and build time, and what a reader needs to
// interpret it (block size, hashing scheme, models). A remote controller
// estimates from it how many leading blocks of a request's chain the region
// holds (Depth), and turns that into a gorgo.Candidate (Candidate), priced
// at the pool of the region's pods, one per hardware profile, that would
// serve the request soonest (Price).
//
// # Sampling
//
// At 64 KiB per region and about 9.5 bits per filter entry, a summary holds
// about 55,000 hashes, so a region holding 1M blocks must keep about one in
// 18. Builder and reader cannot agree on depths (the index does not know a
// block's position in its chain), so the rule is on the hash: keep h iff
// h*M <= 2^64/S (Sampler). Along any chain the sampled positions are then a
// Bernoulli(1/S) pattern: gaps are geometric with mean S, not exactly S.
// Build picks the smallest S whose summary fits the byte budget.
//
// # Filter
//
// A 3-wise binary fuse filter with 8-bit fingerprints (Graf and Lemire,
// 2022): no false negatives, a false-positive rate of about 2^-8, about 9.0
// to 9.6 bits per key at these sizes, three memory reads per lookup.
//
// # Depth estimate and its bias
//
// A region's held set is prefix-closed along any chain (a pod holding H_i
// holds H_0..H_{i-1}), so membership of the sampled positions is monotone
// along the query chain, and a binary search finds the drop with O(log n)
// filter probes. Its answer is checked against the VerifyBefore sampled
// positions before it (a false positive far beyond the drop fails the check
// and the consecutive scan answers instead).
//
// Depth returns the bracket [Lower, Upper]: Lower is one past the last
// sampled position found present, Upper the first found absent. Decisions
// use Lower. It never over-states the match without a false positive, while
// the midpoint would over-state it half of the time; over-stating is the
// costly direction (a request crosses a region boundary, pays the RTT and
// then the prefill it expected to skip), under-stating only forgoes a gain
// that the forwarding margin would often have refused anyway. The price:
// Lower is below the true depth by the number of blocks after the last
// sampled position inside the true prefix, about S-1 on average (geometric,
// so p99 is about 4.6 S); TRADEOFF.md gives the measured figures.
//
// # Encoding
//
// A versioned little-endian binary encoding with a CRC-32C trailer (see
// codec.go); Decode accepts only canonical encodings and reports what is
// wrong and where with a *DecodeError.
//
// # Invariants
//
//   - The filter has no false negatives: every sampled hash of the held set
//     is found.
//   - On prefix-closed data and without a false positive at the query's
//     sampled positions, Depth equals the naive scan of the same samples
//     and brackets the true depth (Lower <= true <= Upper); false positives
//     can only raise it.
//   - A built summary fits BuildConfig.MaxBytes, or Build fails with
//     ErrTooLarge; it is never cut to fit.
//   - Decoding what MarshalBinary wrote gives the summary back, and Decode
//     rejects every non-canonical or corrupted body without panicking.
//
// The package is pure: no goroutines, no I/O, time only as given. It imports
// index (to read hashes for FromIndex) and gorgo (for Candidate) and nothing
// else of ours, nor anything that pulls in net/http, Kafka or Prometheus
// (the root's deps_test.go checks both); gossip carries it, and the
// simulator builds it, without knowing how.
package summary
