package index

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Errors returned by the pod and block operations.
var (
	// ErrFull means every pod slot is live or still awaiting its sweep.
	ErrFull = errors.New("index: no free pod slot")
	// ErrUnknownPod means the PodID is not live: never issued, removed, or
	// from a slot that has since been reused (its generation is stale).
	ErrUnknownPod = errors.New("index: unknown or removed pod")
)

// PodID names one incarnation of a pod in one index: its slot and the slot's
// generation. A slot is reused only after a sweep has cleared it, and the new
// incarnation gets a new generation, so a stale PodID can never touch or read
// the blocks of the pod that reuses its slot. The zero PodID is never issued.
type PodID uint64

// Slot is the pod's bit position in block bitmaps.
func (p PodID) Slot() int { return int(uint16(p)) }

// Gen is the slot's generation at the time the pod was added.
func (p PodID) Gen() uint32 { return uint32(p >> 16) }

func (p PodID) String() string { return fmt.Sprintf("pod(%d.%d)", p.Slot(), p.Gen()) }

func makePodID(slot int, gen uint32) PodID { return PodID(uint64(gen)<<16 | uint64(slot)) }

// Slot states. A slot goes free -> live (AddPod) -> dying (RemovePod: its
// alive bit drops at once) -> free (after a sweep pass has cleared its bits
// from every shard).
const (
	slotFree  = 0
	slotLive  = 1
	slotDying = 2
)

// pods is the slot table. state[slot] = gen<<8 | state, readable without the
// lock; alive is the bitmap of live slots that every lookup masks with.
type pods struct {
	mu    sync.Mutex
	state []atomic.Uint64
	// ids[slot] is the PodID of the slot's latest incarnation (the
	// generation in state), ready for answers.
	ids    *[MaxPods]atomic.Uint64
	alive  []atomic.Uint64
	names  []string
	byName map[string]int
	dying  []uint64 // bitmap of dying slots not yet in a sweep pass
	nDying int
	// liveGen counts the changes of a PodID's liveness (a pod added, a pod
	// removed), each counted after it is visible to live (LivenessGen).
	liveGen atomic.Uint64
}

func newPods(capacity int) pods {
	return pods{
		state:  make([]atomic.Uint64, capacity),
		ids:    new([MaxPods]atomic.Uint64),
		alive:  make([]atomic.Uint64, capacity/64),
		names:  make([]string, capacity),
		byName: make(map[string]int),
		dying:  make([]uint64, capacity/64),
	}
}

// live reports whether id is the current, live incarnation of its slot.
func (p *pods) live(id PodID) bool {
	slot := id.Slot()
	if id == 0 || slot >= len(p.state) {
		return false
	}
	return p.state[slot].Load() == uint64(id.Gen())<<8|slotLive
}

func (p *pods) id(slot int) PodID {
	return makePodID(slot, uint32(p.state[slot].Load()>>8))
}

// fill writes the pods of set, a bitmap of slots, to dst in slot order,
// each with the given matched blocks, and returns how many it wrote;
// dst must have room for them all. An answer is mostly this loop, one
// iteration per pod, so it is kept to a few instructions (fillSet): the
// PodIDs come ready from ids, and it writes at a byte offset from dst's
// start (an index into dst, or a re-sliced dst, made each iteration wait
// on the last one's bookkeeping).
func (p *pods) fill(dst []Match, set []uint64, blocks int) int {
	n := 0
	for _, d := range set {
		n += bits.OnesCount64(d)
	}
	dst = dst[:n] // in bounds: the writes below stay in dst[:n]
	if len(set) > MaxPods/64 {
		panic("index: fill: set wider than MaxPods")
	}
	return fillSet(unsafe.Pointer(unsafe.SliceData(dst)), p.ids, set, blocks)
}

// fillSetGo is fillSet in Go: the reference the amd64 assembly is tested
// against, and fillSet elsewhere. A set bit's position is
// bits.TrailingZeros64, BSF for GOAMD64=v1 (on this EPYC BenchmarkFill
// was 26-32% faster with it than with a de Bruijn multiplication and
// table, which index26 used; TZCNT, which the assembly uses, is faster
// still). set has at most MaxPods/64 words.
func fillSetGo(out unsafe.Pointer, ids *[MaxPods]atomic.Uint64, set []uint64, blocks int) int {
	j := uintptr(0)
	for q, d := range set {
		if d != 0 {
			j = fillWord(out, j, ids, q*64, d, blocks)
		}
	}
	return int(j / unsafe.Sizeof(Match{}))
}

// fillWord is fill for the word of the set whose first slot is base,
// d, writing from byte offset j of out on; it returns the offset after
// the last Match written (fillSetGo's loop).
func fillWord(out unsafe.Pointer, j uintptr, ids *[MaxPods]atomic.Uint64, base int, d uint64, blocks int) uintptr {
	for ; d != 0; d &= d - 1 {
		slot := (base | bits.TrailingZeros64(d)) & (MaxPods - 1)
		*(*Match)(unsafe.Add(out, j)) = Match{Pod: PodID(ids[slot].Load()), Blocks: blocks}
		j += unsafe.Sizeof(Match{})
	}
	return j
}

// AddPod registers a pod by name and returns its PodID. Adding a name that is
// already live returns the existing PodID (pod-up announcements may repeat).
// A removed pod's name gets a fresh slot. ErrFull when no slot is free: slots
// of removed pods become free only after their sweep.
func (x *Index) AddPod(name string) (PodID, error) {
	p := &x.pods
	p.mu.Lock()
	defer p.mu.Unlock()
	if slot, ok := p.byName[name]; ok {
		return p.id(slot), nil
	}
	for slot := range p.state {
		st := p.state[slot].Load()
		if st&0xff != slotFree {
			continue
		}
		gen := uint32(st>>8) + 1
		if gen == 0 || gen >= 1<<32-1 {
			gen = 1
		}
		p.ids[slot].Store(uint64(makePodID(slot, gen)))
		p.state[slot].Store(uint64(gen)<<8 | slotLive)
		p.names[slot] = name
		p.byName[name] = slot
		p.alive[slot/64].Or(1 << (slot % 64))
		p.liveGen.Add(1)
		return makePodID(slot, gen), nil
	}
	return 0, fmt.Errorf("%w (capacity %d, %d awaiting sweep)", ErrFull, len(p.state), p.nDying+x.sweepPending())
}

// RemovePod marks a pod dead. From the moment it returns no lookup returns
// the pod, and its blocks can no longer be registered; its bits are cleared
// by the background sweep (SweepStep / RunSweeper), after which the slot is
// free for reuse.
func (x *Index) RemovePod(id PodID) error {
	p := &x.pods
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live(id) {
		return fmt.Errorf("remove %v: %w", id, ErrUnknownPod)
	}
	slot := id.Slot()
	p.alive[slot/64].And(^(uint64(1) << (slot % 64)))
	p.state[slot].Store(uint64(id.Gen())<<8 | slotDying)
	delete(p.byName, p.names[slot])
	p.names[slot] = ""
	p.dying[slot/64] |= 1 << (slot % 64)
	p.nDying++
	p.liveGen.Add(1)
	return nil
}

// Pod returns the live PodID registered under name.
func (x *Index) Pod(name string) (PodID, bool) {
	p := &x.pods
	p.mu.Lock()
	defer p.mu.Unlock()
	slot, ok := p.byName[name]
	if !ok {
		return 0, false
	}
	return p.id(slot), true
}

// PodName returns the name of a live pod.
func (x *Index) PodName(id PodID) (string, bool) {
	p := &x.pods
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live(id) {
		return "", false
	}
	return p.names[id.Slot()], true
}

// Alive reports whether id is a live pod.
func (x *Index) Alive(id PodID) bool { return x.pods.live(id) }

// LivenessGen counts the changes of liveness: it grows after every AddPod
// that adds a pod and every RemovePod, once Alive answers the new way. A
// caller that read it before asking Alive of some pods knows their answers
// stand while it has not changed.
func (x *Index) LivenessGen() uint64 { return x.pods.liveGen.Load() }

// takeDying moves the dying slots into a sweep pass mask (dst) and reports
// how many there were.
func (p *pods) takeDying(dst []uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for i, w := range p.dying {
		dst[i] = w
		n += bits.OnesCount64(w)
		p.dying[i] = 0
	}
	p.nDying = 0
	return n
}

// release frees the slots of a finished sweep pass.
func (p *pods) release(mask []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	forEachBit(mask, func(slot int) {
		st := p.state[slot].Load()
		p.state[slot].Store(st&^0xff | slotFree)
	})
}

func forEachBit(words []uint64, f func(i int)) {
	for wi, w := range words {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			f(wi*64 + b)
			w &= w - 1
		}
	}
}
