package tokenize

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tiktoken-go/tokenizer"
)

// Errors callers branch on.
var (
	// ErrUnknownEncoding: the tokenizer name is not one this package ships.
	ErrUnknownEncoding = errors.New("unknown tokenizer encoding")
	// ErrInvalidPrompt wraps every error caused by the request itself (bad
	// prompt shape, template refusal, unknown content part): an HTTP layer
	// answers 400.
	ErrInvalidPrompt = errors.New("invalid prompt")
)

// Encoding names accepted by NewTokenizer and Config.Encoding.
const (
	Cl100kBase = "cl100k_base"
	O200kBase  = "o200k_base"
	P50kBase   = "p50k_base"
	R50kBase   = "r50k_base"
)

// builtinSpecials are the special tokens each encoding recognises without a
// model directory: tiktoken's own specials for the encoding, plus the ChatML
// extension the built-in chat template needs (for cl100k_base the ids of
// tiktoken's cl100k_im; for o200k_base the ids listed for gpt-4o's ChatML).
// A model directory's added tokens (tokenizer_config.json) are added on top.
var builtinSpecials = map[string]map[string]uint32{
	Cl100kBase: {
		"<|endoftext|>":   100257,
		"<|fim_prefix|>":  100258,
		"<|fim_middle|>":  100259,
		"<|fim_suffix|>":  100260,
		"<|im_start|>":    100264,
		"<|im_end|>":      100265,
		"<|im_sep|>":      100266,
		"<|endofprompt|>": 100276,
	},
	O200kBase: {
		"<|endoftext|>":   199999,
		"<|endofprompt|>": 200018,
		"<|im_start|>":    200264,
		"<|im_end|>":      200265,
		"<|im_sep|>":      200266,
	},
	P50kBase: {"<|endoftext|>": 50256},
	R50kBase: {"<|endoftext|>": 50256},
}

// Encodings returns the encoding names this package ships, sorted.
func Encodings() []string {
	names := make([]string, 0, len(builtinSpecials))
	for n := range builtinSpecials {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Tokenizer encodes text to token ids: special tokens are matched anywhere in
// the text (longest first), and the text between them is byte-pair encoded
// with the encoding's ranks. It is safe for concurrent use.
type Tokenizer struct {
	encoding string
	// library is the encoding's github.com/tiktoken-go/tokenizer codec
	// (shared, built on first use): what encodes and decodes when fast is
	// nil, and the tests' reference otherwise. With fast set, nothing
	// outside the tests builds it (TestFastTokenizerBuildsNoCodec).
	library func() tokenizer.Codec
	fast    *fastBPE // nil: every encode goes through the library

	specials   map[string]uint32 // content -> id
	byID       map[uint32]string // id -> content
	lengths    []int             // distinct special lengths, longest first
	first      [256]bool         // first bytes of specials
	firstOne   int               // the only first byte when all share one, else -1
	maxSpecial int               // longest special, in bytes
	// few: when there are at most maxFewSpecials specials, all of them,
	// longest first, matched by comparing instead of hashing each length.
	few []fewSpecial
}

// maxFewSpecials bounds the specials nextSpecial compares one by one.
const maxFewSpecials = 16

// fewSpecial is a special token and its first eight bytes as a
// little-endian word (when it has eight).
type fewSpecial struct {
	s    string
	id   uint32
	head uint64
}

// NewTokenizer returns the tokenizer of a tiktoken encoding (see Encodings)
// with its built-in special tokens plus extra (content -> id). An extra id
// that collides with an ordinary rank of the encoding is an error: the ids
// would be ambiguous.
func NewTokenizer(encoding string, extra map[string]uint32) (*Tokenizer, error) {
	base, ok := builtinSpecials[encoding]
	if !ok {
		return nil, fmt.Errorf("new tokenizer %q: %w (have %s)", encoding, ErrUnknownEncoding, strings.Join(Encodings(), ", "))
	}
	newCodec, ok := codecs[encoding]
	if !ok {
		return nil, fmt.Errorf("new tokenizer %q: %w (no library codec)", encoding, ErrUnknownEncoding)
	}
	t := &Tokenizer{
		encoding: encoding,
		library:  newCodec,
		fast:     newFastBPE(encoding),
		specials: make(map[string]uint32, len(base)+len(extra)),
		byID:     make(map[uint32]string, len(base)+len(extra)),
		firstOne: -1,
	}
	for s, id := range base {
		t.specials[s] = id
	}
	for s, id := range extra {
		if s == "" {
			return nil, fmt.Errorf("new tokenizer %q: special token with id %d has empty content", encoding, id)
		}
		if t.ordinary(id) {
			return nil, fmt.Errorf("new tokenizer %q: special token %q id %d collides with an ordinary token of the encoding", encoding, s, id)
		}
		t.specials[s] = id
	}
	lens := map[int]bool{}
	firsts := map[byte]bool{}
	for s, id := range t.specials {
		if prev, dup := t.byID[id]; dup && prev != s {
			return nil, fmt.Errorf("new tokenizer %q: special tokens %q and %q share id %d", encoding, prev, s, id)
		}
		t.byID[id] = s
		lens[len(s)] = true
		t.first[s[0]] = true
		firsts[s[0]] = true
		t.maxSpecial = max(t.maxSpecial, len(s))
	}
	for l := range lens {
		t.lengths = append(t.lengths, l)
	}
	slices.Sort(t.lengths)
	slices.Reverse(t.lengths)
	if len(firsts) == 1 {
		for b := range firsts {
			t.firstOne = int(b)
		}
	}
	if len(t.specials) <= maxFewSpecials {
		for s, id := range t.specials {
			f := fewSpecial{s: s, id: id}
			if len(s) >= 8 {
				f.head = binary.LittleEndian.Uint64([]byte(s[:8]))
			}
			t.few = append(t.few, f)
		}
		slices.SortFunc(t.few, func(a, b fewSpecial) int { return cmp.Compare(len(b.s), len(a.s)) })
	}
	if t.fast == nil {
		t.library() // built now rather than on the first request
	}
	return t, nil
}

// ordinary reports whether id is the rank of an ordinary token of the
// encoding.
func (t *Tokenizer) ordinary(id uint32) bool {
	if t.fast != nil {
		_, ok := vocabs[t.encoding]().token(id)
		return ok
	}
	_, err := t.library().Decode([]uint{uint(id)})
	return err == nil
}

// Name returns the encoding name, e.g. "cl100k_base".
func (t *Tokenizer) Name() string { return t.encoding }

// SpecialID returns the id of a special token, if the tokenizer has it.
func (t *Tokenizer) SpecialID(content string) (uint32, bool) {
	id, ok := t.specials[content]
	return id, ok
}

// Encode returns the token ids of text.
func (t *Tokenizer) Encode(text string) []uint32 {
	return t.AppendEncode(nil, text)
}

// AppendEncode appends the token ids of text to dst and returns the extended
// slice. For cl100k_base and o200k_base with enough capacity in dst it does
// not allocate (TestFastEncodeAllocs) unless text is not valid UTF-8; other
// encodings go through github.com/tiktoken-go/tokenizer, which allocates.
func (t *Tokenizer) AppendEncode(dst []uint32, text string) []uint32 {
	dst, _ = t.appendSegments(dst, text, nil, 0, 0)
	return dst
}

// appendSegments encodes text, splitting it at special tokens. For each
// special token it appends a restart point (offsets relative to text plus
// base, ids counted from the start of dst plus before) to restarts when
// restarts is non-nil.
func (t *Tokenizer) appendSegments(dst []uint32, text string, restarts *[]restart, base, before int) ([]uint32, *[]restart) {
	pos := 0
	for pos < len(text) {
		start, end, id, found := t.nextSpecial(text, pos)
		if !found {
			dst = t.appendBPE(dst, text[pos:])
			break
		}
		dst = t.appendBPE(dst, text[pos:start])
		dst = append(dst, id)
		if restarts != nil {
			*restarts = append(*restarts, restart{start: base + start, end: base + end, tokens: before + len(dst)})
		}
		pos = end
	}
	return dst, restarts
}

// nextSpecial finds the leftmost special token at or after from, the longest
// one when several match there.
func (t *Tokenizer) nextSpecial(text string, from int) (start, end int, id uint32, ok bool) {
	if len(t.specials) == 0 {
		return 0, 0, 0, false
	}
	for p := from; p < len(text); p++ {
		if t.firstOne >= 0 {
			i := strings.IndexByte(text[p:], byte(t.firstOne))
			if i < 0 {
				return 0, 0, 0, false
			}
			p += i
		} else if !t.first[text[p]] {
			continue
		}
		if t.few != nil {
			if id, l, ok := t.matchFew(text[p:]); ok {
				return p, p + l, id, true
			}
			continue
		}
		for _, l := range t.lengths {
			if p+l > len(text) {
				continue
			}
			if id, ok := t.specials[text[p:p+l]]; ok {
				return p, p + l, id, true
			}
		}
	}
	return 0, 0, 0, false
}

// matchFew returns the longest special in t.few that text starts with: what
// looking text's prefixes up in t.specials, longest first, finds
// (TestSpecialSplittingMatchesNaive).
func (t *Tokenizer) matchFew(text string) (id uint32, n int, ok bool) {
	var head uint64
	if len(text) >= 8 {
		head = binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(text), 8))
	}
	for i := range t.few {
		f := &t.few[i]
		if len(f.s) > len(text) || len(f.s) >= 8 && f.head != head {
			continue
		}
		if text[:len(f.s)] == f.s {
			return f.id, len(f.s), true
		}
	}
	return 0, 0, false
}

func (t *Tokenizer) appendBPE(dst []uint32, text string) []uint32 {
	if text == "" {
		return dst
	}
	if t.fast == nil {
		return t.appendLibrary(dst, text)
	}
	if !utf8.ValidString(text) {
		// What the library (and any regexp engine working on runes) does:
		// each byte that is not part of a valid sequence becomes U+FFFD
		// (TestInvalidUTF8MatchesLibrary).
		text = string([]rune(text))
	}
	return t.fast.appendEncode(dst, text)
}

// appendLibrary encodes with github.com/tiktoken-go/tokenizer itself: the
// reference the fast path is tested against, and the path for encodings it
// does not cover.
func (t *Tokenizer) appendLibrary(dst []uint32, text string) []uint32 {
	if text == "" {
		return dst
	}
	ids, _, err := t.library().Encode(text)
	if err != nil {
		// The codec fails only on a regexp timeout (none is set) or on
		// invalid UTF-8 in strict mode (not used): a broken invariant.
		panic(fmt.Sprintf("tokenize: %s encoder failed: %v", t.encoding, err))
	}
	dst = slices.Grow(dst, len(ids))
	for _, id := range ids {
		dst = append(dst, uint32(id))
	}
	return dst
}

// Decode returns the text of ids (special tokens as their content). An id the
// tokenizer does not know is an error.
func (t *Tokenizer) Decode(ids []uint32) (string, error) {
	var sb strings.Builder
	run := make([]uint, 0, len(ids))
	flush := func() error {
		if len(run) == 0 {
			return nil
		}
		s, err := t.decodeRun(run)
		if err != nil {
			return fmt.Errorf("decode tokens: %w", err)
		}
		sb.WriteString(s)
		run = run[:0]
		return nil
	}
	for _, id := range ids {
		if s, ok := t.byID[id]; ok {
			if err := flush(); err != nil {
				return "", err
			}
			sb.WriteString(s)
			continue
		}
		run = append(run, uint(id))
	}
	if err := flush(); err != nil {
		return "", err
	}
	return sb.String(), nil
}

// decodeRun returns the text of ids, none of them special.
func (t *Tokenizer) decodeRun(ids []uint) (string, error) {
	if t.fast == nil {
		return t.library().Decode(ids)
	}
	v := vocabs[t.encoding]()
	var sb strings.Builder
	for _, id := range ids {
		s, ok := v.token(uint32(id))
		if !ok {
			return "", fmt.Errorf("invalid token: %d", id)
		}
		sb.WriteString(s)
	}
	return sb.String(), nil
}
