package enginesim

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// naiveCache restates the prefix cache's rules as plainly as possible: a map
// of blocks with reference counts and a "freed at" stamp; the victim is the
// unreferenced block with the smallest stamp; a request's blocks are
// stamped tail first when released.
type naiveCache struct {
	blockSize, capacity int
	blocks              map[uint64]*naiveBlock
	clearedPinned       map[*naiveBlock]bool // evicted-by-reset blocks still held by requests
	scratch             int
	stamp               int
	events              []Event
}

type naiveBlock struct {
	hash   uint64
	tokens []uint32
	refs   int
	freed  int // stamp when refs dropped to 0
	parent uint64
	hasPar bool
}

type naiveHolding struct {
	tokens    []uint32
	hashes    []uint64
	maxTokens int
	hit       int
	held      []*naiveBlock
	scratch   int
	prefilled bool
}

func (n *naiveCache) used() int { return len(n.blocks) + len(n.clearedPinned) + n.scratch }

func (n *naiveCache) admit(h *naiveHolding) bool {
	limit := 0
	if len(h.tokens) > 0 {
		limit = (len(h.tokens) - 1) / n.blockSize
	}
	hit := 0
	for hit < limit && hit < len(h.hashes) && n.blocks[h.hashes[hit]] != nil {
		hit++
	}
	need := (len(h.tokens)+h.maxTokens+n.blockSize-1)/n.blockSize - hit
	isHit := map[uint64]bool{}
	for _, x := range h.hashes[:hit] {
		isHit[x] = true
	}
	evictable := 0
	for _, b := range n.blocks {
		if b.refs == 0 && !isHit[b.hash] {
			evictable++
		}
	}
	if n.capacity-n.used()+evictable < need {
		return false
	}
	h.hit = hit
	for _, x := range h.hashes[:hit] {
		b := n.blocks[x]
		b.refs++
		h.held = append(h.held, b)
	}
	var removed []uint64
	for n.capacity-n.used() < need {
		var victim *naiveBlock
		for _, b := range n.blocks {
			if b.refs == 0 && (victim == nil || b.freed < victim.freed) {
				victim = b
			}
		}
		delete(n.blocks, victim.hash)
		removed = append(removed, victim.hash)
	}
	if len(removed) > 0 {
		n.events = append(n.events, Event{Kind: BlockRemoved, BlockHashes: removed, Medium: MediumGPU})
	}
	n.scratch += need
	h.scratch = need
	return true
}

func (n *naiveCache) prefillDone(h *naiveHolding) {
	var cur *Event
	for i := h.hit; i < len(h.hashes); i++ {
		x := h.hashes[i]
		if b := n.blocks[x]; b != nil {
			if cur != nil {
				n.events = append(n.events, *cur)
				cur = nil
			}
			b.refs++
			h.held = append(h.held, b)
		} else {
			toks := h.tokens[i*n.blockSize : (i+1)*n.blockSize]
			b := &naiveBlock{hash: x, tokens: toks, refs: 1}
			if i > 0 {
				b.parent, b.hasPar = h.hashes[i-1], true
			}
			n.blocks[x] = b
			h.held = append(h.held, b)
			if cur == nil {
				cur = &Event{Kind: BlockStored, BlockSize: n.blockSize, Medium: MediumGPU, ParentHash: b.parent, HasParent: b.hasPar}
			}
			cur.BlockHashes = append(cur.BlockHashes, x)
			cur.TokenIDs = append(cur.TokenIDs, toks...)
		}
		h.scratch--
		n.scratch--
	}
	if cur != nil {
		n.events = append(n.events, *cur)
	}
	h.prefilled = true
}

func (n *naiveCache) release(h *naiveHolding) {
	for i := len(h.held) - 1; i >= 0; i-- {
		b := h.held[i]
		b.refs--
		if b.refs == 0 {
			if n.clearedPinned[b] {
				delete(n.clearedPinned, b)
			} else {
				n.stamp++
				b.freed = n.stamp
			}
		}
	}
	n.scratch -= h.scratch
	h.scratch = 0
	h.held = nil
}

func (n *naiveCache) reset() {
	for x, b := range n.blocks {
		if b.refs > 0 {
			n.clearedPinned[b] = true
		}
		delete(n.blocks, x)
	}
	n.events = append(n.events, Event{Kind: AllBlocksCleared})
}

// replay applies events to a set of hashes, as a consumer would.
func replay(events []Event) map[uint64]bool {
	set := map[uint64]bool{}
	for _, e := range events {
		switch e.Kind {
		case BlockStored:
			for _, x := range e.BlockHashes {
				set[x] = true
			}
		case BlockRemoved:
			for _, x := range e.BlockHashes {
				delete(set, x)
			}
		case AllBlocksCleared:
			clear(set)
		}
	}
	return set
}

// TestCacheMatchesNaive drives the cache and the naive reference with the
// same random request sequences (prompts built from shared prefixes so hits
// and duplicates happen; admissions, prefills, releases and cancellations in
// any order; resets) and compares after every step: admission outcome, hit
// blocks, the event stream, the cached blocks, the occupancy. It also checks
// that replaying the events gives exactly the cache's content, that the
// cache never exceeds capacity and that pinned blocks are never evicted.
func TestCacheMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		bs := rapid.SampledFrom([]int{1, 2, 4}).Draw(rt, "blockSize")
		capacity := rapid.IntRange(1, 24).Draw(rt, "capacity")
		var events []Event
		c := newPrefixCache(bs, capacity, func(e Event) { events = append(events, e) })
		n := &naiveCache{blockSize: bs, capacity: capacity, blocks: map[uint64]*naiveBlock{}, clearedPinned: map[*naiveBlock]bool{}}
		chain := newHashChain("test")

		// A few "documents" that prompts start with, so prefixes repeat.
		docs := [][]uint32{{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 3, 4, 9, 9, 9, 9}, {5, 5, 5, 5, 5, 5, 5, 5}}
		type pair struct {
			real  *holding
			naive *naiveHolding
		}
		var queued, running []pair

		steps := rapid.IntRange(10, 80).Draw(rt, "steps")
		for step := range steps {
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case op <= 3: // a new request arrives and tries admission (FIFO: only the head may be admitted)
				doc := docs[rapid.IntRange(0, len(docs)-1).Draw(rt, "doc")]
				cut := rapid.IntRange(1, len(doc)).Draw(rt, "cut")
				var tail []uint32
				if rapid.Bool().Draw(rt, "hasTail") {
					tail = rapid.SliceOfN(rapid.Uint32Range(1, 3), 1, 6).Draw(rt, "tail")
				}
				toks := append(slices.Clone(doc[:cut]), tail...)
				maxTok := rapid.IntRange(1, 4).Draw(rt, "maxTokens")
				hashes := chain.appendHashes(nil, toks, bs, "", "")
				if c.blocksFor(len(toks)+maxTok) > capacity {
					continue // the engine refuses such a request up front
				}
				queued = append(queued, pair{
					&holding{tokens: toks, hashes: hashes, maxTokens: maxTok},
					&naiveHolding{tokens: toks, hashes: hashes, maxTokens: maxTok},
				})
			case op <= 5: // try to admit the queue head
				if len(queued) == 0 {
					continue
				}
				p := queued[0]
				okReal, okNaive := c.admit(p.real), n.admit(p.naive)
				if okReal != okNaive {
					rt.Fatalf("step %d: admit real=%v naive=%v", step, okReal, okNaive)
				}
				if okReal {
					if p.real.Hit != p.naive.hit {
						rt.Fatalf("step %d: hit real=%d naive=%d", step, p.real.Hit, p.naive.hit)
					}
					queued = queued[1:]
					running = append(running, p)
				}
			case op <= 7: // a running request finishes its prefill
				var pending []int
				for i, p := range running {
					if !p.real.prefilled {
						pending = append(pending, i)
					}
				}
				if len(pending) == 0 {
					continue
				}
				p := running[rapid.SampledFrom(pending).Draw(rt, "prefill")]
				c.prefillDone(p.real)
				n.prefillDone(p.naive)
			case op == 8: // a running request finishes or is cancelled (before or after prefill)
				if len(running) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(running)-1).Draw(rt, "release")
				c.release(running[i].real)
				n.release(running[i].naive)
				running = slices.Delete(running, i, i+1)
			default:
				c.reset()
				n.reset()
			}
			if !slices.EqualFunc(events, n.events, eventsEqual) {
				rt.Fatalf("step %d: events differ:\nreal  %v\nnaive %v", step, events, n.events)
			}
			if got, want := cachedHashes(c), slices.Sorted(maps.Keys(n.blocks)); !slices.Equal(got, want) {
				rt.Fatalf("step %d: cached real=%v naive=%v", step, got, want)
			}
			if got := slices.Sorted(maps.Keys(replay(events))); !slices.Equal(got, cachedHashes(c)) {
				rt.Fatalf("step %d: replayed events %v != cache %v", step, got, cachedHashes(c))
			}
			if c.Used() != n.used() || c.Used() > capacity {
				rt.Fatalf("step %d: used real=%d naive=%d capacity=%d", step, c.Used(), n.used(), capacity)
			}
			for _, p := range running {
				for _, b := range p.real.Pinned {
					if b.Refs() <= 0 {
						rt.Fatalf("step %d: a held block has refs %d", step, b.Refs())
					}
				}
			}
		}
		// Drain: everything released leaves only unpinned cached blocks.
		for _, p := range running {
			c.release(p.real)
		}
		if c.Used() != c.Len() || c.Evictable() != c.Len() || c.Usage() != 0 {
			rt.Fatalf("after release: used %d, lru %d, table %d, usage %v", c.Used(), c.Evictable(), c.Len(), c.Usage())
		}
	})
}

// cachedHashes returns the hashes c holds, sorted.
func cachedHashes(c *prefixCache) []uint64 {
	var hs []uint64
	for b := range c.All() {
		hs = append(hs, b.Hash)
	}
	slices.Sort(hs)
	return hs
}

func eventsEqual(a, b Event) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func TestCacheSnapshotChains(t *testing.T) {
	var events []Event
	c := newPrefixCache(2, 100, func(e Event) { events = append(events, e) })
	chain := newHashChain("s")
	toks := []uint32{1, 2, 3, 4, 5}
	h := &holding{tokens: toks, hashes: chain.appendHashes(nil, toks, 2, "lora-a", "salt"), lora: "lora-a", salt: "salt", maxTokens: 1}
	if !c.admit(h) {
		t.Fatal("admit failed")
	}
	c.prefillDone(h)
	snap := c.snapshot()
	if len(snap) != 2 {
		t.Fatalf("snapshot %v", snap)
	}
	byPos := map[int]CachedBlock{}
	for _, b := range snap {
		byPos[b.Position] = b
	}
	if !slices.Equal(byPos[1].Prefix, []uint32{1, 2, 3, 4}) || !slices.Equal(byPos[1].Tokens, []uint32{3, 4}) ||
		byPos[1].ParentHash != byPos[0].Hash || !byPos[1].HasParent || byPos[0].HasParent || byPos[1].Refs != 1 || byPos[0].LoRA != "lora-a" {
		t.Fatalf("snapshot %+v", snap)
	}
	if len(events) != 1 || events[0].Kind != BlockStored || events[0].HasParent || events[0].LoRAName != "lora-a" ||
		!slices.Equal(events[0].TokenIDs, []uint32{1, 2, 3, 4}) {
		t.Fatalf("events %+v", events)
	}
	// The LoRA and the salt are part of the hash chain.
	plain := chain.appendHashes(nil, toks, 2, "", "")
	salted := chain.appendHashes(nil, toks, 2, "", "salt")
	if plain[0] == h.hashes[0] || plain[0] == salted[0] || plain[1] == salted[1] {
		t.Fatal("LoRA or salt does not change the hash chain")
	}
	c.release(h)
	if c.Usage() != 0 || c.Evictable() != 2 {
		t.Fatalf("after release: usage %v lru %d", c.Usage(), c.Evictable())
	}
}

// A prompt whose length is a multiple of the block size and fully cached
// still recomputes its last block (vLLM recomputes the last token).
func TestCacheRecomputesLastToken(t *testing.T) {
	c := newPrefixCache(4, 100, func(Event) {})
	chain := newHashChain("s")
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	mk := func() *holding {
		return &holding{tokens: toks, hashes: chain.appendHashes(nil, toks, 4, "", ""), maxTokens: 1}
	}
	a := mk()
	c.admit(a)
	c.prefillDone(a)
	c.release(a)
	b := mk()
	c.admit(b)
	if b.Hit != 1 {
		t.Fatalf("hit %d blocks, want 1 (the last block is recomputed)", b.Hit)
	}
	longer := append(slices.Clone(toks), 9)
	l := &holding{tokens: longer, hashes: chain.appendHashes(nil, longer, 4, "", ""), maxTokens: 1}
	c.admit(l)
	if l.Hit != 2 {
		t.Fatalf("hit %d blocks, want 2", l.Hit)
	}
}
