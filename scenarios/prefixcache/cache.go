// Package prefixcache is vLLM's KV-block prefix cache in miniature: the one
// cache model both simulators run, the engine simulator (scenarios/enginesim)
// and the multi-region simulator's pods (scenarios/sim).
//
// A Cache has a fixed number of blocks. A cached block is found by its
// prefix-chained hash. Blocks that running requests hold are pinned
// (reference counted); cached blocks no request holds sit in an LRU, least
// recently released first, and are evicted from its front to make room. A
// request's Holding frees its blocks tail first, so the tail of a chain is
// evicted before its head, as vLLM's free queue does. Used counts the cached
// blocks, the blocks requests still hold after a Clear, and every holding's
// scratch blocks (allocated, not cached: prompt blocks until its prefill
// ends, partial and output blocks).
//
// The cache reports nothing itself: the methods that change the set of
// cached hashes return what they evicted or stored, and each simulator turns
// that into its own events. Not safe for concurrent use. It imports nothing
// of ours.
package prefixcache

import (
	"iter"
	"maps"
)

// Block is one cached block, or one that requests still hold after a Clear
// dropped it from the cache.
type Block[T any] struct {
	Hash uint64
	// Data is what the cache's owner keeps with the block; it sets it on the
	// block Store returns as new.
	Data       T
	refs       int  // running requests holding it
	inTable    bool // findable by hash; false once evicted or cleared
	inLRU      bool
	prev, next *Block[T] // LRU links while inLRU
}

// Refs is the number of running requests holding b.
func (b *Block[T]) Refs() int { return b.refs }

// Holding is what one request holds in a cache from Admit to Release.
type Holding[T any] struct {
	Hit    int         // leading blocks served from cache at admission
	Pinned []*Block[T] // in chain order: the hit blocks, then those Store added
	// Scratch counts blocks allocated but not cached: prompt blocks until
	// they are stored, and output blocks.
	Scratch int
}

// Cache is a prefix cache of a fixed number of blocks.
type Cache[T any] struct {
	capacity int
	table    map[uint64]*Block[T]
	head     *Block[T] // next victim
	tail     *Block[T]
	lruLen   int
	used     int
}

// New returns an empty cache of capacity blocks.
func New[T any](capacity int) *Cache[T] {
	return &Cache[T]{capacity: capacity, table: make(map[uint64]*Block[T])}
}

// Capacity is the number of blocks the cache has.
func (c *Cache[T]) Capacity() int { return c.capacity }

// Used is the number of blocks occupied: cached, held after a Clear, or
// scratch. It exceeds Capacity only after an overcommitting Admit.
func (c *Cache[T]) Used() int { return c.used }

// Len is the number of cached blocks.
func (c *Cache[T]) Len() int { return len(c.table) }

// Evictable is the number of cached blocks no request holds.
func (c *Cache[T]) Evictable() int { return c.lruLen }

// Free is the number of blocks not used by running requests (cached but
// unreferenced blocks count as free).
func (c *Cache[T]) Free() int { return max(c.capacity-c.used+c.lruLen, 0) }

// Usage is vLLM's kv_cache_usage_perc: the fraction of the blocks in use by
// running requests (cached but unreferenced blocks count as free), at most 1.
func (c *Cache[T]) Usage() float64 {
	if c.capacity == 0 {
		return 0
	}
	return min(float64(c.used-c.lruLen)/float64(c.capacity), 1)
}

// All returns the cached blocks, in no particular order.
func (c *Cache[T]) All() iter.Seq[*Block[T]] { return maps.Values(c.table) }

// Victims returns the cached blocks no request holds, next victim first.
func (c *Cache[T]) Victims() iter.Seq[*Block[T]] {
	return func(yield func(*Block[T]) bool) {
		for b := c.head; b != nil; b = b.next {
			if !yield(b) {
				return
			}
		}
	}
}

// Lookup returns how many leading hashes the cache holds.
func (c *Cache[T]) Lookup(hashes []uint64) int {
	n := 0
	for n < len(hashes) {
		if _, ok := c.table[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// Fits reports whether a request could be admitted now whose cached prefix
// is hit (hashes Lookup found) and that needs need more blocks: whether
// evicting every unpinned block but those of hit would make room.
func (c *Cache[T]) Fits(hit []uint64, need int) bool {
	fromLRU := 0
	for _, hash := range hit {
		if c.table[hash].refs == 0 {
			fromLRU++
		}
	}
	return c.capacity-c.used+c.lruLen-fromLRU >= need
}

// Admit pins the cached blocks of hit (hashes Lookup found) for h and
// reserves need scratch blocks, evicting unpinned blocks, next victim first,
// to make room. When they run out first (the caller did not check Fits) the
// cache is overcommitted until Reclaim. It returns the evicted hashes.
func (c *Cache[T]) Admit(h *Holding[T], hit []uint64, need int) (evicted []uint64) {
	h.Hit = len(hit)
	h.Pinned = h.Pinned[:0]
	for _, hash := range hit {
		b := c.table[hash]
		c.pin(b)
		h.Pinned = append(h.Pinned, b)
	}
	evicted = c.evictOver(c.capacity - need)
	c.used += need
	h.Scratch = need
	return evicted
}

// Store caches hash, a block h has just computed, in one of h's scratch
// blocks (an overcommitted holding without scratch left takes a new block),
// and pins it for h. When the cache already holds hash (another request
// stored it meanwhile) it pins that block instead and frees a scratch block.
// It returns the block and whether it is new.
func (c *Cache[T]) Store(h *Holding[T], hash uint64) (b *Block[T], stored bool) {
	if b, ok := c.table[hash]; ok {
		c.pin(b)
		h.Pinned = append(h.Pinned, b)
		if h.Scratch > 0 {
			h.Scratch--
			c.used--
		}
		return b, false
	}
	b = &Block[T]{Hash: hash, refs: 1, inTable: true}
	c.table[hash] = b
	h.Pinned = append(h.Pinned, b)
	if h.Scratch > 0 {
		h.Scratch-- // the scratch block became a cached one
	} else {
		c.used++
	}
	return b, true
}

// Release returns what h holds. Its blocks are unpinned tail first: one no
// request holds any more joins the LRU, or is freed when a Clear dropped it.
// Its scratch blocks are freed.
func (c *Cache[T]) Release(h *Holding[T]) {
	for i := len(h.Pinned) - 1; i >= 0; i-- {
		b := h.Pinned[i]
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
	c.used -= h.Scratch
	h.Scratch = 0
	clear(h.Pinned)
	h.Pinned = h.Pinned[:0]
}

// Reclaim gives back what an overcommitted cache holds over its capacity as
// soon as it can: it evicts unpinned blocks, next victim first, while Used
// exceeds Capacity, and returns their hashes.
func (c *Cache[T]) Reclaim() (evicted []uint64) { return c.evictOver(c.capacity) }

// Clear empties the cache (vLLM's reset_prefix_cache). Blocks that requests
// hold stay allocated to them, no longer findable, until they are released.
func (c *Cache[T]) Clear() {
	for _, b := range c.table {
		b.inTable = false
		if b.refs == 0 {
			c.lruRemove(b)
			c.used--
		}
	}
	clear(c.table)
}

// evictOver evicts unpinned blocks, next victim first, while more than limit
// blocks are used, and returns their hashes.
func (c *Cache[T]) evictOver(limit int) (evicted []uint64) {
	for c.used > limit && c.head != nil {
		v := c.head
		c.lruRemove(v)
		delete(c.table, v.Hash)
		v.inTable = false
		c.used--
		evicted = append(evicted, v.Hash)
	}
	return evicted
}

func (c *Cache[T]) pin(b *Block[T]) {
	if b.refs == 0 && b.inLRU {
		c.lruRemove(b)
	}
	b.refs++
}

func (c *Cache[T]) lruPushBack(b *Block[T]) {
	b.prev, b.next, b.inLRU = c.tail, nil, true
	if c.tail != nil {
		c.tail.next = b
	} else {
		c.head = b
	}
	c.tail = b
	c.lruLen++
}

func (c *Cache[T]) lruRemove(b *Block[T]) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next, b.inLRU = nil, nil, false
	c.lruLen--
}
