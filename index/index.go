package index

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Index is the block index of one region. All methods are safe for
// concurrent use. Lookups never block on writers.
type Index struct {
	words  int // bitmap width in 64-bit words
	stride int // slab words per entry: hash + bitmap
	// growStep is how many slots a growing shard table copies per
	// insertion (defaultGrowStep; tests vary it, and a step larger than
	// any table is the old stop-the-world growth).
	growStep int
	shards   *[numShards]shard
	pods     pods
	// offloaded[slot] counts the pod's (block, pod) pairs held in a non-GPU
	// tier; when it is 0 TierProfile answers without touching the shards.
	offloaded []atomic.Int64
	// counts[slot<<shardBits | i] is the number of shard i's blocks whose
	// bit for slot is set, guarded by shard i's mutex. A pod's counts are
	// contiguous, so writers for different pods never share a line of
	// them (see count).
	counts []int32
	// hints are the depths where pods dropped out of recent lookups, by
	// the chain's first block (see hints).
	hints *hints

	sweepMu sync.Mutex
	sweep   sweepState
}

// New builds an empty index.
func New(cfg Config) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	x := &Index{
		words:     cfg.PodCapacity / 64,
		stride:    1 + cfg.PodCapacity/64,
		growStep:  defaultGrowStep,
		shards:    new([numShards]shard),
		pods:      newPods(cfg.PodCapacity),
		offloaded: make([]atomic.Int64, cfg.PodCapacity),
		counts:    make([]int32, cfg.PodCapacity<<shardBits),
		hints:     new(hints),
	}
	presize := tableBitsFor((cfg.ExpectedBlocks + numShards - 1) / numShards)
	for i := range x.shards {
		s := &x.shards[i]
		s.details = make(map[detailKey]tierCounts)
		if cfg.ExpectedBlocks > 0 {
			s.tab.Store(&table{slots: make([]atomic.Uint64, 1<<presize), bits: presize})
		}
	}
	x.sweep.mask = make([]uint64, x.words)
	return x, nil
}

// count is the number of shard si's blocks whose bit for slot is set.
// Requires that shard's mutex.
func (x *Index) count(si uint64, slot int) *int32 {
	return &x.counts[uint64(slot)<<shardBits|si]
}

// tableBitsFor is the smallest table size (log2) holding n entries within
// the 3/4 load limit.
func tableBitsFor(n int) uint {
	b := uint(minTableBits)
	for uint64(n)*4 > (uint64(1)<<b)*3 {
		b++
	}
	return b
}

// PodCapacity is the number of pod slots.
func (x *Index) PodCapacity() int { return x.words * 64 }

// Register records that pod holds each block of hashes in tier. Registrations
// are reference-counted per (pod, tier): announcing a block twice needs two
// evictions to remove it. It returns ErrUnknownPod, and changes nothing, if
// pod is not live. Hashes are usually a whole chain from one KV event; there
// is no need to sort or group them.
func (x *Index) Register(pod PodID, tier Tier, hashes []uint64) error {
	if tier >= NumTiers {
		return fmt.Errorf("register: bad tier %d", tier)
	}
	if !x.pods.live(pod) {
		return fmt.Errorf("register %v: %w", pod, ErrUnknownPod)
	}
	slot := pod.Slot()
	word, bit := slot/64, uint64(1)<<(slot%64)
	for i, h := range hashes {
		if i%registerPrefetch == 0 {
			x.prefetch(hashes[i:min(i+registerPrefetch, len(hashes))])
		}
		if h == 0 {
			continue // never a chain hash (see Extend); ignore rather than corrupt
		}
		si := shardOf(h)
		s := &x.shards[si]
		s.mu.Lock()
		// Checked under the shard lock: a sweep of this shard either ran
		// before (and we see the pod dying) or runs after and clears our bit.
		if !x.pods.live(pod) {
			s.mu.Unlock()
			return fmt.Errorf("register %v: %w", pod, ErrUnknownPod)
		}
		x.registerLocked(s, si, h, slot, word, bit, tier)
		s.mu.Unlock()
	}
	return nil
}

func (x *Index) registerLocked(s *shard, si, h uint64, slot, word int, bit uint64, tier Tier) {
	t := s.tab.Load()
	i, e, ok := t.find(h, x.stride)
	if !ok {
		if tier != TierGPU {
			x.insertDetail(s, h, slot, tierCounts{}, tier)
		}
		s.insertEntry(t, i, h, x.stride, word, bit, x.growStep)
		*x.count(si, slot)++
		return
	}
	w := t.word(e, x.stride, 1+word)
	cur := w.Load()
	if cur&bit == 0 {
		if tier != TierGPU {
			x.insertDetail(s, h, slot, tierCounts{}, tier)
		}
		w.Store(cur | bit)
		*x.count(si, slot)++
		return
	}
	k := detailKey{h, uint16(slot)}
	old, ok := s.details[k]
	if !ok {
		old = defaultCounts
	}
	x.insertDetail(s, h, slot, old, tier)
}

// insertDetail stores old plus one reference in tier as the (h, slot)
// detail, or drops the detail when the result is the default state.
func (x *Index) insertDetail(s *shard, h uint64, slot int, old tierCounts, tier Tier) {
	c := old
	if c[tier] < ^uint16(0) {
		c[tier]++
	}
	x.setDetail(s, detailKey{h, uint16(slot)}, old, c)
}

func (x *Index) setDetail(s *shard, k detailKey, old, c tierCounts) {
	if c == defaultCounts || c.empty() {
		delete(s.details, k)
	} else {
		s.details[k] = c
	}
	if a, b := old.offloaded(), c.offloaded(); a != b {
		if b {
			x.offloaded[k.slot].Add(1)
		} else {
			x.offloaded[k.slot].Add(-1)
		}
	}
}

// Evict drops one reference of pod to each block of hashes in tier. Evicting
// a block the pod does not hold in that tier is a no-op. The block stays
// indexed for the pod while any tier still holds a reference. Evicting for a
// pod that is no longer live is a no-op too (its sweep clears everything).
func (x *Index) Evict(pod PodID, tier Tier, hashes []uint64) error {
	if tier >= NumTiers {
		return fmt.Errorf("evict: bad tier %d", tier)
	}
	if !x.pods.live(pod) {
		return nil
	}
	slot := pod.Slot()
	word, bit := slot/64, uint64(1)<<(slot%64)
	for i, h := range hashes {
		if i%prefetchBatch == 0 {
			x.prefetchFound(hashes[i:min(i+prefetchBatch, len(hashes))], word)
		}
		si := shardOf(h)
		s := &x.shards[si]
		s.mu.Lock()
		x.evictLocked(s, si, h, slot, word, bit, tier)
		s.mu.Unlock()
	}
	return nil
}

func (x *Index) evictLocked(s *shard, si, h uint64, slot, word int, bit uint64, tier Tier) {
	t := s.tab.Load()
	i, e, ok := t.find(h, x.stride)
	if !ok {
		return
	}
	w := t.word(e, x.stride, 1+word)
	cur := w.Load()
	if cur&bit == 0 {
		return
	}
	k := detailKey{h, uint16(slot)}
	old, ok := s.details[k]
	if !ok {
		old = defaultCounts
	}
	if old[tier] == 0 {
		return
	}
	c := old
	c[tier]--
	x.setDetail(s, k, old, c)
	if !c.empty() {
		return
	}
	*x.count(si, slot)--
	w.Store(cur &^ bit)
	if cur&^bit == 0 && x.bitmapEmpty(t, e) {
		s.deleteEntry(t, i, e, x.stride)
	}
}

func (x *Index) bitmapEmpty(t *table, e uint32) bool {
	for w := 1; w < x.stride; w++ {
		if t.word(e, x.stride, w).Load() != 0 {
			return false
		}
	}
	return true
}

// ClearPod drops every block of a live pod (vLLM's AllBlocksCleared, or an
// engine restart) while the pod stays live. It runs synchronously, one shard
// at a time, skipping shards where the pod holds nothing; lookups proceed
// meanwhile and may see the clear half done.
func (x *Index) ClearPod(pod PodID) error {
	if !x.pods.live(pod) {
		return fmt.Errorf("clear %v: %w", pod, ErrUnknownPod)
	}
	var mask [maxWords]uint64
	slot := pod.Slot()
	mask[slot/64] = 1 << (slot % 64)
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.Lock()
		if *x.count(uint64(i), slot) != 0 {
			x.clearSlots(s, uint64(i), mask[:x.words], 0, ^uint32(0))
		}
		s.mu.Unlock()
	}
	return nil
}

// clearSlots clears the bits of the slots in mask from the slab entries
// [from, to) of s, shard si, deletes entries left empty, drops their tier
// details and fixes the per-slot counts. It returns where it stopped.
// Requires s.mu.
func (x *Index) clearSlots(s *shard, si uint64, mask []uint64, from, to uint32) uint32 {
	t := s.tab.Load()
	if t == nil {
		return s.used
	}
	to = min(to, s.used)
	for e := from; e < to; e++ {
		h := t.word(e, x.stride, 0).Load()
		if h == 0 {
			continue
		}
		hit := false
		for w := 0; w < x.words; w++ {
			if t.word(e, x.stride, 1+w).Load()&mask[w] != 0 {
				hit = true
				break
			}
		}
		if !hit {
			continue
		}
		empty := true
		for w := 0; w < x.words; w++ {
			p := t.word(e, x.stride, 1+w)
			v := p.Load()
			if cleared := v & mask[w]; cleared != 0 {
				forEachBit([]uint64{cleared}, func(b int) {
					slot := w*64 + b
					*x.count(si, slot)--
					k := detailKey{h, uint16(slot)}
					if c, ok := s.details[k]; ok {
						x.setDetail(s, k, c, tierCounts{})
					}
				})
				v &^= mask[w]
				p.Store(v)
			}
			if v != 0 {
				empty = false
			}
		}
		if empty {
			i, _, _ := t.find(h, x.stride)
			s.deleteEntry(t, i, e, x.stride)
		}
	}
	return to
}

// Match is one pod's answer to a lookup: how many leading blocks of the query
// chain it holds.
type Match struct {
	Pod    PodID
	Blocks int
}

// Lookup returns, for the query chain H_0..H_{n-1}, every live pod holding at
// least H_0 with the number of leading blocks it holds, ranked by blocks
// (most first; ties by slot). It appends to dst[:0] and returns the result;
// with cap(dst) >= PodCapacity it allocates nothing.
//
// It exploits prefix closure (a pod holding H_i holds H_0..H_{i-1}). A
// chain of fewer than lookupParallelFrom blocks is searched one drop-off
// depth at a time (lookupSequential); a longer one by intervals refined in
// parallel rounds (lookup). Each pod holding H_0 belongs to one interval
// (l, r]: it holds H_l and does not hold H_r (H_n is held by nobody), so
// its answer, the depth where it drops out, lies in (l, r]. A round picks
// probe positions inside every interval wider than one block
// (lookupRoundProbes in all, at least one per interval, evenly spread),
// loads them, and splits each interval at its probes: a pod goes to the
// piece ending at the first probe it does not hold. An interval (r-1, r]
// is final: its pods matched r blocks. Intervals with no pod are dropped,
// so there are at most K of them, K the number of distinct depths. The
// first round loads H_0 along with its probes and only then fills the
// first interval with the pods holding it, so H_0's cache misses overlap
// the probes' instead of costing a round of their own.
//
// The probes of a round do not depend on each other, so they are loaded
// in passes over all of them (loadBatch) and the CPU overlaps their
// cache misses: a lookup waits for about log(n) rounds of misses, however
// many depths, instead of one pair of misses per probe of the sequential
// search (K log n of them). The bookkeeping costs more instructions, so
// on a chain whose blocks are all in the CPU caches it is slower (about
// 1.3x at 1,024 blocks, 1.7x at 128 with 4 depths), and faster as soon as
// they are not: at 1,024 blocks and 16 depths, 0.3-0.5x on
// BenchmarkLookupRotating's index.
// Short chains, whose few probes leave little to overlap, stay sequential,
// unless the hints (see hints) name their drop-off depths: the first
// round then probes both sides of each, and settles every pod at once when
// the depths still hold.
//
// When evictions have broken prefix closure (a middle block evicted while its
// descendants are still announced), the answer d for a pod p still satisfies
//
//	c <= d <= n, p holds H_{d-1} (if d > 0), and p does not hold H_d (if d < n)
//
// where c is the consecutive-scan answer. The rounds keep "holds H_l, does
// not hold H_r" for every pod of an interval, so a final one is such a drop
// point, and a pod that does not hold H_d has d >= c; for the sequential
// search see lookupSequential. So it never under-reports, and over-reports
// only across a hole: by at most (last index p holds along the chain + 1)
// - c.
func (x *Index) Lookup(chain []uint64, dst []Match) []Match {
	if len(chain) < lookupParallelFrom {
		if len(chain) < 2 || x.hints.entry(chain[0]).key.Load() != chain[0] {
			return x.lookupSequential(chain, dst)
		}
		return x.lookupShort(chain, dst)
	}
	return x.lookupFull(chain, dst)
}

// lookupShort is lookup for a hinted chain shorter than
// lookupParallelFrom, with room for 40 interval bitmaps at 256 pods (10
// at 1,024), not 128: Go zeroes every array a function declares, and
// the 4 KB of the full scratch, with loadBatch's 1 KB (see loadOct), cost
// a hinted 64-block lookup about a tenth of its time. A lookup that
// outgrows it starts over with the full one.
func (x *Index) lookupShort(chain []uint64, dst []Match) []Match {
	var scratch [lookupShortScratchWords]uint64
	if res, ok := x.lookupIn(chain, dst, scratch[:]); ok {
		return res
	}
	return x.lookupFull(chain, dst)
}

// lookupFull is lookup in the full working space.
func (x *Index) lookupFull(chain []uint64, dst []Match) []Match {
	var scratch [lookupScratchWords]uint64
	return x.lookup(chain, dst, scratch[:])
}

// lookupParallelFrom is the chain length from which Lookup searches in
// parallel rounds (see Lookup).
const lookupParallelFrom = 256

const (
	// lookupScratchWords is the stack space, in words, for the pod
	// bitmaps of the intervals: 128 bitmaps at 256 pods, 32 at 1,024. A
	// lookup that needs more (a bitmap per piece an interval is split
	// into, about one per probe) falls back to lookupSequential.
	lookupScratchWords = 512
	// lookupMaxIntervals bounds the intervals whatever the bitmap width.
	lookupMaxIntervals = 128
	// lookupRoundProbes is how many probes a round makes when there are
	// fewer open intervals than that (each gets at least one): enough to
	// keep the CPU's outstanding misses busy, and to cut a chain into
	// pieces of about one depth each in fewer rounds (8 rather than 4:
	// 2-15% less CPU per rotating lookup of 256 or 1,024 blocks at 4 or
	// 16 depths, none lost at 128; 12 and 16 cost more than they save).
	lookupRoundProbes = 8
	// lookupMaxRoundProbes bounds a round's probes when there are more
	// open intervals than that; the rest wait for the next round.
	lookupMaxRoundProbes = 32
	// lookupBatchWords is the space for a round's bitmaps: 32 probes at
	// 256 pods, 8 at 1,024.
	lookupBatchWords = 128
	// lookupShortScratchWords is lookupShort's scratch: 40 bitmaps at
	// 256 pods.
	lookupShortScratchWords = 160
)

// interval is a piece of the chain, (lo, hi], and the pods whose answer
// lies in it: the bitmap at words [b*w, (b+1)*w) of the lookup's scratch.
type interval struct {
	lo, hi, b int32
}

// lookup is Lookup with its interval bitmaps in scratch (tests pass a
// small one to reach the fallback).
func (x *Index) lookup(chain []uint64, dst []Match, scratch []uint64) []Match {
	if res, ok := x.lookupIn(chain, dst, scratch); ok {
		return res
	}
	return x.lookupSequential(chain, dst)
}

// lookupIn is lookup without the fallback: it reports false, having
// written nothing to dst, when scratch is too small.
func (x *Index) lookupIn(chain []uint64, dst []Match, scratch []uint64) ([]Match, bool) {
	dst = dst[:0]
	n := len(chain)
	if n == 0 {
		return dst, true
	}
	w := x.words
	if len(scratch) < 2*w || n > 1<<30 {
		return nil, false
	}
	bitmaps := len(scratch) / w
	used := 1 // bitmaps in scratch
	var ivs [lookupMaxIntervals]interval
	var k [lookupMaxIntervals]uint8 // probes of interval i this round
	var pos [lookupMaxRoundProbes]int32
	var got [lookupBatchWords]uint64 // the bitmaps at pos
	maxRound := min(lookupMaxRoundProbes, lookupBatchWords/w)
	var hinted [hintDepths]int32
	nh := 0
	if n >= 2 {
		nh = x.hints.get(chain[0], &hinted)
	}
	ivs[0] = interval{0, int32(n), 0}
	m := 1
	total := 0
	for first := true; ; first = false {
		open := 0
		for i := 0; i < m; i++ {
			if ivs[i].hi-ivs[i].lo > 1 {
				open++
			}
		}
		if open == 0 && !first {
			break
		}
		// Plan the round: each open interval gets per probes (fewer if
		// narrower), as long as the pieces they make and their bitmaps
		// fit. The first round also loads H_0, whose holders are the
		// pods of the first interval, so that its misses overlap the
		// others'.
		np := 0
		if first {
			pos[0] = 0
			np = 1
		}
		budget := min(lookupMaxIntervals-m, bitmaps-used, maxRound-np)
		if budget <= 0 {
			return nil, false
		}
		per := int32(max(lookupRoundProbes/max(open, 1), 1))
		limit := np + budget
		if first && nh > 0 {
			// The hinted depths, and evenly spread probes up to a
			// round's worth (see hints).
			k[0] = uint8(hintProbes(int32(n), hinted[:nh], lookupRoundProbes-2*nh, pos[1:limit]))
			np += int(k[0])
		}
		for i := 0; i < m && !(first && nh > 0); i++ {
			l, r := ivs[i].lo, ivs[i].hi
			ki := min(per, r-l-1, int32(limit-np))
			k[i] = uint8(max(ki, 0))
			if ki == 1 {
				pos[np] = l + (r-l)>>1
				np++
				continue
			}
			for j := int32(1); j <= ki; j++ {
				pos[np] = l + int32((int64(r-l)*int64(j))/int64(ki+1))
				np++
			}
		}
		if np <= 8 {
			x.loadOct(chain, pos[:np], got[:np*w])
		} else {
			x.loadBatch(chain, pos[:np], got[:np*w])
		}
		ps, gs := pos[:np], got[:np*w] // the probes to split at
		if first {
			for i := 0; i < w; i++ {
				scratch[i] = got[i] & x.pods.alive[i].Load()
				total += bits.OnesCount64(scratch[i])
			}
			if total == 0 {
				return dst, true
			}
			ps, gs = ps[1:], gs[w:]
			np--
		}
		// Split, from the last interval back, writing the pieces of
		// interval i from i + (probes of the intervals before it) on: no
		// interval is overwritten before it is split. A piece no pod
		// falls into is dropped; the last piece keeps the interval's
		// bitmap, the others take new ones.
		next := m + np
		pi := np
		for i := m - 1; i >= 0; i-- {
			ki := int(k[i])
			pi -= ki
			iv := ivs[i]
			if ki == 0 {
				next--
				ivs[next] = iv
				continue
			}
			rest := scratch[int(iv.b)*w : int(iv.b)*w+w]
			base := next - ki - 1
			out := base
			l := iv.lo
			for j := 0; j < ki; j++ {
				at := gs[(pi+j)*w : (pi+j)*w+w]
				d := scratch[used*w : used*w+w]
				var any uint64
				for q := range d {
					v := rest[q] &^ at[q]
					d[q] = v
					any |= v
					rest[q] &= at[q]
				}
				p := ps[pi+j]
				if any != 0 {
					ivs[out] = interval{l, p, int32(used)}
					used++
					out++
				}
				l = p
			}
			var any uint64
			for _, v := range rest {
				any |= v
			}
			if any != 0 {
				ivs[out] = interval{l, iv.hi, iv.b}
				out++
			}
			// Mark the unused tail of this interval's room.
			for ; out < next; out++ {
				ivs[out] = interval{b: -1}
			}
			next = base
		}
		// Drop the marked pieces.
		out := 0
		for i := 0; i < m+np; i++ {
			if ivs[i].b >= 0 {
				ivs[out] = ivs[i]
				out++
			}
		}
		m = out
	}
	// Every interval is final: its pods matched hi blocks. Deepest first,
	// slots ascending.
	if n <= hintMaxLen {
		// The deepest hintDepths depths, ascending, hint the next lookup.
		var depths [hintDepths]int32
		lo := max(m-hintDepths, 0)
		for i := lo; i < m; i++ {
			depths[i-lo] = ivs[i].hi
		}
		x.hints.set(chain[0], depths[:m-lo])
	}
	if cap(dst) < total {
		dst = make([]Match, total)
	}
	dst = dst[:total]
	j := 0
	for i := m - 1; i >= 0; i-- {
		b := int(ivs[i].b) * w
		j += x.pods.fill(dst[j:], scratch[b:b+w], int(ivs[i].hi))
	}
	return dst[:j], true
}

// loadBatch loads the pod bitmaps of the blocks at the given positions of
// chain into out (x.words words each), as load does one at a time, but in
// three passes over them, each of which only issues loads that do not
// depend on each other, so the CPU overlaps their cache misses (and page
// walks) where one load after another would wait for each:
//
//  1. prefetch each block's home slot (the shard and table headers it
//     needs to find it are read by every lookup and stay cached);
//  2. scan each probe run for the block's fingerprint and prefetch the
//     slab entry it names (both lines when the entry straddles two);
//  3. check each entry's hash and copy its bitmap.
//
// So a batch waits for about two cache misses, not two per block. Each
// read is checked against the seqlock count taken in pass 1; one that
// raced a writer, or whose entry turned out to hold another key (a
// fingerprint collision), is done again by load.
func (x *Index) loadBatch(chain []uint64, pos []int32, out []uint64) {
	var seqs [lookupMaxRoundProbes]uint64
	var tabs [lookupMaxRoundProbes]*table
	var found [lookupMaxRoundProbes]uint32
	var lines [2 * lookupMaxRoundProbes]unsafe.Pointer
	x.loadBatchIn(chain, pos, out, seqs[:], tabs[:], found[:], lines[:])
}

// loadQuad is loadBatch for at most 4 probes, with less working space to
// zero on the stack.
func (x *Index) loadQuad(chain []uint64, pos []int32, out []uint64) {
	var seqs [4]uint64
	var tabs [4]*table
	var found [4]uint32
	var lines [8]unsafe.Pointer
	x.loadBatchIn(chain, pos, out, seqs[:], tabs[:], found[:], lines[:])
}

// loadOct is loadBatch for at most 8 probes, as a hinted lookup's first
// round of a chain with 4 drop-off depths makes.
func (x *Index) loadOct(chain []uint64, pos []int32, out []uint64) {
	var seqs [8]uint64
	var tabs [8]*table
	var found [8]uint32
	var lines [16]unsafe.Pointer
	x.loadBatchIn(chain, pos, out, seqs[:], tabs[:], found[:], lines[:])
}

// loadBatchIn is loadBatch with its working space given: room for
// len(pos) probes in seqs, tabs and found, and twice that in lines.
// found[j] is 1 + the slab entry the fingerprint of probe j names, or 0
// if its probe run ended without one; seqs[j] odd sends probe j to load.
func (x *Index) loadBatchIn(chain []uint64, pos []int32, out []uint64, seqs []uint64, tabs []*table, found []uint32, lines []unsafe.Pointer) {
	w, stride := x.words, x.stride
	n := 0
	for j, p := range pos {
		h := chain[p]
		s := &x.shards[shardOf(h)]
		seqs[j] = s.seq.Load()
		t := s.tab.Load()
		tabs[j] = t
		if t != nil {
			lines[n] = unsafe.Pointer(&t.slots[uint64(fingerprint(h)>>(32-t.bits))&uint64(len(t.slots)-1)])
			n++
		}
	}
	prefetchRead(lines[:n])
	n = 0
	for j, p := range pos {
		found[j] = 0
		t := tabs[j]
		if t == nil {
			continue
		}
		mask := uint64(len(t.slots) - 1)
		fp := fingerprint(chain[p])
		for i, k := uint64(fp>>(32-t.bits))&mask, uint64(0); k <= mask; i, k = (i+1)&mask, k+1 {
			v := t.slots[i].Load()
			if v == 0 {
				break
			}
			if uint32(v>>32) == fp {
				e := uint32(v) - 1
				if int(e>>chunkShift) >= len(t.chunks) {
					// Mid-update (see table.read): leave it to load.
					seqs[j] = 1
					break
				}
				first := t.word(e, stride, 0)
				lines[n] = unsafe.Pointer(first)
				n++
				// The entry's last word, when it lies in the next line.
				if off := uintptr(stride-1) * 8; (uintptr(unsafe.Pointer(first))+off)&63 < off {
					lines[n] = unsafe.Add(unsafe.Pointer(first), off)
					n++
				}
				found[j] = e + 1
				break
			}
		}
	}
	prefetchRead(lines[:n])
	for j, p := range pos {
		h := chain[p]
		s := &x.shards[shardOf(h)]
		d := out[j*w : (j+1)*w]
		if v, t := seqs[j], tabs[j]; v&1 == 0 {
			switch e := found[j]; {
			case t == nil || e == 0:
				clear(d)
				if s.seq.Load() == v {
					continue
				}
			default:
				c := t.chunks[(e-1)>>chunkShift]
				base := int((e-1)&chunkMask) * stride
				if c[base].Load() == h {
					for q := range d {
						d[q] = c[base+1+q].Load()
					}
					if s.seq.Load() == v {
						continue
					}
				}
			}
		}
		s.load(h, stride, d)
	}
}

// lookupSequential is Lookup one drop-off depth at a time: starting from
// the set S of pods holding H_0, a binary search finds the first depth
// where some pod of S drops out, records the pods that dropped, and
// continues from there with the rest. Each of the K distinct drop-off
// depths costs O(log n) probes, so a lookup costs O(K log n) probes, not
// O(pods * n). Each search remembers where its probes found pods missing;
// the next one starts from the nearest of those that still fails for the
// pods left (its bitmap kept, so it is not probed again), so closely
// spaced depths cost about a probe each. Its probes
// depend on each other: each waits for its own cache misses (slot, then
// entry) when the chain is not cached; only the first few, which do not,
// are loaded together (H_0, the chain's midpoint and its halves'). Lookup
// uses it for short chains, and lookup when its scratch space cannot hold
// the intervals.
//
// Under broken closure it only ever reports a pod at a depth where it was
// seen to drop out after holding the previous block, and a pod holding
// H_0..H_{c-1} cannot drop out before c: Lookup's bound holds.
func (x *Index) lookupSequential(chain []uint64, dst []Match) []Match {
	dst = dst[:0]
	n := len(chain)
	if n == 0 {
		return dst
	}
	w := x.words
	// none is the bitmap at n: nobody holds chain[n]. spare holds the
	// bitmap at r when the memo is full.
	var cand, probe, none, spare, dropped [maxWords]uint64
	// The first search's first probes do not depend on H_0's bitmap: its
	// midpoint, and the midpoints of its halves, one of which it probes
	// next (a later search often starts at the other). They are loaded
	// with H_0 in one batch, so that their cache misses overlap.
	pre := [4]int32{0, -1, -1, -1}
	var preAt [4 * maxWords]uint64
	if n >= 4 {
		h := n >> 1
		pre = [4]int32{0, int32(h >> 1), int32(h), int32((h + n) >> 1)}
		x.loadQuad(chain, pre[:], preAt[:4*w])
	} else {
		x.load(chain[0], preAt[:w])
	}
	total := 0
	for i := 0; i < w; i++ {
		cand[i] = preAt[i] & x.pods.alive[i].Load()
		total += bits.OnesCount64(cand[i])
	}
	if total == 0 {
		return dst
	}
	if cap(dst) < total {
		dst = make([]Match, total)
	}
	dst = dst[:total]
	end := total
	// failed is a stack of positions beyond lo where a probe found some pod
	// of cand missing, smallest on top: later searches, for fewer pods,
	// start from them instead of from the whole rest of the chain. A
	// probe reads its bitmap into the stack's next free room, so one that
	// fails is pushed without a copy.
	var failed [lookupMemo]int32
	var failedAt [lookupMemoWords]uint64 // the bitmap at failed[i], at [i*w, (i+1)*w)
	memo := min(lookupMemo, len(failedAt)/w)
	sp := 0
	lo := 0
	var depths [hintDepths]int32 // the first depths found, for hints
	nd := 0
	for {
		// Invariant: every pod in cand holds chain[lo]. Find the smallest
		// r in (lo, n] where some pod of cand does not hold chain[r]
		// (chain[n] is held by nobody). atR is the bitmap at r.
		for sp > 0 && int(failed[sp-1]) <= lo {
			sp--
		}
		l, r := lo, n
		atR := none[:w]
		for sp > 0 {
			m, at := int(failed[sp-1]), failedAt[(sp-1)*w:sp*w]
			if !subset(cand[:w], at) {
				r, atR = m, at
				break
			}
			l = m // every pod left holds it: search beyond
			sp--
		}
		for r-l > 1 {
			m := int(uint(l+r) >> 1)
			at := probe[:w]
			if sp < memo {
				at = failedAt[sp*w : (sp+1)*w]
			}
			switch int32(m) {
			case pre[1]:
				copy(at, preAt[w:2*w])
			case pre[2]:
				copy(at, preAt[2*w:3*w])
			case pre[3]:
				copy(at, preAt[3*w:4*w])
			default:
				x.load(chain[m], at)
			}
			if subset(cand[:w], at) {
				l = m
				continue
			}
			r = m
			if sp < memo {
				failed[sp] = int32(m)
				sp++
				atR = at
			} else {
				atR = spare[:w]
				copy(atR, at)
			}
		}
		// Pods of cand missing at r matched exactly r blocks.
		k, remaining := 0, 0
		for i := 0; i < w; i++ {
			dropped[i] = cand[i] &^ atR[i]
			cand[i] &= atR[i]
			k += bits.OnesCount64(dropped[i])
			remaining += bits.OnesCount64(cand[i])
		}
		// This depth's group goes just below the deeper groups (found
		// later), so dst ends sorted by depth, most first, slots ascending.
		end -= k
		out := unsafe.Pointer(unsafe.SliceData(dst[end : end+k])) // the room for the k
		fillSet(out, x.pods.ids, dropped[:w], r)
		if nd < hintDepths {
			depths[nd] = int32(r)
			nd++
		}
		if remaining == 0 {
			break
		}
		lo = r
	}
	if n >= 2 && n <= hintMaxLen {
		x.hints.set(chain[0], depths[:nd])
	}
	return dst
}

// lookupMemo is how many failed probes a lookup remembers for its later
// searches, with their bitmaps in lookupMemoWords words (fewer when the
// bitmaps are wide: 32 at 256 pods, 8 at 1,024, where a search of a chain
// shorter than lookupParallelFrom seldom needs more): 1 KB of stack, which
// every lookup zeroes.
const (
	lookupMemo      = 48
	lookupMemoWords = 128
)

// load copies the pod bitmap of block h into dst (zeroed when absent).
func (x *Index) load(h uint64, dst []uint64) bool {
	return x.shards[shardOf(h)].load(h, x.stride, dst)
}

// subset reports whether every bit of a is set in b.
func subset(a, b []uint64) bool {
	for i := range a {
		if a[i]&^b[i] != 0 {
			return false
		}
	}
	return true
}

// prefetchFound brings in, for each hash of a batch about to be evicted
// (at most prefetchBatch), the lines evicting it reads and writes, in two
// steps of prefetches that do not wait on one another: its home slot; then,
// the slots in cache, the slab entry its fingerprint names (its hash and
// the pod's bitmap word) and its shard's mutex. Evictions are of blocks
// spread at random over the table: one after another, each waited for its
// slot's and its entry's misses in turn.
func (x *Index) prefetchFound(hashes []uint64, word int) {
	hashes = hashes[:min(len(hashes), prefetchBatch)]
	var lines [3 * prefetchBatch]unsafe.Pointer
	n := 0
	for _, h := range hashes {
		if t := x.shards[shardOf(h)].tab.Load(); t != nil {
			lines[n] = unsafe.Pointer(&t.slots[uint64(fingerprint(h)>>(32-t.bits))&uint64(len(t.slots)-1)])
			n++
		}
	}
	prefetchRead(lines[:n])
	n = 0
	for _, h := range hashes {
		s := &x.shards[shardOf(h)]
		lines[n] = unsafe.Pointer(&s.mu)
		n++
		t := s.tab.Load()
		if t == nil {
			continue
		}
		mask := uint64(len(t.slots) - 1)
		fp := fingerprint(h)
		// The first slot of its fingerprint, within a short probe run (a
		// collision costs a useless prefetch).
		for i, k := uint64(fp>>(32-t.bits))&mask, 0; k < 8; i, k = (i+1)&mask, k+1 {
			v := t.slots[i].Load()
			if v == 0 {
				break
			}
			if uint32(v>>32) == fp {
				if e := uint32(v) - 1; int(e>>chunkShift) < len(t.chunks) {
					lines[n] = unsafe.Pointer(t.word(e, x.stride, 0))
					n++
					if w := t.word(e, x.stride, 1+word); uintptr(unsafe.Pointer(w))&^63 != uintptr(lines[n-1])&^63 {
						lines[n] = unsafe.Pointer(w)
						n++
					}
				}
				break
			}
		}
	}
	prefetchLines(lines[:n], 0)
}

// prefetchSink keeps the prefetch loads from being optimized away.
var prefetchSink atomic.Uint64

// prefetchBatch is how many hashes of an Evict call prefetchFound
// prepares at a time: their lines stay in the cache until they are
// evicted. Small for the reason registerPrefetch is: a batch is 3-4 lines
// a hash and a core keeps only about 32 misses in flight; BenchmarkEvict
// (cold order, 1M blocks) evicts 25-45% more blocks/s at 8 than at 64,
// and 4 or 16 are between the two.
const prefetchBatch = 8

// registerPrefetch is how many hashes of a Register call prefetch
// prepares at a time. A batch is about 4 lines a hash, and 8 hashes' 32
// lines are about as many misses as a core keeps in flight; at 64 hashes the 256 prefetches queued behind one another
// (each waited for room) and the first insertions waited for lines
// queued behind the rest. 8 registers from empty with 12-20% less CPU
// per block than 64 (and 16 or 32 no better than 8; prefetching the
// next batch while inserting this one no better either).
const registerPrefetch = 8

// prefetch brings in, for each hash of a batch about to be registered (at
// most registerPrefetch), the cache lines its insertion will write: the
// shard's writer line (its mutex), the home slot and the slot four further
// on (in the next line when the home is in the second half of its own,
// where a probe run often continues), and the slab entry the shard will
// give a new block (nextEntry). The prefetches do not wait, so the CPU
// overlaps their cache misses instead of taking them one at a time inside
// the locked section, where each insertion's atomic slot store waits for
// its writes to reach the cache; and a prefetch for writing (see
// prefetchLines) takes the line from the other cores at once, so the
// insertion need not ask for it again. Reading nextEntry and the table
// without the lock is safe (atomic loads), and a stale one only brings a
// line in vain.
func (x *Index) prefetch(hashes []uint64) {
	hashes = hashes[:min(len(hashes), registerPrefetch)]
	var lines [4 * registerPrefetch]unsafe.Pointer
	n := 0
	// Slots first: where prefetchLines cannot prefetch, it loads them.
	for _, h := range hashes {
		if t := x.shards[shardOf(h)].tab.Load(); t != nil {
			mask := uint64(len(t.slots) - 1)
			i := uint64(fingerprint(h)>>(32-t.bits)) & mask
			lines[n], lines[n+1] = unsafe.Pointer(&t.slots[i]), unsafe.Pointer(&t.slots[(i+4)&mask])
			n += 2
		}
	}
	slots := n
	for _, h := range hashes {
		s := &x.shards[shardOf(h)]
		lines[n] = unsafe.Pointer(&s.mu)
		n++
		if t := s.tab.Load(); t != nil {
			if e := s.nextEntry.Load(); int(e>>chunkShift) < len(t.chunks) {
				lines[n] = unsafe.Pointer(t.word(e, x.stride, 0))
				n++
			}
		}
	}
	prefetchLines(lines[:n], slots)
}
