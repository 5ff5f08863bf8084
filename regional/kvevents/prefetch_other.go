//go:build !amd64

package kvevents

import (
	"sync/atomic"
	"unsafe"
)

// prefetchSink keeps prefetchLines's loads from being optimized away; the
// store is atomic because every Rekeyer in the process shares it.
var prefetchSink atomic.Uint32

// prefetchLines loads a byte at each address in lines (see the amd64
// version, which prefetches them): the loads do not depend on each other,
// so the CPU overlaps their misses.
func prefetchLines(lines []unsafe.Pointer) {
	var acc uint8
	for _, p := range lines {
		acc += *(*uint8)(p)
	}
	if acc == 1 {
		prefetchSink.Store(1)
	}
}
