package tokenize

import "unsafe"

// Encoding is a text with its token ids and the points where tokenization
// restarts (the end of each special token): what a multi-turn session keeps
// from one turn to the next so that Extend re-encodes only the new part.
// An Encoding is immutable once returned; share it freely.
//
// Its ids are held in parts, concatenated: an encoding that reuses another's
// prefix (Extend, EncodeCached) shares that prefix's ids instead of copying
// them, so every part but the last may also belong to other encodings.
type Encoding struct {
	// text, in order, is the text in pieces, tlen bytes in all: an
	// encoding made from another's by rendering against it (Model.ExtendChat,
	// Model.EncodeChatCached) shares the other's text up to where it
	// reused its ids, and owns only the rest. Like parts, nothing writes
	// to a piece once the Encoding is returned.
	text    []textPiece
	tlen    int
	textBuf [2]textPiece // text's room when it has at most two pieces

	// parts, in order, are the ids; n counts them. Each part starts at
	// index 0 of its backing array, so its capacity is the array's whole
	// size (what the prefix cache charges for it). Nothing writes or
	// appends to a part once the Encoding is returned.
	parts    [][]uint32
	n        int
	partsBuf [2][]uint32 // parts' room when it has at most two
	restarts []restart
	memo     chainMemo // chain hashes of its blocks (chain.go)
	// restartsBuf is restarts' room when it has at most six (a system
	// prompt and a question in ChatML have five).
	restartsBuf [6]restart
}

// textPiece is a piece of an encoding's text, and the length of the
// string it was cut from: what it keeps from being collected.
type textPiece struct {
	s     string
	whole int
}

// Text returns the encoded text (one allocation when it is held in
// several pieces).
func (e *Encoding) Text() string {
	if len(e.text) == 1 {
		return e.text[0].s
	}
	b := make([]byte, 0, e.tlen)
	for _, p := range e.text {
		b = append(b, p.s...)
	}
	return string(b)
}

// textBytes is what e's text keeps from being collected: every string a
// piece is cut from, whole (charged to each encoding sharing it, as
// idBytes charges ids).
func (e *Encoding) textBytes() int64 {
	var n int64
	for _, p := range e.text {
		n += int64(p.whole)
	}
	return n
}

// setText makes e's text head's first n bytes (none when head is nil)
// followed by tail. An encoding that would have more than maxParts
// pieces gets one, a copy.
func (e *Encoding) setText(head *Encoding, n int, tail textPiece) {
	e.tlen = n + len(tail.s)
	k := 0 // pieces of head that hold its first n bytes
	for left := n; left > 0; k++ {
		left -= len(head.text[k].s)
	}
	switch {
	case k == 0:
		e.text = e.textBuf[:1]
		e.text[0] = tail
		return
	case k+1 > maxParts:
		b := make([]byte, 0, e.tlen)
		b = appendText(b, head.text, 0, n)
		b = append(b, tail.s...)
		e.text = e.textBuf[:1]
		e.text[0] = textPiece{s: unsafe.String(unsafe.SliceData(b), len(b)), whole: cap(b)}
		return
	case k+1 <= len(e.textBuf):
		e.text = e.textBuf[:k+1]
	default:
		e.text = make([]textPiece, k+1)
	}
	copy(e.text, head.text[:k])
	last := &e.text[k-1]
	last.s = last.s[:len(last.s)-(e.textPrefixLen(k)-n)]
	e.text[k] = tail
}

// textPrefixLen is the length of e's first k pieces.
func (e *Encoding) textPrefixLen(k int) int {
	n := 0
	for _, p := range e.text[:k] {
		n += len(p.s)
	}
	return n
}

// appendText appends the bytes [from, to) of the text held in pieces.
func appendText(dst []byte, pieces []textPiece, from, to int) []byte {
	for _, p := range pieces {
		if to <= 0 {
			break
		}
		s := p.s[:min(to, len(p.s))]
		if from < len(s) {
			dst = append(dst, s[max(from, 0):]...)
		}
		from, to = from-len(p.s), to-len(p.s)
	}
	return dst
}

// piecesEqual reports whether the first n bytes of two texts held in
// pieces are the same; both hold n bytes at least.
func piecesEqual(a, b []textPiece, n int) bool {
	var as, bs string
	for n > 0 {
		if as == "" {
			as, a = a[0].s, a[1:]
			continue
		}
		if bs == "" {
			bs, b = b[0].s, b[1:]
			continue
		}
		k := min(len(as), len(bs), n)
		if as[:k] != bs[:k] {
			return false
		}
		as, bs, n = as[k:], bs[k:], n-k
	}
	return true
}

// commonPrefixPieces returns the length of the longest common prefix of
// the text held in pieces and s.
func commonPrefixPieces(pieces []textPiece, s string) int {
	n := 0
	for _, p := range pieces {
		c := commonPrefix(p.s, s)
		n += c
		if c < len(p.s) {
			break
		}
		s = s[c:]
	}
	return n
}

// maxParts bounds how many parts an encoding built from another has: a
// conversation extended turn by turn adds one per turn, and copying them
// into one array every few turns keeps iterating over them cheap.
const maxParts = 8

// restart marks a special token at Text[start:end] after which tokenization
// starts afresh; tokens is the number of ids up to and including it.
type restart struct {
	start, end int
	tokens     int
}

// Len returns the number of ids.
func (e *Encoding) Len() int { return e.n }

// AppendParts appends the ids to dst in consecutive pieces, at most 8
// (maxParts) of them, and returns the extended slice. The pieces are shared
// with other encodings and caches: read them, never modify them (they
// have no spare capacity, so appending to one copies it).
func (e *Encoding) AppendParts(dst [][]uint32) [][]uint32 {
	for _, p := range e.parts {
		dst = append(dst, p[:len(p):len(p)])
	}
	return dst
}

// AppendIDs appends the ids to dst and returns the extended slice.
func (e *Encoding) AppendIDs(dst []uint32) []uint32 {
	return e.appendIDs(dst, e.n)
}

// appendIDs appends the first n ids to dst.
func (e *Encoding) appendIDs(dst []uint32, n int) []uint32 {
	for _, p := range e.parts {
		if n <= 0 {
			break
		}
		p = p[:min(n, len(p))]
		dst = append(dst, p...)
		n -= len(p)
	}
	return dst
}

// EncodeText encodes text and records its restart points.
func (t *Tokenizer) EncodeText(text string) *Encoding {
	// Sized like Extend's: at about 4 bytes a token in English, a third of
	// the bytes rarely needs growing (growing an 8k-token encoding from
	// nil cost a sixth of its encoding time).
	e := new(Encoding)
	t.encodePiece(e, textPiece{s: text, whole: len(text)})
	return e
}

// encodePiece makes e, which must be zero, the encoding of a text in one
// piece.
func (t *Tokenizer) encodePiece(e *Encoding, text textPiece) {
	e.text = e.textBuf[:1]
	e.text[0], e.tlen = text, len(text.s)
	e.restarts = e.restartsBuf[:0]
	ids, _ := t.appendSegments(make([]uint32, 0, len(text.s)/3+16), text.s, &e.restarts, 0, 0)
	e.parts = e.partsBuf[:1]
	e.parts[0], e.n = ids, len(ids)
}

// Extend returns the encoding of text, reusing the ids of prev (the previous
// turn of the same session, encoded by the same Tokenizer) up to the last
// safe restart point, and the number of ids it reused. The result is always
// exactly EncodeText(text); when text shares no safe prefix with prev (or
// prev is nil) it is a full encode. The reused ids are shared with prev, not
// copied.
//
// Why the reuse is exact: tokenization splits the text at special tokens and
// encodes the pieces between them independently, so the ids up to the end of
// a special token depend only on the text before it. A special token of prev
// at [s, e) is kept when s + (longest special) <= the common prefix length:
// then every special-token match the scanner made before e looked only at
// text the two strings share, and none can start before e and end beyond
// the common prefix. Byte-pair merges never cross a special token, so no
// merge crosses the reuse boundary.
func (t *Tokenizer) Extend(prev *Encoding, text string) (*Encoding, int) {
	if prev == nil || len(prev.restarts) == 0 {
		return t.EncodeText(text), 0
	}
	common := commonPrefixPieces(prev.text, text)
	i := len(prev.restarts) - 1
	for i >= 0 && prev.restarts[i].start+t.maxSpecial > common {
		i--
	}
	if i < 0 {
		return t.EncodeText(text), 0
	}
	e := new(Encoding)
	t.encodeAfter(e, prev, i, text[prev.restarts[i].end:])
	e.setText(nil, 0, textPiece{s: text, whole: len(text)})
	return e, prev.restarts[i].tokens
}

// encodeAfter makes e, which must be zero, the encoding of a text that has prev's text up to the end of its
// restart point i, and tokenizes the same up to there, followed by rest:
// prev's ids up to that point are shared (the parts that hold them, the
// last one cut), and only rest is encoded, into a new last part. An
// encoding that would have more than maxParts parts gets one, a copy. The
// caller sets the encoding's text (setText).
func (t *Tokenizer) encodeAfter(e, prev *Encoding, i int, rest string) {
	r := prev.restarts[i]
	if n := len(prev.restarts) + 1; n <= len(e.restartsBuf) {
		e.restarts = e.restartsBuf[:i+1]
	} else {
		e.restarts = make([]restart, i+1, n)
	}
	copy(e.restarts, prev.restarts[:i+1])
	shared := 0 // parts of prev that hold its first r.tokens ids
	for left := r.tokens; left > 0; shared++ {
		left -= len(prev.parts[shared])
	}
	room := len(rest)/3 + 16
	var own []uint32
	if shared+1 > maxParts {
		own = prev.appendIDs(make([]uint32, 0, r.tokens+room), r.tokens)
		shared = 0
	} else {
		own = make([]uint32, 0, room)
	}
	if shared+1 <= len(e.partsBuf) {
		e.parts = e.partsBuf[:shared+1]
	} else {
		e.parts = make([][]uint32, shared+1)
	}
	left := r.tokens
	for k := range shared {
		p := prev.parts[k]
		p = p[:min(left, len(p))]
		e.parts[k] = p
		left -= len(p)
	}
	// appendSegments counts a restart's tokens from the start of own; the
	// shared parts hold the ids before it.
	before := r.tokens - len(own)
	own, _ = t.appendSegments(own, rest, &e.restarts, r.end, before)
	e.parts[shared] = own
	e.n = before + len(own)
	e.memo.inherited = prev.prefixChain(r.tokens)
}

// commonPrefix returns the length in bytes of the longest common prefix of a
// and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	if a[:n] == b[:n] {
		return n
	}
	// Compare in 2 KB chunks first (memequal's vector loop), then 64
	// bytes, then 8-byte words, then bytes.
	i := 0
	for i+2048 <= n && a[i:i+2048] == b[i:i+2048] {
		i += 2048
	}
	for i+64 <= n && a[i:i+64] == b[i:i+64] {
		i += 64
	}
	for i+8 <= n && a[i:i+8] == b[i:i+8] {
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
