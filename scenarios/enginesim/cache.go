package enginesim

import (
	"cmp"
	"slices"

	"github.com/meridian-llm/meridian/scenarios/prefixcache"
)

// blockInfo is what the engine keeps with a cached block (or a formerly
// cached one that requests still hold).
type blockInfo struct {
	parent     *prefixcache.Block[blockInfo] // chain predecessor, kept even after it is evicted
	tokens     []uint32
	pos        int // block index in its chain
	lora, salt string
}

// holding is what one request holds in the cache, from admission to release.
type holding struct {
	prefixcache.Holding[blockInfo] // Pinned: the hit blocks, then those stored at prefill
	tokens                         []uint32
	hashes                         []uint64 // engine hashes of the full prompt blocks
	lora, salt                     string
	maxTokens                      int
	prefilled                      bool
}

// prefixCache is vLLM's prefix cache in miniature (prefixcache.Cache), with
// the engine's block size and its KV events. Not safe for concurrent use:
// the engine calls it under its mutex. Every change is reported through
// emit, in order.
type prefixCache struct {
	*prefixcache.Cache[blockInfo]
	blockSize int
	emit      func(Event)
}

func newPrefixCache(blockSize, capacity int, emit func(Event)) *prefixCache {
	return &prefixCache{Cache: prefixcache.New[blockInfo](capacity), blockSize: blockSize, emit: emit}
}

// blocksFor returns the blocks n tokens occupy.
func (c *prefixCache) blocksFor(n int) int { return (n + c.blockSize - 1) / c.blockSize }

// hitLimit is the most blocks a prompt of n tokens may take from cache: vLLM
// always recomputes the last prompt token, so a fully cached prompt whose
// length is a multiple of the block size hits one block less.
func (c *prefixCache) hitLimit(n int) int { return max(n-1, 0) / c.blockSize }

// admit allocates what h needs: its cached prefix is pinned and every other
// block it will occupy (prompt, partial block, maxTokens of output) is
// reserved, evicting least recently used unpinned blocks to make room. When
// h cannot fit even after evicting every unpinned block it returns false and
// changes nothing.
func (c *prefixCache) admit(h *holding) bool {
	hashes := h.hashes[:min(c.hitLimit(len(h.tokens)), len(h.hashes))]
	hit := hashes[:c.Lookup(hashes)]
	need := c.blocksFor(len(h.tokens)+h.maxTokens) - len(hit)
	if !c.Fits(hit, need) {
		return false
	}
	if removed := c.Admit(&h.Holding, hit, need); len(removed) > 0 {
		c.emit(Event{Kind: BlockRemoved, BlockHashes: removed, Medium: MediumGPU})
	}
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
	for i := h.Hit; i < len(h.hashes); i++ {
		b, stored := c.Store(&h.Holding, h.hashes[i])
		if !stored {
			flush()
			continue
		}
		b.Data = blockInfo{tokens: slices.Clone(h.tokens[i*c.blockSize : (i+1)*c.blockSize]), pos: i, lora: h.lora, salt: h.salt}
		if i > 0 {
			b.Data.parent = h.Pinned[i-1]
		}
		if run == nil {
			run = &Event{Kind: BlockStored, BlockSize: c.blockSize, LoRAName: h.lora, Medium: MediumGPU}
			if i > 0 {
				run.ParentHash, run.HasParent = h.hashes[i-1], true
			}
			run.CacheSalt = h.salt
		}
		run.BlockHashes = append(run.BlockHashes, b.Hash)
		run.TokenIDs = append(run.TokenIDs, b.Data.tokens...)
	}
	flush()
	h.prefilled = true
}

// release returns what h holds. Its blocks are unpinned tail first, so the
// tail of a chain becomes evictable before its head (vLLM frees a request's
// blocks in reverse order onto the free queue). The engine never
// overcommits, so nothing is evicted.
func (c *prefixCache) release(h *holding) { c.Release(&h.Holding) }

// reset empties the cache (vLLM's reset_prefix_cache). Pinned blocks stay
// allocated to their requests but are no longer findable; they are freed
// when released.
func (c *prefixCache) reset() {
	c.Clear()
	c.emit(Event{Kind: AllBlocksCleared})
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
	out := make([]CachedBlock, 0, c.Len())
	for b := range c.All() {
		d := &b.Data
		cb := CachedBlock{Hash: b.Hash, Position: d.pos, Tokens: slices.Clone(d.tokens), LoRA: d.lora, CacheSalt: d.salt, Refs: b.Refs()}
		if d.parent != nil {
			cb.ParentHash, cb.HasParent = d.parent.Hash, true
		}
		cb.Prefix = make([]uint32, (d.pos+1)*c.blockSize)
		for p := b; p != nil; p = p.Data.parent {
			copy(cb.Prefix[p.Data.pos*c.blockSize:], p.Data.tokens)
		}
		out = append(out, cb)
	}
	slices.SortFunc(out, func(a, b CachedBlock) int { return cmp.Compare(a.Hash, b.Hash) })
	return out
}
