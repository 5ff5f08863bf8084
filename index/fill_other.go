//go:build !amd64

package index

import (
	"sync/atomic"
	"unsafe"
)

// fillSet writes a Match{ids[slot], blocks} at out for each slot of set,
// in slot order, and returns how many it wrote (see pods.fill).
func fillSet(out unsafe.Pointer, ids *[MaxPods]atomic.Uint64, set []uint64, blocks int) int {
	return fillSetGo(out, ids, set, blocks)
}
