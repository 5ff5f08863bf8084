package tokenize

import (
	"sync"
	"sync/atomic"
)

// BlockHasher chains the hashes of token blocks: Extend(parent, block)
// is the hash of block chained from parent (the seed for the first
// block). Encodings keep the chains Encoding.Chain computes keyed by the
// hasher (its address), the seed and the block size, so a program uses
// one BlockHasher per hash function (the router: index.Extend).
type BlockHasher struct {
	Extend func(parent uint64, block []uint32) uint64
}

// blockChain is the chain hashes of an encoding's first len(hashes) full
// blocks of size ids, chained by hasher from seed. It is immutable;
// encodings share it.
type blockChain struct {
	hasher *BlockHasher
	seed   uint64
	size   int
	hashes []uint64
}

func (c *blockChain) is(hasher *BlockHasher, seed uint64, size int) bool {
	return c.hasher == hasher && c.seed == seed && c.size == size
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
	return blockChain{hasher: c.hasher, seed: c.seed, size: c.size, hashes: c.hashes[:k:k]}
}

// Chain returns the chain hashes of e's full blocks of size ids, chained
// by hasher from seed (for index.Extend, index.ChainFrom(seed, size, ids)
// of e's ids). The result is shared with e and with encodings that reuse
// e's ids: read it, never modify it.
//
// It is computed once per encoding (for the last hasher, seed and size
// asked), and an encoding that reuses another's prefix (Extend,
// EncodeCached) takes over the hashes of the blocks within that prefix,
// when the other encoding's were computed with the same hasher, seed and
// size, so that only the blocks after it are hashed. Exact because a
// block's chain hash depends only on those and the ids up to the end of
// the block, and the reused ids are the same. TestChainMatchesNaive holds
// it to index.ChainFrom of the ids.
func (e *Encoding) Chain(hasher *BlockHasher, seed uint64, size int) []uint64 {
	if size <= 0 {
		return nil
	}
	if c := e.memo.own.Load(); c != nil && c.is(hasher, seed, size) {
		return c.hashes
	}
	hashes := make([]uint64, 0, e.n/size)
	h := seed
	if c := &e.memo.inherited; c.is(hasher, seed, size) {
		hashes = append(hashes, c.hashes...)
		if len(hashes) > 0 {
			h = hashes[len(hashes)-1]
		}
	}
	hashes = chainParts(hasher, h, size, e.parts, len(hashes)*size, hashes)
	c := &e.memo.ownBuf
	if !e.memo.claimed.CompareAndSwap(false, true) {
		c = new(blockChain)
	}
	*c = blockChain{hasher: hasher, seed: seed, size: size, hashes: hashes}
	e.memo.own.Store(c)
	return hashes
}

// chainParts appends to dst the chain hashes, from parent h, of the full
// blocks of the ids held in consecutive parts after the first skip: a
// block that spans parts is gathered into a buffer, the others are hashed
// where they lie.
func chainParts(hasher *BlockHasher, h uint64, size int, parts [][]uint32, skip int, dst []uint64) []uint64 {
	// The start of a block that spans parts. A buffer passed to the
	// hasher escapes: it comes from a pool.
	var carry []uint32
	if len(parts) > 1 {
		if size <= carryBufLen {
			buf := carryBufs.Get().(*[carryBufLen]uint32)
			defer carryBufs.Put(buf)
			carry = buf[:0]
		} else {
			carry = make([]uint32, 0, size)
		}
	}
	for pi, part := range parts {
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
			h = hasher.Extend(h, carry)
			dst = append(dst, h)
			carry = carry[:0]
		}
		for len(part) >= size {
			h = hasher.Extend(h, part[:size])
			dst = append(dst, h)
			part = part[size:]
		}
		if pi < len(parts)-1 {
			carry = append(carry, part...)
		}
	}
	return dst
}

// carryBufs hold chainParts' blocks that span parts, for block sizes up
// to carryBufLen.
const carryBufLen = 256

var carryBufs = sync.Pool{New: func() any { return new([carryBufLen]uint32) }}
