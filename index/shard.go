package index

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

const (
	shardBits = 8
	numShards = 1 << shardBits
	// fib is 2^64 / golden ratio: multiplying by it and keeping the high bits
	// (Fibonacci hashing) spreads structured keys evenly over the shards.
	fib = 0x9E3779B97F4A7C15

	chunkShift = 8 // slab entries per chunk = 256
	chunkLen   = 1 << chunkShift
	chunkMask  = chunkLen - 1

	minTableBits = 4
	maxTableBits = 32
)

// shardOf picks the shard of a block hash: the top 8 bits of key*fib.
func shardOf(key uint64) uint64 { return (key * fib) >> (64 - shardBits) }

// fingerprint is bits 24..55 of key*fib: the bits below the shard bits. The
// top bits of the fingerprint are the key's home position in its shard's
// table, so a table slot alone says where its key belongs (which backward-
// shift deletion and growth need) without reading the slab.
func fingerprint(key uint64) uint32 { return uint32((key * fib) >> 24) }

// table is one shard's published view: an open-addressing (linear probing)
// array of slots and the slab of entries they point to. A table header is
// immutable once published; the atomics inside it change only under the
// shard's mutex, inside a seqlock write window.
type table struct {
	// slots[i] = fingerprint<<32 | (entry+1); 0 is an empty slot.
	slots []atomic.Uint64
	bits  uint // len(slots) == 1<<bits
	// chunks is the slab: entry e lives at chunks[e>>chunkShift], words
	// [(e&chunkMask)*stride, +stride): word 0 is the block hash (0 while the
	// entry is free), then the pod bitmap.
	chunks [][]atomic.Uint64
}

// shard is 1/256 of the index. Readers never lock: they read under a seqlock,
// so a lookup costs no atomic read-modify-write and scales with cores.
// Writers serialize on mu. Most mutations are a single atomic store that
// leaves the table consistent at every instant (inserting into an empty slot,
// setting or clearing a bit); only deletion moves slots and frees an entry
// for reuse, and it alone runs inside a write window (seq odd while it runs,
// and changed after), which makes concurrent readers retry. Each deletion is
// its own short window, so a long writer operation (a sweep of the shard)
// never stalls readers for long.
//
// A shard is two 64-byte lines, the readers' and the writers' (see
// shardState), a multiple of cacheLine so that two hot shards never share
// one (TestShardLayout checks both). No padding field makes it so: a
// trailing one of size 0 would add 8 bytes.
type shard struct {
	shardState
}

// cacheLine is the padding unit: two 64-byte lines, as adjacent-line
// prefetching pairs lines on current x86 cores.
const cacheLine = 128

type shardState struct {
	// Read by every lookup. Writers change them rarely (a deletion, a
	// published growth, a new slab chunk), so they share no cache line
	// with the writer state below, which every insertion writes: a writer
	// does not take the line away from the readers of its shard.
	seq atomic.Uint64
	tab atomic.Pointer[table]
	// details holds the tier reference counts of (block, pod) pairs that are
	// not in the default state "held once, on GPU" (the bit alone says that).
	// Guarded by mu; the map header never changes, so it can sit here.
	details map[detailKey]tierCounts
	_       [64 - 24]byte

	// Writer-only state, guarded by mu. What an insertion touches fills
	// exactly the next 64-byte line, the one line two writers of the
	// shard pass between them.
	mu   sync.Mutex
	n    uint32   // entries in use
	used uint32   // slab high-water mark
	free []uint32 // freed slab entries, reused before used grows
	// nextEntry is the slab entry the next insertion will take (the top
	// of free, or used), for Index.prefetch, which reads it without the
	// lock to prefetch that entry's line before the insertion writes it.
	nextEntry atomic.Uint32
	// next is the table being grown into, not yet published (nil: none);
	// it holds exactly the slots of the published table before cursor.
	// See startGrow.
	next   *table
	cursor uint64
}

type detailKey struct {
	block uint64
	slot  uint16
}

// tierCounts are the reference counts of one (block, pod) pair per tier.
type tierCounts [NumTiers]uint16

var defaultCounts = tierCounts{TierGPU: 1}

func (c tierCounts) empty() bool { return c == tierCounts{} }

func (c tierCounts) offloaded() bool {
	for t := TierCPU; t < NumTiers; t++ {
		if c[t] != 0 {
			return true
		}
	}
	return false
}

// best is the fastest tier with a reference.
func (c tierCounts) best() Tier {
	for t := TierGPU; t < NumTiers; t++ {
		if c[t] != 0 {
			return t
		}
	}
	return NumTiers
}

func (s *shard) beginWrite() { s.seq.Add(1) }
func (s *shard) endWrite()   { s.seq.Add(1) }

// load copies key's pod bitmap into dst (len(dst) words) and reports whether
// the key is present; when absent dst is zeroed. It never blocks on writers.
func (s *shard) load(key uint64, stride int, dst []uint64) bool {
	for spins := 0; ; spins++ {
		v := s.seq.Load()
		if v&1 == 0 {
			if t := s.tab.Load(); t != nil {
				ok, consistent := t.read(key, stride, dst)
				if consistent && s.seq.Load() == v {
					return ok
				}
			} else if s.seq.Load() == v {
				clear(dst)
				return false
			}
		}
		if spins&63 == 63 {
			// A writer was preempted inside its window: let it run.
			runtime.Gosched()
		}
	}
}

// read probes for key. consistent is false when the table was seen mid-update
// (a slot naming an entry beyond the slab this header knows); the caller
// retries. Every access is atomic, so a racing writer can make the answer
// stale but never unsafe; the seqlock check discards stale answers.
func (t *table) read(key uint64, stride int, dst []uint64) (ok, consistent bool) {
	mask := uint64(len(t.slots) - 1)
	fp := fingerprint(key)
	i := uint64(fp>>(32-t.bits)) & mask
	for probes := uint64(0); probes <= mask; probes++ {
		v := t.slots[i].Load()
		if v == 0 {
			break
		}
		if uint32(v>>32) == fp {
			e := uint32(v) - 1
			ci := int(e >> chunkShift)
			if ci >= len(t.chunks) {
				return false, false
			}
			c := t.chunks[ci]
			base := int(e&chunkMask) * stride
			if c[base].Load() == key {
				for w := range dst {
					dst[w] = c[base+1+w].Load()
				}
				return true, true
			}
		}
		i = (i + 1) & mask
	}
	clear(dst)
	return false, true
}

// The methods below are for writers and require s.mu.

// find returns the slot index and entry of key; when the key is absent, ok
// is false and slot is the empty slot that ended the probe (where an insert
// into this same table goes), or len(slots) if the table is nil or full.
func (t *table) find(key uint64, stride int) (slot uint64, entry uint32, ok bool) {
	if t == nil {
		return 0, 0, false
	}
	mask := uint64(len(t.slots) - 1)
	fp := fingerprint(key)
	i := uint64(fp>>(32-t.bits)) & mask
	for probes := uint64(0); probes <= mask; probes++ {
		v := t.slots[i].Load()
		if v == 0 {
			return i, 0, false
		}
		if uint32(v>>32) == fp {
			e := uint32(v) - 1
			if t.word(e, stride, 0).Load() == key {
				return i, e, true
			}
		}
		i = (i + 1) & mask
	}
	return uint64(len(t.slots)), 0, false
}

func (t *table) word(e uint32, stride, w int) *atomic.Uint64 {
	return &t.chunks[e>>chunkShift][int(e&chunkMask)*stride+w]
}

// insertEntry links a new entry for key, holding only the given bit, into
// the table t at the empty slot that find returned, and advances the
// shard's growth by step slots (see startGrow): it may publish a new
// table, into which the slot is then found again.
//
// It needs no seqlock window: the entry's words are written before the slot
// that makes it reachable (all atomics, so in that order for readers), and
// filling an empty slot never breaks another key's probe run. A freed entry
// is all zeros (deletion requires an empty bitmap and zeroes the hash), so
// only the hash and one bitmap word are stored.
func (s *shard) insertEntry(t *table, slot uint64, key uint64, stride, word int, bit uint64, step int) {
	switch {
	case t == nil:
		s.startGrow(nil)
		t = s.tab.Load()
		slot, _, _ = t.find(key, stride)
	case s.next == nil && uint64(s.n+1)*4 > uint64(len(t.slots))*3:
		s.startGrow(t)
	}
	if s.next != nil {
		var done bool
		if uint64(s.n+1)*8 > uint64(len(t.slots))*7 {
			// The growth fell behind (a step below 4 slots): finish it
			// rather than fill the table, whose probe runs would then
			// never end. At the default step the load stays under 0.76.
			done = s.settle()
		} else {
			done = s.growStep(step)
		}
		if done {
			t = s.tab.Load()
			slot, _, _ = t.find(key, stride)
		}
	}
	var e uint32
	if n := len(s.free); n > 0 {
		// A reused entry may still be read by a reader that found it before
		// it was freed (that reader will retry): store atomically.
		e = s.free[n-1]
		s.free = s.free[:n-1]
		t.word(e, stride, 0).Store(key)
		t.word(e, stride, 1+word).Store(bit)
	} else {
		e = s.used
		s.used++
		if int(e>>chunkShift) >= len(t.chunks) {
			nt := &table{slots: t.slots, bits: t.bits, chunks: append(t.chunks, make([]atomic.Uint64, chunkLen*stride))}
			s.tab.Store(nt)
			t = nt
		}
		// A never-used entry is unreachable until the slot store below
		// publishes it, so plain stores suffice (and cost no bus lock).
		*plain(t.word(e, stride, 0)) = key
		*plain(t.word(e, stride, 1+word)) = bit
	}
	v := uint64(fingerprint(key))<<32 | uint64(e+1)
	t.slots[slot].Store(v)
	if s.next != nil && slot < s.cursor {
		s.next.place(v) // the growth has copied this part of the table
	}
	s.n++
	s.setNextEntry()
}

// setNextEntry publishes the entry the next insertion will take.
func (s *shard) setNextEntry() {
	e := s.used
	if n := len(s.free); n > 0 {
		e = s.free[n-1]
	}
	s.nextEntry.Store(e)
}

// Growth is incremental, so that no insertion holds the shard's writer lock
// for a whole rehash: a writer whose batch needs the shard would wait all
// that time (a batch of 64 blocks needs most shards), and a fresh controller
// catching up from the topic would register in bursts. When the published
// table passes 3/4 full, startGrow allocates a table with twice the slots,
// private to the writers (next). From then on:
//
//   - each insertion copies the next step slots of the published table, from
//     cursor on, into next (growStep);
//   - an insertion into a slot before cursor is made in next as well;
//   - a deletion, whose backward shift may carry slots across cursor (or
//     across the end of the table, from its start), removes from or adds to
//     next whatever changes sides, and the deleted slot too if it was copied.
//
// So next holds exactly the slots of the published table before cursor, and
// when cursor reaches the end it holds all of them and is published in one
// atomic store. Readers see only the published table, which stays complete
// and consistent throughout. The slab of entries is shared by both tables:
// only slots are copied. The one step still proportional to the table is
// allocating (zeroing) next.
//
// defaultGrowStep is the step of Index: a growth starts at a load of 3/4
// and, copying 256 slots per insertion, is over before 1/256 more of the
// old table fills, so the published table's load stays under 0.76 while it
// grows. A step copies runs of 2 KB into runs of 4 KB, which the hardware
// streams: registration from empty costs the same CPU time per block as
// with stop-the-world growth (at 32 slots a step it cost a fifth more),
// and a step takes a few microseconds, against a millisecond for the last
// stop-the-world rehash of a 4M-block index (BenchmarkGrowthPause).
const defaultGrowStep = 256

// startGrow allocates the table to grow into (or publishes the first).
func (s *shard) startGrow(old *table) {
	if old == nil {
		s.tab.Store(&table{slots: asAtomic(make([]uint64, 1<<minTableBits)), bits: minTableBits})
		return
	}
	bits := old.bits + 1
	if bits > maxTableBits {
		panic("index: shard table exceeds 2^32 slots")
	}
	// Plain stores fill it: nothing reads it before its publication,
	// which orders these writes before it.
	s.next = &table{slots: asAtomic(make([]uint64, 1<<bits)), bits: bits}
	s.cursor = 0
}

// growStep copies up to k more slots of the published table into the
// growing one and, when that completes it, publishes it and reports true.
func (s *shard) growStep(k int) bool {
	nt := s.next
	if nt == nil {
		return false
	}
	t := s.tab.Load()
	end := uint64(len(t.slots))
	if uint64(k) < end-s.cursor {
		end = s.cursor + uint64(k)
	}
	if end-s.cursor <= maxTouchSlots {
		touchStep(t, nt, s.cursor, end)
	}
	for i := s.cursor; i < end; i++ {
		if v := t.slots[i].Load(); v != 0 {
			nt.place(v)
		}
	}
	s.cursor = end
	if end < uint64(len(t.slots)) {
		return false
	}
	// Readers still holding the old table answer from the state before the
	// swap; any deletion after it bumps seq and sends them round again.
	s.tab.Store(&table{slots: nt.slots, bits: nt.bits, chunks: t.chunks})
	s.next, s.cursor = nil, 0
	return true
}

// maxTouchSlots bounds the steps touchStep prepares: a settle copies the
// whole rest of the table, whose lines would not all stay in the cache.
const maxTouchSlots = 4096

// touchStep loads one word of every cache line that copying the published
// slots [from, to) into the growing table reads or writes: those slots, and
// the growing table's slots from 2*from to 2*to, where their home positions
// lie (a slot's home doubles with the table, and few slots sit far from
// home). Neither range is likely to be cached: the growing table was zeroed
// when it was allocated, long before, and the published one is read at
// random. These loads do not depend on each other, so the CPU overlaps
// their misses, where the copy would take them one at a time (each placing
// probe waits for its line, and a probe that finds the slot taken ends in a
// mispredicted branch that discards the loads issued past it).
//
// The first line of each 4 KB page of the growing table (a table of 32 KB
// or more starts a page) is touched by a write that changes nothing
// rather than a load: its pages are often fresh from the kernel, and a
// load would map the shared zero page, so that placing the first slot
// there faulted a second time to copy it.
func touchStep(t, nt *table, from, to uint64) {
	const (
		perLine = 8   // slots in a 64-byte line
		perPage = 512 // slots in a 4 KB page
	)
	var acc uint64
	for i := from &^ (perLine - 1); i < to; i += perLine {
		acc += t.slots[i].Load()
	}
	for j := (2 * from) &^ (perLine - 1); j < 2*to && j < uint64(len(nt.slots)); j += perLine {
		if j%perPage == 0 {
			nt.slots[j].Or(0)
		} else {
			acc += *plain(&nt.slots[j])
		}
	}
	if acc == 1 {
		prefetchSink.Store(acc)
	}
}

// settle finishes a growth in progress at once and reports whether there
// was one.
func (s *shard) settle() bool {
	return s.growStep(int(^uint(0) >> 1))
}

// place puts slot value v at the first empty slot of its probe run in t,
// a table no reader sees yet (plain loads and stores).
func (t *table) place(v uint64) {
	mask := uint64(len(t.slots) - 1)
	j := uint64(uint32(v>>32)>>(32-t.bits)) & mask
	for *plain(&t.slots[j]) != 0 {
		j = (j + 1) & mask
	}
	*plain(&t.slots[j]) = v
}

// remove takes slot value v, which must be present, out of t, a table no
// reader sees yet, by backward shift like deleteEntry.
func (t *table) remove(v uint64) {
	mask := uint64(len(t.slots) - 1)
	i := uint64(uint32(v>>32)>>(32-t.bits)) & mask
	for w := *plain(&t.slots[i]); w != v; w = *plain(&t.slots[i]) {
		if w == 0 {
			panic("index: growing table lacks a slot it should hold")
		}
		i = (i + 1) & mask
	}
	for j := i; ; {
		j = (j + 1) & mask
		w := *plain(&t.slots[j])
		if w == 0 {
			break
		}
		home := uint64(uint32(w>>32)>>(32-t.bits)) & mask
		if (j-home)&mask >= (j-i)&mask {
			*plain(&t.slots[i]) = w
			i = j
		}
	}
	*plain(&t.slots[i]) = 0
}

// deleteEntry unlinks the entry at slot i (backward-shift deletion keeps
// every probe run unbroken, so no tombstones accumulate) and frees it. The
// entry's bitmap must already be empty. Moving slots is the one mutation a
// reader could see half done, so it runs inside a seqlock write window.
// During a growth it keeps the growing table equal to the published one's
// slots before cursor (see startGrow).
func (s *shard) deleteEntry(t *table, i uint64, e uint32, stride int) {
	s.beginWrite()
	defer s.endWrite()
	nt, cur := s.next, s.cursor
	if nt != nil && i < cur {
		nt.remove(t.slots[i].Load())
	}
	mask := uint64(len(t.slots) - 1)
	j := i
	for {
		j = (j + 1) & mask
		v := t.slots[j].Load()
		if v == 0 {
			break
		}
		home := uint64(uint32(v>>32)>>(32-t.bits)) & mask
		// v may move back to i only if i lies on its probe path, from home to j.
		if (j-home)&mask >= (j-i)&mask {
			t.slots[i].Store(v)
			if nt != nil && (i < cur) != (j < cur) {
				if i < cur {
					nt.place(v) // moved back across cursor: not copied yet
				} else {
					nt.remove(v) // wrapped from the start: to be copied again
				}
			}
			i = j
		}
	}
	t.slots[i].Store(0)
	t.word(e, stride, 0).Store(0)
	s.free = append(s.free, e)
	s.n--
	s.setNextEntry()
}

// asAtomic views a freshly built []uint64 as atomics (same size and
// alignment), so it can be filled with plain stores before publication.
func asAtomic(raw []uint64) []atomic.Uint64 {
	return unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(raw))), len(raw))
}

// plain gives the writer a non-atomic store into a word nobody else can
// reach yet (see insertEntry).
func plain(w *atomic.Uint64) *uint64 { return (*uint64)(unsafe.Pointer(w)) }
