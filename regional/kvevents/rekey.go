package kvevents

import (
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/meridian-llm/meridian/index"
)

// OpKind is what an Op does to the index.
type OpKind uint8

// The index operations a Rekeyer emits.
const (
	// OpRegister: the pod now holds each of Hashes in Tier (one more
	// reference per hash).
	OpRegister OpKind = iota + 1
	// OpEvict: drop one reference per hash of Hashes in Tier for the pod.
	OpEvict
	// OpClearPod: the pod holds nothing any more, in any tier.
	OpClearPod
)

func (k OpKind) String() string {
	switch k {
	case OpRegister:
		return "register"
	case OpEvict:
		return "evict"
	case OpClearPod:
		return "clear"
	}
	return "op(" + strconv.Itoa(int(k)) + ")"
}

// Op is one index operation for the Rekeyer's pod, in the shape of
// index.Index's Register, Evict and ClearPod. Registrations are balanced: every
// hash registered in a tier is evicted from it exactly once later (or cleared
// with the pod), so an index that counts references per (pod, hash, tier)
// holds exactly what the pod holds.
type Op struct {
	Kind   OpKind
	Tier   index.Tier // for OpRegister and OpEvict
	Hashes []uint64   // our chain hashes; valid until the Rekeyer's next call
}

// RekeyConfig configures the Rekeyer of one pod.
type RekeyConfig struct {
	// Model is the pod's served model name: the Namespace every chain starts
	// from. Required.
	Model string
	// BlockSize is the router's block size in tokens (index.Namespace
	// BlockSize). The engine's block size must divide it or be a multiple of
	// it. Default 64.
	BlockSize int
	// MaxEntries caps the engine blocks tracked for the pod (live blocks, and
	// removed ones still needed by a live descendant). Set it a little above
	// the pod's KV capacity in blocks (GPU plus offload tiers). Past it, the
	// least recently stored leaf block is forgotten and evicted from the
	// index (RekeyStats.CapEvicted). An entry takes about 80 bytes (a
	// 64-byte record and its slots in the key table), and about 130 on
	// average when the engine block is a quarter of the router block (the
	// tokens of unfinished router blocks are kept; BenchmarkRekeyMemory),
	// so the default 1<<18 (a 32k-block GPU cache plus offload tiers)
	// bounds a pod at about 35 MB.
	MaxEntries int
	// MaxRanks is one more than the highest data-parallel rank accepted.
	// Default 64.
	MaxRanks int
	// Media adds medium aliases (upper case) to the built-in table of TierOf,
	// and overrides it.
	Media map[string]index.Tier
}

// DefaultRekeyConfig returns the documented defaults, without a Model.
func DefaultRekeyConfig() RekeyConfig {
	return RekeyConfig{BlockSize: 64, MaxEntries: 1 << 18, MaxRanks: 64}
}

// Validate names the first field that is wrong.
func (c RekeyConfig) Validate() error {
	switch {
	case c.Model == "":
		return fmt.Errorf("%w: RekeyConfig.Model is empty", ErrInvalidConfig)
	case c.BlockSize <= 0 || c.BlockSize > maxBlockSize:
		return fmt.Errorf("%w: RekeyConfig.BlockSize = %d, want 1..%d", ErrInvalidConfig, c.BlockSize, maxBlockSize)
	case c.MaxEntries < 2 || c.MaxEntries > 1<<30:
		return fmt.Errorf("%w: RekeyConfig.MaxEntries = %d, want 2..2^30", ErrInvalidConfig, c.MaxEntries)
	case c.MaxRanks <= 0 || c.MaxRanks > 1<<16:
		return fmt.Errorf("%w: RekeyConfig.MaxRanks = %d, want 1..65536", ErrInvalidConfig, c.MaxRanks)
	}
	for m, t := range c.Media {
		if t >= index.NumTiers {
			return fmt.Errorf("%w: RekeyConfig.Media[%q] = %d, not a tier", ErrInvalidConfig, m, t)
		}
		if m != strings.ToUpper(m) {
			return fmt.Errorf("%w: RekeyConfig.Media key %q is not upper case", ErrInvalidConfig, m)
		}
	}
	return nil
}

// maxBlockSize bounds engine and router block sizes (tokens).
const maxBlockSize = 1 << 16

// RekeyStats counts what a Rekeyer did and dropped; each field only grows,
// except Entries. Event counts are per event, block counts per block hash.
type RekeyStats struct {
	StoredBlocks uint64 // block announcements applied (new or repeated)
	// Reannounced: announcements of a block the pod already held in that
	// tier (a set: they change nothing; vLLM's kv_cache_report_mode=full
	// re-announces every reused block).
	Reannounced   uint64
	RemovedBlocks uint64 // block removals applied
	Clears        uint64 // AllBlocksCleared applied
	// UnknownParent: BlockStored events dropped because their parent is not
	// held by the pod (never seen, removed, or forgotten at the cap).
	UnknownParent uint64
	// NoTokensUnknown: blocks of a BlockStored without token_ids (CPU offload)
	// whose hash the pod does not hold; a no-op, as in llm-d.
	NoTokensUnknown uint64
	// UnknownRemoved: removed block hashes the pod does not hold (usually
	// stored before this Rekeyer started); RemovedNotHeld: held, but not in
	// the removal's tier.
	UnknownRemoved uint64
	RemovedNotHeld uint64
	// UnknownMedium: events skipped because TierOf and Media do not know
	// their medium.
	UnknownMedium uint64
	// NonLocal: events skipped because their storage is not the pod's own
	// (see Local: locality REMOTE, shared file-system or object tiers, the
	// external tier).
	NonLocal uint64
	// NotFullAttention: new blocks of a KV-cache group that is not full
	// attention (sliding window, mamba, ...), tracked but never registered:
	// such a group cannot extend a prefix match (see the package doc).
	NotFullAttention uint64
	// BadBlocks: BlockStored events dropped because block_size is not
	// positive, token_ids is not len(block_hashes)*block_size long, the ratio
	// to the router block size is not whole, or a block's size differs from
	// its parent's or from the size the same block was announced with
	// before (the event's blocks up to it are kept).
	BadBlocks uint64
	// BadRank: events dropped because the data-parallel rank or group_idx is
	// out of range.
	BadRank uint64
	// Conflicts: stored blocks whose hash is already held under a different
	// parent (a hash collision or an engine bug); the first mapping stays.
	Conflicts uint64
	// Opaque: new blocks that are never registered because they or an
	// ancestor carry content our chain hash cannot express (multimodal
	// items in extra_keys or TensorRT-LLM's mm_keys, string token ids,
	// prompt embeddings, or a LoRA or salt where it is not expected).
	Opaque uint64
	// CapEvicted: blocks forgotten to stay within MaxEntries; CapDropped:
	// stored blocks not tracked because nothing could be forgotten.
	CapEvicted uint64
	CapDropped uint64
	// Entries is the number of engine blocks tracked now.
	Entries int
}

// Add returns the sum of two pods' counters (Entries included).
func (s RekeyStats) Add(o RekeyStats) RekeyStats {
	s.StoredBlocks += o.StoredBlocks
	s.Reannounced += o.Reannounced
	s.RemovedBlocks += o.RemovedBlocks
	s.Clears += o.Clears
	s.UnknownParent += o.UnknownParent
	s.NoTokensUnknown += o.NoTokensUnknown
	s.UnknownRemoved += o.UnknownRemoved
	s.RemovedNotHeld += o.RemovedNotHeld
	s.UnknownMedium += o.UnknownMedium
	s.NonLocal += o.NonLocal
	s.NotFullAttention += o.NotFullAttention
	s.BadBlocks += o.BadBlocks
	s.BadRank += o.BadRank
	s.Conflicts += o.Conflicts
	s.Opaque += o.Opaque
	s.CapEvicted += o.CapEvicted
	s.CapDropped += o.CapDropped
	s.Entries += o.Entries
	return s
}

// Rekeyer turns one pod's engine events into index operations on our own
// chain hashes. It is a single-threaded state machine (no I/O, no clock);
// feed it the pod's batches in order. See the package documentation for the
// exact rules.
type Rekeyer struct {
	cfg   RekeyConfig
	stats RekeyStats

	byKey   keyTable
	entries []entry
	free    []int32
	// leaf list (no children), least recently stored first
	leafHead, leafTail int32
	rankCount          []int

	toks tokStore
	// ours holds the router hashes of entries that complete more than one
	// router block (engine blocks larger than the router's), by entry.
	ours map[int32][]uint64

	ops      []opRec
	opHashes []uint64
	scratch  []uint32
	stack    []int32
	nsCache  index.Namespace
	seed     uint64
}

type ekey struct {
	hash  uint64
	group int32
	rank  int32
}

const none int32 = -1

// entry is one tracked engine block, in one 64-byte cache line (entries are
// reached at random: parents, children, leaf neighbours).
type entry struct {
	key                ekey
	parent             int32 // none for the first block of a sequence
	child              int32 // first child, none if a leaf
	prevSib, nextSib   int32
	prevLeaf, nextLeaf int32
	// h is the hash this entry's children chain from: our hash of the last
	// router block it completes (nours > 0), else the hash the router block
	// it is filling chains from.
	h     uint64
	pos   uint16 // index of this engine block within its router block (engine < router)
	ebsm1 uint16 // engine block size - 1
	nours uint32 // router blocks this entry completes
	tok   int32  // its own tokens in the token store (nours == 0), while a descendant may need them
	held  uint8  // bit t: the engine announced this block in tier t (a set)
	reg   uint8  // bit t: this entry's router blocks are registered in tier t
	flags uint8
	_     uint8
}

// entry flags.
const (
	fUsed   uint8 = 1 << iota // a tracked block (not a free slot)
	fOpaque                   // never registered (it or an ancestor)
	fInLeaf                   // on the leaf list
)

func (e *entry) ebs() uint32     { return uint32(e.ebsm1) + 1 }
func (e *entry) is(f uint8) bool { return e.flags&f != 0 }
func (e *entry) set(f uint8, on bool) {
	if on {
		e.flags |= f
	} else {
		e.flags &^= f
	}
}

// tokStore keeps the own tokens of entries that end inside a router block,
// in chunks of one engine block size: one arena per size (a pod usually has
// one), its chunks recycled.
type tokStore struct {
	arenas []tokArena
	// reserved is the pod's capacity in engine blocks (Rekeyer.Reserve):
	// an arena is sized on creation for the blocks that may keep tokens.
	reserved int
}

type tokArena struct {
	size int
	buf  []uint32
	free []int32
}

// arena returns the arena of chunks of size tokens, creating it (sized for
// the reserved capacity at router block size R) on first use.
func (s *tokStore) arena(size int) *tokArena {
	for i := range s.arenas {
		if s.arenas[i].size == size {
			return &s.arenas[i]
		}
	}
	return s.newArena(size)
}

// newArena is arena's slow path, kept out of line so that arena inlines.
func (s *tokStore) newArena(size int) *tokArena {
	s.arenas = append(s.arenas, tokArena{size: size})
	return &s.arenas[len(s.arenas)-1]
}

// reserve sizes arena a for the reserved capacity: with engine blocks of
// a.size tokens and router blocks of R, all but one engine block in R/a.size
// keeps its tokens while the router block is unfinished (entry.tok).
func (s *tokStore) reserve(a *tokArena, R int) {
	if a.size <= 0 || a.size >= R {
		return
	}
	k := R / a.size
	want := s.reserved / k * (k - 1) * a.size
	if want > cap(a.buf) {
		a.buf = append(make([]uint32, 0, want), a.buf...)
	}
}

// put stores toks and returns its chunk. R is the router block size.
func (s *tokStore) put(toks []uint32, R int) int32 {
	a := s.arena(len(toks))
	if a.buf == nil && s.reserved > 0 {
		s.reserve(a, R)
	}
	if n := len(a.free); n > 0 {
		c := a.free[n-1]
		a.free = a.free[:n-1]
		copy(a.buf[int(c)*a.size:], toks)
		return c
	}
	a.buf = append(a.buf, toks...)
	return int32(len(a.buf)/a.size - 1)
}

func (s *tokStore) get(size int, c int32) []uint32 {
	a := s.arena(size)
	return a.buf[int(c)*size : int(c+1)*size]
}

func (s *tokStore) release(size int, c int32) {
	a := s.arena(size)
	a.free = append(a.free, c)
}

func (s *tokStore) clear() {
	for i := range s.arenas {
		s.arenas[i].buf = s.arenas[i].buf[:0]
		s.arenas[i].free = s.arenas[i].free[:0]
	}
}

type opRec struct {
	kind       OpKind
	tier       index.Tier
	start, end int
}

// NewRekeyer returns an empty Rekeyer for one pod.
func NewRekeyer(cfg RekeyConfig) (*Rekeyer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Rekeyer{cfg: cfg, leafHead: none, leafTail: none,
		rankCount: make([]int, cfg.MaxRanks)}
	return r, nil
}

// Stats returns the counters.
func (r *Rekeyer) Stats() RekeyStats {
	s := r.stats
	s.Entries = r.byKey.n
	return s
}

// Len is the number of engine blocks tracked.
func (r *Rekeyer) Len() int { return r.byKey.n }

// Reserve sizes the Rekeyer for n engine blocks (the pod's KV capacity in
// blocks, GPU plus offload tiers), at most MaxEntries, so that it does not
// grow while the pod's cache fills: its key table, its entries and (once
// the engine block size is known, with the first block that keeps tokens)
// its token store. Growing them as the cache filled copied every entry
// and token chunk several times over and left up to a quarter of each
// array unused.
func (r *Rekeyer) Reserve(n int) {
	n = min(n, r.cfg.MaxEntries)
	r.byKey.reserve(n)
	if n > cap(r.entries) {
		r.entries = append(make([]entry, 0, n), r.entries...)
	}
	r.toks.reserved = max(r.toks.reserved, n)
	for i := range r.toks.arenas {
		r.toks.reserve(&r.toks.arenas[i], r.cfg.BlockSize)
	}
}

// Capacity is how many engine blocks the Rekeyer tracks without growing.
func (r *Rekeyer) Capacity() int { return len(r.byKey.slots) * 3 / 4 }

// Apply appends to dst the index operations that b's block events imply and
// returns it. Lifecycle events (PodUp, PodDown) are not the Rekeyer's: the
// caller decides, e.g. on a new epoch, to call Reset. The Hashes of the ops
// stay valid until the next call on r.
func (r *Rekeyer) Apply(dst []Op, b *Batch) []Op {
	r.begin()
	rank := b.Rank()
	for _, ev := range b.Events {
		r.event(rank, ev)
	}
	return r.finish(dst)
}

// ApplyEvent is Apply for a single event published by data-parallel rank.
func (r *Rekeyer) ApplyEvent(dst []Op, rank int64, ev Event) []Op {
	r.begin()
	r.event(rank, ev)
	return r.finish(dst)
}

// ApplyEvents is Apply for a run of events published by data-parallel
// rank (lifecycle events among them are skipped, as Apply skips them). The
// ops are those of ApplyEvent called on each event in turn, concatenated,
// with adjacent ops of the same kind and tier merged: the index gets fewer,
// longer calls, whose cache misses it overlaps.
func (r *Rekeyer) ApplyEvents(dst []Op, rank int64, evs []Event) []Op {
	r.begin()
	for _, ev := range evs {
		r.event(rank, ev)
	}
	return r.finish(dst)
}

// Reset forgets everything (the engine restarted, or the caller lost track)
// and appends the OpClearPod that says so.
func (r *Rekeyer) Reset(dst []Op) []Op {
	r.begin()
	r.clearAll()
	return r.finish(dst)
}

// ApplyEventsGuarded is ApplyEvents for events nobody vouches for (the
// consumer's): a panic while re-keying them, a defect of this package
// that the fuzzers have not found, does not reach the caller, whose
// process would otherwise die on the message and again on its every
// replay. The re-keyer's state may be half-changed then, so it forgets
// everything, as Reset does: dst gets the OpClearPod that says so in
// place of the events' ops, and err describes the panic. The pod's
// blocks are learnt again from its next events.
func (r *Rekeyer) ApplyEventsGuarded(dst []Op, rank int64, evs []Event) (out []Op, err error) {
	n := len(dst)
	defer func() {
		if v := recover(); v != nil {
			err = &RekeyPanic{Events: len(evs), Value: v, Stack: debug.Stack()}
			out = r.Reset(dst[:n])
		}
	}()
	return r.ApplyEvents(dst, rank, evs), nil
}

// RekeyPanic is the error of ApplyEventsGuarded: what the panic was, and
// where (for a bug report).
type RekeyPanic struct {
	Events int // in the call
	Value  any
	Stack  []byte
}

func (e *RekeyPanic) Error() string {
	return fmt.Sprintf("re-keying %d events panicked (%v): the pod's state was reset", e.Events, e.Value)
}

func (r *Rekeyer) begin() {
	r.ops = r.ops[:0]
	r.opHashes = r.opHashes[:0]
}

func (r *Rekeyer) finish(dst []Op) []Op {
	for _, o := range r.ops {
		op := Op{Kind: o.kind, Tier: o.tier}
		if o.end > o.start {
			op.Hashes = r.opHashes[o.start:o.end:o.end]
		}
		dst = append(dst, op)
	}
	return dst
}

// emit records an op for entry i's router blocks (none for OpClearPod),
// merging it into the previous one when kind and tier match (the index
// takes a slice per call).
func (r *Rekeyer) emit(kind OpKind, t index.Tier, i int32) {
	if n := len(r.ops); n > 0 && kind != OpClearPod {
		if last := &r.ops[n-1]; last.kind == kind && last.tier == t && last.end == len(r.opHashes) {
			r.opHashes = r.appendOurs(r.opHashes, i)
			last.end = len(r.opHashes)
			return
		}
	}
	start := len(r.opHashes)
	if i != none {
		r.opHashes = r.appendOurs(r.opHashes, i)
	}
	r.ops = append(r.ops, opRec{kind: kind, tier: t, start: start, end: len(r.opHashes)})
}

func (r *Rekeyer) appendOurs(dst []uint64, i int32) []uint64 {
	if e := &r.entries[i]; e.nours == 1 {
		return append(dst, e.h)
	}
	return append(dst, r.ours[i]...)
}

func (r *Rekeyer) event(rank int64, ev Event) {
	switch ev := ev.(type) {
	case *BlockStored:
		if k, ok := r.key(rank, ev.GroupIdx); ok {
			r.stored(k, ev)
		}
	case *BlockRemoved:
		if k, ok := r.key(rank, ev.GroupIdx); ok {
			r.removed(k, ev)
		}
	case *AllBlocksCleared:
		if rank < 0 || rank >= int64(r.cfg.MaxRanks) {
			r.stats.BadRank++
			return
		}
		r.stats.Clears++
		r.clearRank(int32(rank))
	}
}

// key returns the key template (hash 0) for an event's rank and group.
func (r *Rekeyer) key(rank int64, group Opt[int64]) (ekey, bool) {
	g := int64(0)
	if group.Valid {
		g = group.V
	}
	if rank < 0 || rank >= int64(r.cfg.MaxRanks) || g < 0 || g > 1<<30 {
		r.stats.BadRank++
		return ekey{}, false
	}
	return ekey{group: int32(g), rank: int32(rank)}, true
}

// local reports whether an event's medium and locality are the pod's own
// storage: Local, except that a medium the operator mapped in Media is
// local unless its locality says otherwise.
func (r *Rekeyer) local(m, locality Opt[string]) bool {
	if m.Valid && !locality.Valid && len(r.cfg.Media) > 0 {
		if _, ok := r.cfg.Media[m.V]; ok {
			return true
		}
		if _, ok := r.cfg.Media[strings.ToUpper(m.V)]; ok {
			return true
		}
	}
	return Local(m, locality)
}

// FullAttention reports whether a KV-cache group of this kind extends a
// prefix match: absent (engines without hybrid groups, and vLLM before
// #40984), vLLM's "full_attention" (MLA included) or SGLang's "full".
// Sliding-window, chunked-local, mamba and other groups are not.
func FullAttention(kind Opt[string]) bool {
	return !kind.Valid || kind.V == "full_attention" || kind.V == "full"
}

// nonEmptyList reports whether raw is a msgpack array or map with at least
// one element (a block's mm_keys entry that names content).
func nonEmptyList(raw Raw) bool {
	if len(raw) == 0 {
		return false
	}
	rd := reader{b: raw}
	_, n, err := rd.container("mm_keys")
	return err != nil || n > 0
}

func (r *Rekeyer) tier(m Opt[string]) (index.Tier, bool) {
	if m.Valid && len(r.cfg.Media) > 0 {
		if t, ok := r.cfg.Media[m.V]; ok {
			return t, true
		}
		if t, ok := r.cfg.Media[strings.ToUpper(m.V)]; ok {
			return t, true
		}
	}
	return TierOf(m)
}

func (r *Rekeyer) lookup(k ekey) int32 {
	return r.byKey.lookup(k, r.entries)
}

func (e *entry) alive() bool { return e.held != 0 }

func (r *Rekeyer) stored(k ekey, ev *BlockStored) {
	t, ok := r.tier(ev.Medium)
	if !ok {
		r.stats.UnknownMedium++
		return
	}
	if !r.local(ev.Medium, ev.Locality) {
		r.stats.NonLocal++
		return
	}
	n := len(ev.BlockHashes)
	if n == 0 {
		return
	}
	if len(ev.TokenIDs) == 0 {
		// CPU offload announces blocks without tokens: they can only be
		// blocks the pod already holds in another tier.
		for _, h := range ev.BlockHashes {
			k.hash = h
			i := r.lookup(k)
			if i == none || !r.entries[i].alive() {
				r.stats.NoTokensUnknown++
				continue
			}
			r.store(i, t)
		}
		return
	}
	ebs := ev.BlockSize
	R := int64(r.cfg.BlockSize)
	if ebs <= 0 || ebs > maxBlockSize || int64(len(ev.TokenIDs)) != int64(n)*ebs || (R%ebs != 0 && ebs%R != 0) {
		r.stats.BadBlocks++
		return
	}
	parent := none
	if ev.ParentBlockHash.Valid {
		pk := k
		pk.hash = ev.ParentBlockHash.V
		parent = r.lookup(pk)
		if parent == none || !r.entries[parent].alive() {
			r.stats.UnknownParent++
			return
		}
		if int64(r.entries[parent].ebs()) != ebs {
			r.stats.BadBlocks++
			return
		}
	}
	lora := ""
	if ev.LoRAName.Valid {
		lora = ev.LoRAName.V
	} else if ev.LoRAID.Valid {
		// Only the deprecated id: a name no request will carry, so these
		// blocks never match the base model's.
		lora = "lora_id:" + strconv.FormatInt(ev.LoRAID.V, 10)
	}
	ctx := blockCtx{lora: lora, full: FullAttention(ev.KVCacheSpecKind)}
	if ev.CacheSalt.Valid {
		ctx.salt = ev.CacheSalt.V
	}
	strs := ev.StringTokens
	for b, h := range ev.BlockHashes {
		if b%prefetchRun == 0 {
			r.prefetchStored(k, ev.BlockHashes[b:min(b+prefetchRun, n)], int(ebs))
		}
		k.hash = h
		ctx.extra = nil
		if b < len(ev.ExtraKeys) {
			ctx.extra = ev.ExtraKeys[b]
		}
		// Multimodal content our chain cannot express: mm_keys, or string
		// token ids inside this block.
		ctx.mm = b < len(ev.MMKeys) && nonEmptyList(ev.MMKeys[b])
		for len(strs) > 0 && int64(strs[0].Pos) < int64(b+1)*ebs {
			ctx.mm = true
			strs = strs[1:]
		}
		if i := r.lookup(k); i != none {
			if int64(r.entries[i].ebs()) != ebs {
				// The pod announced this block before with blocks of
				// another size: the chain cannot go on through it (its
				// children's router blocks would take its tokens as
				// this event's size), as it cannot from a parent of
				// another size.
				r.stats.BadBlocks++
				return
			}
			if r.entries[i].parent != parent {
				r.stats.Conflicts++
			}
			r.store(i, t)
			parent = i
			continue
		}
		i := r.create(k, parent, ev.TokenIDs[int64(b)*ebs:int64(b+1)*ebs], &ctx)
		if i == none {
			r.stats.CapDropped += uint64(n - b)
			return
		}
		r.store(i, t)
		parent = i
	}
}

// blockCtx is what a BlockStored says about each of its blocks beyond
// tokens: the namespace (LoRA name, the event's cache salt), the block's
// extra keys, whether it holds multimodal content, and whether its group
// is full attention.
type blockCtx struct {
	lora, salt string
	extra      Raw
	mm, full   bool
}

// create adds the entry for a new engine block under parent (none for the
// first block of a sequence) and returns its index, or none when the cap is
// reached and nothing can be forgotten.
func (r *Rekeyer) create(k ekey, parent int32, toks []uint32, ctx *blockCtx) int32 {
	if r.byKey.n >= r.cfg.MaxEntries && !r.evictOne(parent) {
		return none
	}
	var i int32
	if n := len(r.free); n > 0 {
		i = r.free[n-1]
		r.free = r.free[:n-1]
	} else {
		r.entries = append(r.entries, entry{})
		i = int32(len(r.entries) - 1)
	}
	ebs := uint32(len(toks))
	R := uint32(r.cfg.BlockSize)
	e := entry{key: k, parent: parent, child: none, prevSib: none, nextSib: none,
		prevLeaf: none, nextLeaf: none, ebsm1: uint16(ebs - 1), tok: none, flags: fUsed}
	salt, opaque := classifyExtra(ctx.extra, ctx.lora, parent == none)
	if salt == "" {
		salt = ctx.salt // SGLang's: the event's, for the chain it starts
	}
	var p *entry
	if parent != none {
		p = &r.entries[parent]
		e.set(fOpaque, p.is(fOpaque))
	}
	if opaque || ctx.mm || !ctx.full {
		e.set(fOpaque, true)
	}
	// The hash this block's router block chains from: the seed, or what
	// the parent leaves (see entry.h).
	var base uint64
	if p == nil {
		base = r.seedFor(ctx.lora, salt)
	} else {
		base = p.h
		if R > ebs && uint32(p.pos)+1 < R/ebs {
			e.pos = p.pos + 1
		}
	}
	if R >= ebs {
		kk := R / ebs
		if uint32(e.pos) == kk-1 {
			e.nours = 1
			e.h = index.Extend(base, r.routerBlock(p, kk-1, toks))
		} else {
			e.h = base
			e.tok = r.toks.put(toks, r.cfg.BlockSize)
		}
	} else {
		m := ebs / R
		e.nours = m
		ours := index.ChainFrom(base, int(R), toks, make([]uint64, 0, m))
		e.h = ours[m-1]
		if r.ours == nil {
			r.ours = map[int32][]uint64{}
		}
		r.ours[i] = ours
	}
	switch {
	case !ctx.full:
		r.stats.NotFullAttention++
	case e.is(fOpaque):
		r.stats.Opaque++
	}
	r.entries[i] = e
	r.byKey.insert(k, i)
	r.rankCount[k.rank]++
	if parent != none {
		p := &r.entries[parent]
		if p.child == none {
			r.leafRemove(parent)
		} else {
			r.entries[p.child].prevSib = i
			r.entries[i].nextSib = p.child
		}
		p.child = i
	}
	r.leafPushBack(i)
	return i
}

// routerBlock returns the tokens of the router block that ends with toks: the
// own tokens of the n ancestors before it, then toks.
func (r *Rekeyer) routerBlock(p *entry, n uint32, toks []uint32) []uint32 {
	if n == 0 {
		return toks
	}
	total := int(n+1) * len(toks)
	if cap(r.scratch) < total {
		r.scratch = make([]uint32, total)
	}
	s := r.scratch[:total]
	copy(s[int(n)*len(toks):], toks)
	for j := int(n) - 1; j >= 0; j-- {
		copy(s[j*len(toks):], r.toks.get(len(toks), p.tok))
		if j > 0 {
			p = &r.entries[p.parent]
		}
	}
	return s
}

func (r *Rekeyer) seedFor(lora, salt string) uint64 {
	ns := index.Namespace{Model: r.cfg.Model, LoRA: lora, CacheSalt: salt, BlockSize: r.cfg.BlockSize}
	if r.seed == 0 || ns != r.nsCache {
		r.nsCache, r.seed = ns, ns.Seed()
	}
	return r.seed
}

// classifyExtra reads a block's extra_keys tuple. The chain hash covers model,
// LoRA name and cache salt and nothing else, so: the LoRA name (first
// element, when it equals the event's) is expected on every block; a string
// on the first block of a sequence is the cache salt; anything else
// (multimodal (id, offset) pairs, prompt-embeds digests, strings elsewhere)
// makes the block opaque.
func classifyExtra(raw Raw, lora string, first bool) (salt string, opaque bool) {
	if len(raw) == 0 || (len(raw) == 1 && raw[0] == mpNil) {
		return "", false
	}
	rd := reader{b: raw}
	isMap, n, err := rd.container("extra_keys")
	if err != nil || isMap {
		return "", true
	}
	sawSalt := false
	for k := 0; k < n; k++ {
		// Not redundant with bytes' own type check: a multimodal (id,
		// offset) pair is rejected here without bytes building a
		// DecodeError for it (TestClassifyExtraOpaqueAllocs).
		c, err := rd.peek()
		if err != nil || typeName(c) != "string" {
			return "", true
		}
		p, isStr, err := rd.bytes("extra key", 1<<20)
		if err != nil || !isStr {
			return "", true
		}
		switch {
		case k == 0 && lora != "" && string(p) == lora:
		case first && !sawSalt:
			salt, sawSalt = string(p), true
		default:
			return "", true
		}
	}
	return salt, false
}

// store adds one announcement of entry i in tier t: announcements of one
// engine block on one medium are a set, not a counter.
func (r *Rekeyer) store(i int32, t index.Tier) {
	r.stats.StoredBlocks++
	e := &r.entries[i]
	if e.held&(1<<t) != 0 {
		r.stats.Reannounced++
	} else {
		e.held |= 1 << t
		r.flip(i, t)
	}
	if e.is(fInLeaf) && e.nextLeaf != none {
		// Most recently stored leaf goes last.
		r.leafRemove(i)
		r.leafPushBack(i)
	}
}

func (r *Rekeyer) removed(k ekey, ev *BlockRemoved) {
	t, ok := r.tier(ev.Medium)
	if !ok {
		r.stats.UnknownMedium++
		return
	}
	if !r.local(ev.Medium, ev.Locality) {
		r.stats.NonLocal++
		return
	}
	for b, h := range ev.BlockHashes {
		if b%prefetchRun == 0 {
			r.prefetchRemoved(k, ev.BlockHashes[b:min(b+prefetchRun, len(ev.BlockHashes))])
		}
		k.hash = h
		i := r.lookup(k)
		if i == none {
			r.stats.UnknownRemoved++
			continue
		}
		e := &r.entries[i]
		if e.held&(1<<t) == 0 {
			r.stats.RemovedNotHeld++
			continue
		}
		r.stats.RemovedBlocks++
		e.held &^= 1 << t
		r.flip(i, t)
		r.maybeDelete(i)
	}
}

// prefetchRun is how many blocks of a BlockStored the Rekeyer brings into
// cache at a time before it stores them: their lines (a slot, an entry and
// a token chunk each) stay well within the L1 cache.
const prefetchRun = 64

// prefetchStored brings into cache what storing hashes will touch: their
// slots (a new block's lookup misses there, and its insertion writes
// there), and the entries and token chunks the free lists will hand out,
// with loads that do not depend on one another (touchLines); then, the
// slots read, the entries of the blocks already held (announced again),
// with prefetch instructions. Prefetch instructions in the first pass left
// most of those lines out of cache when they were written (the CPU may
// drop a prefetch it has no room for): each new entry's first write then
// waited on a miss.
func (r *Rekeyer) prefetchStored(k ekey, hashes []uint64, ebs int) {
	hashes = hashes[:min(len(hashes), prefetchRun)]
	var lines [3 * prefetchRun]unsafe.Pointer
	n := 0
	t := &r.byKey
	if t.n > 0 {
		for _, h := range hashes {
			k.hash = h
			lines[n] = unsafe.Pointer(&t.slots[keyHash(k)>>t.shift])
			n++
		}
	}
	slots := n
	for j, f := 0, len(r.free); j < len(hashes) && j < f; j++ {
		lines[n] = unsafe.Pointer(&r.entries[r.free[f-1-j]])
		n++
	}
	if ebs < r.cfg.BlockSize {
		a := r.toks.arena(ebs)
		for j, f := 0, len(a.free); j < len(hashes) && j < f; j++ {
			if c := int(a.free[f-1-j]) * ebs; c < len(a.buf) {
				lines[n] = unsafe.Pointer(&a.buf[c])
				n++
			}
		}
	}
	touchLines(lines[:n])
	if slots == 0 {
		return
	}
	n = 0
	for _, h := range hashes {
		k.hash = h
		kh := keyHash(k)
		if s := t.slots[kh>>t.shift]; s != 0 && uint32(s>>32) == uint32(kh>>32) {
			if e := int(uint32(s)) - 1; e < len(r.entries) {
				lines[n] = unsafe.Pointer(&r.entries[e])
				n++
			}
		}
	}
	prefetchLines(lines[:n])
}

// touchSink keeps touchLines's loads from being optimized away: written
// only when the sum is 1, never read on purpose. It is shared by every
// Rekeyer in the process (a controller's replicas in one test binary, the
// shards of one ingester), so the store is atomic: a plain one is a data
// race between two of them.
var touchSink atomic.Uint32

// touchLines loads a byte at each address in lines: the loads do not
// depend on each other, so the CPU overlaps their misses, as many as its
// reorder window holds, and none is dropped.
func touchLines(lines []unsafe.Pointer) {
	var acc uint8
	for _, p := range lines {
		acc += *(*uint8)(p)
	}
	if acc == 1 {
		touchSink.Store(1)
	}
}

// prefetchRemoved brings into cache what removing hashes (at most
// prefetchRun) will touch, in three passes, each of which issues
// prefetches that do not wait on one another: the home slot of each hash;
// then, the slots now in cache, the entry each names; then, those entries
// read, the entries unlinking one reads and writes (its parent, its
// siblings and its neighbours on the leaf list). Removals are of blocks
// spread at random over a pod's entries: one after another, each waited
// for four or five cache misses in turn.
func (r *Rekeyer) prefetchRemoved(k ekey, hashes []uint64) {
	t := &r.byKey
	if t.n == 0 {
		return
	}
	hashes = hashes[:min(len(hashes), prefetchRun)]
	var lines [5 * prefetchRun]unsafe.Pointer
	var found [prefetchRun]int32
	for j, h := range hashes {
		k.hash = h
		lines[j] = unsafe.Pointer(&t.slots[keyHash(k)>>t.shift])
	}
	prefetchLines(lines[:len(hashes)])
	mask := uint64(len(t.slots) - 1)
	n := 0
	for _, h := range hashes {
		k.hash = h
		kh := keyHash(k)
		fp := uint32(kh >> 32)
		// The first slot of its fingerprint (probe runs are short; a
		// collision costs a useless prefetch).
		for i, probes := kh>>t.shift, 0; probes < 8; i, probes = (i+1)&mask, probes+1 {
			s := t.slots[i]
			if s == 0 {
				break
			}
			if uint32(s>>32) == fp {
				if e := int32(uint32(s)) - 1; int(e) < len(r.entries) {
					lines[n] = unsafe.Pointer(&r.entries[e])
					found[n] = e
					n++
				}
				break
			}
		}
	}
	prefetchLines(lines[:n])
	m := 0
	for _, e := range found[:n] {
		en := &r.entries[e]
		for _, j := range [...]int32{en.parent, en.prevSib, en.nextSib, en.prevLeaf, en.nextLeaf} {
			if j >= 0 && int(j) < len(r.entries) {
				lines[m] = unsafe.Pointer(&r.entries[j])
				m++
			}
		}
	}
	prefetchLines(lines[:m])
}

// flip re-evaluates, in tier t, every router block whose engine blocks
// include entry i, after i became held or not held in t.
func (r *Rekeyer) flip(i int32, t index.Tier) {
	e := &r.entries[i]
	if e.nours > 0 {
		r.recheck(i, t)
		return
	}
	// i ends inside a router block: the completing descendants are below it.
	r.stack = append(r.stack[:0], e.child)
	for len(r.stack) > 0 {
		c := r.stack[len(r.stack)-1]
		r.stack = r.stack[:len(r.stack)-1]
		for ; c != none; c = r.entries[c].nextSib {
			ce := &r.entries[c]
			if ce.nours > 0 {
				r.recheck(c, t)
			} else if ce.child != none {
				r.stack = append(r.stack, ce.child)
			}
		}
	}
}

// recheck registers or evicts the router blocks completed by entry c in tier
// t: they are held exactly when every engine block they span is held in t
// and none is opaque.
func (r *Rekeyer) recheck(c int32, t index.Tier) {
	e := &r.entries[c]
	want := !e.is(fOpaque)
	if want {
		w := e
		for j := uint16(0); ; j++ {
			if w.held&(1<<t) == 0 {
				want = false
				break
			}
			if j == e.pos {
				break
			}
			w = &r.entries[w.parent]
		}
	}
	bit := uint8(1) << t
	switch {
	case want && e.reg&bit == 0:
		e.reg |= bit
		r.emit(OpRegister, t, c)
	case !want && e.reg&bit != 0:
		e.reg &^= bit
		r.emit(OpEvict, t, c)
	}
}

// maybeDelete frees entry i if it is held nowhere and no entry needs it, and
// then its ancestors on the same terms.
func (r *Rekeyer) maybeDelete(i int32) {
	for i != none {
		e := &r.entries[i]
		if e.alive() || e.child != none {
			return
		}
		parent := e.parent
		r.unlink(i)
		r.release(i)
		if parent != none && r.entries[parent].child == none && r.entries[parent].alive() {
			r.leafPushFront(parent) // stored before its child: among the oldest leaves
		}
		i = parent
	}
}

// evictOne forgets the least recently stored leaf other than keep, evicting
// its router blocks from the index. It reports whether one was found.
func (r *Rekeyer) evictOne(keep int32) bool {
	v := r.leafHead
	if v == keep && v != none {
		v = r.entries[v].nextLeaf
	}
	if v == none {
		return false
	}
	r.stats.CapEvicted++
	e := &r.entries[v]
	for t := index.Tier(0); t < index.NumTiers; t++ {
		if e.reg&(1<<t) != 0 {
			r.emit(OpEvict, t, v)
		}
	}
	e = &r.entries[v]
	e.reg = 0
	e.held = 0
	r.maybeDelete(v)
	return true
}

// unlink detaches entry i (which has no children) from its parent and from
// the leaf list.
func (r *Rekeyer) unlink(i int32) {
	e := &r.entries[i]
	if e.is(fInLeaf) {
		r.leafRemove(i)
	}
	if e.prevSib != none {
		r.entries[e.prevSib].nextSib = e.nextSib
	} else if e.parent != none {
		r.entries[e.parent].child = e.nextSib
	}
	if e.nextSib != none {
		r.entries[e.nextSib].prevSib = e.prevSib
	}
}

func (r *Rekeyer) release(i int32) {
	e := &r.entries[i]
	r.byKey.remove(e.key, i)
	r.rankCount[e.key.rank]--
	if e.tok != none {
		r.toks.release(int(e.ebs()), e.tok)
	}
	if e.nours > 1 {
		delete(r.ours, i)
	}
	*e = entry{}
	r.free = append(r.free, i)
}

func (r *Rekeyer) leafPushBack(i int32) {
	e := &r.entries[i]
	e.prevLeaf, e.nextLeaf = r.leafTail, none
	e.set(fInLeaf, true)
	if r.leafTail != none {
		r.entries[r.leafTail].nextLeaf = i
	} else {
		r.leafHead = i
	}
	r.leafTail = i
}

func (r *Rekeyer) leafPushFront(i int32) {
	e := &r.entries[i]
	e.prevLeaf, e.nextLeaf = none, r.leafHead
	e.set(fInLeaf, true)
	if r.leafHead != none {
		r.entries[r.leafHead].prevLeaf = i
	} else {
		r.leafTail = i
	}
	r.leafHead = i
}

func (r *Rekeyer) leafRemove(i int32) {
	e := &r.entries[i]
	if e.prevLeaf != none {
		r.entries[e.prevLeaf].nextLeaf = e.nextLeaf
	} else {
		r.leafHead = e.nextLeaf
	}
	if e.nextLeaf != none {
		r.entries[e.nextLeaf].prevLeaf = e.prevLeaf
	} else {
		r.leafTail = e.prevLeaf
	}
	e.prevLeaf, e.nextLeaf = none, none
	e.set(fInLeaf, false)
}

// clearRank forgets every block of one data-parallel rank. When no other
// rank holds anything the whole pod is cleared with one OpClearPod;
// otherwise the rank's registered router blocks are evicted one by one.
func (r *Rekeyer) clearRank(rank int32) {
	if r.rankCount[rank] == r.byKey.n {
		r.clearAll()
		return
	}
	for i := range r.entries {
		e := &r.entries[i]
		if !e.is(fUsed) || e.key.rank != rank {
			continue // a free slot, or another rank's
		}
		for t := index.Tier(0); t < index.NumTiers; t++ {
			if e.reg&(1<<t) != 0 {
				r.emit(OpEvict, t, int32(i))
			}
		}
		if e.is(fInLeaf) {
			r.leafRemove(int32(i))
		}
		r.release(int32(i))
	}
	// The rank's trees were disjoint from the others': no live entry points
	// into a released one.
}

func (r *Rekeyer) clearAll() {
	r.emit(OpClearPod, 0, none)
	r.byKey.clear()
	r.toks.clear()
	clear(r.ours)
	r.entries = r.entries[:0]
	r.free = r.free[:0]
	r.leafHead, r.leafTail = none, none
	clear(r.rankCount)
}
