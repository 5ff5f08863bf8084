package index

import (
	"encoding/binary"
	"strconv"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Namespace scopes a hash chain: equal tokens under different namespaces never
// share a key, by construction, because the namespace seeds the chain.
type Namespace struct {
	Model     string // served model name, e.g. "meta-llama/Llama-3.1-8B"
	LoRA      string // LoRA adapter name; empty for the base model
	CacheSalt string // vLLM cache_salt; empty when the request has none
	BlockSize int    // tokens per block of this chain (the router's block size)
}

// Seed returns H_{-1}, the value the first block's hash is chained from. It is
// a hash of a length-prefixed encoding of every field, so no two distinct
// namespaces can be confused by concatenation ("ab"+"c" vs "a"+"bc").
func (ns Namespace) Seed() uint64 {
	var d xxhash.Digest
	d.Reset()
	writeField := func(s string) {
		var n [binary.MaxVarintLen64]byte
		_, _ = d.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		_, _ = d.WriteString(s)
	}
	writeField("meridian/chain/v1")
	writeField(ns.Model)
	writeField(ns.LoRA)
	writeField(ns.CacheSalt)
	writeField(strconv.Itoa(ns.BlockSize))
	return nonZero(d.Sum64())
}

// Extend returns H_i = hash(H_{i-1}, tokens of block i). The parent hash seeds
// xxhash64, so the same tokens after a different prefix give a different key.
// The result is never 0 (0 marks an empty slot in the index).
func Extend(parent uint64, block []uint32) uint64 {
	return nonZero(xxhash64Seeded(parent, tokenBytes(block)))
}

// ChainHashes appends to dst the hash chain of the full blocks of tokens under
// ns (a trailing partial block is not hashed, as engines only cache full
// blocks) and returns the extended slice. With enough capacity in dst it does
// not allocate.
func ChainHashes(ns Namespace, tokens []uint32, dst []uint64) []uint64 {
	return ChainFrom(ns.Seed(), ns.BlockSize, tokens, dst)
}

// ChainFrom is ChainHashes from a known parent hash (the seed, or the hash of
// the last block already hashed, which lets a multi-turn session hash only its
// new blocks).
func ChainFrom(parent uint64, blockSize int, tokens []uint32, dst []uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	h := parent
	for len(tokens) >= blockSize {
		h = Extend(h, tokens[:blockSize])
		dst = append(dst, h)
		tokens = tokens[blockSize:]
	}
	return dst
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// tokenBytes views token ids as their little-endian bytes without copying on
// little-endian machines (every platform Go ships for servers); elsewhere it
// copies.
func tokenBytes(block []uint32) []byte {
	if len(block) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&block[0])), len(block)*4)
	}
	b := make([]byte, len(block)*4)
	for i, t := range block {
		binary.LittleEndian.PutUint32(b[i*4:], t)
	}
	return b
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

func xxhash64Seeded(seed uint64, b []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write(b)
	return d.Sum64()
}
