package regional

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"golang.org/x/net/http/httpguts"
)

// readRequestFast parses the request at the start of br, as
// http.ReadRequest(br) would, when it is of the plain form most clients
// send; the caller falls back to http.ReadRequest for anything else.
// http.ReadRequest's allocations (15 for a request of curl's, 36 for
// one of the OpenAI Python SDK's, its Request included) are the most of
// any step on the proxy's request path. Besides the Request its caller
// gives, this makes 4 for a request of up to 8 header names (the string
// copied from it, one block for its URL, body and header values, and
// the header map's two), 6 for the SDK's 16 (the map takes more), and
// one more for each name repeated.
//
// It looks only at the bytes br already holds and never reads from br's
// source: the caller has buffered the request line and the whole header
// (h1Conn.scanHeader). When those bytes hold a plain request (below), it
// fills *req with what http.ReadRequest would return for them, field by
// field (Header without Host, as ReadRequest leaves it; Body http.NoBody
// without a body, otherwise a reader of exactly Content-Length bytes of
// br that behaves as net/http's body does), discards the request line
// and header from br, and returns true. Otherwise it returns false, has
// consumed nothing from br, and may have written to *req.
//
// The plain form: a request line "METHOD SP TARGET SP HTTP/1.1" (or
// HTTP/1.0) whose method is a token and whose target is an origin-form
// path of bytes that url.ParseRequestURI keeps as they are (letters,
// digits and -._~/$&+,:;= and @, not starting with "//") with an
// optional query of visible ASCII but '#'; then at most maxFastHeaders
// lines "Name:value", whose name is a token of at most maxFastName bytes
// in any case and whose value is visible ASCII, spaces and tabs (those
// around it trimmed); then an empty line; every line ended by CRLF. Refused, for http.ReadRequest to
// judge: a bare CR or LF, a folded line, any byte >= 0x80 or control
// byte but HTAB in a value, more than one Host header, a
// Transfer-Encoding, Trailer or Pragma header, more than one
// Content-Length header or one that is not 1 to 18 decimal digits.
//
// The strings of the request (its method and header names where they are
// not common ones, values, target, path, query and Host) are substrings
// of one string copied from them, never of br's buffer, which the next
// request overwrites while a handler may still hold them. So a string a
// handler keeps past the request keeps all of them, Authorization's
// value included (http.ReadRequest gives each value a string of its
// own): what is kept long (a map key, a metric label) is copied or
// derived from them (route.Sessions keys by a hash, Prompts by a new
// string), and the server keeps only an uncommon method until the next
// request (h1Conn.lastMethod).
func readRequestFast(br *bufio.Reader, req *http.Request) bool {
	buf, _ := br.Peek(br.Buffered())
	// Offsets are kept as int32: a header is not looked for past 1 GiB.
	buf = buf[:min(len(buf), 1<<30)]

	// The request line: METHOD SP TARGET SP HTTP/1.x CRLF.
	nl := bytes.IndexByte(buf, '\n')
	if nl < 1 || buf[nl-1] != '\r' {
		return false
	}
	line := buf[:nl-1]
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || !allIn(line[:sp], classTchar) {
		return false
	}
	target := line[sp+1:]
	sp2 := bytes.IndexByte(target, ' ')
	if sp2 < 0 {
		return false
	}
	proto := target[sp2+1:]
	target = target[:sp2]
	var minor int
	switch string(proto) {
	case "HTTP/1.1":
		minor = 1
	case "HTTP/1.0":
		minor = 0
	default:
		return false
	}
	q, ok := originForm(target)
	if !ok {
		return false
	}

	// The header lines up to the empty one, checked before anything is
	// allocated. A line with a CR or LF but its CRLF is refused, so the
	// empty line is the first "\r\n\r\n".
	var hs [maxFastHeaders]fastHeader
	var name [maxFastName]byte
	var seen [2]uint64 // the ids of the interned names met
	nh, host, hosts := 0, -1, 0
	dup := false // a name is met twice
	contentLength := int64(-1)
	off := nl + 1
	for { // at most maxFastHeaders+1 lines: each but the empty one adds to nh
		nl := bytes.IndexByte(buf[off:], '\n')
		if nl < 1 || buf[off+nl-1] != '\r' {
			// The header is not all buffered, or has a bare LF.
			return false
		}
		l := buf[off : off+nl-1]
		if len(l) == 0 {
			break
		}
		colon := bytes.IndexByte(l, ':')
		if colon <= 0 || colon > maxFastName || nh == len(hs) || !validValue(l[colon+1:]) {
			return false
		}
		canon, ok := canonicalName(name[:], l[:colon])
		if !ok {
			return false
		}
		// The value as textproto trims it.
		vs, ve := off+colon+1, off+len(l)
		for vs < ve && (buf[vs] == ' ' || buf[vs] == '\t') {
			vs++
		}
		for ve > vs && (buf[ve-1] == ' ' || buf[ve-1] == '\t') {
			ve--
		}
		id := commonHeaderID(canon)
		if id > 0 {
			if seen[id/64]&(1<<(id%64)) != 0 {
				dup = true
			}
			seen[id/64] |= 1 << (id % 64)
		} else {
			// A name not interned: compare with the others (rare).
			for _, h := range hs[:nh] {
				if h.id == 0 && bytes.EqualFold(buf[h.name:h.colon], l[:colon]) {
					dup = true
				}
			}
		}
		switch commonHeaderNames[id] {
		case "Host":
			host = nh
			hosts++
		case "Content-Length":
			if contentLength >= 0 {
				return false
			}
			if contentLength, ok = parseDecimal(buf[vs:ve]); !ok {
				return false
			}
		case "Transfer-Encoding", "Trailer", "Pragma":
			return false
		}
		hs[nh] = fastHeader{name: int32(off), colon: int32(off + colon), vs: int32(vs), ve: int32(ve), id: id}
		nh++
		off += nl + 1
	}
	if hosts > 1 {
		return false
	}
	headerLen := off + 2 // with the empty line

	// The common methods are constants; any other is copied.
	var method string
	switch string(line[:sp]) {
	case "GET":
		method = "GET"
	case "POST":
		method = "POST"
	case "HEAD":
		method = "HEAD"
	case "PUT":
		method = "PUT"
	case "DELETE":
		method = "DELETE"
	case "OPTIONS":
		method = "OPTIONS"
	case "PATCH":
		method = "PATCH"
	}

	// One string holds the request's other strings: the target, then
	// the method if copied, then each header's name if not interned (in
	// canonical form) and value. hs is moved to its offsets in it.
	size := len(target)
	if method == "" {
		size += sp
	}
	for _, h := range hs[:nh] {
		if h.id == 0 {
			size += int(h.colon - h.name)
		}
		size += int(h.ve - h.vs)
	}
	var sb strings.Builder
	sb.Grow(size)
	sb.Write(target)
	if method == "" {
		sb.Write(line[:sp])
	}
	for i := range hs[:nh] {
		h := &hs[i]
		if h.id == 0 {
			at := int32(sb.Len())
			canon, _ := canonicalName(name[:], buf[h.name:h.colon])
			sb.Write(canon)
			h.name, h.colon = at, at+int32(len(canon))
		}
		at := int32(sb.Len())
		sb.Write(buf[h.vs:h.ve])
		h.vs, h.ve = at, at+h.ve-h.vs
	}
	s := sb.String()

	u, body, vals := newFastBlock(nh - hosts)
	header := make(http.Header, nh-hosts)
	for i, h := range hs[:nh] {
		if i == host {
			// http.ReadRequest takes Host out of the header.
			continue
		}
		key := commonHeaderNames[h.id]
		if h.id == 0 {
			key = s[h.name:h.colon]
		}
		v := s[h.vs:h.ve]
		// As textproto: the first value of a name in a slice of the
		// shared array, capped, so that a second value appends apart.
		var vv []string
		if dup {
			vv = header[key]
		}
		if vv == nil {
			vals[0] = v
			header[key], vals = vals[:1:1], vals[1:]
		} else {
			header[key] = append(vv, v)
		}
	}

	// The request line's strings.
	if method == "" {
		method = s[len(target) : len(target)+sp]
	}
	requestURI := s[:len(target)]
	u.Path = requestURI[:q]
	if q < len(target) {
		if q == len(target)-1 {
			// "/path?": url.ParseRequestURI's ForceQuery.
			u.ForceQuery = true
		} else {
			u.RawQuery = requestURI[q+1:]
		}
	}

	// Connection as net/http's shouldClose reads it for a request.
	conn := header["Connection"]
	closing := httpguts.HeaderValuesContainsToken(conn, "close")
	if minor == 0 {
		closing = closing || !httpguts.HeaderValuesContainsToken(conn, "keep-alive")
	}

	// A request without Content-Length has no body (http.ReadRequest's
	// fixLength), nor one with Content-Length 0.
	var rc io.ReadCloser = http.NoBody
	if contentLength > 0 {
		body.src = io.LimitedReader{R: br, N: contentLength}
		body.closing = closing
		rc = body
	}
	hostValue := ""
	if host >= 0 {
		hostValue = s[hs[host].vs:hs[host].ve]
	}
	protoName := "HTTP/1.1"
	if minor == 0 {
		protoName = "HTTP/1.0"
	}
	*req = http.Request{
		Method:        method,
		URL:           u,
		Proto:         protoName,
		ProtoMajor:    1,
		ProtoMinor:    minor,
		Header:        header,
		Body:          rc,
		ContentLength: max(contentLength, 0),
		Close:         closing,
		Host:          hostValue,
		RequestURI:    requestURI,
	}
	_, _ = br.Discard(headerLen)
	return true
}

// Limits of readRequestFast: a request past them goes to
// http.ReadRequest.
const (
	// maxFastHeaders is how many header lines it takes (the OpenAI
	// Python SDK sends 17).
	maxFastHeaders = 32
	// maxFastName is how long a header name it takes.
	maxFastName = 128
)

// fastHeader is where one header line lies in the request's bytes (or,
// later, in the string copied from them): its name [name, colon), its
// value trimmed [vs, ve); id is the name's index in commonHeaderNames,
// 0 if it has none.
type fastHeader struct {
	name, colon, vs, ve int32
	id                  uint8
}

// newFastBlock returns what a request holds besides its strings and
// header map, its URL, its body and the backing array of n header
// values, in one allocation for up to 16 values (curl and Go's client
// send 5 or 6 besides Host, the OpenAI Python SDK 16).
func newFastBlock(n int) (*url.URL, *fastBody, []string) {
	if n <= 8 {
		b := new(struct {
			url  url.URL
			body fastBody
			vals [8]string
		})
		return &b.url, &b.body, b.vals[:n]
	}
	b := new(struct {
		url  url.URL
		body fastBody
		vals [16]string
	})
	if n > len(b.vals) {
		return &b.url, &b.body, make([]string, n)
	}
	return &b.url, &b.body, b.vals[:n]
}

// originForm reports whether target is an origin-form request target
// that url.ParseRequestURI parses into a Path equal to the bytes before
// '?' (no RawPath, no escapes) and a RawQuery equal to those after it;
// q is the index of the '?', len(target) without one.
func originForm(target []byte) (q int, ok bool) {
	if len(target) == 0 || target[0] != '/' || len(target) > 1 && target[1] == '/' {
		return 0, false
	}
	q = bytes.IndexByte(target, '?')
	if q < 0 {
		q = len(target)
	}
	if !allIn(target[:q], classPath) {
		return 0, false
	}
	if q < len(target) && !allIn(target[q+1:], classQuery) {
		return 0, false
	}
	return q, true
}

// parseDecimal parses a Content-Length of 1 to 18 digits, which
// strconv.ParseUint(v, 10, 63) (net/http's parser) takes alike; longer
// ones are left to net/http.
func parseDecimal(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// canonicalName writes the canonical form of name into dst, as
// textproto.CanonicalMIMEHeaderKey makes it: the first letter and each
// letter after a hyphen upper case, every other letter lower case. It
// reports false if name is not a token. dst is at least as long as name.
func canonicalName(dst, name []byte) ([]byte, bool) {
	upper := true
	for i, c := range name {
		if byteClass[c]&classTchar == 0 {
			return nil, false
		}
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst[i] = c
		upper = c == '-'
	}
	return dst[:len(name)], true
}

// validValue reports whether v is all visible ASCII, spaces and tabs;
// eight bytes at a time while none is a tab.
func validValue(v []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(v) >= 8 {
		x := binary.LittleEndian.Uint64(v)
		// Some byte below 0x20, or at or above 0x7f: byte by byte.
		if (x-0x20*ones)&^x&highs != 0 || (x+ones|x)&highs != 0 {
			break
		}
		v = v[8:]
	}
	return allIn(v, classValue)
}

// allIn reports whether every byte of b is of the class.
func allIn(b []byte, class uint8) bool {
	for _, c := range b {
		if byteClass[c]&class == 0 {
			return false
		}
	}
	return true
}

// Byte classes (bits of byteClass).
const (
	// classTchar: RFC 9110's tchar, the bytes of methods and header
	// names (httpguts.ValidHeaderFieldName's).
	classTchar uint8 = 1 << iota
	// classValue: visible ASCII, space and tab, the header value bytes
	// taken here (textproto also takes bytes >= 0x80).
	classValue
	// classPath: the path bytes that url.URL.setPath keeps as they are
	// (it would escape any other, and set RawPath).
	classPath
	// classQuery: visible ASCII but '#'.
	classQuery
)

// byteClass gives each byte its classes. Read only.
var byteClass = func() (t [256]uint8) {
	alnum := func(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' }
	for i := range t {
		c := byte(i)
		if alnum(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			t[i] |= classTchar
		}
		if c == '\t' || ' ' <= c && c < 0x7f {
			t[i] |= classValue
		}
		if alnum(c) || strings.IndexByte("-._~/$&+,:;=@", c) >= 0 {
			t[i] |= classPath
		}
		if ' ' < c && c < 0x7f && c != '#' {
			t[i] |= classQuery
		}
	}
	return t
}()

// commonHeaderNames are the canonical header names interned: those
// textproto interns, those OpenAI's SDKs and this proxy's clients send,
// and every name readRequestFast must recognise (Host, Content-Length,
// Transfer-Encoding, Trailer, Pragma, Connection). Index 0 is none; at
// most 127 names (readRequestFast keeps a 128-bit set of them). Read
// only.
var commonHeaderNames = []string{
	"",
	// textproto's.
	"Accept", "Accept-Charset", "Accept-Encoding", "Accept-Language",
	"Accept-Ranges", "Cache-Control", "Cc", "Connection", "Content-Id",
	"Content-Language", "Content-Length", "Content-Transfer-Encoding",
	"Content-Type", "Cookie", "Date", "Dkim-Signature", "Etag", "Expires",
	"From", "Host", "If-Modified-Since", "If-None-Match", "In-Reply-To",
	"Last-Modified", "Location", "Message-Id", "Mime-Version", "Pragma",
	"Received", "Return-Path", "Server", "Set-Cookie", "Subject", "To",
	"User-Agent", "Via", "X-Forwarded-For", "X-Imforwards", "X-Powered-By",
	// Requests to an HTTP API.
	"Authorization", "Content-Encoding", "Expect", "Keep-Alive", "Origin",
	"Referer", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Traceparent", "Tracestate", "X-Request-Id", "X-Forwarded-Host",
	"X-Forwarded-Proto", "X-Real-Ip", "X-Api-Key", "Idempotency-Key",
	"Openai-Organization", "Openai-Project", "Openai-Beta", "X-Stainless-Lang",
	"X-Stainless-Package-Version", "X-Stainless-Os", "X-Stainless-Arch",
	"X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Async",
	"X-Stainless-Retry-Count", "X-Stainless-Read-Timeout", "X-Stainless-Timeout",
	"Anthropic-Version",
	// This proxy's.
	"X-Tenant-Id", "X-Session-Id", "X-Data-Class", "X-Meridian-Policy",
	"X-Meridian-Region", "X-Meridian-Hop", "X-Meridian-Hop-Auth",
}

// commonHeaderTable finds a name's index in commonHeaderNames: an open
// addressing hash table of 256 slots (at most 127 of them used, so a
// probe always meets an empty one), the slot to start from nameHash's.
// A map lookup costs several times as much per header line. Read only.
var commonHeaderTable = func() (t [256]uint8) {
	for id := 1; id < len(commonHeaderNames); id++ {
		h := nameHash(commonHeaderNames[id])
		for t[h] != 0 { // ends: fewer names than slots
			h++
		}
		t[h] = uint8(id)
	}
	return t
}()

// nameHash mixes a header name's length and three of its bytes.
func nameHash[T string | []byte](name T) uint8 {
	n := len(name)
	return uint8(n*29 + int(name[0])*7 + int(name[n/2])*3 + int(name[n-1]))
}

// commonHeaderID is the index of the canonical name in
// commonHeaderNames, 0 if it is not there.
func commonHeaderID(name []byte) uint8 {
	h := nameHash(name)
	for range len(commonHeaderTable) {
		id := commonHeaderTable[h]
		if id == 0 || commonHeaderNames[id] == string(name) {
			return id
		}
		h++
	}
	return 0
}

// fastBody is the body of a request readRequestFast read that has a
// Content-Length: what net/http's body does in that case (no trailer),
// reproduced. Read gives exactly Content-Length bytes of the connection's
// reader, the last with io.EOF, then io.EOF; io.ErrUnexpectedEOF if the
// connection ends first (and io.EOF after). Close reads the rest unless
// the connection closes after this request; Read after Close is
// http.ErrBodyReadAfterClose. Read and Close are safe to call at once.
type fastBody struct {
	mu      sync.Mutex
	src     io.LimitedReader
	closing bool // the connection closes after this request
	sawEOF  bool
	closed  bool
}

func (b *fastBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.readLocked(p)
}

// readLocked reads with b.mu held.
func (b *fastBody) readLocked(p []byte) (n int, err error) {
	if b.sawEOF {
		return 0, io.EOF
	}
	n, err = b.src.Read(p)
	if err == io.EOF {
		b.sawEOF = true
		if b.src.N > 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	if err == nil && n > 0 && b.src.N == 0 {
		// The last bytes with io.EOF, as net/http gives them.
		err = io.EOF
		b.sawEOF = true
	}
	return n, err
}

func (b *fastBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	var err error
	if !b.sawEOF && !b.closing {
		// Read to the end to keep the connection, as net/http's body does.
		_, err = io.Copy(io.Discard, fastBodyLocked{b})
	}
	b.closed = true
	return err
}

// fastBodyLocked reads a fastBody whose mutex is held.
type fastBodyLocked struct{ b *fastBody }

func (l fastBodyLocked) Read(p []byte) (int, error) { return l.b.readLocked(p) }
