package regional

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http/httpguts"
	"pgregory.net/rapid"
)

// fastBufSize is the size of the readers in these tests: every input
// fits, so what is buffered is what the test chose.
const fastBufSize = 16 << 10

// fastSplitReader gives its parts one Read each, then io.EOF: a connection
// on which the first part has arrived and the rest comes later.
type fastSplitReader struct{ parts [][]byte }

func (r *fastSplitReader) Read(p []byte) (int, error) {
	for len(r.parts) > 0 && len(r.parts[0]) == 0 {
		r.parts = r.parts[1:]
	}
	if len(r.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.parts[0])
	r.parts[0] = r.parts[0][n:]
	return n, nil
}

// fastReader returns a reader over data with its first buffered bytes
// already in its buffer and the rest still to come.
func fastReader(tb fastTB, data []byte, buffered int) *bufio.Reader {
	tb.Helper()
	br := bufio.NewReaderSize(&fastSplitReader{parts: [][]byte{data[:buffered], data[buffered:]}}, fastBufSize)
	if _, err := br.Peek(buffered); err != nil {
		tb.Fatalf("buffer %d bytes: %v", buffered, err)
	}
	if br.Buffered() != buffered {
		tb.Fatalf("buffered %d bytes, want %d", br.Buffered(), buffered)
	}
	return br
}

// fastCase is an input to checkFast.
type fastCase struct {
	data     []byte
	buffered int // how many bytes of data are buffered when the request is read
	step     int // the length of each Read of the body
	reads    int // how many Reads of the body before Close; -1: to its end
}

// checkFast runs readRequestFast over c.data, c.buffered bytes of it
// buffered, and http.ReadRequest over the same bytes arriving alike,
// and fails tb where they differ: when readRequestFast takes the
// request, every exported field of the two requests, each Read of the
// bodies (bytes, count and error) and their Close, the bytes left after
// them, and the fields again once the reader's buffer has been
// overwritten (no string may alias it); when it refuses, the reader must
// be untouched. It reports whether readRequestFast took the request.
func checkFast(tb fastTB, c fastCase) bool {
	tb.Helper()
	data := c.data
	br := fastReader(tb, data, c.buffered)
	before := bytes.Clone(fastPeekAll(br))
	var got http.Request
	ok := readRequestFast(br, &got)
	stdBR := fastReader(tb, data, c.buffered)
	want, err := http.ReadRequest(stdBR)
	if !ok {
		if after := fastPeekAll(br); !bytes.Equal(after, before) {
			tb.Fatalf("refused %q but consumed from the reader: %d bytes buffered, was %d", data, len(after), len(before))
		}
		return false
	}
	if err != nil {
		tb.Fatalf("took %q, which http.ReadRequest refuses: %v", data, err)
	}
	compareFastRequests(tb, data, &got, want)
	// The server does not check again the names and values of a request
	// read here (h1Conn.serveOne): each must pass its checks.
	for k, vv := range got.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			tb.Fatalf("%q: took the header name %q, which httpguts refuses", data, k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				tb.Fatalf("%q: took the %s value %q, which httpguts refuses", data, k, v)
			}
		}
	}
	if (got.Body == http.NoBody) != (want.Body == http.NoBody) {
		tb.Fatalf("%q: Body is NoBody %v, want %v", data, got.Body == http.NoBody, want.Body == http.NoBody)
	}
	gp, wp := make([]byte, max(c.step, 1)), make([]byte, max(c.step, 1))
	// Bounded: each Read before the end gives at least a byte.
	for i := 0; (c.reads < 0 || i < c.reads) && i <= len(data)+1; i++ {
		gn, ge := got.Body.Read(gp)
		wn, we := want.Body.Read(wp)
		if gn != wn || !bytes.Equal(gp[:gn], wp[:wn]) || !fastSameErr(ge, we) {
			tb.Fatalf("%q: Read %d: %q, %v; want %q, %v", data, i, gp[:gn], ge, wp[:wn], we)
		}
		if ge != nil && c.reads < 0 {
			break
		}
	}
	for i := range 2 {
		if ge, we := got.Body.Close(), want.Body.Close(); !fastSameErr(ge, we) {
			tb.Fatalf("%q: Close %d: %v, want %v", data, i, ge, we)
		}
		gn, ge := got.Body.Read(gp)
		wn, we := want.Body.Read(wp)
		if gn != wn || !fastSameErr(ge, we) {
			tb.Fatalf("%q: Read after Close: %d, %v; want %d, %v", data, gn, ge, wn, we)
		}
	}
	gr, ge := io.ReadAll(br)
	wr, we := io.ReadAll(stdBR)
	if !bytes.Equal(gr, wr) || ge != nil || we != nil {
		tb.Fatalf("%q: left %q (%v), want %q (%v)", data, gr, ge, wr, we)
	}
	// Overwrite the whole buffer: a field that aliased it changes.
	br.Reset(bytes.NewReader(bytes.Repeat([]byte{'Z'}, fastBufSize)))
	if _, err := br.Peek(fastBufSize); err != nil {
		tb.Fatal(err)
	}
	compareFastRequests(tb, data, &got, want)
	return true
}

// fastTB is what the checks need of a *testing.T or *rapid.T.
type fastTB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func fastPeekAll(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return b
}

// fastSameErr reports whether two errors are the same: both nil, or one is
// the other (the sentinels io.EOF, io.ErrUnexpectedEOF and
// http.ErrBodyReadAfterClose), or the same text.
func fastSameErr(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return errors.Is(a, b) || a.Error() == b.Error()
}

// compareFastRequests fails tb unless every exported field of got but Body
// equals want's (reflect.DeepEqual, the URL and Header included), and
// their contexts are the same.
func compareFastRequests(tb fastTB, data []byte, got, want *http.Request) {
	tb.Helper()
	gv, wv := reflect.ValueOf(got).Elem(), reflect.ValueOf(want).Elem()
	for i := range gv.NumField() {
		f := gv.Type().Field(i)
		if !f.IsExported() || f.Name == "Body" {
			continue
		}
		g, w := gv.Field(i).Interface(), wv.Field(i).Interface()
		if !reflect.DeepEqual(g, w) {
			tb.Fatalf("%q: %s = %#v, want %#v", data, f.Name, fastDeref(g), fastDeref(w))
		}
	}
	if got.Context() != want.Context() {
		tb.Fatalf("%q: context differs", data)
	}
}

func fastDeref(v any) any {
	if u, ok := v.(*url.URL); ok && u != nil {
		return *u
	}
	return v
}

// Tails after a request's header: a body (or none), then the start of
// the next request.
var fastTails = []string{
	"",
	"hello",
	"0123456789abcdef",
	"GET /next HTTP/1.1\r\nHost: n\r\n\r\n",
	"{\"model\":\"m\"}POST /next HTTP/1.1\r\n",
	"\r\nGET /x HTTP/1.1\r\n\r\n",
}

// genFastRequest draws request bytes from a grammar whose every part is
// usually of the plain form and otherwise one of the forms net/http
// treats differently; plain is whether every part drawn was plain.
// With onlyPlain, every part is plain.
func genFastRequest(t *rapid.T, onlyPlain bool) (data []byte, plain bool) {
	plain = true
	// oddOne is 1 in how many parts are odd: none (half the requests),
	// or 1 in 10 or 30.
	oddOne := 0
	if !onlyPlain {
		oddOne = rapid.SampledFrom([]int{0, 0, 10, 30}).Draw(t, "oddOne")
	}
	// pick draws a plain value, or (1 in oddOne) an odd one.
	pick := func(label string, plainGen, oddGen *rapid.Generator[string]) string {
		if oddOne > 0 && rapid.IntRange(1, oddOne).Draw(t, label+"Odd") == oddOne {
			plain = false
			return oddGen.Draw(t, label)
		}
		return plainGen.Draw(t, label)
	}
	var b strings.Builder
	b.WriteString(pick("method",
		rapid.SampledFrom([]string{"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "get", "M-SEARCH", "CONNECT", "TRACE"}),
		rapid.SampledFrom([]string{"", "G@T", "GET\x00", "G\xc3\x8bT", "{X}", "GET ", "GET\t", "PRI"})))
	b.WriteString(pick("sp1", rapid.Just(" "), rapid.SampledFrom([]string{"  ", "\t", ""})))
	b.WriteString(pick("target", fastPlainTarget(), fastOddTarget()))
	b.WriteString(pick("sp2", rapid.Just(" "), rapid.SampledFrom([]string{"  ", "\t", ""})))
	proto := pick("proto", rapid.SampledFrom([]string{"HTTP/1.1", "HTTP/1.0"}),
		rapid.SampledFrom([]string{"HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTP/11", "http/1.1", "HTTP/1.1 ", "HTTP/1", "HTTP/3.0", "HTTP/1.1x", "PRI"}))
	b.WriteString(proto)
	b.WriteString(pick("eol", rapid.Just("\r\n"), rapid.SampledFrom([]string{"\n", "\r", "\r\r\n"})))

	hosts, lengths := 0, 0
	n := rapid.IntRange(0, 10).Draw(t, "headers")
	bodyLen := -1
	for i := range n {
		name, value := genFastHeader(t, i, pick)
		switch strings.ToLower(name) {
		case "host":
			hosts++
			if onlyPlain && hosts > 1 {
				continue
			}
		case "content-length":
			lengths++
			if onlyPlain && lengths > 1 {
				continue
			}
			if v, err := strconv.Atoi(strings.TrimSpace(value)); err == nil {
				bodyLen = v
			}
		}
		if hosts > 1 || lengths > 1 {
			plain = false
		}
		b.WriteString(name)
		b.WriteString(pick(fmt.Sprint("colon", i), rapid.SampledFrom([]string{": ", ":"}), rapid.SampledFrom([]string{" :", " : ", ""})))
		b.WriteString(value)
		b.WriteString(pick(fmt.Sprint("eol", i), rapid.Just("\r\n"), rapid.SampledFrom([]string{"\n", "\r", "\r\r\n", "\r\n folded\r\n", "\r\n\tx\r\n"})))
	}
	b.WriteString(pick("end", rapid.Just("\r\n"), rapid.Just("\n")))
	if bodyLen > 0 && bodyLen < 64 && rapid.Bool().Draw(t, "fullBody") {
		b.WriteString(strings.Repeat("b", bodyLen))
	}
	b.WriteString(rapid.SampledFrom(fastTails).Draw(t, "tail"))
	return []byte(b.String()), plain
}

// fastPlainTarget draws origin-form targets readRequestFast must take.
func fastPlainTarget() *rapid.Generator[string] {
	seg := rapid.StringMatching(`[A-Za-z0-9._~$&+,:;=@-]{0,8}`)
	query := rapid.StringMatching(`[!-"$-~]{0,12}`) // visible ASCII but '#'
	return rapid.Custom(func(t *rapid.T) string {
		segs := rapid.SliceOfN(seg, 1, 4).Draw(t, "segs")
		p := "/" + strings.Join(segs, "/")
		if strings.HasPrefix(p, "//") {
			p = "/x" + p
		}
		switch rapid.IntRange(0, 3).Draw(t, "q") {
		case 1:
			p += "?" + query.Draw(t, "query")
		case 2:
			p += "?"
		}
		return p
	})
}

// fastOddTarget draws request targets of forms readRequestFast refuses or
// whose parse differs from the plain one.
func fastOddTarget() *rapid.Generator[string] {
	return rapid.SampledFrom([]string{
		"*", "http://example.com/a?b", "HTTP://Example.COM", "https://u:p@h:1/x", "//a/b", "//",
		"/%41", "/%zz", "/a%2Fb", "/a#frag", "/a?b#c", "/a??", "/?", "/a?b?", "/??",
		"/a(b)", "/!'*", "/a[1]", "/a|b", "/a\"b", "/a^`{}", "/a\\b",
		"/\xc3\xa9", "/a?\xc3\xa9", "/\x01", "/a?\x7f", "/a\tb", "", "example.com:443", "a/b", "/a b",
	})
}

// genFastHeader draws one header line's name and value.
func genFastHeader(t *rapid.T, i int, pick func(string, *rapid.Generator[string], *rapid.Generator[string]) string) (name, value string) {
	label := fmt.Sprint("h", i)
	kind := pick(label+"kind", rapid.SampledFrom([]string{"any", "Host", "Content-Length", "Connection"}),
		rapid.SampledFrom([]string{"Transfer-Encoding", "Trailer", "Pragma"}))
	name = kind
	switch kind {
	case "any":
		name = pick(label+"name",
			rapid.SampledFrom([]string{"User-Agent", "Accept", "Content-Type", "Authorization", "X-Request-Id",
				"Cache-Control", "Expect", "X-Custom-Thing", "x_under", "1abc", "A-", "-a", "a--b", "X-Stainless-Os", "ETag", "www-authenticate"}),
			rapid.SampledFrom([]string{"Bad Name", "", "X\x01", "N\xc3\xa9", " Leading", "\tTab", "X{}"}))
		value = pick(label+"value", rapid.StringMatching(`[ \t]{0,2}[!-~]([ !-~]{0,10}[!-~])?[ \t]{0,2}|`),
			rapid.SampledFrom([]string{"a\x7fb", "\xc3\xa9", "a\x00b", "a\x0bb", "a\rb", "a\nb", "\x80"}))
	case "Host":
		value = pick(label+"value", rapid.SampledFrom([]string{"example.com", "127.0.0.1:8080", "", "[::1]:80", " spaced ", "a b"}),
			rapid.SampledFrom([]string{"h\x80", "h\x01", "h\r"}))
	case "Content-Length":
		value = pick(label+"value", rapid.SampledFrom([]string{"0", "5", "12", "007", " 16 ", "999999999999999999"}),
			rapid.SampledFrom([]string{"+5", "-1", "", "5, 5", "1e3", "0x10", "5 5", "9999999999999999999", "99999999999999999999", "\t"}))
	case "Connection":
		value = pick(label+"value", rapid.SampledFrom([]string{"close", "keep-alive", "Close", "upgrade", "keep-alive, close", "foo,close ", "", "KEEP-ALIVE", "close-ish"}),
			rapid.SampledFrom([]string{"clos\x80"}))
	case "Transfer-Encoding":
		value = rapid.SampledFrom([]string{"chunked", "identity", "gzip, chunked", "Chunked"}).Draw(t, label+"value")
	case "Trailer":
		value = "X-Sum"
	case "Pragma":
		value = rapid.SampledFrom([]string{"no-cache", "x"}).Draw(t, label+"value")
	}
	// Any case: clients such as Python's httpx send lowercase names.
	switch rapid.IntRange(0, 3).Draw(t, label+"case") {
	case 1:
		name = strings.ToLower(name)
	case 2:
		name = strings.ToUpper(name)
	case 3:
		r := []byte(name)
		for j := range r {
			if j%2 == 1 {
				r[j] = byte(fastFlipCase(r[j]))
			}
		}
		name = string(r)
	}
	return name, value
}

// fastFlipCase flips the case of an ASCII letter.
func fastFlipCase(c byte) byte {
	switch {
	case 'a' <= c && c <= 'z':
		return c - 'a' + 'A'
	case 'A' <= c && c <= 'Z':
		return c - 'A' + 'a'
	}
	return c
}

// TestReadRequestFastLikeReadRequest holds readRequestFast to
// http.ReadRequest over requests from a grammar that mixes the plain
// form with every form net/http treats apart, with all of the request or
// only a prefix of it buffered. It also requires that a good share is
// taken and a good share refused, and that a request all of whose parts
// were plain is never refused once its header is buffered.
func TestReadRequestFastLikeReadRequest(t *testing.T) {
	var took, refused int
	rapid.Check(t, func(t *rapid.T) {
		data, plain := genFastRequest(t, false)
		buffered := len(data)
		if rapid.IntRange(0, 4).Draw(t, "cut") == 0 {
			buffered = rapid.IntRange(0, len(data)).Draw(t, "buffered")
		}
		ok := checkFast(t, fastCase{data, buffered, rapid.IntRange(1, 64).Draw(t, "step"), rapid.IntRange(-1, 3).Draw(t, "reads")})
		if ok {
			took++
		} else {
			refused++
		}
		if plain && buffered == len(data) && !ok {
			t.Fatalf("refused a plain request: %q", data)
		}
	})
	if total := took + refused; took < total/5 || refused < total/10 {
		t.Fatalf("took %d of %d requests, refused %d: the grammar no longer tests both sides", took, total, refused)
	}
}

// TestReadRequestFastTakesPlain: every request of the plain form alone
// is taken, and read as http.ReadRequest reads it.
func TestReadRequestFastTakesPlain(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		data, _ := genFastRequest(t, true)
		if !checkFast(t, fastCase{data, len(data), rapid.IntRange(1, 64).Draw(t, "step"), rapid.IntRange(-1, 3).Draw(t, "reads")}) {
			t.Fatalf("refused a plain request: %q", data)
		}
	})
}

// Requests as real clients send them (their header lines in their
// order and case), each with a 12-byte body.
const (
	fastGoClient = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 12\r\nAuthorization: Bearer sk-test\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n"
	fastCurl = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n" +
		"Content-Type: application/json\r\nAuthorization: Bearer sk-test\r\nContent-Length: 12\r\n\r\n"
	fastHttpx = "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost:8080\r\naccept: */*\r\naccept-encoding: gzip, deflate\r\n" +
		"connection: keep-alive\r\nuser-agent: python-httpx/0.27.0\r\ncontent-length: 12\r\ncontent-type: application/json\r\n\r\n"
	fastOpenAI = "POST /v1/chat/completions HTTP/1.1\r\nhost: api.example.com\r\naccept-encoding: gzip, deflate\r\n" +
		"connection: keep-alive\r\naccept: application/json\r\ncontent-type: application/json\r\nuser-agent: OpenAI/Python 1.54.4\r\n" +
		"x-stainless-lang: python\r\nx-stainless-package-version: 1.54.4\r\nx-stainless-os: Linux\r\nx-stainless-arch: x64\r\n" +
		"x-stainless-runtime: CPython\r\nx-stainless-runtime-version: 3.12.3\r\nauthorization: Bearer sk-test\r\n" +
		"x-stainless-async: false\r\nx-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\ncontent-length: 12\r\n\r\n"
	fastProxyload = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:9000\r\nContent-Type: application/json\r\n" +
		"X-Tenant-Id: t1\r\nContent-Length: 12\r\n\r\n"
	fastGet   = "GET /v1/models?limit=5&after= HTTP/1.1\r\nHost: h\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n"
	fastGet10 = "GET /healthz? HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"
	fastDups  = "DELETE /v1/x?a=1?b HTTP/1.1\r\nHost:h:1\r\nx-dup: 1\r\nAccept: a\r\nX-DUP:\t2 \r\naccept:b\r\nx-trace-1d: \r\n\r\n"

	fastJSONBody = `{"model":""}`
)

// TestReadRequestFastClients: the requests of real clients, and a few
// with repeated names, are taken, with exactly the fields given here.
func TestReadRequestFastClients(t *testing.T) {
	post := func(host string, h http.Header) *http.Request {
		return &http.Request{
			Method: "POST", URL: &url.URL{Path: "/v1/chat/completions"}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: h, ContentLength: 12, Host: host, RequestURI: "/v1/chat/completions",
		}
	}
	type clientCase struct {
		name, raw string
		want      *http.Request
	}
	cases := []clientCase{
		{"go", fastGoClient, post("127.0.0.1:8080", http.Header{
			"User-Agent": {"Go-http-client/1.1"}, "Content-Length": {"12"}, "Authorization": {"Bearer sk-test"},
			"Content-Type": {"application/json"}, "Accept-Encoding": {"gzip"},
		})},
		{"curl", fastCurl, post("localhost:8080", http.Header{
			"User-Agent": {"curl/8.5.0"}, "Accept": {"*/*"}, "Content-Type": {"application/json"},
			"Authorization": {"Bearer sk-test"}, "Content-Length": {"12"},
		})},
		{"httpx", fastHttpx, post("localhost:8080", http.Header{
			"Accept": {"*/*"}, "Accept-Encoding": {"gzip, deflate"}, "Connection": {"keep-alive"},
			"User-Agent": {"python-httpx/0.27.0"}, "Content-Length": {"12"}, "Content-Type": {"application/json"},
		})},
		{"openai", fastOpenAI, post("api.example.com", http.Header{
			"Accept-Encoding": {"gzip, deflate"}, "Connection": {"keep-alive"}, "Accept": {"application/json"},
			"Content-Type": {"application/json"}, "User-Agent": {"OpenAI/Python 1.54.4"},
			"X-Stainless-Lang": {"python"}, "X-Stainless-Package-Version": {"1.54.4"}, "X-Stainless-Os": {"Linux"},
			"X-Stainless-Arch": {"x64"}, "X-Stainless-Runtime": {"CPython"}, "X-Stainless-Runtime-Version": {"3.12.3"},
			"Authorization": {"Bearer sk-test"}, "X-Stainless-Async": {"false"}, "X-Stainless-Retry-Count": {"0"},
			"X-Stainless-Read-Timeout": {"600"}, "Content-Length": {"12"},
		})},
		{"proxyload", fastProxyload, post("127.0.0.1:9000", http.Header{
			"Content-Type": {"application/json"}, "X-Tenant-Id": {"t1"}, "Content-Length": {"12"},
		})},
		{"get", fastGet, &http.Request{
			Method: "GET", URL: &url.URL{Path: "/v1/models", RawQuery: "limit=5&after="}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"User-Agent": {"curl/8.5.0"}, "Accept": {"*/*"}}, Host: "h", RequestURI: "/v1/models?limit=5&after=",
		}},
		{"get10", fastGet10, &http.Request{
			Method: "GET", URL: &url.URL{Path: "/healthz", ForceQuery: true}, Proto: "HTTP/1.0", ProtoMajor: 1, ProtoMinor: 0,
			Header: http.Header{"Connection": {"Keep-Alive"}}, RequestURI: "/healthz?",
		}},
		// Repeated names, interned or not: their values in order.
		{"dups", fastDups, &http.Request{
			Method: "DELETE", URL: &url.URL{Path: "/v1/x", RawQuery: "a=1?b"}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"X-Dup": {"1", "2"}, "Accept": {"a", "b"}, "X-Trace-1d": {""}}, Host: "h:1", RequestURI: "/v1/x?a=1?b",
		}},
		{"dupcustom", "GET / HTTP/1.1\r\nx-dup: 1\r\nX-DUP: 2\r\n\r\n", &http.Request{
			Method: "GET", URL: &url.URL{Path: "/"}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"X-Dup": {"1", "2"}}, RequestURI: "/",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.raw)
			if tc.want.ContentLength > 0 {
				data = append(data, fastJSONBody...)
			}
			data = append(data, "GET /next"...)
			var got http.Request
			if !readRequestFast(fastReader(t, data, len(data)), &got) {
				t.Fatal("refused")
			}
			if tc.want.ContentLength > 0 {
				b, err := io.ReadAll(got.Body)
				if string(b) != fastJSONBody || err != nil {
					t.Fatalf("body %q, %v", b, err)
				}
			} else if got.Body != http.NoBody {
				t.Fatalf("Body %T, want http.NoBody", got.Body)
			}
			tc.want.Body = got.Body
			compareFastRequests(t, data, &got, tc.want)
			if !checkFast(t, fastCase{data, len(data), 5, -1}) {
				t.Fatal("checkFast: refused")
			}
		})
	}
}

// TestReadRequestFastRefuses: a table of the forms left to
// http.ReadRequest, whether it takes them or not. Each must be refused
// with the reader untouched.
func TestReadRequestFastRefuses(t *testing.T) {
	const h = "Host: h\r\n"
	for _, raw := range []string{
		"GET / HTTP/1.1\r\n" + h,                            // header not all buffered
		"GET / HTTP/1.1\r\n" + h + "\n",                     // bare LF ends it
		"GET / HTTP/1.1\n" + h + "\r\n",                     // bare LF
		"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",              // bare CR
		"GET / HTTP/1.1x\n" + h + "\r\n",                    // bare LF after a proto that is not
		"GET / HTTP/1.1\r\nX: 0123456789\x7fabcdef\r\n\r\n", // DEL within a word
		"GET / HTTP/1.1\r\nX: a\nHost: h\r\n\r\n",           // bare LF, which net/http takes
		"GET / HTTP/1.1\r\n" + h + "X: a\r\n b\r\n\r\n",     // obs-fold
		"GET / HTTP/1.1\r\n X: a\r\n" + h + "\r\n",          // first line folded
		"POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.0\r\n" + h + "transfer-encoding: gzip\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "Trailer: X\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "Pragma: no-cache\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "Host: h\r\n\r\n", // two Hosts
		"POST / HTTP/1.1\r\n" + h + "Content-Length: 1\r\nContent-Length: 1\r\n\r\nx",
		"POST / HTTP/1.1\r\n" + h + "Content-Length: +1\r\n\r\nx",
		"POST / HTTP/1.1\r\n" + h + "Content-Length: -1\r\n\r\nx",
		"POST / HTTP/1.1\r\n" + h + "Content-Length: \r\n\r\nx",
		"POST / HTTP/1.1\r\n" + h + "Content-Length: 1 1\r\n\r\nx",
		"POST / HTTP/1.1\r\n" + h + "Content-Length: 1234567890123456789\r\n\r\nx",
		"GET / HTTP/2.0\r\n" + h + "\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\n" + h + "\r\n",
		"GET http://h/ HTTP/1.1\r\n" + h + "\r\n",
		"CONNECT h:443 HTTP/1.1\r\n" + h + "\r\n",
		"GET //h/x HTTP/1.1\r\n" + h + "\r\n",
		"GET /%41 HTTP/1.1\r\n" + h + "\r\n",
		"GET /a#b HTTP/1.1\r\n" + h + "\r\n",
		"GET /a?b#c HTTP/1.1\r\n" + h + "\r\n",
		"GET /a(b) HTTP/1.1\r\n" + h + "\r\n",
		"GET /\xc3\xa9 HTTP/1.1\r\n" + h + "\r\n",
		"GET / HTTP/1.1\r\n" + h + "X: \xc3\xa9\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "X: a\x7f\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "X : a\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + ": a\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "X\r\n\r\n",
		"GET  / HTTP/1.1\r\n" + h + "\r\n",
		"G{T / HTTP/1.1\r\n" + h + "\r\n",
		"\r\nGET / HTTP/1.1\r\n" + h + "\r\n",
	} {
		data := []byte(raw)
		br := fastReader(t, data, len(data))
		var req http.Request
		if readRequestFast(br, &req) {
			t.Errorf("took %q", raw)
		} else if !bytes.Equal(fastPeekAll(br), data) {
			t.Errorf("refused %q but consumed from the reader", raw)
		}
		checkFast(t, fastCase{data, len(data), 5, -1})
	}
}

// TestReadRequestFastByteSets checks the byte classes against what
// they stand for: tchar is httpguts' token byte; a path byte is one that
// url.ParseRequestURI keeps in Path without setting RawPath; and the
// interned names are canonical, and include those readRequestFast must
// recognise.
func TestReadRequestFastByteSets(t *testing.T) {
	for c := range 256 {
		b := byte(c)
		is := func(class uint8) bool { return byteClass[b]&class != 0 }
		if got, want := is(classTchar), httpguts.ValidHeaderFieldName(string(b)); got != want {
			t.Errorf("tchar %q: %v, want %v", b, got, want)
		}
		if is(classPath) {
			p := "/a" + string(b) + "b"
			u, err := url.ParseRequestURI(p)
			if err != nil || u.Path != p || u.RawPath != "" || u.RawQuery != "" || u.ForceQuery {
				t.Errorf("path byte %q: ParseRequestURI(%q) = %+v, %v", b, p, u, err)
			}
		}
		if is(classValue) != (b == '\t' || ' ' <= b && b < 0x7f) {
			t.Errorf("value byte %q: %v", b, is(classValue))
		}
		if is(classQuery) != (' ' < b && b < 0x7f && b != '#') {
			t.Errorf("query byte %q: %v", b, is(classQuery))
		}
	}
	for _, k := range []string{"Host", "Content-Length", "Transfer-Encoding", "Trailer", "Pragma", "Connection"} {
		if id := commonHeaderID([]byte(k)); id == 0 || commonHeaderNames[id] != k {
			t.Errorf("%s is not interned, and readRequestFast must recognise it", k)
		}
	}
	if len(commonHeaderNames) > 128 {
		t.Errorf("%d interned names, at most 127", len(commonHeaderNames)-1)
	}
	for id, k := range commonHeaderNames[1:] {
		if http.CanonicalHeaderKey(k) != k || commonHeaderID([]byte(k)) != uint8(id+1) {
			t.Errorf("commonHeaderNames[%d] = %q: not canonical, or not found (%d)", id+1, k, commonHeaderID([]byte(k)))
		}
	}
	// The table stays fast: no name is far from its slot.
	for _, k := range commonHeaderNames[1:] {
		h, probes := nameHash(k), 1
		for commonHeaderNames[commonHeaderTable[h]] != k {
			h++
			probes++
		}
		if probes > 4 {
			t.Errorf("%s found after %d probes", k, probes)
		}
	}
}

// TestReadRequestFastCommonHeaderID holds the interning table to a
// linear search of the names, for names near the interned ones.
func TestReadRequestFastCommonHeaderID(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := []byte(rapid.SampledFrom(commonHeaderNames[1:]).Draw(t, "name"))
		switch rapid.IntRange(0, 3).Draw(t, "edit") {
		case 1:
			k[rapid.IntRange(0, len(k)-1).Draw(t, "at")] = rapid.SampledFrom([]byte("aZ-9x")).Draw(t, "byte")
		case 2:
			k = k[:rapid.IntRange(1, len(k)).Draw(t, "len")]
		case 3:
			k = append(k, rapid.SampledFrom([]byte("aZ-9x")).Draw(t, "byte"))
		}
		want := 0
		for id, n := range commonHeaderNames[1:] {
			if n == string(k) {
				want = id + 1
			}
		}
		if got := commonHeaderID(k); int(got) != want {
			t.Fatalf("commonHeaderID(%q) = %d, want %d", k, got, want)
		}
	})
}

// TestReadRequestFastValidValue holds validValue, eight bytes at a time,
// to the byte class it stands for.
func TestReadRequestFastValidValue(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// Mostly visible ASCII, so that the words are tested to their end.
		edges := rapid.SampledFrom([]byte{0x00, '\t', '\n', 0x1f, 0x7f, 0x80, 0xff})
		v := rapid.SliceOfN(rapid.OneOf(rapid.ByteRange(0x20, 0x7e), rapid.ByteRange(0x20, 0x7e), edges, rapid.Byte()), 0, 40).Draw(t, "v")
		if got, want := validValue(v), allIn(v, classValue); got != want {
			t.Fatalf("validValue(%q) = %v, want %v", v, got, want)
		}
	})
}

// fastBenchRequest is a request as the proxy's clients send it
// (scripts/proxyload and the OpenAI SDKs), its body 7,700 bytes.
var fastBenchRequest = func() []byte {
	const body = 7700
	h := "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: OpenAI/Python 1.54.4\r\n" +
		"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(body) + "\r\nAccept: application/json\r\n" +
		"Accept-Encoding: gzip, deflate\r\nAuthorization: Bearer sk-proj-0123456789abcdefghijklmnopqrstuvwxyz\r\n" +
		"Connection: keep-alive\r\n\r\n"
	return append([]byte(h), bytes.Repeat([]byte("x"), body)...)
}()

var fastBenchHeaderLen = bytes.Index(fastBenchRequest, []byte("\r\n\r\n")) + 4

// fastBenchSink keeps the requests of the allocation test and the
// benchmark on the heap, where a server's requests are.
var fastBenchSink *http.Request

// TestReadRequestFastAllocs holds readRequestFast to its allocation
// budget, the request itself included: the request, the string, the
// header map's two and the block of URL, body and values; for the
// OpenAI SDK's 16 names, the map's larger table takes two more.
func TestReadRequestFastAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		name   string
		data   []byte
		budget float64
	}{
		{"bench", fastBenchRequest, 5},
		{"curl", []byte(fastCurl + fastJSONBody), 5},
		{"openai", []byte(fastOpenAI + fastJSONBody), 7},
	} {
		rd := bytes.NewReader(nil)
		br := bufio.NewReaderSize(rd, fastBufSize)
		allocs := testing.AllocsPerRun(100, func() {
			rd.Reset(tc.data)
			br.Reset(rd)
			_, _ = br.Peek(len(tc.data))
			fastBenchSink = new(http.Request)
			if !readRequestFast(br, fastBenchSink) {
				t.Fatalf("%s: refused", tc.name)
			}
		})
		if allocs > tc.budget {
			t.Errorf("%s: %v allocations per request, want at most %v", tc.name, allocs, tc.budget)
		}
	}
}

// BenchmarkReadRequest compares readRequestFast (with a new
// http.Request, as a server needs one per request) with http.ReadRequest
// on the same request, its header buffered as h1Conn.scanHeader leaves
// it.
func BenchmarkReadRequest(b *testing.B) {
	rd := bytes.NewReader(nil)
	br := bufio.NewReaderSize(rd, fastBufSize)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rd.Reset(fastBenchRequest)
			br.Reset(rd)
			_, _ = br.Peek(fastBenchHeaderLen)
			fastBenchSink = new(http.Request)
			if !readRequestFast(br, fastBenchSink) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("std", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rd.Reset(fastBenchRequest)
			br.Reset(rd)
			_, _ = br.Peek(fastBenchHeaderLen)
			req, err := http.ReadRequest(br)
			if err != nil {
				b.Fatal(err)
			}
			fastBenchSink = req
		}
	})
}

// FuzzReadRequestFast holds readRequestFast to http.ReadRequest over
// mutated requests: data, of which all but the last cut bytes are
// buffered when the request is read; its body read step bytes at a time
// (0: 32 KiB), reads times before Close (negative: to its end).
func FuzzReadRequestFast(f *testing.F) {
	for _, s := range []string{fastGoClient, fastCurl, fastHttpx, fastOpenAI, fastProxyload} {
		f.Add([]byte(s+fastJSONBody+"GET /next HTTP/1.1\r\n"), uint16(0), uint8(0), int8(-1))
		f.Add([]byte(s+fastJSONBody[:5]), uint16(0), uint8(3), int8(1))
		f.Add([]byte(s+fastJSONBody[:5]), uint16(3), uint8(7), int8(-1))
	}
	f.Add([]byte(fastGet+"GET /n"), uint16(0), uint8(0), int8(-1))
	f.Add([]byte(fastGet10), uint16(0), uint8(0), int8(-1))
	f.Add([]byte(fastGoClient), uint16(20), uint8(0), int8(-1))
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
		"GET / HTTP/1.1\nHost: h\n\n",
		"GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0003\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\nabc",
		"GET / HTTP/1.1\r\nHost: h\r\nPragma: no-cache\r\n\r\n",
		"GET / HTTP/1.1\r\nhost: a\r\nHOST: b\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n",
		"GET http://h/a?b HTTP/1.1\r\nHost: x\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET //a/b HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /a%20b?c HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /a?? HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /a?b#c HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nX: \xc3\xa9\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nX: 0123456789\x7fabcdef\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nX: 0123456789\x1fabcdef\r\n\r\n",
		"GET / HTTP/1.1x\nHost: h\r\n\r\n",
		fastDups,
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(0), uint8(0), int8(-1))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16, step uint8, reads int8) {
		if len(data) > 8<<10 {
			return
		}
		c := fastCase{data: data, buffered: len(data) - min(int(cut), len(data)), step: int(step), reads: max(int(reads), -1)}
		if step == 0 {
			c.step = 32 << 10
		}
		checkFast(t, c)
	})
}

// TestReadRequestFastEdges holds the parser to ReadRequest at its limits:
// every interned name in three cases, Connection tokens for both
// versions, Content-Length spellings, 0 to 34 header lines with and
// without repeats (around the 8 and 16 value blocks and the 32 line
// limit), names of 128 and 129 bytes, and odd targets and values.
func TestReadRequestFastEdges(t *testing.T) {
	var cases []string
	const host = "Host: h\r\n"
	for _, n := range commonHeaderNames[1:] {
		for _, v := range []string{strings.ToLower(n), strings.ToUpper(n), n} {
			cases = append(cases,
				"POST /a HTTP/1.1\r\n"+host+v+": 1\r\nContent-Length: 3\r\n\r\nabcGET",
				"POST /a HTTP/1.0\r\n"+v+": keep-alive\r\n"+v+": x\r\n\r\n")
		}
	}
	for _, c := range []string{"close", "keep-alive", "Keep-Alive", "keep-alive, close", "close,keep-alive",
		" keep-alive ", "upgrade, keep-alive", "keep-alive\t", "x keep-alive", "keep-alivex", ""} {
		cases = append(cases,
			"POST /a HTTP/1.0\r\nConnection: "+c+"\r\nContent-Length: 5\r\n\r\nabcdeGET /",
			"POST /a HTTP/1.1\r\n"+host+"Connection: "+c+"\r\nContent-Length: 5\r\n\r\nabcGET /",
			"POST /a HTTP/1.1\r\n"+host+"connection: x\r\nConnection: "+c+"\r\nContent-Length: 5\r\n\r\nabcdef")
	}
	for _, cl := range []string{"0", "00", "007", "000000000000000001", "999999999999999999", "1", " 3 ", "\t3\t"} {
		cases = append(cases, "POST /a HTTP/1.1\r\n"+host+"Content-Length:"+cl+"\r\n\r\nabcdefgh")
	}
	for n := 0; n <= 34; n++ {
		var repeated, distinct strings.Builder
		repeated.WriteString("GET /x?y HTTP/1.1\r\n")
		distinct.WriteString("GET /x?y HTTP/1.1\r\n")
		for i := range n {
			fmt.Fprintf(&repeated, "X-H%d: v%d\r\n", i%9, i)
			if i == n/2 {
				repeated.WriteString(host)
			}
			fmt.Fprintf(&distinct, "X-H%d: v%d\r\n", i, i)
		}
		repeated.WriteString("\r\n")
		distinct.WriteString("\r\n")
		cases = append(cases, repeated.String(), distinct.String())
	}
	cases = append(cases,
		"GET / HTTP/1.1\r\n"+strings.Repeat("a", 128)+": x\r\n\r\n",
		"GET / HTTP/1.1\r\n"+strings.Repeat("a", 129)+": x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost:\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: \t \r\n\r\n",
		"GET / HTTP/1.1\r\nX:\t\r\nx: \r\n\r\n",
		"GET /?# HTTP/1.1\r\n\r\n",
		"GET /? HTTP/1.1\r\n\r\n",
		"GET /?? HTTP/1.1\r\n\r\n",
		"GET /a?%zz HTTP/1.1\r\n\r\n",
		"GET /a?%00 HTTP/1.1\r\n\r\n",
		"GET /@:;=$&+, HTTP/1.1\r\n\r\n",
		"CONNECT /x HTTP/1.1\r\n\r\n",
		"PRI /x HTTP/1.1\r\n\r\n",
		"get / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nX:a\x00b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nab",
		"GET / HTTP/1.1\r\nTe: trailers\r\nTE: x\r\n\r\n",
		"GET / HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nX-a: 3\r\nAccept: 1\r\nACCEPT: 2\r\n\r\n",
	)
	took := 0
	for _, c := range cases {
		d := []byte(c)
		for _, step := range []int{1, 3, 64} {
			for _, reads := range []int{-1, 0, 1, 2} {
				for _, cut := range []int{0, 1, 3} {
					if cut <= len(d) && checkFast(t, fastCase{d, len(d) - cut, step, reads}) {
						took++
					}
				}
			}
		}
	}
	if took == 0 {
		t.Fatal("the parser took none of the cases")
	}
}

// errAfterReader gives its parts in turn, the last together with err.
type errAfterReader struct {
	parts [][]byte
	err   error
}

func (r *errAfterReader) Read(p []byte) (int, error) {
	if len(r.parts) == 0 {
		return 0, r.err
	}
	n := copy(p, r.parts[0])
	r.parts[0] = r.parts[0][n:]
	if len(r.parts[0]) == 0 {
		r.parts = r.parts[1:]
	}
	if len(r.parts) == 0 {
		return n, r.err
	}
	return n, nil
}

// TestReadRequestFastBodyErrors reads bodies whose connection ends (EOF,
// a deadline, another error) with the last bytes, as ReadRequest's body.
func TestReadRequestFastBodyErrors(t *testing.T) {
	hdr := []byte("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n")
	for _, end := range []error{io.EOF, os.ErrDeadlineExceeded, errors.New("reset")} {
		for _, body := range []string{"", "abc", "abcdefghij", "abcdefghijGET"} {
			for _, step := range []int{1, 4, 4096} {
				open := func() *bufio.Reader {
					br := bufio.NewReaderSize(&errAfterReader{parts: [][]byte{hdr, []byte(body)}, err: end}, 64)
					if _, err := br.Peek(len(hdr)); err != nil {
						t.Fatal(err)
					}
					return br
				}
				var got http.Request
				if !readRequestFast(open(), &got) {
					t.Fatal("refused")
				}
				want, err := http.ReadRequest(open())
				if err != nil {
					t.Fatal(err)
				}
				gp, wp := make([]byte, step), make([]byte, step)
				for i := range 20 {
					gn, ge := got.Body.Read(gp)
					wn, we := want.Body.Read(wp)
					if gn != wn || string(gp[:gn]) != string(wp[:wn]) || !fastSameErr(ge, we) {
						t.Fatalf("%v %q step %d read %d: %d %v, want %d %v", end, body, step, i, gn, ge, wn, we)
					}
				}
				if ge, we := got.Body.Close(), want.Body.Close(); !fastSameErr(ge, we) {
					t.Fatalf("%v %q step %d: Close %v, want %v", end, body, step, ge, we)
				}
			}
		}
	}
}

// TestReadRequestFastBodyConcurrent reads a body from four goroutines
// while it is closed: each byte is read once, and the next request stays.
func TestReadRequestFastBodyConcurrent(t *testing.T) {
	const head = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n"
	data := append([]byte(head), make([]byte, 100000)...)
	data = append(data, "GET /next HTTP/1.1\r\n"...)
	br := fastReader(t, data, len(head))
	var req http.Request
	if !readRequestFast(br, &req) {
		t.Fatal("refused")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			p := make([]byte, 7)
			for {
				if _, err := req.Body.Read(p); err != nil {
					return
				}
			}
		})
	}
	if err := req.Body.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if rest, _ := io.ReadAll(br); string(rest) != "GET /next HTTP/1.1\r\n" {
		t.Fatalf("left %q", rest)
	}
}

// TestReadRequestFastHeaderAppendIsolated: each name's values share one
// array, so each slice is capped; appending to one never writes another.
func TestReadRequestFastHeaderAppendIsolated(t *testing.T) {
	data := []byte("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n")
	var req http.Request
	if !readRequestFast(fastReader(t, data, len(data)), &req) {
		t.Fatal("refused")
	}
	_ = append(req.Header["A"], "a2")
	_ = append(req.Header["B"], "b2")
	if a, b, c := req.Header.Get("A"), req.Header.Get("B"), req.Header.Get("C"); a != "1" || b != "2" || c != "3" {
		t.Fatalf("after appends A %q B %q C %q, want 1 2 3", a, b, c)
	}
}
