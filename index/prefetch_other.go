//go:build !amd64

package index

import (
	"sync/atomic"
	"unsafe"
)

// prefetchLines loads the table slots of lines[:slots] (see the amd64
// version, which prefetches every line for writing): the loads do not
// depend on each other, so the CPU overlaps their misses.
func prefetchLines(lines []unsafe.Pointer, slots int) {
	var acc uint64
	for _, p := range lines[:slots] {
		acc += (*atomic.Uint64)(p).Load()
	}
	if acc == 1 {
		prefetchSink.Store(acc)
	}
}

// prefetchRead loads a word at each address in lines (which must point to
// 8-byte aligned words): the loads do not depend on each other, so the CPU
// overlaps their misses.
func prefetchRead(lines []unsafe.Pointer) {
	var acc uint64
	for _, p := range lines {
		acc += (*atomic.Uint64)(p).Load()
	}
	if acc == 1 {
		prefetchSink.Store(acc)
	}
}
