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
// TestPrefixCacheExact checks it against encoding the whole text, and
// TestEncodeChatCachedExact Model.EncodeChatCached, which renders a chat
// against the last cached record, against rendering and encoding whole.
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
	// encoding is enc's room: an encoding is made in the record that
	// may cache it, one allocation for both (an encoding kept after its
	// record left the cache keeps the record's few hundred bytes too).
	encoding Encoding
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

// The key of a restart point p of a text is the xxhash of the text since
// the previous point, seeded with the previous point's key (0 for the
// first): a hash of the whole text up to p, whose keys after a known one
// need only the text after it (tailKeys).

// tailKeys appends to points the key points of tail, a text's bytes from
// base on (base is a key point, or 0), as offsets in the text, and to sums
// their keys, given the key h of the text up to base (0 when base is 0):
// the key points and keys of the whole text (TestTailKeysMatchesNaive)
// from base on, without reading the text before it.
func (t *Tokenizer) tailKeys(tail string, base int, h uint64, points []int, sums []uint64) ([]int, []uint64) {
	from := len(points)
	for pos := 0; pos < len(tail); {
		_, end, _, ok := t.nextSpecial(tail, pos)
		if !ok {
			break
		}
		points = append(points, base+end)
		pos = end
	}
	at := 0
	var d xxhash.Digest
	for _, p := range points[from:] {
		d.ResetWithSeed(h)
		_, _ = d.WriteString(tail[at : p-base])
		h, at = d.Sum64(), p-base
		sums = append(sums, h)
	}
	return points, sums
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
	e, reused, _ := t.encodeCached(c, &renderInput{text: text})
	return e, reused
}

// renderInput is a text to encode: a chat template's rendering of
// messages, or text as it is (tmpl nil).
type renderInput struct {
	tmpl *Template
	msgs []Message
	gen  bool
	text string
}

func (in *renderInput) estimate() int {
	if in.tmpl == nil {
		return len(in.text)
	}
	return in.tmpl.estimate(in.msgs)
}

func (in *renderInput) renderTo(w *renderSink) error {
	if in.tmpl == nil {
		w.WriteString(in.text)
		return nil
	}
	return in.tmpl.renderTo(w, in.msgs, in.gen)
}

// encodeCached is EncodeCached of in's text (c is on). The most recently
// cached record is likely to share a prefix with it (a system prompt, a
// conversation's history): in is rendered against that record's
// encoding, so the text they share is compared, not copied, and its
// restart points and keys, up to the last that the shared text makes
// safe, are the record's (Extend's rule); only the text after it is
// scanned and hashed. Then the longest cached prefix beyond that point, if
// any, is looked up by its key and confirmed by its text (a hash is not
// proof), else the record's own is reused. Records are immutable once
// cached. TestEncodeChatCachedExact checks it against encoding the whole
// rendering.
func (t *Tokenizer) encodeCached(c *PrefixCache, in *renderInput) (*Encoding, int, error) {
	c.mu.Lock()
	cand := c.last
	c.mu.Unlock()
	var ref *Encoding
	maxI := -1
	if cand != nil && cand.tok == t {
		ref = cand.enc
		maxI = min(len(cand.sums), len(ref.restarts)) - 1
	}
	var w renderSink
	w.reset(ref, maxI, t.maxSpecial, in.estimate())
	if err := in.renderTo(&w); err != nil {
		return nil, 0, err
	}
	cut, tail := w.finish()

	// The keys: the record's up to cut, then the tail's.
	var pointsBuf [16]int
	var sumsBuf [64]uint64
	sums := sumsBuf[:0]
	base, h := 0, uint64(0)
	if cut >= 0 {
		sums = append(sums, cand.sums[:cut+1]...)
		base, h = ref.restarts[cut].end, cand.sums[cut]
	} else {
		ref = nil
	}
	from := len(sums)
	points, sums := t.tailKeys(tail.s, base, h, pointsBuf[:0], sums)

	// The text is ref's up to base, then tail: as pieces, to confirm a
	// hit by.
	var textBuf [maxParts + 1]textPiece
	text := textBuf[:0]
	var hit *prefixRecord
	hitI := -1
	c.mu.Lock()
	c.stats.Lookups++
	for j := len(points) - 1; j >= 0 && hit == nil; j-- {
		i, p := from+j, points[j]
		r, ok := c.keys[prefixKey{t, sums[i]}]
		if !ok || r.i != i || r.rec.enc.restarts[i].end != p {
			continue
		}
		if len(text) == 0 {
			text = appendPieces(text, ref, base)
			text = append(text, tail)
		}
		if piecesEqual(r.rec.enc.text, text, p) {
			hit, hitI = r.rec, i
		}
	}
	if hit == nil && cut >= 0 {
		hit, hitI = cand, cut
	}
	if hit != nil && hit.next != nil {
		c.unlink(hit)
		c.pushFront(hit)
	}
	c.mu.Unlock()

	// The encoding is made in its record (one allocation), cached or not.
	rec := new(prefixRecord)
	e := &rec.encoding
	reused := 0
	if hit != nil {
		// The cached encoding is immutable: its ids up to the hit are
		// shared, not copied.
		r := hit.enc.restarts[hitI]
		t.encodeAfter(e, hit.enc, hitI, tail.s[r.end-base:])
		e.setText(ref, base, tail)
		reused = r.tokens
	} else {
		t.encodePiece(e, tail)
	}
	c.insert(t, rec, sums, reused)
	return e, reused, nil
}

// appendPieces appends the pieces of e's first n bytes (none when e is
// nil).
func appendPieces(dst []textPiece, e *Encoding, n int) []textPiece {
	for k := 0; n > 0; k++ {
		p := e.text[k]
		p.s = p.s[:min(n, len(p.s))]
		dst = append(dst, p)
		n -= len(p.s)
	}
	return dst
}

// insert caches rec's encoding under the keys of its restart points
// (sums, in order), taking them over from the records that held them.
func (c *PrefixCache) insert(t *Tokenizer, rec *prefixRecord, sums []uint64, reused int) {
	e := &rec.encoding
	n := min(len(sums), len(e.restarts))
	// Its chain hashes (Encoding.Chain, made later) are charged ahead:
	// 8 bytes a block of 4 ids or more.
	size := e.textBytes() + e.idBytes() + int64(e.n)*2 + int64(cap(e.restarts))*int64(unsafe.Sizeof(restart{})) + int64(n)*(prefixKeyBytes+8)
	c.mu.Lock()
	defer c.mu.Unlock()
	if reused > 0 {
		c.stats.Hits++
		c.stats.ReusedTokens += int64(reused)
	}
	if n == 0 || size > c.max/4 {
		return // nothing to key it by, or too big to be worth the room
	}
	rec.tok, rec.enc, rec.bytes = t, e, size
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
