package tokenize

import (
	"sync/atomic"

	"github.com/meridian-llm/meridian/index"
)

// blockChain is the chain hashes of an encoding's first len(hashes) full
// blocks of size ids, chained from seed: index.ChainFrom(seed, size, ids).
// It is immutable; encodings share it.
type blockChain struct {
	seed   uint64
	size   int
	hashes []uint64
}

// chainMemo is where an Encoding keeps the chain hashes of its blocks:
// its own (computed by the first Chain call) and those it took over from
// the encoding whose ids it reused.
type chainMemo struct {
	own       atomic.Pointer[blockChain]
	inherited blockChain // set before the encoding is returned, then read only
	// ownBuf is own's room for the first Chain call that claims it (an
	// encoding is usually hashed under one seed, once): written once,
	// before own points to it.
	ownBuf  blockChain
	claimed atomic.Bool
}

// prefixChain returns e's chain hashes that also hold for another
// encoding sharing e's first tokens ids: those of the full blocks within
// them (none when e has none).
func (e *Encoding) prefixChain(tokens int) blockChain {
	c := e.memo.own.Load()
	if c == nil {
		c = &e.memo.inherited
	}
	if c.size <= 0 {
		return blockChain{}
	}
	k := min(len(c.hashes), tokens/c.size)
	if k == 0 {
		return blockChain{}
	}
	return blockChain{seed: c.seed, size: c.size, hashes: c.hashes[:k:k]}
}

// Chain returns index.ChainFrom(seed, size, ids, nil) of e's ids: the
// chain hashes of its full blocks. The result is shared with e and with
// encodings that reuse e's ids: read it, never modify it.
//
// It is computed once per encoding (for the last seed and size asked),
// and an encoding that reuses another's prefix (Extend, EncodeCached)
// takes over the hashes of the blocks within that prefix, when the other
// encoding's were computed under the same seed and size, so that only the
// blocks after it are hashed. Exact because a block's chain hash depends
// only on the seed, the size and the ids up to the end of the block, and
// the reused ids are the same. TestChainMatchesNaive holds it to
// index.ChainHashes of the ids.
func (e *Encoding) Chain(seed uint64, size int) []uint64 {
	if size <= 0 {
		return nil
	}
	if c := e.memo.own.Load(); c != nil && c.seed == seed && c.size == size {
		return c.hashes
	}
	n := e.n / size
	hashes := make([]uint64, 0, n)
	h := seed
	if c := &e.memo.inherited; c.seed == seed && c.size == size {
		hashes = append(hashes, c.hashes...)
		if len(hashes) > 0 {
			h = hashes[len(hashes)-1]
		}
	}
	hashes = chainParts(h, size, e.parts, len(hashes)*size, hashes)
	c := &e.memo.ownBuf
	if !e.memo.claimed.CompareAndSwap(false, true) {
		c = new(blockChain)
	}
	*c = blockChain{seed: seed, size: size, hashes: hashes}
	e.memo.own.Store(c)
	return hashes
}

// chainParts appends to dst the chain hashes, from parent h, of the full
// blocks of the ids held in consecutive parts after the first skip: a
// block that spans parts is gathered into a buffer, the others are hashed
// where they lie.
func chainParts(h uint64, size int, parts [][]uint32, skip int, dst []uint64) []uint64 {
	var stack [256]uint32
	carry := stack[:0] // the start of a block that spans parts
	if size > len(stack) {
		carry = make([]uint32, 0, size)
	}
	for _, part := range parts {
		if skip >= len(part) {
			skip -= len(part)
			continue
		}
		part, skip = part[skip:], 0
		if len(carry) > 0 {
			k := min(size-len(carry), len(part))
			carry, part = append(carry, part[:k]...), part[k:]
			if len(carry) < size {
				continue
			}
			h = index.Extend(h, carry)
			dst = append(dst, h)
			carry = carry[:0]
		}
		full := len(part) / size * size
		if full > 0 {
			dst = index.ChainFrom(h, size, part[:full], dst)
			h = dst[len(dst)-1]
		}
		carry = append(carry, part[full:]...)
	}
	return dst
}
