package index

import "unsafe"

// prefetchWrite reports whether the CPU has PREFETCHW (CPUID
// 0x80000001:ECX bit 8), a fact of the machine, read once.
var prefetchWrite = cpuHasPrefetchW()

func cpuHasPrefetchW() bool

// prefetchLines prefetches the cache line of each address in lines,
// without waiting for any, for writing where the CPU can (the line then
// comes in exclusively, taken from other cores' caches at once) and into
// every cache level otherwise. Prefetches never fault, so an address that
// has gone stale costs only the traffic. lines[:slots] are table slots; on
// other architectures those alone are loaded.
func prefetchLines(lines []unsafe.Pointer, slots int) {
	if prefetchWrite {
		prefetchw(lines)
	} else {
		prefetcht0(lines)
	}
}

//go:noescape
func prefetchw(lines []unsafe.Pointer)

//go:noescape
func prefetcht0(lines []unsafe.Pointer)

// prefetchRead prefetches the cache line of each address in lines into
// every cache level, for reading, without waiting for any.
func prefetchRead(lines []unsafe.Pointer) { prefetcht0(lines) }
