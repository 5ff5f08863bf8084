package index

import "unsafe"

// TierCounts counts blocks by the fastest tier a pod holds each in.
type TierCounts [NumTiers]int

// TierProfile reports, for a pod and the blocks of chain it matched (pass
// chain[:match.Blocks]), how many it holds at best in each tier. It is meant
// for the chosen pod only, off the hot path: when the pod has nothing outside
// GPU memory it answers at once; otherwise it reads each block's detail under
// its shard's writer lock. Blocks the pod does not hold are not counted.
func (x *Index) TierProfile(pod PodID, chain []uint64) TierCounts {
	var tc TierCounts
	if !x.pods.live(pod) {
		return tc
	}
	slot := pod.Slot()
	if x.offloaded[slot].Load() == 0 {
		tc[TierGPU] = len(chain)
		return tc
	}
	word, bit := slot/64, uint64(1)<<(slot%64)
	for _, h := range chain {
		s := &x.shards[shardOf(h)]
		s.mu.Lock()
		t := s.tab.Load()
		if _, e, ok := t.find(h, x.stride); ok && t.word(e, x.stride, 1+word).Load()&bit != 0 {
			c, ok := s.details[detailKey{h, uint16(slot)}]
			if !ok {
				c = defaultCounts
			}
			tc[c.best()]++
		}
		s.mu.Unlock()
	}
	return tc
}

// Stats is a point-in-time summary for metrics.
type Stats struct {
	Blocks    int   // distinct blocks indexed
	Bytes     int64 // memory held by the index structures (estimate, see Bytes)
	PodBlocks []int // per slot: blocks the slot's pod holds
	Details   int   // (block, pod) pairs with non-default tier counts
	LivePods  int   // live pods
	Sweep     SweepProgress
}

// detailBytes estimates a Go map entry of details, with its share of empty
// slots and control bytes.
const detailBytes = int64(unsafe.Sizeof(detailKey{})+unsafe.Sizeof(tierCounts{})) * 2

// Stats walks every shard under its writer lock (briefly each) and returns
// counts and an estimate of bytes used: the slot arrays, slab chunks, free
// lists and details of every shard, plus the fixed parts.
func (x *Index) Stats() Stats {
	st := Stats{PodBlocks: make([]int, x.PodCapacity())}
	st.Bytes = int64(unsafe.Sizeof(*x)) + int64(unsafe.Sizeof(*x.shards))
	st.Bytes += int64(x.PodCapacity()) * int64(numShards) * 4 // counts
	st.Bytes += int64(unsafe.Sizeof(*x.hints))
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.Lock()
		st.Blocks += int(s.n)
		st.Details += len(s.details)
		if t := s.tab.Load(); t != nil {
			st.Bytes += int64(len(t.slots))*8 + int64(len(t.chunks))*chunkLen*int64(x.stride)*8
			st.Bytes += int64(cap(t.chunks)) * int64(unsafe.Sizeof([]uint64{}))
		}
		if s.next != nil {
			st.Bytes += int64(len(s.next.slots)) * 8 // a growth in progress
		}
		st.Bytes += int64(cap(s.free))*4 + int64(len(s.details))*detailBytes
		for slot := range st.PodBlocks {
			st.PodBlocks[slot] += int(*x.count(uint64(i), slot))
		}
		s.mu.Unlock()
	}
	for slot := range x.pods.state {
		if x.pods.state[slot].Load()&0xff == slotLive {
			st.LivePods++
		}
	}
	x.sweepMu.Lock()
	st.Sweep = x.sweepProgressLocked()
	x.sweepMu.Unlock()
	return st
}

// AppendHashes appends to dst every indexed block hash for which keep
// returns true (all of them when keep is nil) and held by at least one live
// pod, and returns the extended slice. It walks one shard at a time under
// its writer lock; meant for periodic work such as building the region's
// summary, not for the request path.
func (x *Index) AppendHashes(dst []uint64, keep func(h uint64) bool) []uint64 {
	var alive [maxWords]uint64
	for i := 0; i < x.words; i++ {
		alive[i] = x.pods.alive[i].Load()
	}
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.Lock()
		if t := s.tab.Load(); t != nil {
			for e := uint32(0); e < s.used; e++ {
				h := t.word(e, x.stride, 0).Load()
				if h == 0 || (keep != nil && !keep(h)) {
					continue
				}
				for w := 0; w < x.words; w++ {
					if t.word(e, x.stride, 1+w).Load()&alive[w] != 0 {
						dst = append(dst, h)
						break
					}
				}
			}
		}
		s.mu.Unlock()
	}
	return dst
}
