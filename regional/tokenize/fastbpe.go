package tokenize

import (
	"encoding/binary"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/tiktoken-go/tokenizer"
)

// fastBPE is an allocation-free reimplementation of what
// github.com/tiktoken-go/tokenizer does for cl100k_base and o200k_base: the
// same pre-tokenizer (the encoding's split regular expression, here written
// out as code) and the same byte-pair merges over the same ranks (read out
// of the library once per process). The library stays the reference: the
// tests compare the two on random and fuzzed text, and text that is not
// valid UTF-8 (which the library's regexp engine rewrites to U+FFFD) is
// left to the library.
type fastBPE struct {
	ranks map[string]uint32 // only when table is nil (rankTable cannot hold the encoding)
	table *rankTable
	split func(s string, i int) int // end of the piece that starts at i
	// words: split takes asciiWord's pieces as asciiWord does (cl100k_base),
	// so appendEncode may find them and their ranks from one or two 8-byte loads.
	words bool
}

// rankTables builds each encoding's rank map at most once per process, from
// its embedded vocabulary (vocab.go). It is the reference the tests read,
// and what a fastBPE reads when rankTable cannot hold its encoding;
// otherwise it is never built.
var rankTables = map[string]func() map[string]uint32{
	Cl100kBase: sync.OnceValue(func() map[string]uint32 { return vocabs[Cl100kBase]().ranks() }),
	O200kBase:  sync.OnceValue(func() map[string]uint32 { return vocabs[O200kBase]().ranks() }),
}

// rankLookups are the same ranks as rankTables, as rankTable (nil: keep
// to the map), built at most once per process straight from the embedded
// vocabulary. As a map they would be 100,256 strings (cl100k_base, as
// TestRankTableProbes logs) and 5.8 MB of map groups, three quarters of a
// controller's live heap objects, that the collector marks at every cycle:
// its marks took 12-18 ms, and requests arriving meanwhile made the proxy's
// p99.
var rankLookups = map[string]func() *rankTable{
	Cl100kBase: sync.OnceValue(func() *rankTable { v := vocabs[Cl100kBase](); return newRankTable(v.n, v.all()) }),
	O200kBase:  sync.OnceValue(func() *rankTable { v := vocabs[O200kBase](); return newRankTable(v.n, v.all()) }),
}

// codecs holds each encoding's library codec, built at most once per
// process and shared by every Tokenizer that needs one (those of
// p50k_base and r50k_base; the tests, for cl100k_base and o200k_base):
// tokenizer.Get compiles the encoding's split regexp anew for every codec
// it returns, and a codec's first Decode builds a reverse vocabulary of the
// whole encoding. Building one also builds the library's package-level
// vocabulary of the encoding, which stays live (see vocab.go). Sharing is
// safe: a codec is safe for concurrent use as this package uses it (Encode
// only reads the vocabulary and runs the split regexp, which pools its
// matchers; Decode builds the reverse vocabulary under a sync.Once), and
// nothing here changes it (no SetErrorMode).
var codecs = map[string]func() tokenizer.Codec{
	Cl100kBase: onceCodec(Cl100kBase),
	O200kBase:  onceCodec(O200kBase),
	P50kBase:   onceCodec(P50kBase),
	R50kBase:   onceCodec(R50kBase),
}

// codecsBuilt counts the codecs built (TestFastTokenizerBuildsNoCodec).
var codecsBuilt atomic.Int32

func onceCodec(encoding string) func() tokenizer.Codec {
	return sync.OnceValue(func() tokenizer.Codec {
		codecsBuilt.Add(1)
		codec, err := tokenizer.Get(tokenizer.Encoding(encoding))
		if err != nil {
			panic("tokenize: " + encoding + ": " + err.Error()) // a name the library ships
		}
		return codec
	})
}

func newFastBPE(encoding string) *fastBPE {
	var f *fastBPE
	switch encoding {
	case Cl100kBase:
		f = &fastBPE{table: rankLookups[encoding](), split: splitCl100k}
		f.words = f.table != nil
	case O200kBase:
		f = &fastBPE{table: rankLookups[encoding](), split: splitO200k}
	default:
		return nil
	}
	if f.table == nil {
		f.ranks = rankTables[encoding]()
	}
	return f
}

// appendEncode appends the ids of text, which must be valid UTF-8.
func (f *fastBPE) appendEncode(dst []uint32, text string) []uint32 {
	for i := 0; i < len(text); {
		// Most pre-tokens of prose are an ASCII word with its leading
		// space, and most of those are one token: split and look up from
		// one or two loads, without reading the bytes again. A word that
		// is not a token is merged as appendPiece merges it.
		if f.words && len(text)-i >= 8 {
			if j, h, tail, ok := asciiWord(text, i); ok {
				if j-i <= 8 {
					if id, ok := f.table.getShort(h, j-i); ok {
						dst = append(dst, id)
						i = j
						continue
					}
				} else if id, ok := f.table.getPair(h, tail, j-i); ok {
					dst = append(dst, id)
					i = j
					continue
				}
				dst = f.appendMerged(dst, text[i:j])
				i = j
				continue
			}
		}
		j := f.split(text, i)
		dst = f.appendPiece(dst, text[i:j])
		i = j
	}
	return dst
}

// appendPiece appends the byte-pair encoding of one pre-token: the whole
// piece when it is a token, else its bytes merged pair by pair, the pair of
// lowest rank first (the leftmost among equals).
func (f *fastBPE) appendPiece(dst []uint32, piece string) []uint32 {
	if id, ok := f.get(piece); ok {
		return append(dst, id)
	}
	return f.appendMerged(dst, piece)
}

// appendMerged is appendPiece of a piece that is not a token.
func (f *fastBPE) appendMerged(dst []uint32, piece string) []uint32 {
	if len(piece) <= smallPiece {
		var buf [smallPiece + 1]int32
		return f.mergeScan(dst, piece, buf[:len(piece)+1])
	}
	s := mergePool.Get().(*mergeScratch)
	dst = f.mergeHeap(dst, piece, s)
	mergePool.Put(s)
	return dst
}

// smallPiece is the longest piece merged by the quadratic scan (on the
// stack); longer ones use the heap.
const smallPiece = 64

const noRank = math.MaxUint32

func (f *fastBPE) rank(piece string) uint32 {
	if r, ok := f.get(piece); ok {
		return r
	}
	return noRank
}

// get returns the rank of piece.
func (f *fastBPE) get(piece string) (uint32, bool) {
	if f.table != nil {
		return f.table.get(piece)
	}
	r, ok := f.ranks[piece]
	return r, ok
}

// id is the rank of a part the merges left, which is always a token.
func (f *fastBPE) id(part string) uint32 {
	r, _ := f.get(part)
	return r
}

// mergeScan merges with a linear scan per merge (O(n^2), fine for short
// pieces). bounds holds the part boundaries, len(piece)+1 of them.
func (f *fastBPE) mergeScan(dst []uint32, piece string, bounds []int32) []uint32 {
	for i := range bounds {
		bounds[i] = int32(i)
	}
	var ranks [smallPiece]uint32
	pairRank := func(i int) uint32 { // rank of parts i and i+1 merged
		if i+2 >= len(bounds) {
			return noRank
		}
		return f.rank(piece[bounds[i]:bounds[i+2]])
	}
	for i := 0; i+1 < len(bounds); i++ {
		ranks[i] = pairRank(i)
	}
	for len(bounds) > 2 {
		best, at := uint32(noRank), -1
		for i := 0; i+2 < len(bounds); i++ {
			if ranks[i] < best {
				best, at = ranks[i], i
			}
		}
		if at < 0 {
			break
		}
		// Drop boundary at+1: parts at and at+1 become one.
		copy(bounds[at+1:], bounds[at+2:])
		bounds = bounds[:len(bounds)-1]
		copy(ranks[at+1:], ranks[at+2:len(bounds)])
		ranks[at] = pairRank(at)
		if at > 0 {
			ranks[at-1] = pairRank(at - 1)
		}
	}
	for i := 0; i+1 < len(bounds); i++ {
		dst = append(dst, f.id(piece[bounds[i]:bounds[i+1]]))
	}
	return dst
}

// mergeScratch is reused across long pieces (pooled: the Tokenizer is
// shared by goroutines).
type mergeScratch struct {
	next, prev []int32
	rank       []uint32
	heap       []mergeCand
}

type mergeCand struct {
	rank uint32
	at   int32
}

var mergePool = sync.Pool{New: func() any { return new(mergeScratch) }}

// mergeHeap merges with a doubly linked list of boundaries and a min-heap of
// candidate pairs ordered by (rank, position): the same merges as mergeScan
// in O(n log n).
func (f *fastBPE) mergeHeap(dst []uint32, piece string, s *mergeScratch) []uint32 {
	n := int32(len(piece))
	grow := func(b []int32) []int32 {
		if cap(b) < int(n)+1 {
			return make([]int32, n+1)
		}
		return b[:n+1]
	}
	s.next, s.prev = grow(s.next), grow(s.prev)
	if cap(s.rank) < int(n)+1 {
		s.rank = make([]uint32, n+1)
	}
	s.rank = s.rank[:n+1]
	next, prev, rank := s.next, s.prev, s.rank
	for i := int32(0); i <= n; i++ {
		next[i], prev[i], rank[i] = i+1, i-1, noRank
	}
	next[n] = -1
	pairRank := func(i int32) uint32 {
		j := next[i]
		if j < 0 {
			return noRank
		}
		k := next[j]
		if k < 0 {
			return noRank
		}
		return f.rank(piece[i:k])
	}
	h := s.heap[:0]
	for i := int32(0); i+2 <= n; i++ {
		if r := pairRank(i); r != noRank {
			rank[i] = r
			h = append(h, mergeCand{r, i})
		}
	}
	heapInit(h)
	for len(h) > 0 {
		var c mergeCand
		c, h = heapPop(h)
		i := c.at
		if rank[i] != c.rank {
			continue // stale: the pair changed since it was pushed
		}
		j := next[i]
		k := next[j]
		rank[j] = noRank
		next[i] = k
		if k >= 0 {
			prev[k] = i
		}
		for _, b := range [2]int32{i, prev[i]} {
			if b < 0 {
				continue
			}
			rank[b] = pairRank(b)
			if rank[b] != noRank {
				h = heapPush(h, mergeCand{rank[b], b})
			}
		}
	}
	s.heap = h
	for i := int32(0); next[i] >= 0; i = next[i] {
		dst = append(dst, f.id(piece[i:next[i]]))
	}
	return dst
}

func candLess(a, b mergeCand) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.at < b.at)
}

func heapInit(h []mergeCand) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		heapDown(h, i)
	}
}

func heapPush(h []mergeCand, c mergeCand) []mergeCand {
	h = append(h, c)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !candLess(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeCand) (mergeCand, []mergeCand) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	heapDown(h, 0)
	return top, h
}

func heapDown(h []mergeCand, i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if r := c + 1; r < len(h) && candLess(h[r], h[c]) {
			c = r
		}
		if !candLess(h[c], h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// Character classes of the split patterns (the library's regexp engine uses
// Go's unicode tables for \p{..} and unicode.IsSpace for \s).

func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

func isSpace(r rune) bool { return unicode.IsSpace(r) }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// contraction returns the end of (?i:'s|'t|'re|'ve|'m|'ll|'d) at i (s[i] is
// the apostrophe), or -1. Case folding makes 'ſ' (U+017F) an s.
func contraction(s string, i int) int {
	j := i + 1
	if j >= len(s) {
		return -1
	}
	switch s[j] {
	case 's', 'S', 't', 'T', 'm', 'M', 'd', 'D':
		return j + 1
	case 'r', 'R', 'v', 'V':
		if j+1 < len(s) && (s[j+1] == 'e' || s[j+1] == 'E') {
			return j + 2
		}
	case 'l', 'L':
		if j+1 < len(s) && (s[j+1] == 'l' || s[j+1] == 'L') {
			return j + 2
		}
	case "ſ"[0]:
		if strings.HasPrefix(s[j:], "ſ") {
			return j + len("ſ")
		}
	}
	return -1
}

// whitespaceTail handles the three whitespace alternatives shared by both
// patterns, at i where s[i] starts a whitespace run:
// \s*[\r\n]+ | \s+(?!\S) | \s+
func whitespaceTail(s string, i int) int {
	end, afterNL, lastStart := i, -1, i
	for end < len(s) {
		r, n := runeAt(s, end)
		if !isSpace(r) {
			break
		}
		lastStart = end
		end += n
		if r == '\r' || r == '\n' {
			afterNL = end
		}
	}
	if afterNL > 0 {
		return afterNL
	}
	if end == len(s) || lastStart == i {
		return end // the whole run: at the end of the text, or a single character
	}
	return lastStart // all but the last character, which goes with what follows
}

// splitCl100k returns the end of the cl100k_base pre-token starting at i:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func splitCl100k(s string, i int) int {
	// The common case, a word with or without its leading space or
	// punctuation, in ASCII: decided from a table, a byte at a time.
	if c := s[i]; c < utf8.RuneSelf {
		switch class := asciiClass[c]; {
		case class == asciiLetter:
			return letterRun(s, i+1)
		case class&(asciiNumber|asciiNewline) == 0 && c != '\'' && i+1 < len(s):
			if c2 := s[i+1]; c2 < utf8.RuneSelf && asciiClass[c2] == asciiLetter {
				return letterRun(s, i+2)
			}
		}
	}
	r, n := runeAt(s, i)
	if r == '\'' {
		if e := contraction(s, i); e > 0 {
			return e
		}
	}
	if isLetter(r) {
		return letterRun(s, i+n)
	}
	if r != '\r' && r != '\n' && !isNumber(r) && i+n < len(s) {
		if r2, n2 := runeAt(s, i+n); isLetter(r2) {
			return letterRun(s, i+n+n2)
		}
	}
	if isNumber(r) {
		return numberTail(s, i+n)
	}
	if end := punctuation(s, i, r, n, false); end > 0 {
		return end
	}
	return whitespaceTail(s, i)
}

// asciiWord is splitCl100k's common case read 8 bytes at a time. At i,
// with at least 8 bytes of s from i, it matches ASCII letters with or
// without one leading ASCII byte that is not a letter, digit, newline or
// apostrophe (the ASCII case of [^\r\n\p{L}\p{N}]?\p{L}+ that the
// contractions do not take first). It reports ok when that piece is at
// most 7 bytes long, or at most 15 and s has 16 bytes from i (a second
// load), and ends at an ASCII byte, so that splitCl100k ends it at the
// same place. It returns the piece's end and its bytes as rankTable keys
// them: its first 8 bytes (head) and the rest (tail, 0 for a piece of 8
// bytes or less), little-endian and zero padded. Otherwise the caller
// splits as usual.
func asciiWord(s string, i int) (end int, h, tail uint64, ok bool) {
	w := load64(s, i)
	letters := asciiLetters(w)
	var before uint // bytes before the letters
	switch {
	case letters&0x80 != 0:
		before = 1 // the letter run starts at i; splitCl100k extends it from i+1
	case letters&0x8000 != 0 && wordPrefix[byte(w)]:
		before = 2
	default:
		return 0, 0, 0, false
	}
	if rest := ^letters & highBits &^ (1<<(8*before) - 1); rest != 0 { // non-letters after the first letter
		n := uint(bits.TrailingZeros64(rest)) / 8 // the first byte after the letters
		if w>>(8*n)&0x80 != 0 {
			return 0, 0, 0, false // not ASCII: maybe a letter that letterRun takes
		}
		return i + int(n), w & (1<<(8*n) - 1), 0, true
	}
	// Eight bytes of word: the letters go on into the next eight.
	if len(s)-i < 16 {
		return 0, 0, 0, false
	}
	w2 := load64(s, i+8)
	rest := ^asciiLetters(w2) & highBits
	if rest == 0 {
		return 0, 0, 0, false // 16 bytes or more
	}
	n := uint(bits.TrailingZeros64(rest)) / 8
	if w2>>(8*n)&0x80 != 0 {
		return 0, 0, 0, false
	}
	return i + 8 + int(n), w, w2 & (1<<(8*n) - 1), true
}

// load64 is the 8 bytes of s from i, little-endian; s must have them.
func load64(s string, i int) uint64 {
	return binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[i:]), 8)) // read only
}

const highBits = 0x8080808080808080

// asciiLetters has the high bit set in each byte of w that is an ASCII
// letter ([A-Za-z]) and every other bit clear.
func asciiLetters(w uint64) uint64 {
	const ones = 0x0101010101010101
	y := (w | 0x20*ones) &^ highBits // lower case, high bit dropped: y <= 0x7f in each byte
	ge := y + (0x80-'a')*ones        // high bit: y >= 'a' (no carry out of a byte)
	gt := y + (0x80-'z'-1)*ones      // high bit: y > 'z'
	return ge &^ gt &^ w & highBits  // and w's byte was ASCII
}

// wordPrefix holds the ASCII bytes that splitCl100k's fast path lets lead
// a letter run: not letters, digits, \r, \n or the apostrophe.
var wordPrefix = func() (t [256]bool) {
	for c := range utf8.RuneSelf {
		t[c] = asciiClass[c]&(asciiLetter|asciiNumber|asciiNewline) == 0 && c != '\''
	}
	return t
}()

// letterRun returns the end of the run of letters (\p{L}*) at j.
func letterRun(s string, j int) int {
	for j < len(s) {
		if c := s[j]; c < utf8.RuneSelf {
			if asciiClass[c] != asciiLetter {
				break
			}
			j++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[j:])
		if !unicode.IsLetter(r) {
			break
		}
		j += n
	}
	return j
}

// The classes of ASCII bytes the split patterns tell apart.
const (
	asciiOther   = 0
	asciiLetter  = 1 << iota // [A-Za-z]
	asciiNumber              // [0-9]
	asciiSpace               // \s other than \r and \n
	asciiNewline             // \r, \n (also \s)
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		r := rune(c)
		switch {
		case isLetter(r):
			t[c] = asciiLetter
		case isNumber(r):
			t[c] = asciiNumber
		case r == '\r' || r == '\n':
			t[c] = asciiNewline
		case isSpace(r):
			t[c] = asciiSpace
		}
	}
	return t
}()

// numberTail ends "\p{N}{1,3}" whose first number rune ends at j: it takes
// at most two more number runes.
func numberTail(s string, j int) int {
	for k := 1; k < 3 && j < len(s); k++ {
		r, n := runeAt(s, j)
		if !isNumber(r) {
			break
		}
		j += n
	}
	return j
}

// punctuation matches " ?[^\s\p{L}\p{N}]+[\r\n]*" (with '/' in the tail
// class too for o200k_base) at i, whose rune is r of n bytes; -1 if not.
func punctuation(s string, i int, r rune, n int, slash bool) int {
	j := i
	if r == ' ' {
		if i+1 >= len(s) {
			return -1
		}
		j = i + 1
		r, n = runeAt(s, j)
	}
	if !isOther(r) {
		return -1
	}
	j += n
	for j < len(s) {
		r2, n2 := runeAt(s, j)
		if !isOther(r2) {
			break
		}
		j += n2
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || (slash && s[j] == '/')) {
		j++
	}
	return j
}

// o200k_base letter classes: U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
// L = [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func isUpperish(r rune) bool {
	if r < utf8.RuneSelf {
		return 'A' <= r && r <= 'Z'
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

func isLowerish(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z'
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

// isPrefixClass is [^\r\n\p{L}\p{N}].
func isPrefixClass(r rune) bool { return r != '\r' && r != '\n' && !isLetter(r) && !isNumber(r) }

// o200kWord matches U*L+ at j with the backtracking of a greedy U*: the
// run of U characters, then the L run after it; failing that, the last L
// character inside the U run alone. It returns the end, or -1.
func o200kWord(s string, j int) int {
	u, lastL := j, -1
	for u < len(s) {
		r, n := runeAt(s, u)
		if !isUpperish(r) {
			break
		}
		if isLowerish(r) {
			lastL = u + n
		}
		u += n
	}
	if u < len(s) {
		if r, _ := runeAt(s, u); isLowerish(r) {
			return lowerRun(s, u)
		}
	}
	return lastL
}

func lowerRun(s string, j int) int {
	for j < len(s) {
		r, n := runeAt(s, j)
		if !isLowerish(r) {
			break
		}
		j += n
	}
	return j
}

// o200kUpperWord matches U+L* at j, or returns -1.
func o200kUpperWord(s string, j int) int {
	u := j
	for u < len(s) {
		r, n := runeAt(s, u)
		if !isUpperish(r) {
			break
		}
		u += n
	}
	if u == j {
		return -1
	}
	return lowerRun(s, u)
}

// splitO200k returns the end of the o200k_base pre-token starting at i:
// [^\r\n\p{L}\p{N}]?[U]*[L]+(?i:'s|...)?|[^\r\n\p{L}\p{N}]?[U]+[L]*(?i:'s|...)?|
// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func splitO200k(s string, i int) int {
	r, n := runeAt(s, i)
	withContraction := func(e int) int {
		if e < len(s) && s[e] == '\'' {
			if c := contraction(s, e); c > 0 {
				return c
			}
		}
		return e
	}
	prefixed := isPrefixClass(r) && i+n < len(s)
	// Alternative 1, with the optional prefix taken, then given back.
	if prefixed {
		if e := o200kWord(s, i+n); e > 0 {
			return withContraction(e)
		}
	}
	if e := o200kWord(s, i); e > 0 {
		return withContraction(e)
	}
	// Alternative 2, likewise.
	if prefixed {
		if e := o200kUpperWord(s, i+n); e > 0 {
			return withContraction(e)
		}
	}
	if e := o200kUpperWord(s, i); e > 0 {
		return withContraction(e)
	}
	if isNumber(r) {
		return numberTail(s, i+n)
	}
	if end := punctuation(s, i, r, n, true); end > 0 {
		return end
	}
	return whitespaceTail(s, i)
}
