package enginesim

import (
	"slices"
)

// cacheBlock is one cached (or formerly cached, still pinned) full block.
type cacheBlock struct {
	hash       uint64
	parent     *cacheBlock // chain predecessor, kept even after it is evicted
	tokens     []uint32
	pos        int // block index in its chain
	lora, salt string
	refs       int  // running requests holding it
	inTable    bool // findable by hash; false once evicted or cleared
	inLRU      bool
	prev, next *cacheBlock // LRU links, valid while inLRU
}

// holding is what one request holds in the cache, from admission to release.
type holding struct {
	tokens     []uint32
	hashes     []uint64 // engine hashes of the full prompt blocks
	lora, salt string
	maxTokens  int

	hit       int           // blocks served from cache at admission
	blocks    []*cacheBlock // pinned, in chain order: hit blocks, then those stored at prefill
	scratch   int           // blocks allocated but not cached (new prompt blocks until prefill, partial and decode blocks)
	prefilled bool
}

// prefixCache is vLLM's prefix cache in miniature. Not safe for concurrent
// use: the engine calls it under its mutex. Every change is reported through
// emit, in order.
type prefixCache struct {
	blockSize int
	capacity  int
	table     map[uint64]*cacheBlock
	lruHead   *cacheBlock // next victim
	lruTail   *cacheBlock
	lruLen    int
	used      int // blocks occupied: in the table, pinned after a clear, or scratch
	emit      func(Event)
}

func newPrefixCache(blockSize, capacity int, emit func(Event)) *prefixCache {
	return &prefixCache{blockSize: blockSize, capacity: capacity, table: make(map[uint64]*cacheBlock), emit: emit}
}

// blocksFor returns the blocks n tokens occupy.
func (c *prefixCache) blocksFor(n int) int { return (n + c.blockSize - 1) / c.blockSize }

// hitLimit is the most blocks a prompt of n tokens may take from cache: vLLM
// always recomputes the last prompt token, so a fully cached prompt whose
// length is a multiple of the block size hits one block less.
func (c *prefixCache) hitLimit(n int) int { return max(n-1, 0) / c.blockSize }

// lookup returns how many leading hashes the cache holds, at most limit.
func (c *prefixCache) lookup(hashes []uint64, limit int) int {
	n := 0
	for n < limit && n < len(hashes) {
		if _, ok := c.table[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// admit allocates what h needs: its cached prefix is pinned and every other
// block it will occupy (prompt, partial block, maxTokens of output) is
// reserved, evicting least recently used unpinned blocks to make room. When
// h cannot fit even after evicting every unpinned block it returns false and
// changes nothing.
func (c *prefixCache) admit(h *holding) bool {
	hit := c.lookup(h.hashes, c.hitLimit(len(h.tokens)))
	need := c.blocksFor(len(h.tokens)+h.maxTokens) - hit
	fromLRU := 0
	for _, hash := range h.hashes[:hit] {
		if c.table[hash].refs == 0 {
			fromLRU++
		}
	}
	if c.capacity-c.used+c.lruLen-fromLRU < need {
		return false
	}
	h.hit = hit
	h.blocks = h.blocks[:0]
	for _, hash := range h.hashes[:hit] {
		b := c.table[hash]
		c.pin(b)
		h.blocks = append(h.blocks, b)
	}
	var removed []uint64
	for c.capacity-c.used < need {
		v := c.lruHead
		c.lruRemove(v)
		delete(c.table, v.hash)
		v.inTable = false
		c.used--
		removed = append(removed, v.hash)
	}
	if len(removed) > 0 {
		c.emit(Event{Kind: BlockRemoved, BlockHashes: removed, Medium: MediumGPU})
	}
	c.used += need
	h.scratch = need
	return true
}

// prefillDone caches h's newly computed full prompt blocks. A block another
// request stored meanwhile is shared instead (its scratch block is freed);
// each run of blocks this request stores is one BlockStored.
func (c *prefixCache) prefillDone(h *holding) {
	var run *Event
	flush := func() {
		if run != nil {
			c.emit(*run)
			run = nil
		}
	}
	for i := h.hit; i < len(h.hashes); i++ {
		hash := h.hashes[i]
		var parent *cacheBlock
		if i > 0 {
			parent = h.blocks[i-1]
		}
		if b, ok := c.table[hash]; ok {
			flush()
			c.pin(b)
			h.blocks = append(h.blocks, b)
			h.scratch--
			c.used--
			continue
		}
		toks := slices.Clone(h.tokens[i*c.blockSize : (i+1)*c.blockSize])
		b := &cacheBlock{hash: hash, parent: parent, tokens: toks, pos: i, lora: h.lora, salt: h.salt, refs: 1, inTable: true}
		c.table[hash] = b
		h.blocks = append(h.blocks, b)
		h.scratch-- // the scratch block became a cached one: used is unchanged
		if run == nil {
			run = &Event{Kind: BlockStored, BlockSize: c.blockSize, LoRAName: h.lora, Medium: MediumGPU}
			if i > 0 {
				run.ParentHash, run.HasParent = h.hashes[i-1], true
			} else {
				run.CacheSalt = h.salt
			}
		}
		run.BlockHashes = append(run.BlockHashes, hash)
		run.TokenIDs = append(run.TokenIDs, toks...)
	}
	flush()
	h.prefilled = true
}

// release returns what h holds. Its blocks are unpinned tail first, so the
// tail of a chain becomes evictable before its head (vLLM frees a request's
// blocks in reverse order onto the free queue).
func (c *prefixCache) release(h *holding) {
	for i := len(h.blocks) - 1; i >= 0; i-- {
		b := h.blocks[i]
		b.refs--
		if b.refs > 0 {
			continue
		}
		if b.inTable {
			c.lruPushBack(b)
		} else {
			c.used--
		}
	}
	c.used -= h.scratch
	h.scratch = 0
	clear(h.blocks)
	h.blocks = h.blocks[:0]
}

// reset empties the cache (vLLM's reset_prefix_cache). Pinned blocks stay
// allocated to their requests but are no longer findable; they are freed
// when released.
func (c *prefixCache) reset() {
	for _, b := range c.table {
		b.inTable = false
		if b.refs == 0 {
			c.lruRemove(b)
			c.used--
		}
	}
	clear(c.table)
	c.emit(Event{Kind: AllBlocksCleared})
}

// usage is vLLM's kv_cache_usage_perc: the fraction of blocks in use by
// running requests (cached but unreferenced blocks count as free).
func (c *prefixCache) usage() float64 {
	return float64(c.used-c.lruLen) / float64(c.capacity)
}

func (c *prefixCache) pin(b *cacheBlock) {
	if b.refs == 0 && b.inLRU {
		c.lruRemove(b)
	}
	b.refs++
}

func (c *prefixCache) lruPushBack(b *cacheBlock) {
	b.prev, b.next, b.inLRU = c.lruTail, nil, true
	if c.lruTail != nil {
		c.lruTail.next = b
	} else {
		c.lruHead = b
	}
	c.lruTail = b
	c.lruLen++
}

func (c *prefixCache) lruRemove(b *cacheBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.lruHead = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.lruTail = b.prev
	}
	b.prev, b.next, b.inLRU = nil, nil, false
	c.lruLen--
}

// CachedBlock is one block the engine's prefix cache holds.
type CachedBlock struct {
	Hash       uint64   // engine hash (as published)
	ParentHash uint64   // engine hash of the previous block of the chain
	HasParent  bool     // false for the first block of a chain
	Position   int      // block index in the chain
	Tokens     []uint32 // this block's tokens
	Prefix     []uint32 // every token of the chain through this block
	LoRA       string   // adapter name; "" for the base model
	CacheSalt  string
	Refs       int // running requests holding it
}

// snapshot returns the cache's blocks sorted by hash.
func (c *prefixCache) snapshot() []CachedBlock {
	out := make([]CachedBlock, 0, len(c.table))
	for _, b := range c.table {
		cb := CachedBlock{Hash: b.hash, Position: b.pos, Tokens: slices.Clone(b.tokens), LoRA: b.lora, CacheSalt: b.salt, Refs: b.refs}
		if b.parent != nil {
			cb.ParentHash, cb.HasParent = b.parent.hash, true
		}
		cb.Prefix = make([]uint32, (b.pos+1)*c.blockSize)
		for p := b; p != nil; p = p.parent {
			copy(cb.Prefix[p.pos*c.blockSize:], p.tokens)
		}
		out = append(out, cb)
	}
	slices.SortFunc(out, func(a, b CachedBlock) int {
		switch {
		case a.Hash < b.Hash:
			return -1
		case a.Hash > b.Hash:
			return 1
		}
		return 0
	})
	return out
}
