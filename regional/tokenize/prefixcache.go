package tokenize

import (
	"sync"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// PrefixCache remembers the encodings of texts, so that a text sharing a
// prefix with one encoded before — the same system prompt in another
// session, the history of a conversation at its next turn — re-encodes
// only what follows it. It is shared by every session (and by every
// Tokenizer: entries are per Tokenizer) and bounded in bytes; the least
// recently used texts go first. Safe for concurrent use.
//
// It is exact: EncodeCached returns what EncodeText would. An encoding is
// reused only up to the end e of one of its special tokens, where
// tokenization restarts (see Tokenizer.Extend), when the new text has the
// same first e bytes and its own i-th special token ends at e too. Then
// both texts hold the same i special tokens at the same places: at the
// first place their scans could differ, one of them matched a special
// token the other did not; within the shared bytes the other would have
// matched it too (or a longer one that both see), so that match must
// reach past e, and then that text's i-th special token cannot end at e.
// The text between special tokens is the same, so are its ids. Entries are
// keyed by the hash of text[:e] and confirmed by comparing the bytes (a
// hash collision can cost a lookup, never a wrong id).
// TestPrefixCacheExact checks it against encoding the whole text.
//
// A hit shares the cached encoding's ids up to the reused point instead of
// copying them (encodings are immutable), so its cost does not grow with
// the prefix (TestPrefixCacheHitSharesPrefix).
type PrefixCache struct {
	max int64 // bytes

	mu    sync.Mutex
	used  int64
	keys  map[prefixKey]prefixRef
	lru   prefixRecord // sentinel of the records' ring, most recent first
	recs  int
	last  *prefixRecord // the record cached last: EncodeCached's first guess
	stats PrefixCacheStats
}

type prefixKey struct {
	tok *Tokenizer
	sum uint64 // xxhash of the text up to the restart point's key end
}

// prefixRef is where a key's prefix is encoded: restart point i of rec.
type prefixRef struct {
	rec *prefixRecord
	i   int
}

// prefixRecord is one cached text with its encoding, and how many keys
// still lead to it (a later text that extends it takes its keys over; a
// record no key leads to is dropped).
type prefixRecord struct {
	tok  *Tokenizer
	enc  *Encoding
	sums []uint64 // its keys' hashes, by restart point
	keys int      // keys that lead to it
	// owned has bit i set while the key of sums[i] (i < 64) leads to it
	// at i, so that evicting it deletes those keys without looking the
	// others up.
	owned uint64
	bytes int64
	// prev and next link it into the cache's ring (nil: not in it).
	prev, next *prefixRecord
	sumsBuf    [6]uint64 // sums' room when it has at most six
}

// pushFront links rec as the ring's most recent record.
func (c *PrefixCache) pushFront(rec *prefixRecord) {
	rec.prev, rec.next = &c.lru, c.lru.next
	c.lru.next.prev = rec
	c.lru.next = rec
	c.recs++
}

// unlink takes rec out of the ring.
func (c *PrefixCache) unlink(rec *prefixRecord) {
	rec.prev.next, rec.next.prev = rec.next, rec.prev
	rec.prev, rec.next = nil, nil
	c.recs--
}

// PrefixCacheStats counts the cache's work since it was made.
type PrefixCacheStats struct {
	Lookups, Hits   int64
	ReusedTokens    int64
	Records, Keys   int
	Bytes, MaxBytes int64
}

// prefixKeyBytes is what a key costs in the map, roughly.
const prefixKeyBytes = 64

// NewPrefixCache makes a cache that holds at most maxBytes of texts, ids
// and keys. maxBytes <= 0 makes a cache that keeps nothing.
func NewPrefixCache(maxBytes int64) *PrefixCache {
	c := &PrefixCache{max: maxBytes, keys: map[prefixKey]prefixRef{}}
	c.lru.prev, c.lru.next = &c.lru, &c.lru
	return c
}

// Stats reports the cache's counters and size.
func (c *PrefixCache) Stats() PrefixCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Records, st.Keys, st.Bytes, st.MaxBytes = c.recs, len(c.keys), c.used, c.max
	return st
}

// keyPoints appends to dst the end of each special token of text, in
// order: the restart points EncodeText records.
func (t *Tokenizer) keyPoints(text string, dst []int) []int {
	return t.keyPointsFrom(text, 0, dst)
}

// keyPointsFrom is keyPoints of the special tokens that start at or after
// from, which must be a key point (or 0).
func (t *Tokenizer) keyPointsFrom(text string, from int, dst []int) []int {
	for pos := from; pos < len(text); {
		_, end, _, ok := t.nextSpecial(text, pos)
		if !ok {
			break
		}
		dst = append(dst, end)
		pos = end
	}
	return dst
}

// prefixSums appends to dst the key of text[:p] for each key point p in
// points[from:], given the key h of text[:points[from-1]] (from > 0). The
// keys chain: each is the xxhash of the text since the previous point,
// seeded with the previous key, so a key is a hash of the whole text up
// to its point and the keys after a known one need only the text after it.
func prefixSums(text string, points []int, from int, h uint64, dst []uint64) []uint64 {
	at := 0
	if from > 0 {
		at = points[from-1]
	}
	var d xxhash.Digest
	for _, p := range points[from:] {
		d.ResetWithSeed(h)
		_, _ = d.WriteString(text[at:p])
		h, at = d.Sum64(), p
		dst = append(dst, h)
	}
	return dst
}

// keySums returns text's key points and their keys (keyPoints and
// prefixSums of the whole text), taking over those of the cached record
// cand (nil: none) that hold for text too, and the length of the prefix
// text shares with cand's text. A restart point of cand is one of text's,
// with the same key, when its special token starts at least maxSpecial
// bytes before the end of the shared prefix: Extend's rule, which makes
// every special-token match up to it look only at shared bytes.
// TestKeySumsMatchesNaive compares it with scanning and hashing all of
// text.
func (t *Tokenizer) keySums(text string, cand *prefixRecord, points []int, sums []uint64) ([]int, []uint64, int) {
	shared, k := 0, 0
	if cand != nil && cand.tok == t {
		shared = commonPrefix(cand.enc.Text, text)
		rs := cand.enc.restarts
		for k < len(cand.sums) && k < len(rs) && rs[k].start+t.maxSpecial <= shared {
			points = append(points, rs[k].end)
			k++
		}
		sums = append(sums, cand.sums[:k]...)
	}
	from, h := 0, uint64(0)
	if k > 0 {
		from, h = points[k-1], sums[k-1]
	}
	points = t.keyPointsFrom(text, from, points)
	return points, prefixSums(text, points, k, h, sums), shared
}

// EncodeCached returns the encoding of text, as EncodeText does, reusing
// the longest cached prefix that ends at a special token, and the number
// of ids it reused; then it caches text's own encoding. The reused ids
// are shared with the cached encoding, not copied. A nil cache encodes in
// full.
func (t *Tokenizer) EncodeCached(c *PrefixCache, text string) (*Encoding, int) {
	if c == nil || c.max <= 0 {
		return t.EncodeText(text), 0
	}
	var pointsBuf [64]int
	var sumsBuf [64]uint64
	// The most recently used record is likely to share a prefix with
	// text (a system prompt, a conversation's history): the keys of the
	// restart points within it are its keys, and the text there is
	// known to be the same. Records are immutable once cached.
	c.mu.Lock()
	cand := c.last
	c.mu.Unlock()
	points, sums, shared := t.keySums(text, cand, pointsBuf[:0], sumsBuf[:0])
	// The longest cached prefix, confirmed by its text.
	var hit prefixRef
	found := false
	c.mu.Lock()
	c.stats.Lookups++
	for i := len(sums) - 1; i >= 0 && !found; i-- {
		ref, ok := c.keys[prefixKey{t, sums[i]}]
		// Confirm: the same restart point, the same text up to it (a hash
		// is not proof; cand's text up to shared was compared).
		if ok && ref.i == i && ref.rec.enc.restarts[i].end == points[i] &&
			(ref.rec == cand && points[i] <= shared || ref.rec.enc.Text[:points[i]] == text[:points[i]]) {
			hit, found = ref, true
			c.unlink(ref.rec)
			c.pushFront(ref.rec)
		}
	}
	c.mu.Unlock()

	var e *Encoding
	reused := 0
	if found {
		// The cached encoding is immutable: its ids up to the hit are
		// shared, not copied.
		e = t.encodeAfter(hit.rec.enc, hit.i, text)
		reused = hit.rec.enc.restarts[hit.i].tokens
	} else {
		e = t.EncodeText(text)
	}
	c.insert(t, e, sums, reused)
	return e, reused
}

// insert caches e under the keys of its restart points (sums, in order),
// taking them over from the records that held them.
func (c *PrefixCache) insert(t *Tokenizer, e *Encoding, sums []uint64, reused int) {
	n := min(len(sums), len(e.restarts))
	// Its chain hashes (Encoding.Chain, made later) are charged ahead:
	// 8 bytes a block of 4 ids or more.
	size := int64(len(e.Text)) + e.idBytes() + int64(e.n)*2 + int64(cap(e.restarts))*int64(unsafe.Sizeof(restart{})) + int64(n)*(prefixKeyBytes+8)
	c.mu.Lock()
	defer c.mu.Unlock()
	if reused > 0 {
		c.stats.Hits++
		c.stats.ReusedTokens += int64(reused)
	}
	if n == 0 || size > c.max/4 {
		return // nothing to key it by, or too big to be worth the room
	}
	rec := &prefixRecord{tok: t, enc: e, bytes: size}
	rec.sums = append(rec.sumsBuf[:0:len(rec.sumsBuf)], sums[:n]...)
	c.pushFront(rec)
	c.last = rec
	c.used += size
	for i := 0; i < n; i++ {
		k := prefixKey{t, sums[i]}
		if old, ok := c.keys[k]; ok {
			if old.i < 64 {
				old.rec.owned &^= 1 << old.i
			}
			if old.rec.keys--; old.rec.keys == 0 {
				c.drop(old.rec)
			}
		}
		c.keys[k] = prefixRef{rec, i}
		rec.keys++
		if i < 64 {
			rec.owned |= 1 << i
		}
	}
	for c.used > c.max && c.recs > 1 {
		c.evict(c.lru.prev)
	}
}

// idBytes is what e's ids keep from being collected: every backing array
// a part of e is in, whole. Arrays shared with other records are charged
// to each, so the cache's bytes bound what it holds from above.
func (e *Encoding) idBytes() int64 {
	var n int64
	for _, p := range e.parts {
		n += int64(cap(p)) * 4
	}
	return n
}

// evict removes a record and the keys that still lead to it.
func (c *PrefixCache) evict(rec *prefixRecord) {
	for i, sum := range rec.sums {
		k := prefixKey{rec.tok, sum}
		if i < 64 {
			if rec.owned&(1<<i) != 0 {
				delete(c.keys, k)
			}
		} else if ref, ok := c.keys[k]; ok && ref.rec == rec {
			delete(c.keys, k)
		}
	}
	c.drop(rec)
}

// drop forgets a record no key leads to.
func (c *PrefixCache) drop(rec *prefixRecord) {
	if rec.next == nil {
		return
	}
	c.unlink(rec)
	c.used -= rec.bytes
	if c.last == rec {
		c.last = nil
	}
}
