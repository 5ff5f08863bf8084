package tokenize

// Encoding is a text with its token ids and the points where tokenization
// restarts (the end of each special token): what a multi-turn session keeps
// from one turn to the next so that Extend re-encodes only the new part.
// An Encoding is immutable once returned; share it freely.
//
// Its ids are held in parts, concatenated: an encoding that reuses another's
// prefix (Extend, EncodeCached) shares that prefix's ids instead of copying
// them, so every part but the last may also belong to other encodings.
type Encoding struct {
	Text string

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
	e := &Encoding{Text: text}
	e.restarts = e.restartsBuf[:0]
	ids, _ := t.appendSegments(make([]uint32, 0, len(text)/3+16), text, &e.restarts, 0, 0)
	e.parts = e.partsBuf[:1]
	e.parts[0], e.n = ids, len(ids)
	return e
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
	common := commonPrefix(prev.Text, text)
	i := len(prev.restarts) - 1
	for i >= 0 && prev.restarts[i].start+t.maxSpecial > common {
		i--
	}
	if i < 0 {
		return t.EncodeText(text), 0
	}
	e := t.encodeAfter(prev, i, text)
	return e, prev.restarts[i].tokens
}

// encodeAfter encodes text, which has prev's text up to the end of its
// restart point i and tokenizes the same up to there: prev's ids up to
// that point are shared (the parts that hold them, the last one cut), and
// only the rest of text is encoded, into a new last part. An encoding that
// would have more than maxParts parts gets one, a copy.
func (t *Tokenizer) encodeAfter(prev *Encoding, i int, text string) *Encoding {
	r := prev.restarts[i]
	e := &Encoding{Text: text}
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
	room := (len(text)-r.end)/3 + 16
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
	own, _ = t.appendSegments(own, text[r.end:], &e.restarts, r.end, before)
	e.parts[shared] = own
	e.n = before + len(own)
	e.memo.inherited = prev.prefixChain(r.tokens)
	return e
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
