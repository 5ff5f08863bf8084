package sim

// cacheBlock is one cached block: a prefix-chained block hash.
type cacheBlock struct {
	hash       uint64
	refs       int // running requests holding it
	inLRU      bool
	prev, next *cacheBlock // LRU links while inLRU
}

// holding is what one request holds in a cache from admission to release.
type holding struct {
	chain  []uint64 // the prompt's block hashes
	blocks int      // blocks the request occupies: prompt and output
	hit    int      // leading chain blocks served from cache at admission
	pinned []*cacheBlock
	// scratch counts blocks allocated but not cached: prompt blocks until
	// prefill ends, and output blocks.
	scratch int
}

// kvCache is a pod's KV cache in blocks: vLLM's prefix cache in miniature.
// Blocks of running requests are pinned; unreferenced cached blocks sit in
// an LRU (least recently released first) and are evicted to make room. A
// request frees its blocks tail first, so a chain's tail is evicted before
// its head, as vLLM's free queue does. Every change of the set of cached
// hashes is reported through emit, in order (stored at prefill end, removed
// at eviction), as an engine's KV events are. Not safe for concurrent use.
type kvCache struct {
	capacity int
	table    map[uint64]*cacheBlock
	head     *cacheBlock // next victim
	tail     *cacheBlock
	lruLen   int
	used     int // len(table) + scratch of every holding
	emit     func(stored bool, hashes []uint64)
}

func newKVCache(capacity int, emit func(stored bool, hashes []uint64)) *kvCache {
	return &kvCache{capacity: capacity, table: make(map[uint64]*cacheBlock), emit: emit}
}

// lookup returns how many leading hashes of chain the cache holds.
func (c *kvCache) lookup(chain []uint64) int {
	n := 0
	for n < len(chain) {
		if _, ok := c.table[chain[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// fits reports whether h could be admitted now.
func (c *kvCache) fits(h *holding) bool {
	hit := c.lookup(h.chain)
	fromLRU := 0
	for _, hash := range h.chain[:hit] {
		if c.table[hash].refs == 0 {
			fromLRU++
		}
	}
	return c.capacity-c.used+c.lruLen-fromLRU >= h.blocks-hit
}

// admit pins h's cached prefix and reserves its other blocks, evicting
// unpinned blocks as needed. Unless force is set it changes nothing and
// returns false when h does not fit; with force (a pod with nothing else
// running takes a request larger than its cache) it evicts what it can and
// overcommits.
func (c *kvCache) admit(h *holding, force bool) bool {
	if !force && !c.fits(h) {
		return false
	}
	hit := c.lookup(h.chain)
	h.hit = hit
	h.pinned = h.pinned[:0]
	for _, hash := range h.chain[:hit] {
		b := c.table[hash]
		c.pin(b)
		h.pinned = append(h.pinned, b)
	}
	need := max(h.blocks-hit, 0)
	var removed []uint64
	for c.capacity-c.used < need && c.head != nil {
		v := c.head
		c.lruRemove(v)
		delete(c.table, v.hash)
		c.used--
		removed = append(removed, v.hash)
	}
	if len(removed) > 0 && c.emit != nil {
		c.emit(false, removed)
	}
	c.used += need
	h.scratch = need
	return true
}

// prefillDone caches h's newly computed prompt blocks. A block stored by
// another request meanwhile is shared (its scratch block is freed).
func (c *kvCache) prefillDone(h *holding) {
	var stored []uint64
	for _, hash := range h.chain[h.hit:] {
		if b, ok := c.table[hash]; ok {
			c.pin(b)
			h.pinned = append(h.pinned, b)
			if h.scratch > 0 {
				h.scratch--
				c.used--
			}
			continue
		}
		b := &cacheBlock{hash: hash, refs: 1}
		c.table[hash] = b
		h.pinned = append(h.pinned, b)
		if h.scratch > 0 {
			h.scratch-- // the scratch block became a cached one
		} else {
			c.used++ // overcommitted request
		}
		stored = append(stored, hash)
	}
	if len(stored) > 0 && c.emit != nil {
		c.emit(true, stored)
	}
}

// release returns what h holds, tail first.
func (c *kvCache) release(h *holding) {
	for i := len(h.pinned) - 1; i >= 0; i-- {
		b := h.pinned[i]
		b.refs--
		if b.refs == 0 {
			c.lruPushBack(b)
		}
	}
	c.used -= h.scratch
	h.scratch = 0
	clear(h.pinned)
	h.pinned = h.pinned[:0]
	// An overcommitted cache gives the excess back as soon as it can.
	var removed []uint64
	for c.used > c.capacity && c.head != nil {
		v := c.head
		c.lruRemove(v)
		delete(c.table, v.hash)
		c.used--
		removed = append(removed, v.hash)
	}
	if len(removed) > 0 && c.emit != nil {
		c.emit(false, removed)
	}
}

// touch runs one request through the cache at once (admission, prefill,
// release) and returns its hit: the cache model check's "no routing, no
// timing" mode.
func (c *kvCache) touch(chain []uint64, h *holding) int {
	h.chain, h.blocks = chain, len(chain)
	c.admit(h, true)
	c.prefillDone(h)
	hit := h.hit
	c.release(h)
	return hit
}

// usage is vLLM's kv_cache_usage_perc: blocks in use by running requests
// (cached unreferenced blocks count as free).
func (c *kvCache) usage() float64 {
	if c.capacity == 0 {
		return 0
	}
	return min(float64(c.used-c.lruLen)/float64(c.capacity), 1)
}

// free is the number of blocks not used by running requests.
func (c *kvCache) free() int { return max(c.capacity-c.used+c.lruLen, 0) }

func (c *kvCache) pin(b *cacheBlock) {
	if b.refs == 0 && b.inLRU {
		c.lruRemove(b)
	}
	b.refs++
}

func (c *kvCache) lruPushBack(b *cacheBlock) {
	b.prev, b.next = c.tail, nil
	if c.tail != nil {
		c.tail.next = b
	} else {
		c.head = b
	}
	c.tail = b
	b.inLRU = true
	c.lruLen++
}

func (c *kvCache) lruRemove(b *cacheBlock) {
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
