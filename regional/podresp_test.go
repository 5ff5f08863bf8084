package regional

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// genResponse writes a pod's answer from parts drawn at random: most of
// the kind fastResponse reads, and each of the ways out of it (other
// versions and statuses, folded and bare-LF lines, bad names and values,
// missing, repeated or malformed lengths, chunked bodies, the headers
// ReadResponse rewrites), with bodies cut short or followed by more.
func genResponse(rng *rand.Rand) []byte {
	pick := func(p float64) bool { return rng.Float64() < p }
	one := func(v ...string) string { return v[rng.IntN(len(v))] }
	var b strings.Builder
	eol := "\r\n"
	lineEnd := func() string {
		if pick(0.02) {
			return "\n"
		}
		return eol
	}
	proto := "HTTP/1.1"
	if pick(0.1) {
		proto = one("HTTP/1.0", "HTTP/2.0", "HTTP/1.1 ", "HTTP/1", "http/1.1")
	}
	code := "200"
	if pick(0.3) {
		code = one("201", "204", "206", "304", "400", "404", "429", "500", "503", "599", "100", "101", "199", "600", "099", "20", "2000", "abc")
	}
	reason := " OK"
	if pick(0.2) {
		reason = one("", " Not Found", "  x", "\tx", " r\x01", " caf\xc3\xa9", " OK  ", "OK", " \x7f")
	}
	b.WriteString(proto + " " + code + reason + lineEnd())
	body := `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."}}]}`
	if pick(0.1) {
		body = strings.Repeat("0123456789", rng.IntN(2000))
	}
	if pick(0.05) {
		body = ""
	}
	names := []string{"Content-Type", "content-type", "X-Request-Id", "date", "Server", "x-a", "X-Weird_Name!", "Bad Name", "", " Leading", "Key ", "caf\xc3\xa9", "X-Dup", "x-dup"}
	values := []string{"application/json", " spaced ", "\tx\t", "", "a\x01b", "caf\xc3\xa9", "a\x7fb", "a\rb", "v", "a, b"}
	headers := []string{}
	for range rng.IntN(6) {
		name := names[rng.IntN(4)]
		if pick(0.2) {
			name = names[rng.IntN(len(names))]
		}
		value := values[0]
		if pick(0.3) {
			value = values[rng.IntN(len(values))]
		}
		headers = append(headers, name+":"+one(" ", "", "  ", "\t")+value)
	}
	chunked := false
	switch {
	case pick(0.05):
		headers = append(headers, "Transfer-Encoding: "+one("chunked", "gzip", "Chunked"))
		chunked = true
	case pick(0.05): // no length
	default:
		n := strconv.Itoa(len(body))
		switch {
		case pick(0.03):
			headers = append(headers, "Content-Length: "+n, "Content-Length: "+n)
		case pick(0.03):
			headers = append(headers, "Content-Length: "+n, "content-length: 1"+n)
		case pick(0.03):
			headers = append(headers, "Content-Length: "+one("-1", "abc", "", " ", "1 2", "+5", "0x10", "99999999999999999999"))
		case pick(0.05):
			headers = append(headers, one("content-length", "CONTENT-LENGTH")+":"+one(" ", "  ", "\t")+"00"+n+one("", " ", "\t"))
		default:
			headers = append(headers, "Content-Length: "+n)
		}
	}
	if pick(0.03) {
		headers = append(headers, one("Connection: close", "Connection: keep-alive", "Pragma: no-cache", "Trailer: X-T", "Keep-Alive: timeout=5"))
	}
	rng.Shuffle(len(headers), func(i, j int) { headers[i], headers[j] = headers[j], headers[i] })
	for i, h := range headers {
		b.WriteString(h + lineEnd())
		if pick(0.01) && i == 0 {
			b.WriteString(" folded" + eol)
		}
	}
	b.WriteString(eol)
	if chunked {
		for rest := body; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(500))
			fmt.Fprintf(&b, "%x\r\n%s\r\n", k, rest[:k])
			rest = rest[k:]
		}
		b.WriteString("0\r\n\r\n")
	} else {
		switch {
		case pick(0.05) && len(body) > 0:
			body = body[:rng.IntN(len(body))] // the connection ends early
		case pick(0.1):
			body += "HTTP/1.1 200 OK\r\n" // the next answer
		}
		b.WriteString(body)
	}
	return []byte(b.String())
}

// readOp is one read of a body: what it gave.
type readOp struct {
	n   int
	err error
}

// readAll reads body in reads of the sizes sizes gives, to its end or an
// error, and returns each read.
func readAll(body io.Reader, sizes *rand.Rand) (ops []readOp, data []byte) {
	for range 100000 {
		p := make([]byte, sizes.IntN(3000))
		n, err := body.Read(p)
		ops = append(ops, readOp{n, err})
		data = append(data, p[:n]...)
		if err != nil {
			return ops, data
		}
	}
	return ops, data
}

// compareWithReadResponse reads raw with fastResponse, answering a
// request of method; where it reads it, everything must be as
// ReadResponse reads it: the fields, the header map, each read of the
// body (sizes from seed), Close, and the bytes left for the next answer.
// Where it does not, nothing may have been consumed. It reports whether
// the fast path read it.
func compareWithReadResponse(t *testing.T, raw []byte, method string, seed uint64, closeFirst bool) bool {
	t.Helper()
	req := &http.Request{Method: method}
	br := bufio.NewReaderSize(bytes.NewReader(raw), 4<<10)
	_, _ = br.Peek(1) // as readResponse does
	before, _ := br.Peek(br.Buffered())
	before = bytes.Clone(before)
	resp, ok := fastResponse(br, req)
	if !ok {
		if after, _ := br.Peek(br.Buffered()); !bytes.Equal(after, before) {
			t.Fatalf("%q: left to ReadResponse, but the reader moved", raw)
		}
		return false
	}
	refBr := bufio.NewReaderSize(bytes.NewReader(raw), 4<<10)
	ref, err := http.ReadResponse(refBr, req)
	if err != nil {
		t.Fatalf("%q: read fast, but ReadResponse refuses it: %v", raw, err)
	}
	type fields struct {
		Status                      string
		StatusCode, Major, Minor    int
		Proto                       string
		Header, Trailer             http.Header
		ContentLength               int64
		TransferEncoding            []string
		Close, Uncompressed, NoBody bool
		SameRequest                 bool
	}
	of := func(r *http.Response) fields {
		return fields{r.Status, r.StatusCode, r.ProtoMajor, r.ProtoMinor, r.Proto, r.Header, r.Trailer, r.ContentLength,
			r.TransferEncoding, r.Close, r.Uncompressed, r.Body == http.NoBody, r.Request == req}
	}
	if got, want := of(resp), of(ref); !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\nfast       %+v\nReadResponse %+v", raw, got, want)
	}
	var gotOps, wantOps []readOp
	var got, want []byte
	if !closeFirst {
		gotOps, got = readAll(resp.Body, rand.New(rand.NewPCG(seed, 1)))
		wantOps, want = readAll(ref.Body, rand.New(rand.NewPCG(seed, 1)))
	}
	gotClose, wantClose := resp.Body.Close(), ref.Body.Close()
	gotAfter, gotAfterErr := resp.Body.Read(make([]byte, 8))
	wantAfter, wantAfterErr := ref.Body.Read(make([]byte, 8))
	gotRest, _ := io.ReadAll(br)
	wantRest, _ := io.ReadAll(refBr)
	switch {
	case !reflect.DeepEqual(gotOps, wantOps) || !bytes.Equal(got, want):
		t.Fatalf("%q: body reads %v, ReadResponse's %v", raw, gotOps, wantOps)
	case !sameErr(gotClose, wantClose):
		t.Fatalf("%q: Close %v, ReadResponse's body %v", raw, gotClose, wantClose)
	case gotAfter != wantAfter || !sameErr(gotAfterErr, wantAfterErr):
		t.Fatalf("%q: read after Close %d %v, ReadResponse's body %d %v", raw, gotAfter, gotAfterErr, wantAfter, wantAfterErr)
	case !bytes.Equal(gotRest, wantRest):
		t.Fatalf("%q: left for the next answer %q, ReadResponse left %q", raw, gotRest, wantRest)
	}
	return true
}

// sameErr: both nil, or the same error (by identity, or by message for
// errors made anew each time).
func sameErr(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return errors.Is(a, b) || a.Error() == b.Error()
}

// The fast path reads what ReadResponse reads, as ReadResponse reads it,
// over thousands of answers drawn from genResponse; and it reads most of
// the common ones.
func TestFastResponseLikeReadResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	fast, all := 0, 20000
	for i := range all {
		raw := genResponse(rng)
		method := http.MethodPost
		if rng.IntN(10) == 0 {
			method = []string{http.MethodGet, http.MethodHead, http.MethodPut}[rng.IntN(3)]
		}
		if compareWithReadResponse(t, raw, method, uint64(i), rng.IntN(5) == 0) {
			fast++
		}
	}
	t.Logf("%d of %d answers read fast", fast, all)
	if fast < all/4 {
		t.Fatalf("only %d of %d answers read fast: the test no longer exercises the fast path", fast, all)
	}
	// The harness backend's answer and a typical engine's, lower-case names
	// included, are read fast.
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}",
		"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
	} {
		if !compareWithReadResponse(t, []byte(raw), http.MethodPost, 1, false) {
			t.Errorf("%q was left to ReadResponse", raw)
		}
	}
}

func FuzzFastResponse(f *testing.F) {
	rng := rand.New(rand.NewPCG(13, 14))
	for range 50 {
		f.Add(genResponse(rng), false, uint64(1))
	}
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), true, uint64(2))
	f.Fuzz(func(t *testing.T, raw []byte, closeFirst bool, seed uint64) {
		compareWithReadResponse(t, raw, http.MethodPost, seed, closeFirst)
	})
}

// BenchmarkReadAnswer reads the harness backend's answer (scripts/proxyload)
// with the fast path and with http.ReadResponse, body included.
func BenchmarkReadAnswer(b *testing.B) {
	raw := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 167\r\n\r\n" +
		`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":2048,"completion_tokens":2}}`)
	req := &http.Request{Method: http.MethodPost}
	for _, fast := range []bool{true, false} {
		b.Run(fmt.Sprintf("fast=%v", fast), func(b *testing.B) {
			r := bytes.NewReader(raw)
			br := bufio.NewReaderSize(r, 4<<10)
			buf := make([]byte, 512)
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(raw)
				br.Reset(r)
				_, _ = br.Peek(1)
				var resp *http.Response
				if fast {
					var ok bool
					if resp, ok = fastResponse(br, req); !ok {
						b.Fatal("not read fast")
					}
				} else {
					var err error
					if resp, err = http.ReadResponse(br, req); err != nil {
						b.Fatal(err)
					}
				}
				for {
					if _, err := resp.Body.Read(buf); err != nil {
						break
					}
				}
				resp.Body.Close()
			}
		})
	}
}
