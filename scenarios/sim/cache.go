package sim

import "github.com/meridian-llm/meridian/scenarios/prefixcache"

// holding is what one request holds in a cache from admission to release.
type holding struct {
	prefixcache.Holding[struct{}]
	chain  []uint64 // the prompt's block hashes
	blocks int      // blocks the request occupies: prompt and output
}

// kvCache is a pod's KV cache in blocks: vLLM's prefix cache in miniature
// (prefixcache.Cache, as the engine simulator runs it). Every change of the
// set of cached hashes is reported through emit, in order (stored at
// prefill end, removed at eviction), as an engine's KV events are. Not safe
// for concurrent use.
type kvCache struct {
	*prefixcache.Cache[struct{}]
	emit func(stored bool, hashes []uint64)
}

func newKVCache(capacity int, emit func(stored bool, hashes []uint64)) *kvCache {
	return &kvCache{Cache: prefixcache.New[struct{}](capacity), emit: emit}
}

// admit pins h's cached prefix and reserves its other blocks, evicting
// unpinned blocks as needed. Unless force is set it changes nothing and
// returns false when h does not fit; with force (a pod with nothing else
// running takes a request larger than its cache) it evicts what it can and
// overcommits.
func (c *kvCache) admit(h *holding, force bool) bool {
	hit := h.chain[:c.Lookup(h.chain)]
	if !force && !c.Fits(hit, h.blocks-len(hit)) {
		return false
	}
	c.removed(c.Admit(&h.Holding, hit, max(h.blocks-len(hit), 0)))
	return true
}

// prefillDone caches h's newly computed prompt blocks. A block stored by
// another request meanwhile is shared (its scratch block is freed).
func (c *kvCache) prefillDone(h *holding) {
	var stored []uint64
	for _, hash := range h.chain[h.Hit:] {
		if _, ok := c.Store(&h.Holding, hash); ok {
			stored = append(stored, hash)
		}
	}
	if len(stored) > 0 && c.emit != nil {
		c.emit(true, stored)
	}
}

// release returns what h holds, tail first. An overcommitted cache gives
// the excess back as soon as it can.
func (c *kvCache) release(h *holding) {
	c.Release(&h.Holding)
	c.removed(c.Reclaim())
}

func (c *kvCache) removed(hashes []uint64) {
	if len(hashes) > 0 && c.emit != nil {
		c.emit(false, hashes)
	}
}

// touch runs one request through the cache at once (admission, prefill,
// release) and returns its hit: the cache model check's "no routing, no
// timing" mode.
func (c *kvCache) touch(chain []uint64, h *holding) int {
	h.chain, h.blocks = chain, len(chain)
	c.admit(h, true)
	c.prefillDone(h)
	hit := h.Hit
	c.release(h)
	return hit
}
