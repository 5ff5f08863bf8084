package tokenize

// Encoding is a text with its token ids and the points where tokenization
// restarts (the end of each special token): what a multi-turn session keeps
// from one turn to the next so that Extend re-encodes only the new part.
// An Encoding is immutable once returned; share it freely.
type Encoding struct {
	Text string
	IDs  []uint32

	restarts []restart
}

// restart marks a special token at Text[start:end] after which tokenization
// starts afresh; tokens is the number of ids up to and including it.
type restart struct {
	start, end int
	tokens     int
}

// EncodeText encodes text and records its restart points.
func (t *Tokenizer) EncodeText(text string) *Encoding {
	// Sized like Extend's: at about 4 bytes a token in English, a third of
	// the bytes rarely needs growing (growing an 8k-token encoding from
	// nil cost a sixth of its encoding time).
	e := &Encoding{Text: text, IDs: make([]uint32, 0, len(text)/3+16)}
	e.IDs, _ = t.appendSegments(e.IDs, text, &e.restarts, 0)
	return e
}

// Extend returns the encoding of text, reusing the ids of prev (the previous
// turn of the same session, encoded by the same Tokenizer) up to the last
// safe restart point, and the number of ids it reused. The result is always
// exactly EncodeText(text); when text shares no safe prefix with prev (or
// prev is nil) it is a full encode.
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
	r := prev.restarts[i]
	e := &Encoding{
		Text:     text,
		IDs:      make([]uint32, r.tokens, r.tokens+(len(text)-r.end)/3+1),
		restarts: make([]restart, i+1, i+1+(len(prev.restarts)-i)),
	}
	copy(e.IDs, prev.IDs[:r.tokens])
	copy(e.restarts, prev.restarts[:i+1])
	// appendSegments counts a restart's tokens from the start of e.IDs, which
	// already holds the reused prefix, so the new points need no shifting.
	e.IDs, _ = t.appendSegments(e.IDs, text[r.end:], &e.restarts, r.end)
	return e, r.tokens
}

// commonPrefix returns the length in bytes of the longest common prefix of a
// and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	if a[:n] == b[:n] {
		return n
	}
	// Compare in 8-byte words first, then bytes.
	i := 0
	for i+8 <= n && a[i:i+8] == b[i:i+8] {
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
