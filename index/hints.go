package index

import "sync/atomic"

// Depth hints: where the pods dropped out along a chain the last time it
// was looked up, kept per first block. A lookup of a chain whose blocks
// are not in the CPU caches waits for one round of cache misses per round
// of probes (see Lookup); the answer's drop-off depths change far more
// slowly than lookups come, so a lookup that finds a hint for its first
// block probes H_{d-1} and H_d of every hinted depth d in its first round:
// when they still hold, every interval is final after that round. A hint
// only chooses where to probe: the answer is made of what the probes read,
// by the same splitting as without one, so a stale, torn or foreign hint
// (another chain with the same first block, or one sharing its entry)
// costs probes, never correctness.
//
// The table is direct-mapped by the first block's hash, hintEntries
// entries of hintDepths depths, 16 bits each (deeper depths are not
// hinted), about 160 KB per index. Lookups write an entry only when its
// depths changed, so concurrent lookups of stable chains only read it.
const (
	hintEntries = 4096
	hintDepths  = 16
	hintMaxLen  = 1<<16 - 1
)

type hint struct {
	key atomic.Uint64
	// depths holds hintDepths 16-bit depths, ascending, two per word,
	// the first in the low half; 0 ends the list.
	depths [hintDepths / 2]atomic.Uint32
}

type hints [hintEntries]hint

func (h *hints) entry(first uint64) *hint {
	return &h[(first*fib)>>(64-12)&(hintEntries-1)]
}

// get writes the hinted depths for a chain starting with first, ascending,
// to dst and returns how many; 0 when there is no hint.
func (h *hints) get(first uint64, dst *[hintDepths]int32) int {
	e := h.entry(first)
	if e.key.Load() != first {
		return 0
	}
	n := 0
	for i := range e.depths {
		v := e.depths[i].Load()
		lo, hi := int32(v&0xffff), int32(v>>16)
		if lo == 0 {
			break
		}
		dst[n] = lo
		n++
		if hi == 0 {
			break
		}
		dst[n] = hi
		n++
	}
	return n
}

// set records depths (ascending, at most hintDepths, each in [1,
// hintMaxLen]) as the hint for a chain starting with first, unless it is
// already there.
func (h *hints) set(first uint64, depths []int32) {
	var words [hintDepths / 2]uint32
	for i, d := range depths {
		words[i/2] |= uint32(d) << (16 * (i % 2))
	}
	e := h.entry(first)
	same := e.key.Load() == first
	for i := range words {
		if e.depths[i].Load() != words[i] {
			same = false
			e.depths[i].Store(words[i])
		}
	}
	if !same {
		e.key.Store(first)
	}
}

// hintProbes plans the first round of a lookup of an n-block chain (n >=
// 2) with the hinted depths: the positions d-1 and d of each, inside (0,
// n), merged with even evenly spread positions, ascending and distinct,
// at most len(out). It returns how many it wrote.
func hintProbes(n int32, depths []int32, even int, out []int32) int {
	k := 0
	add := func(p int32) {
		if p <= 0 || p >= n || k == len(out) {
			return
		}
		// Insert p in order unless present (out is short).
		i := k
		for i > 0 && out[i-1] > p {
			i--
		}
		if i > 0 && out[i-1] == p {
			return
		}
		copy(out[i+1:k+1], out[i:k])
		out[i] = p
		k++
	}
	for _, d := range depths {
		add(d - 1)
		add(d)
	}
	for j := 1; j <= even; j++ {
		add(int32((int64(n) * int64(j)) / int64(even+1)))
	}
	return k
}
