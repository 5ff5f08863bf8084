package regional

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// A pod's answer is read with http.ReadResponse, which costs about 6% of
// the controller's CPU per proxied request at 3,000 req/s (a CPU profile,
// docs/perf/proxy-tail.md) and a sixth of the bytes it allocates: a
// textproto reader, the status line, a transfer reader, a limited reader,
// the body, and each header value as a string of its own. The common
// answer is read here instead, straight from the bytes already buffered:
// one string for the whole header, the values cut from it. What it gives
// is what ReadResponse gives for the same bytes (TestFastResponseLike
// ReadResponse and FuzzFastResponse, field by field and byte by byte of
// the body, with ReadResponse as the reference); anything else is left to
// ReadResponse, untouched.
//
// The common answer: HTTP/1.1, a final status of 200-599 other than 204
// and 304, to a GET or POST, its whole header buffered, with CRLF line
// ends, no folded lines, names of token characters and values of the
// bytes textproto allows, and exactly one Content-Length of digits; no
// Transfer-Encoding, Connection, Trailer or Pragma header (ReadResponse
// changes the header map for those). A streamed answer (chunked) goes to
// ReadResponse.

// fastResponse reads the answer to req at the head of br when it is of
// the common kind, and reports whether it did; when it did not, br is as
// it was.
func fastResponse(br *bufio.Reader, req *http.Request) (*http.Response, bool) {
	if req == nil || req.Method != http.MethodPost && req.Method != http.MethodGet {
		return nil, false
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false
	}
	head := buf[:end+2] // each line with its CRLF
	// Status line: "HTTP/1.1 ddd" and an optional reason.
	const proto = "HTTP/1.1 "
	if !bytes.HasPrefix(head, []byte(proto)) || len(head) < len(proto)+3+2 {
		return nil, false
	}
	code := 0
	for _, c := range head[len(proto) : len(proto)+3] {
		if c < '0' || c > '9' {
			return nil, false
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil, false
	}
	eol := bytes.IndexByte(head, '\n')
	status := head[len(proto) : eol-1]
	if head[eol-1] != '\r' || len(status) > 3 && status[3] != ' ' {
		return nil, false
	}
	for _, c := range status {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return nil, false
		}
	}
	// The header lines: counted and checked first, so that nothing is
	// allocated for an answer left to ReadResponse.
	lines := head[eol+1:]
	n, lengths := 0, 0
	var length []byte
	for rest := lines; len(rest) > 0; n++ {
		i := bytes.IndexByte(rest, '\n')
		line := rest[:i]
		rest = rest[i+1:]
		if len(line) == 0 || line[len(line)-1] != '\r' {
			return nil, false
		}
		line = line[:len(line)-1]
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || !httpguts.ValidHeaderFieldName(string(k)) {
			return nil, false
		}
		for _, c := range v {
			if c < 0x20 && c != '\t' || c == 0x7f {
				return nil, false
			}
		}
		// k is a token (checked above): ASCII, so EqualFold's Unicode
		// folding is ASCII's.
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			lengths++
			length = bytes.Trim(v, " \t")
		case bytes.EqualFold(k, []byte("Transfer-Encoding")), bytes.EqualFold(k, []byte("Connection")),
			bytes.EqualFold(k, []byte("Trailer")), bytes.EqualFold(k, []byte("Pragma")):
			return nil, false
		}
	}
	if lengths != 1 || len(length) == 0 || len(length) > 18 {
		return nil, false
	}
	var cl int64
	for _, c := range length {
		if c < '0' || c > '9' {
			return nil, false
		}
		cl = cl*10 + int64(c-'0')
	}

	// The answer: its header's text copied once, every string cut from it.
	text := string(head)
	resp := &http.Response{
		Status: text[len(proto) : eol-1], StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        make(http.Header, n),
		ContentLength: cl,
		Request:       req,
	}
	values := make([]string, n) // one each, as textproto does
	for rest, at := text[eol+1:], 0; len(rest) > 0; at++ {
		i := strings.IndexByte(rest, '\n')
		line := rest[:i-1]
		rest = rest[i+1:]
		k, v, _ := strings.Cut(line, ":")
		k = http.CanonicalHeaderKey(k)
		v = strings.Trim(v, " \t")
		if vv := resp.Header[k]; vv != nil {
			resp.Header[k] = append(vv, v)
		} else {
			values[at] = v
			resp.Header[k] = values[at : at+1 : at+1]
		}
	}
	_, _ = br.Discard(end + 4)
	if cl == 0 {
		resp.Body = http.NoBody
	} else {
		resp.Body = &lengthBody{r: br, n: cl}
	}
	return resp, true
}

// lengthBody is the body of an answer of n bytes, read as net/http's
// response body reads one: io.EOF with the last bytes, io.ErrUnexpectedEOF
// when the connection ends early, http.ErrBodyReadAfterClose after Close,
// and Close reading what is left (the connection can then carry the
// next answer).
type lengthBody struct {
	r      *bufio.Reader
	n      int64 // bytes left
	eof    bool  // read to its end, or past the connection's
	closed bool
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.eof {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	switch {
	case err == io.EOF:
		b.eof = true
		if b.n > 0 {
			err = io.ErrUnexpectedEOF
		}
	case err == nil && b.n == 0:
		b.eof, err = true, io.EOF
	}
	return n, err
}

func (b *lengthBody) Close() error {
	if b.closed {
		return nil
	}
	var err error
	if !b.eof {
		_, err = io.Copy(io.Discard, b)
	}
	b.closed = true
	return err
}
