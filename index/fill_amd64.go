package index

import (
	"sync/atomic"
	"unsafe"
)

// fillSet writes a Match{ids[slot], blocks} at out for each slot of set,
// in slot order, and returns how many it wrote (see pods.fill); set has
// at most MaxPods/64 words. In assembly for TZCNT, which GOAMD64=v1 code
// cannot use: bits.TrailingZeros64 is BSF there, several µops on AMD
// cores where TZCNT is one or two, and the loop is one per pod. TZCNT
// runs as BSF on a CPU without BMI1, which gives the same answer for
// the non-zero words it is used on. fillSetGo is the reference.
//
//go:noescape
func fillSet(out unsafe.Pointer, ids *[MaxPods]atomic.Uint64, set []uint64, blocks int) int
