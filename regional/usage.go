package regional

import (
	"bytes"
	"encoding/json"
)

// usage is the part of an OpenAI usage object the router checks.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// usageSniffer finds the usage object in a response as it passes: the last
// SSE data chunk carrying "usage", or the whole JSON body (bounded).
type usageSniffer struct {
	sse     bool
	line    []byte
	body    []byte
	found   *usage
	tooLong bool
}

const maxSniff = 4 << 20

func newUsageSniffer(sse bool) *usageSniffer { return &usageSniffer{sse: sse} }

func (u *usageSniffer) write(b []byte) {
	if !u.sse {
		if len(u.body)+len(b) > maxSniff {
			u.tooLong = true
			return
		}
		u.body = append(u.body, b...)
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(u.line)+len(b) <= maxSniff {
				u.line = append(u.line, b...)
			}
			return
		}
		line := b[:i]
		if len(u.line) > 0 {
			u.line = append(u.line, line...)
			line = u.line
		}
		u.sseLine(line)
		u.line = u.line[:0]
		b = b[i+1:]
	}
}

// keep is write for a whole (non-streamed) answer that is all of b, which
// the caller does not change afterwards: it is kept, not copied.
func (u *usageSniffer) keep(b []byte) {
	if u.sse || len(u.body) > 0 {
		u.write(b)
		return
	}
	if len(b) > maxSniff {
		u.tooLong = true
		return
	}
	u.body = b[:len(b):len(b)]
}

func (u *usageSniffer) sseLine(line []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	if found := decodeUsage(bytes.TrimSpace(data)); found != nil {
		u.found = found
	}
}

func (u *usageSniffer) result() *usage {
	if u.sse || u.tooLong {
		return u.found
	}
	return decodeUsage(u.body)
}

// decodeUsage returns the usage object of the JSON text b: what
// json.Unmarshal(b, &v) leaves in v.Usage, v a struct{ Usage *usage
// `json:"usage"` }, when it returns no error, else nil (naiveUsage in the
// tests, which compare the two).
//
// Answers are mostly choices, so only the usage values are decoded with
// encoding/json: scanUsage checks the syntax of the whole text as
// json.Unmarshal does and finds the values of the top-level keys that
// encoding/json would decode into Usage (it matches names without regard
// to case). They are decoded in turn into one pointer, as Unmarshal does
// for repeated keys; a type error in any of them fails the whole, as it
// does in Unmarshal. What the scanner is not sure of (a key with escapes,
// deep nesting, many usage keys) is decoded as before.
func decodeUsage(b []byte) *usage {
	var buf [maxUsageSpans]span
	spans, verdict := scanUsage(b, buf[:0])
	switch verdict {
	case scanInvalid, scanNone:
		return nil
	case scanUnsure:
		var body struct {
			Usage *usage `json:"usage"`
		}
		if json.Unmarshal(b, &body) == nil {
			return body.Usage
		}
		return nil
	}
	var u *usage
	for _, sp := range spans {
		if usageInto(b[sp.start:sp.end], &u) {
			continue
		}
		if json.Unmarshal(b[sp.start:sp.end], &u) != nil {
			return nil
		}
	}
	return u
}

// usageInto is json.Unmarshal(v, u) for the usage values engines send (v
// is valid JSON, scanUsage checked it): null, or an object whose keys
// have no escapes and no bytes past ASCII, whose prompt_tokens and
// cached_tokens are integers or null and prompt_tokens_details an object
// or null, and whose other values nest at most a few levels. For those it
// decodes v into *u as Unmarshal does, without reflection, and reports
// true; for anything else it changes nothing and reports false (Unmarshal
// then decides). decodeUsage's tests hold the two to the same answers.
func usageInto(v []byte, u **usage) bool {
	if string(v) == "null" {
		*u = nil
		return true
	}
	// Decoded into a copy first: an object that turns out to need
	// Unmarshal leaves *u as it was.
	var next usage
	var details struct{ CachedTokens int }
	hadDetails := false
	if *u != nil {
		next = **u
		if next.PromptTokensDetails != nil {
			details.CachedTokens, hadDetails = next.PromptTokensDetails.CachedTokens, true
		}
	}
	ok := objectMembers(v, 0, func(key []byte, val []byte) bool {
		switch {
		case asciiFold(key, "prompt_tokens"):
			return intValue(val, &next.PromptTokens)
		case asciiFold(key, "prompt_tokens_details"):
			if string(val) == "null" {
				hadDetails = false
				details.CachedTokens = 0
				return true
			}
			if !hadDetails {
				hadDetails, details.CachedTokens = true, 0
			}
			return objectMembers(val, 1, func(key []byte, val []byte) bool {
				if asciiFold(key, "cached_tokens") {
					return intValue(val, &details.CachedTokens)
				}
				return true
			})
		}
		return true
	})
	if !ok {
		return false
	}
	if *u == nil {
		*u = new(usage)
	}
	(*u).PromptTokens = next.PromptTokens
	switch {
	case !hadDetails:
		(*u).PromptTokensDetails = nil
	case (*u).PromptTokensDetails == nil:
		(*u).PromptTokensDetails = &struct {
			CachedTokens int `json:"cached_tokens"`
		}{details.CachedTokens}
	default:
		(*u).PromptTokensDetails.CachedTokens = details.CachedTokens
	}
	return true
}

// objectMembers calls member with each key (without its quotes) and value
// of the JSON object v, in order, while it returns true, and reports
// whether v was an object it could read so (keys without escapes or
// non-ASCII bytes, values nested at most maxUsageNesting levels below v).
// v is valid JSON.
func objectMembers(v []byte, depth int, member func(key, val []byte) bool) bool {
	if depth > maxUsageNesting || len(v) == 0 || v[0] != '{' {
		return false
	}
	i := skipSpace(v, 1)
	if i < len(v) && v[i] == '}' {
		return true
	}
	for i < len(v) {
		if v[i] != '"' {
			return false
		}
		end, escaped, ok := scanString(v, i)
		if !ok || escaped {
			return false
		}
		key := v[i+1 : end-1]
		for _, c := range key {
			if c >= 0x80 {
				return false
			}
		}
		i = skipSpace(v, end)
		if i >= len(v) || v[i] != ':' {
			return false
		}
		i = skipSpace(v, i+1)
		vend, ok := skipValue(v, i, depth+1)
		if !ok || !member(key, v[i:vend]) {
			return false
		}
		i = skipSpace(v, vend)
		if i >= len(v) {
			return false
		}
		switch v[i] {
		case ',':
			i = skipSpace(v, i+1)
		case '}':
			return true
		default:
			return false
		}
	}
	return false
}

// maxUsageNesting bounds how deep usageInto follows a usage object.
const maxUsageNesting = 4

// skipValue returns the index after the JSON value at v[i].
func skipValue(v []byte, i, depth int) (int, bool) {
	if i >= len(v) {
		return 0, false
	}
	switch c := v[i]; {
	case c == '"':
		end, _, ok := scanString(v, i)
		return end, ok
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(v, i)
	case c == 't':
		return scanLiteral(v, i, "true")
	case c == 'f':
		return scanLiteral(v, i, "false")
	case c == 'n':
		return scanLiteral(v, i, "null")
	case c == '{' || c == '[':
		if depth > maxUsageNesting {
			return 0, false
		}
		i = skipSpace(v, i+1)
		if i < len(v) && v[i] == c+2 {
			return i + 1, true
		}
		for i < len(v) {
			if c == '{' {
				end, _, ok := scanString(v, i)
				if !ok {
					return 0, false
				}
				i = skipSpace(v, end)
				if i >= len(v) || v[i] != ':' {
					return 0, false
				}
				i = skipSpace(v, i+1)
			}
			end, ok := skipValue(v, i, depth+1)
			if !ok {
				return 0, false
			}
			i = skipSpace(v, end)
			if i >= len(v) {
				return 0, false
			}
			switch v[i] {
			case ',':
				i = skipSpace(v, i+1)
			case c + 2:
				return i + 1, true
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

// intValue sets *dst to the JSON integer val, leaves it for null, and
// reports false for anything else (a fraction, an exponent, a number out
// of int's range, another type: Unmarshal's errors).
func intValue(val []byte, dst *int) bool {
	if string(val) == "null" {
		return true
	}
	if len(val) == 0 {
		return false
	}
	neg := val[0] == '-'
	digits := val
	if neg {
		digits = val[1:]
	}
	if len(digits) == 0 || len(digits) > 18 { // 18 digits cannot overflow
		return false
	}
	n := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	*dst = n
	return true
}

// asciiFold reports whether the ASCII key equals name (lower case) under
// ASCII case folding, as encoding/json matches an ASCII key.
func asciiFold(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := range key {
		c := key[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

// span is a value's bytes, b[start:end].
type span struct{ start, end int }

// scanVerdict is what scanUsage found.
type scanVerdict int

const (
	scanInvalid scanVerdict = iota // not JSON: Unmarshal fails
	scanNone                       // JSON without a top-level usage key
	scanFound                      // JSON with top-level usage values at the spans
	scanUnsure                     // only encoding/json can tell
)

// maxScanDepth is the deepest nesting scanUsage follows (one bit of a
// uint64 per level: set for an object); deeper text is left to
// encoding/json, which allows 10,000 levels.
const maxScanDepth = 64

// maxUsageSpans is how many usage keys scanUsage records before it leaves
// the text to encoding/json.
const maxUsageSpans = 4

// scanUsage checks that b is one JSON value, with JSON's grammar (RFC
// 8259, strings' bytes taken as they come, as encoding/json does), and
// appends to spans the values of the keys of the top-level object whose
// names equal "usage" under Unicode case folding, as encoding/json matches
// them.
func scanUsage(b []byte, spans []span) ([]span, scanVerdict) {
	const (
		wantValue = iota
		wantKey   // in an object, after '{' or ','
		ended     // a value ended at i
	)
	var objs uint64 // bit d set: level d+1 is an object
	depth := 0
	usageAt := -1 // the start of the top-level usage value being read
	state := wantValue
	i := skipSpace(b, 0)
	for {
		switch state {
		case wantValue:
			if i >= len(b) {
				return spans, scanInvalid
			}
			var ok bool
			switch c := b[i]; {
			case c == '{' || c == '[':
				if depth == maxScanDepth {
					return spans, scanUnsure
				}
				objs &^= 1 << depth
				if c == '{' {
					objs |= 1 << depth
				}
				depth++
				i = skipSpace(b, i+1)
				switch {
				case i < len(b) && b[i] == c+2: // '}' is '{'+2, ']' is '['+2
					depth--
					i, ok = i+1, true
				case c == '{':
					state = wantKey
					continue
				default:
					continue
				}
			case c == '"':
				i, _, ok = scanString(b, i)
			case c == '-' || c >= '0' && c <= '9':
				i, ok = scanNumber(b, i)
			case c == 't':
				i, ok = scanLiteral(b, i, "true")
			case c == 'f':
				i, ok = scanLiteral(b, i, "false")
			case c == 'n':
				i, ok = scanLiteral(b, i, "null")
			}
			if !ok {
				return spans, scanInvalid
			}
			state = ended

		case ended:
			if depth == 1 && usageAt >= 0 {
				spans = append(spans, span{usageAt, i})
				usageAt = -1
			}
			i = skipSpace(b, i)
			if depth == 0 {
				switch {
				case i != len(b):
					return spans, scanInvalid
				case len(spans) > 0:
					return spans, scanFound
				default:
					return spans, scanNone
				}
			}
			obj := objs&(1<<(depth-1)) != 0
			switch {
			case i < len(b) && b[i] == ',':
				i = skipSpace(b, i+1)
				state = wantValue
				if obj {
					state = wantKey
				}
			case i < len(b) && (obj && b[i] == '}' || !obj && b[i] == ']'):
				depth--
				i++
			default:
				return spans, scanInvalid
			}

		case wantKey:
			if i >= len(b) || b[i] != '"' {
				return spans, scanInvalid
			}
			end, escaped, ok := scanString(b, i)
			if !ok {
				return spans, scanInvalid
			}
			isUsage := false
			if depth == 1 {
				switch {
				case escaped:
					// "\u0075sage" is usage too: leave names with
					// escapes to encoding/json.
					return spans, scanUnsure
				case bytes.EqualFold(b[i+1:end-1], []byte("usage")):
					if len(spans) == maxUsageSpans {
						return spans, scanUnsure
					}
					isUsage = true
				}
			}
			i = skipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return spans, scanInvalid
			}
			i = skipSpace(b, i+1)
			if isUsage {
				usageAt = i
			}
			state = wantValue
		}
	}
}

// scanLiteral reads lit at b[i] and returns the index after it.
func scanLiteral(b []byte, i int, lit string) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return 0, false
	}
	return i + len(lit), true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// scanString reads the string starting at b[i] (a '"'): it returns the
// index after its closing quote and whether it has escapes. Bytes below
// 0x20 are not allowed in it; any other bytes are, as in encoding/json.
func scanString(b []byte, i int) (end int, escaped, ok bool) {
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, escaped, true
		case c < 0x20:
			return 0, false, false
		case c == '\\':
			escaped = true
			i++
			if i >= len(b) {
				return 0, false, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return 0, false, false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return 0, false, false
					}
				}
				i += 4
			default:
				return 0, false, false
			}
		}
	}
	return 0, false, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// scanNumber reads the number starting at b[i]: -?(0|[1-9][0-9]*)
// (\.[0-9]+)?([eE][+-]?[0-9]+)?, and returns the index after it.
func scanNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}
