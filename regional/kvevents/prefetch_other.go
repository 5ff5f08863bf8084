//go:build !amd64

package kvevents

import "unsafe"

// prefetchSink keeps prefetchLines's loads from being optimized away.
var prefetchSink uint8

// prefetchLines loads a byte at each address in lines (see the amd64
// version, which prefetches them): the loads do not depend on each other,
// so the CPU overlaps their misses.
func prefetchLines(lines []unsafe.Pointer) {
	var acc uint8
	for _, p := range lines {
		acc += *(*uint8)(p)
	}
	if acc == 1 {
		prefetchSink = acc
	}
}
