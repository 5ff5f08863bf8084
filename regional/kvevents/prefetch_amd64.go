package kvevents

import "unsafe"

// prefetchLines prefetches the cache line of each address in lines into
// every cache level, without waiting for any: the instructions retire at
// once, so a run of them keeps many misses in flight where loads would
// stall the CPU once its reorder window filled. Prefetches never fault.
//
//go:noescape
func prefetchLines(lines []unsafe.Pointer)
