package tokenize

import (
	"encoding/binary"
	"iter"
	"math/bits"
	"unsafe"
)

// rankTable maps the byte strings of an encoding's ordinary tokens to their
// ranks, for the byte-pair encoder's hot path: every pre-token is looked up
// whole, and every candidate pair while merging. A Go map of strings hashes
// with a general-purpose function and compares through the key's pointer,
// a second memory access; here the first 8 bytes of each token live in its
// slot, so a lookup is one hash of at most a few words and one slot (two
// adjacent ones at most, as the table is at most half full) for the 8-byte
// and shorter strings that most pre-tokens and pairs are. Longer tokens
// compare their remaining bytes in an arena (in one load up to 16 bytes).
// Immutable once built; safe for concurrent use. TestRankTableMatchesMap
// checks it against the map it is built from.
type rankTable struct {
	slots []rankSlot
	shift uint // 64 - log2(len(slots))
	arena string
}

// rankSlot is one token: head is its first 8 bytes (little-endian, zero
// padded); meta is rank | length<<24 | (arena offset of bytes 8 on)<<32,
// and 0 for an empty slot (every token has a length).
type rankSlot struct {
	head uint64
	meta uint64
}

const (
	rankBits   = 24
	rankMask   = 1<<rankBits - 1
	maxRankLen = 255
)

// newRankTable builds the table of the n tokens of ranks, or returns nil
// when a token does not fit the packing (a rank of 2^24 or more, a token
// longer than 255 bytes, or more than 4 GB of them); the encoder then uses
// the map.
func newRankTable(n int, ranks iter.Seq2[string, uint32]) *rankTable {
	size := 1 << bits.Len(uint(n*2))
	t := &rankTable{slots: make([]rankSlot, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
	var arena []byte
	for s, r := range ranks {
		if r > rankMask || len(s) == 0 || len(s) > maxRankLen || len(arena) > 1<<32-maxRankLen {
			return nil
		}
		meta := uint64(r) | uint64(len(s))<<rankBits
		if len(s) > 8 {
			meta |= uint64(len(arena)) << 32
			arena = append(arena, s[8:]...)
		}
		i := t.home(s)
		for t.slots[i].meta != 0 {
			i = (i + 1) & uint64(size-1)
		}
		t.slots[i] = rankSlot{head: head(s), meta: meta}
	}
	t.arena = string(append(arena, make([]byte, 8)...)) // padded: getPair loads 8 bytes at any offset
	return t
}

func (t *rankTable) home(s string) uint64 { return hashToken(s) >> t.shift }

// get returns the rank of s.
func (t *rankTable) get(s string) (uint32, bool) {
	n := len(s)
	if n == 0 || n > maxRankLen {
		return 0, false
	}
	h := head(s)
	if n <= 8 {
		return t.getShort(h, n)
	}
	if n <= 16 {
		return t.getPair(h, head(s[8:]), n)
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(s); ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.meta == 0 {
			return 0, false
		}
		if sl.head == h && int(sl.meta>>rankBits&maxRankLen) == n {
			off := int(sl.meta >> 32)
			if t.arena[off:off+n-8] == s[8:] {
				return uint32(sl.meta & rankMask), true
			}
		}
	}
}

// getShort returns the rank of the string of n bytes (1 to 8) whose head
// is h: get without reading the string again, for a caller that has its
// bytes in a word already.
func (t *rankTable) getShort(h uint64, n int) (uint32, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := hashShort(h, n) >> t.shift; ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.meta == 0 {
			return 0, false
		}
		if sl.head == h && int(sl.meta>>rankBits&maxRankLen) == n {
			return uint32(sl.meta & rankMask), true
		}
	}
}

// getPair returns the rank of the string of n bytes (9 to 16) whose head
// is h and whose bytes from 8 on, little-endian and zero padded, are tail:
// get without reading the string again. The slot's tail is read from the
// arena in one load (the arena is padded for it).
func (t *rankTable) getPair(h, tail uint64, n int) (uint32, bool) {
	mask := uint64(len(t.slots) - 1)
	keep := ^uint64(0) >> (128 - 8*n) // the n-8 bytes of tail
	for i := hashPair(h, tail, n) >> t.shift; ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.meta == 0 {
			return 0, false
		}
		if sl.head == h && int(sl.meta>>rankBits&maxRankLen) == n {
			off := int(sl.meta >> 32)
			if binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(t.arena[off:]), 8))&keep == tail {
				return uint32(sl.meta & rankMask), true
			}
		}
	}
}

// head is the first 8 bytes of s, little-endian, zero padded. Short strings
// are read with overlapping loads instead of a byte loop.
func head(s string) uint64 {
	n := len(s)
	b := unsafe.Slice(unsafe.StringData(s), n) // read only
	switch {
	case n >= 8:
		return binary.LittleEndian.Uint64(b)
	case n >= 4:
		lo := uint64(binary.LittleEndian.Uint32(b))
		hi := uint64(binary.LittleEndian.Uint32(b[n-4:]))
		return lo | hi<<(8*(n-4))
	case n > 0:
		return uint64(b[0]) | uint64(b[n/2])<<(8*(n/2)) | uint64(b[n-1])<<(8*(n-1))
	}
	return 0
}

// hashToken mixes s's bytes and length into 64 bits, of which the table
// uses the high ones (multiply and xor-shift rounds; not for adversarial
// keys — the table's keys are fixed). Strings of 8 bytes or less, most
// lookups, take one multiply (hashShort), and of 16 or less two
// (hashPair); TestRankTableProbes keeps the probe sequences short with
// them.
func hashToken(s string) uint64 {
	if len(s) <= 8 {
		return hashShort(head(s), len(s))
	}
	if len(s) <= 16 {
		return hashPair(head(s), head(s[8:]), len(s))
	}
	h := uint64(len(s))*hashLen ^ head(s)
	for s = s[8:]; len(s) > 0; s = s[min(8, len(s)):] {
		h = (h ^ h>>29) * hashMul
		h ^= head(s)
	}
	h = (h ^ h>>32) * 0x94D049BB133111EB
	return h ^ h>>29
}

const (
	hashLen = 0x9E3779B97F4A7C15
	hashMul = 0xBF58476D1CE4E5B9
)

// hashShort is hashToken of the string of n <= 8 bytes whose head is h.
func hashShort(h uint64, n int) uint64 { return (h ^ uint64(n)*hashLen) * hashMul }

// hashPair is hashToken of the string of n bytes (9 to 16) whose head is h
// and whose bytes from 8 on are tail (little-endian, zero padded).
func hashPair(h, tail uint64, n int) uint64 { return (hashShort(h, n) ^ tail) * hashPairMul }

const hashPairMul = 0x94D049BB133111EB
