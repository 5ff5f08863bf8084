package tokenize

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// ErrInvalidJSON is wrapped by ParseBody's errors for a body that is not
// valid JSON, or whose fields have the wrong types.
var ErrInvalidJSON = errors.New("invalid JSON")

// Body is the part of an OpenAI-compatible request body that routing reads:
// the model, whether the answer streams, and the fields that decide the
// prompt. ParseBody decodes it; json.Unmarshal decodes it the same way,
// several times slower.
type Body struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
	Request
}

// maxJSONDepth is encoding/json's nesting limit, which ParseBody shares.
const maxJSONDepth = 10000

// ParseBody decodes raw into b, which it first zeroes, exactly as
// json.Unmarshal(raw, b) decodes into a zero Body: it fails on the same
// bodies (wrapping ErrInvalidJSON, or ErrInvalidPrompt for a message
// json.Unmarshal would refuse through Message.UnmarshalJSON) and otherwise
// sets the same fields to the same values. FuzzParseBody holds it to that.
//
// It is one pass over raw: the fields routing does not read are checked
// for syntax and skipped, and each string routing reads is decoded once
// (json.Unmarshal validates the whole body first, then each message again
// and its content again, through reflection). The body itself is left as
// it is, to be forwarded untouched.
func ParseBody(raw []byte, b *Body) error {
	return parseBody(raw, b, false)
}

// ParseBodyShared is ParseBody, but the contents of messages that need no
// decoding (no escapes: the common case, and most of a chat body's bytes)
// share raw's memory instead of being copied. raw must not change while b
// is in use; the contents keep raw from being collected while they are
// referenced. The other strings (model, roles, names) are copies, so a
// value kept from b does not hold raw.
//
// It also reuses the array of b's Messages, if b has one, for the
// messages it reads: nothing read of an earlier parse into b may be used
// after (the server's pooled parsed request parses into one Body again
// and again).
func ParseBodyShared(raw []byte, b *Body) error {
	msgs := b.Messages[:0]
	clear(msgs[:cap(msgs)]) // no earlier message's strings held
	*b = Body{}
	return parseInto(raw, b, bodyParser{data: raw, share: true, msgs: msgs})
}

func parseBody(raw []byte, b *Body, share bool) error {
	*b = Body{}
	return parseInto(raw, b, bodyParser{data: raw, share: share})
}

// parseInto parses raw into b, zeroed, with p.
func parseInto(raw []byte, b *Body, p bodyParser) error {
	p.ws()
	if p.i >= len(p.data) {
		return p.fail("unexpected end of input")
	}
	switch p.data[p.i] {
	case '{':
		if err := p.body(b); err != nil {
			return err
		}
	case 'n':
		if err := p.literal("null"); err != nil {
			return err
		}
	default:
		return p.fail("want an object")
	}
	p.ws()
	if p.i < len(p.data) {
		return p.fail("data after the top-level value")
	}
	return nil
}

// bodyParser is a position in a JSON document and the depth of nesting
// there; its errors name the offset.
type bodyParser struct {
	data  []byte
	i     int
	depth int
	key   []byte // scratch for keys with escapes
	// share: message contents without escapes are strings over data
	// (ParseBodyShared).
	share bool
	// msgs, when not nil, is the array the messages are read into
	// (ParseBodyShared), empty.
	msgs []Message
}

func (p *bodyParser) fail(format string, args ...any) error {
	return fmt.Errorf("%w: offset %d: %s", ErrInvalidJSON, p.i, fmt.Sprintf(format, args...))
}

func (p *bodyParser) ws() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *bodyParser) peek() byte {
	if p.i < len(p.data) {
		return p.data[p.i]
	}
	return 0
}

// enter consumes open ('{' or '[') and the whitespace after it; when the
// container is empty it consumes its close too and reports true.
func (p *bodyParser) enter(open, close byte) (empty bool, err error) {
	if p.peek() != open {
		return false, p.fail("want %q", open)
	}
	p.depth++
	if p.depth > maxJSONDepth {
		return false, p.fail("nested more than %d deep", maxJSONDepth)
	}
	p.i++
	p.ws()
	if p.peek() == close {
		p.i++
		p.depth--
		return true, nil
	}
	return false, nil
}

// more follows a member or element: it consumes a comma (reporting true,
// another follows) or close (false, the container ended).
func (p *bodyParser) more(close byte) (bool, error) {
	p.ws()
	switch p.peek() {
	case ',':
		p.i++
		p.ws()
		return true, nil
	case close:
		p.i++
		p.depth--
		return false, nil
	}
	return false, p.fail("want ',' or %q", close)
}

// member reads an object member's key and the colon after it, leaving p at
// the value. The key is valid until the next call.
func (p *bodyParser) member() ([]byte, error) {
	s, plain, valid, err := p.str()
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.peek() != ':' {
		return nil, p.fail("want ':'")
	}
	p.i++
	p.ws()
	if plain {
		return s, nil
	}
	p.key = appendUnquoted(p.key[:0], s, valid)
	return p.key, nil
}

// str scans a string, checking it as JSON, and returns its contents
// between the quotes: plain, they hold no escape and are valid UTF-8 (so
// they are the string's value as they are); valid, they are valid UTF-8.
func (p *bodyParser) str() (s []byte, plain, valid bool, err error) {
	if p.peek() != '"' {
		return nil, false, false, p.fail("want a string")
	}
	start := p.i + 1
	ascii, escaped := true, false
	i := start
	for {
		// Thirty-two bytes at a time while none of them needs a look
		// (a word's flags are all zero exactly when none of its bytes
		// needs one), then eight at a time to find the one that does.
		for i+32 <= len(p.data) {
			d := p.data[i : i+32]
			if plainASCII(binary.LittleEndian.Uint64(d))|plainASCII(binary.LittleEndian.Uint64(d[8:]))|
				plainASCII(binary.LittleEndian.Uint64(d[16:]))|plainASCII(binary.LittleEndian.Uint64(d[24:])) != 0 {
				break
			}
			i += 32
		}
		for i+8 <= len(p.data) {
			special := plainASCII(binary.LittleEndian.Uint64(p.data[i:]))
			if special != 0 {
				i += bits.TrailingZeros64(special) / 8
				break
			}
			i += 8
		}
		if i >= len(p.data) {
			break
		}
		c := p.data[i]
		switch {
		case c == '"':
			p.i = i + 1
			s = p.data[start:i]
			valid = ascii || utf8.Valid(s)
			return s, !escaped && valid, valid, nil
		case c == '\\':
			escaped = true
			if i+1 >= len(p.data) {
				i = len(p.data)
				continue
			}
			switch p.data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+5 >= len(p.data) {
					i = len(p.data)
					continue
				}
				for _, h := range p.data[i+2 : i+6] {
					if !isHex(h) {
						p.i = i
						return nil, false, false, p.fail("bad \\u escape")
					}
				}
				i += 6
			default:
				p.i = i
				return nil, false, false, p.fail("bad escape \\%c", p.data[i+1])
			}
		case c < ' ':
			p.i = i
			return nil, false, false, p.fail("control character %#x in a string", c)
		default: // c >= utf8.RuneSelf
			ascii = false
			i++
		}
	}
	p.i = len(p.data)
	return nil, false, false, p.fail("unexpected end of input in a string")
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plainASCII flags, in the high bit of each byte of x, the bytes a string
// scan must look at: '"', '\\', control characters and non-ASCII. Only
// the lowest flag is exact (a borrow may flag a byte above it too), which
// is all the scan uses; a word with no such byte has no flag at all.
func plainASCII(x uint64) uint64 {
	zero := func(v uint64) uint64 { return (v - ones) &^ v & highs }
	return zero(x^(ones*'"')) | zero(x^(ones*'\\')) | (x-ones*' ')&^x&highs | x&highs
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// stringValue reads a string value (decoded), or null (ok false).
func (p *bodyParser) stringValue(what string) (v string, ok bool, err error) {
	switch p.peek() {
	case '"':
		s, plain, valid, err := p.str()
		if err != nil {
			return "", false, err
		}
		if plain {
			return string(s), true, nil
		}
		// Decoding only shortens: one allocation, and no copy after it.
		buf := appendUnquoted(make([]byte, 0, len(s)), s, valid)
		return unsafe.String(unsafe.SliceData(buf), len(buf)), true, nil
	case 'n':
		return "", false, p.literal("null")
	}
	if err := p.skip(); err != nil {
		return "", false, err
	}
	return "", false, p.fail("%s: want a string", what)
}

// boolValue reads true, false or null (ok false).
func (p *bodyParser) boolValue(what string) (v, ok bool, err error) {
	switch p.peek() {
	case 't':
		return true, true, p.literal("true")
	case 'f':
		return false, true, p.literal("false")
	case 'n':
		return false, false, p.literal("null")
	}
	if err := p.skip(); err != nil {
		return false, false, err
	}
	return false, false, p.fail("%s: want true or false", what)
}

func (p *bodyParser) literal(lit string) error {
	if !bytes.HasPrefix(p.data[p.i:], []byte(lit)) {
		return p.fail("want %s", lit)
	}
	p.i += len(lit)
	return nil
}

// skip checks and passes over one value of any kind.
func (p *bodyParser) skip() error {
	switch c := p.peek(); {
	case c == '"':
		_, _, _, err := p.str()
		return err
	case c == '{':
		empty, err := p.enter('{', '}')
		for more := !empty; more && err == nil; {
			if _, err = p.member(); err == nil {
				if err = p.skip(); err == nil {
					more, err = p.more('}')
				}
			}
		}
		return err
	case c == '[':
		empty, err := p.enter('[', ']')
		for more := !empty; more && err == nil; {
			if err = p.skip(); err == nil {
				more, err = p.more(']')
			}
		}
		return err
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		_, err := p.number()
		return err
	case p.i >= len(p.data):
		return p.fail("unexpected end of input")
	}
	return p.fail("unexpected character %q", p.data[p.i])
}

// number scans a number as JSON writes them and returns its text.
func (p *bodyParser) number() ([]byte, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.data) && '0' <= p.data[p.i] && p.data[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.peek() == '-' {
		p.i++
	}
	switch c := p.peek(); {
	case c == '0':
		p.i++
	case '1' <= c && c <= '9':
		digits()
	default:
		return nil, p.fail("bad number")
	}
	if p.peek() == '.' {
		p.i++
		if digits() == 0 {
			return nil, p.fail("bad number")
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		p.i++
		if c := p.peek(); c == '+' || c == '-' {
			p.i++
		}
		if digits() == 0 {
			return nil, p.fail("bad number")
		}
	}
	return p.data[start:p.i], nil
}

// body reads the top-level object into b. Keys match fields as
// encoding/json matches them: exactly, or else case-insensitively (with
// Unicode's simple folding); the last of repeated keys wins.
func (p *bodyParser) body(b *Body) error {
	empty, err := p.enter('{', '}')
	for more := !empty; more && err == nil; {
		var key []byte
		if key, err = p.member(); err != nil {
			break
		}
		switch {
		case fieldIs(key, "model"):
			var v string
			var ok bool
			if v, ok, err = p.stringValue("model"); ok {
				b.Model = v
			}
		case fieldIs(key, "stream"):
			var v, ok bool
			if v, ok, err = p.boolValue("stream"); ok {
				b.Stream = v
			}
		case fieldIs(key, "messages"):
			b.Messages, err = p.messages()
		case fieldIs(key, "cache_salt"):
			var v string
			var ok bool
			if v, ok, err = p.stringValue("cache_salt"); ok {
				b.CacheSalt = v
			}
		case fieldIs(key, "prompt"):
			start := p.i
			if err = p.skip(); err == nil {
				b.Prompt = bytes.Clone(p.data[start:p.i])
			}
		case fieldIs(key, "prompt_token_ids"):
			b.PromptTokenIDs, err = p.tokenIDs()
		case fieldIs(key, "add_generation_prompt"):
			var v, ok bool
			if v, ok, err = p.boolValue("add_generation_prompt"); ok {
				b.AddGenerationPrompt = &v
			} else if err == nil {
				b.AddGenerationPrompt = nil
			}
		default:
			err = p.skip()
		}
		if err == nil {
			more, err = p.more('}')
		}
	}
	return err
}

// fieldIs reports whether key names the field of JSON name name, as
// encoding/json decides it.
func fieldIs(key []byte, name string) bool {
	// A rune folding to an ASCII letter is never shorter than it.
	return len(key) >= len(name) && (string(key) == name || bytes.EqualFold(key, []byte(name)))
}

// messages reads the messages array (or null: none).
func (p *bodyParser) messages() ([]Message, error) {
	if p.peek() == 'n' {
		return nil, p.literal("null")
	}
	if p.peek() != '[' {
		if err := p.skip(); err != nil {
			return nil, err
		}
		return nil, p.fail("messages: want a list")
	}
	empty, err := p.enter('[', ']')
	if err != nil || empty {
		if p.msgs != nil {
			return p.msgs[:0], err
		}
		return []Message{}, err
	}
	msgs := p.msgs[:0]
	if msgs == nil {
		msgs = make([]Message, 0, 4)
	}
	for more := true; more; {
		var m Message
		if err := p.message(&m); err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
		if more, err = p.more(']'); err != nil {
			return nil, err
		}
	}
	return msgs, nil
}

// message reads one message as Message.UnmarshalJSON decodes it.
func (p *bodyParser) message(m *Message) error {
	switch p.peek() {
	case '{':
	case 'n': // decodes as a message with no role
		if err := p.literal("null"); err != nil {
			return err
		}
		return fmt.Errorf("%w: message: role missing", ErrInvalidPrompt)
	default:
		if err := p.skip(); err != nil {
			return err
		}
		return fmt.Errorf("%w: message: want an object", ErrInvalidPrompt)
	}
	// content may come several times: the last one counts, and what is
	// wrong with an earlier one (other than its syntax) does not.
	var contentErr error
	empty, err := p.enter('{', '}')
	for more := !empty; more && err == nil; {
		var key []byte
		if key, err = p.member(); err != nil {
			break
		}
		switch {
		case fieldIs(key, "role"):
			if r, ok := p.commonRole(); ok {
				m.Role = r
				break
			}
			var v string
			var ok bool
			if v, ok, err = p.stringValue("message role"); ok {
				m.Role = v
			}
		case fieldIs(key, "name"):
			var v string
			var ok bool
			if v, ok, err = p.stringValue("message name"); ok {
				m.Name = v
			}
		case fieldIs(key, "content"):
			m.Content, contentErr, err = p.content()
		default:
			err = p.skip()
		}
		if err == nil {
			more, err = p.more('}')
		}
	}
	if err != nil {
		return err
	}
	if m.Role == "" {
		return fmt.Errorf("%w: message: role missing", ErrInvalidPrompt)
	}
	return contentErr
}

// commonRoles are the roles nearly every message has: reading one of them
// costs no allocation.
var commonRoles = [...]string{"system", "user", "assistant", "tool", "developer"}

// commonRole reads a role written plainly as one of commonRoles, or
// leaves p where it was.
func (p *bodyParser) commonRole() (string, bool) {
	for _, r := range commonRoles {
		end := p.i + 1 + len(r) + 1
		if end <= len(p.data) && p.data[p.i] == '"' && p.data[end-1] == '"' && string(p.data[p.i+1:end-1]) == r {
			p.i = end
			return r, true
		}
	}
	return "", false
}

// content reads a message's content: a string, null (""), or a list of
// text parts joined by "\n". err is a syntax error; bad is what
// Message.UnmarshalJSON would refuse in a syntactically valid value.
func (p *bodyParser) content() (s string, bad, err error) {
	switch p.peek() {
	case '"':
		if p.share {
			b, plain, _, err := p.str()
			if err == nil && plain {
				if len(b) == 0 {
					return "", nil, nil
				}
				return unsafe.String(&b[0], len(b)), nil, nil
			}
			if err != nil {
				return "", nil, err
			}
			p.i -= len(b) + 2 // back to the opening quote: decode it
		}
		s, _, err := p.stringValue("")
		return s, nil, err
	case 'n':
		return "", nil, p.literal("null")
	case '[':
	default:
		if err := p.skip(); err != nil {
			return "", nil, err
		}
		return "", fmt.Errorf("%w: message content: want a string or a list of parts", ErrInvalidPrompt), nil
	}
	empty, err := p.enter('[', ']')
	if err != nil || empty {
		return "", nil, err
	}
	var sb strings.Builder
	for i, more := 0, true; more; i++ {
		text, typ, hasText, partBad, err := p.part()
		if err != nil {
			return "", nil, err
		}
		if bad == nil {
			switch {
			case partBad:
				bad = fmt.Errorf("%w: message content: want a string or a list of parts", ErrInvalidPrompt)
			case typ != "text" || !hasText:
				bad = fmt.Errorf("%w: message content part %d: type %q is not supported (only text)", ErrInvalidPrompt, i, typ)
			default:
				if i > 0 {
					sb.WriteByte('\n')
				}
				sb.WriteString(text)
			}
		}
		if more, err = p.more(']'); err != nil {
			return "", nil, err
		}
	}
	if bad != nil {
		return "", bad, nil
	}
	return sb.String(), nil, nil
}

// part reads one content part, as encoding/json decodes it into
// struct{Type string; Text *string}: hasText is whether Text would be set;
// bad, that the part is not an object (or null) with a string (or null)
// type and text.
func (p *bodyParser) part() (text, typ string, hasText, bad bool, err error) {
	switch p.peek() {
	case 'n':
		return "", "", false, false, p.literal("null") // a zero part
	case '{':
	default:
		return "", "", false, true, p.skip()
	}
	empty, err := p.enter('{', '}')
	for more := !empty; more && err == nil; {
		var key []byte
		if key, err = p.member(); err != nil {
			break
		}
		switch {
		case fieldIs(key, "type"):
			switch p.peek() {
			case '"', 'n':
				var v string
				var set bool
				if v, set, err = p.stringValue(""); set {
					typ = v
				}
			default:
				bad = true
				err = p.skip()
			}
		case fieldIs(key, "text"):
			switch p.peek() {
			case '"':
				text, _, err = p.stringValue("")
				hasText = true
			case 'n':
				err = p.literal("null")
				text, hasText = "", false
			default:
				bad = true
				err = p.skip()
			}
		default:
			err = p.skip()
		}
		if err == nil {
			more, err = p.more('}')
		}
	}
	return text, typ, hasText, bad, err
}

// tokenIDs reads prompt_token_ids: a list of integers that fit in 32 bits
// unsigned (null elements, as encoding/json has it, leave 0), or null.
func (p *bodyParser) tokenIDs() ([]uint32, error) {
	if p.peek() == 'n' {
		return nil, p.literal("null")
	}
	if p.peek() != '[' {
		if err := p.skip(); err != nil {
			return nil, err
		}
		return nil, p.fail("prompt_token_ids: want a list")
	}
	empty, err := p.enter('[', ']')
	if err != nil || empty {
		return []uint32{}, err
	}
	var ids []uint32
	for more := true; more; {
		var id uint32
		switch c := p.peek(); {
		case c == 'n':
			if err := p.literal("null"); err != nil {
				return nil, err
			}
		case c == '-' || '0' <= c && c <= '9':
			num, err := p.number()
			if err != nil {
				return nil, err
			}
			v, perr := strconv.ParseUint(string(num), 10, 32)
			if perr != nil {
				return nil, p.fail("prompt_token_ids: %s is not a token id", num)
			}
			id = uint32(v)
		default:
			if err := p.skip(); err != nil {
				return nil, err
			}
			return nil, p.fail("prompt_token_ids: want numbers")
		}
		ids = append(ids, id)
		if more, err = p.more(']'); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// appendUnquoted appends the value of the contents s of a JSON string
// (checked by str; valid: s is valid UTF-8) to dst, as encoding/json
// decodes it: escapes resolved, a \u escape of half a surrogate pair, and
// bytes that are not UTF-8, each replaced by U+FFFD.
func appendUnquoted(dst, s []byte, valid bool) []byte {
	for r := 0; r < len(s); {
		if valid {
			// Only escapes change anything: copy up to the next one.
			n := bytes.IndexByte(s[r:], '\\')
			if n < 0 {
				return append(dst, s[r:]...)
			}
			dst = append(dst, s[r:r+n]...)
			r += n
		}
		c := s[r]
		switch {
		case c == '\\':
			switch e := s[r+1]; e {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := hex4(s[r+2:])
				r += 6
				if utf16.IsSurrogate(rr) {
					if r+6 <= len(s) && s[r] == '\\' && s[r+1] == 'u' {
						if dec := utf16.DecodeRune(rr, hex4(s[r+2:])); dec != unicode.ReplacementChar {
							dst = utf8.AppendRune(dst, dec)
							r += 6
							continue
						}
					}
					rr = unicode.ReplacementChar
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, e)
			}
			r += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			dst = utf8.AppendRune(dst, rr)
			r += size
		}
	}
	return dst
}

// hex4 is the value of the 4 hex digits at the start of s (checked by str).
func hex4(s []byte) rune {
	var r rune
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
