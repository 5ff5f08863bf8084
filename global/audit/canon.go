package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"
)

// maxDepth matches encoding/json's nesting limit.
const maxDepth = 10000

// canonicalCost re-encodes a JSON object canonically: object keys sorted by
// their decoded bytes (the last of duplicate keys wins), no insignificant
// space, numbers as their literal text, strings as appendString writes
// them. Empty input is {}. It is idempotent. It parses the bytes directly;
// naiveCanonicalCost in the tests (decode to map[string]any, re-encode) is
// its reference.
func canonicalCost(raw json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return []byte("{}"), nil
	}
	if len(raw) > MaxCostBytes {
		return nil, fmt.Errorf("%d bytes, limit %d", len(raw), MaxCostBytes)
	}
	c := canonPool.Get().(*canonicaliser)
	defer canonPool.Put(c)
	c.in, c.pos = raw, 0
	c.skipSpace()
	if c.pos >= len(c.in) || c.in[c.pos] != '{' {
		return nil, c.topLevelError()
	}
	out, err := c.value(make([]byte, 0, len(raw)), 0)
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	c.skipSpace()
	if c.pos != len(c.in) {
		return nil, errors.New("trailing data after the JSON object")
	}
	return out, nil
}

type canonicaliser struct {
	in      []byte
	pos     int
	members [][]member // per depth, reused
	scratch [][]byte   // per depth, reused
}

// member is one object member canonicalised into the depth's scratch: its
// encoded key is scratch[m0:key1], the whole `"key":value` scratch[m0:m1];
// key is the decoded key (set once the object is parsed).
type member struct {
	m0, key1, m1 int
	key          []byte
}

var canonPool = sync.Pool{New: func() any { return &canonicaliser{} }}

var errSyntax = errors.New("invalid JSON")

func (c *canonicaliser) syntax(what string) error {
	return fmt.Errorf("%w: %s at offset %d", errSyntax, what, c.pos)
}

func (c *canonicaliser) topLevelError() error {
	var v any
	if err := json.Unmarshal(c.in, &v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return fmt.Errorf("must be a JSON object, got %s", jsonType(v))
}

func (c *canonicaliser) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicaliser) value(dst []byte, depth int) ([]byte, error) {
	c.skipSpace()
	if c.pos >= len(c.in) {
		return nil, c.syntax("unexpected end")
	}
	switch b := c.in[c.pos]; {
	case (b == '{' || b == '[') && depth >= maxDepth:
		return nil, c.syntax("nested too deeply")
	case b == '{':
		return c.object(dst, depth)
	case b == '[':
		c.pos++
		dst = append(dst, '[')
		c.skipSpace()
		if c.pos < len(c.in) && c.in[c.pos] == ']' {
			c.pos++
			return append(dst, ']'), nil
		}
		for {
			var err error
			if dst, err = c.value(dst, depth+1); err != nil {
				return nil, err
			}
			c.skipSpace()
			if c.pos >= len(c.in) {
				return nil, c.syntax("unterminated array")
			}
			if c.in[c.pos] == ']' {
				c.pos++
				return append(dst, ']'), nil
			}
			if c.in[c.pos] != ',' {
				return nil, c.syntax("expected , or ]")
			}
			c.pos++
			dst = append(dst, ',')
		}
	case b == '"':
		return c.str(dst)
	case b == '-' || b >= '0' && b <= '9':
		return c.number(dst)
	case b == 't':
		return c.literal(dst, "true")
	case b == 'f':
		return c.literal(dst, "false")
	case b == 'n':
		return c.literal(dst, "null")
	}
	return nil, c.syntax("unexpected character")
}

func (c *canonicaliser) object(dst []byte, depth int) ([]byte, error) {
	c.pos++ // '{'
	for len(c.members) <= depth {
		c.members = append(c.members, nil)
		c.scratch = append(c.scratch, nil)
	}
	ms, sc := c.members[depth][:0], c.scratch[depth][:0]
	defer func() { c.members[depth], c.scratch[depth] = ms[:0], sc[:0] }()
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		return append(dst, '{', '}'), nil
	}
	for {
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return nil, c.syntax("expected a member name")
		}
		var m member
		var err error
		m.m0 = len(sc)
		if sc, err = c.str(sc); err != nil {
			return nil, err
		}
		m.key1 = len(sc)
		sc = append(sc, ':')
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return nil, c.syntax("expected :")
		}
		c.pos++
		if sc, err = c.value(sc, depth+1); err != nil {
			return nil, err
		}
		m.m1 = len(sc)
		ms = append(ms, m)
		c.skipSpace()
		if c.pos >= len(c.in) {
			return nil, c.syntax("unterminated object")
		}
		if c.in[c.pos] == '}' {
			c.pos++
			break
		}
		if c.in[c.pos] != ',' {
			return nil, c.syntax("expected , or }")
		}
		c.pos++
	}
	// Sort by decoded key (the canonical encoding of a key has an escape
	// only for '"', '\\' and control characters; decode those back).
	for i := range ms {
		ms[i].key = decodeCanonicalString(sc[ms[i].m0:ms[i].key1])
	}
	slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) })
	dst = append(dst, '{')
	first := true
	for i, m := range ms {
		if i+1 < len(ms) && bytes.Equal(ms[i+1].key, m.key) {
			continue // a later duplicate wins
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, sc[m.m0:m.m1]...)
	}
	return append(dst, '}'), nil
}

// str copies a JSON string canonically. A string without escapes and with
// valid UTF-8 is copied as it is; others are decoded by encoding/json (which
// replaces invalid UTF-8 and lone surrogates with U+FFFD) and re-encoded.
func (c *canonicaliser) str(dst []byte) ([]byte, error) {
	start := c.pos
	c.pos++
	simple := true
	for {
		if c.pos >= len(c.in) {
			return nil, c.syntax("unterminated string")
		}
		b := c.in[c.pos]
		switch {
		case b == '"':
			c.pos++
			raw := c.in[start:c.pos]
			if simple && utf8.Valid(raw) {
				return append(dst, raw...), nil
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			return appendString(dst, s), nil
		case b == '\\':
			simple = false
			c.pos += 2
		case b < 0x20:
			return nil, c.syntax("control character in string")
		default:
			c.pos++
		}
	}
}

// decodeCanonicalString decodes a string as appendString wrote it; without
// escapes it is the bytes between the quotes.
func decodeCanonicalString(enc []byte) []byte {
	if bytes.IndexByte(enc, '\\') < 0 {
		return enc[1 : len(enc)-1]
	}
	var s string
	_ = json.Unmarshal(enc, &s)
	return []byte(s)
}

// number copies a JSON number literal after checking its grammar.
func (c *canonicaliser) number(dst []byte) ([]byte, error) {
	start := c.pos
	in := c.in
	p := c.pos
	if p < len(in) && in[p] == '-' {
		p++
	}
	switch {
	case p < len(in) && in[p] == '0':
		p++
	case p < len(in) && in[p] >= '1' && in[p] <= '9':
		p = digits(in, p)
	default:
		c.pos = p
		return nil, c.syntax("bad number")
	}
	if p < len(in) && in[p] == '.' {
		d := p + 1
		if p = digits(in, d); p == d {
			c.pos = p
			return nil, c.syntax("bad number fraction")
		}
	}
	if p < len(in) && (in[p] == 'e' || in[p] == 'E') {
		p++
		if p < len(in) && (in[p] == '+' || in[p] == '-') {
			p++
		}
		d := p
		if p = digits(in, d); p == d {
			c.pos = p
			return nil, c.syntax("bad number exponent")
		}
	}
	c.pos = p
	return append(dst, in[start:p]...), nil
}

// digits returns the end of the run of decimal digits at p.
func digits(in []byte, p int) int {
	for p < len(in) && in[p] >= '0' && in[p] <= '9' {
		p++
	}
	return p
}

func (c *canonicaliser) literal(dst []byte, lit string) ([]byte, error) {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
		return nil, c.syntax("bad literal")
	}
	c.pos += len(lit)
	return append(dst, lit...), nil
}
