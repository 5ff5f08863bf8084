// Command proxyload is the two ends of scripts/proxy-vs-nginx: a backend
// that answers OpenAI chat requests at once, and an open-loop load
// generator that measures what a proxy in front of it adds.
//
//	go run ./scripts/proxyload backend -addr 127.0.0.1:9100
//	go run ./scripts/proxyload drive -direct URL -target nginx=URL -target meridian=URL
//	go run ./scripts/proxyload drive -direct URL -target a=URL -target b=URL -rate 3000 -alternate 500ms -slice-warmup 100ms
//
// drive sends chat requests whose system prompt is about 2,000 tokens (the
// question differs each time) on one fixed-rate schedule, open loop: each
// request is due at start + i/rate and its latency counts from then, so a
// proxy that falls behind pays for the queue it builds (no coordinated
// omission). Each request goes at random either straight to the backend
// or through the target, so both distributions are taken in the same
// seconds of the machine; added pXX = pXX(through the target) - pXX(direct).
// A rate's window lasts until each arm has -samples requests, and the
// added p99 comes with a bootstrap 95% confidence interval (resampling
// rounds of -block, both arms' samples of a round together: see
// estimateAdded): the rate is
// sustained when the interval's upper bound is at most -max-added, not
// when its lower bound is above it, and measured again (pooled, at most
// -tries windows) when the interval holds -max-added. A window in which
// the pacer took up more than -max-late of its requests over a
// millisecond after they were due is invalid, neither a pass nor a fail;
// a goroutine's wait for a CPU after that (the machine busy with the
// proxy and the backend, which both arms carry) is not held against it
// (see pacerLate in judge.go). drive does that at -rate, then searches
// for the highest rate that passes (see search in judge.go), and prints
// one JSON line per target.
//
// With -alternate D, drive compares its targets at -rate instead (A/B of
// two builds): one run whose proxied arm goes to each target in turn for
// D, a line per target and one per pair giving the difference of their
// added p50 and p99 with a confidence interval from resampling whole
// rounds of slices (see compare.go): a stall slows a run of requests
// together, and resampling single requests made two copies of one build
// look 530 us apart at p99.
//
// Both ends are cheap so that they do not cap what a proxy can be shown
// to sustain: raw HTTP/1.1 on kept-alive connections, requests serialized
// into reused buffers, no net/http client or server (driving the backend
// alone, they took 400 us of CPU per request together with net/http and
// take about 175 us without).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: proxyload backend|drive [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "backend":
		err = backend(os.Args[2:])
	case "drive":
		err = drive(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want backend or drive", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxyload:", err)
		os.Exit(1)
	}
}

// backend serves POST /v1/chat/completions (one JSON answer, or with
// "stream":true 16 flushed server-sent events), GET /metrics and GET
// /health, each at once. It speaks just enough HTTP/1.1 for the proxies
// and the load generator (keep-alive, Content-Length or chunked request
// bodies, Expect: 100-continue), one goroutine per connection reading and
// answering in turn: net/http's server cost 160 us of CPU per request
// here, as much as a proxy, and capped what the machine could offer.
func backend(args []string) error {
	fs := flag.NewFlagSet("backend", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:9100", "listen address")
	_ = fs.Parse(args)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	return serve(ln)
}

// serve answers each connection ln accepts, until it fails.
func serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveConn(c)
	}
}

var (
	chatAnswer    = httpAnswer("application/json", `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":2048,"completion_tokens":2}}`)
	metricsAnswer = httpAnswer("text/plain; version=0.0.4", "vllm:kv_cache_usage_perc 0\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
	healthAnswer  = httpAnswer("text/plain", "")
	notFound      = []byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	streamHead    = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	streamEvent   = chunk(`data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}` + "\n\n")
	streamEnd     = append(chunk("data: [DONE]\n\n"), "0\r\n\r\n"...)
)

func httpAnswer(ctype, body string) []byte {
	return []byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", ctype, len(body), body))
}

func chunk(s string) []byte { return []byte(fmt.Sprintf("%x\r\n%s\r\n", len(s), s)) }

// serveConn answers the requests of one connection until it closes or
// sends something this backend does not understand.
func serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	var body, out []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		method, rest, _ := strings.Cut(string(line), " ")
		path, _, _ := strings.Cut(rest, " ")
		length, chunked, closing, expect := int64(0), false, false, false
		for {
			k, v, end, err := headerLine(br)
			if err != nil {
				return
			}
			if end {
				break
			}
			switch {
			case bytes.EqualFold(k, []byte("Content-Length")):
				if length, err = strconv.ParseInt(string(v), 10, 64); err != nil || length < 0 {
					return
				}
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				chunked = bytes.EqualFold(v, []byte("chunked"))
			case bytes.EqualFold(k, []byte("Connection")):
				closing = bytes.EqualFold(v, []byte("close"))
			case bytes.EqualFold(k, []byte("Expect")):
				expect = bytes.EqualFold(v, []byte("100-continue"))
			}
		}
		if expect {
			if _, err := c.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
				return
			}
		}
		if body, err = readRequestBody(br, body[:0], length, chunked); err != nil {
			return
		}
		switch {
		case method == "POST" && path == "/v1/chat/completions" && bytes.Contains(body, []byte(`"stream":true`)):
			// Each event flushed on its own, as a streaming engine sends
			// them; the last with the end of the answer.
			out = append(append(out[:0], streamHead...), streamEvent...)
			for i := 0; i < 16 && err == nil; i++ {
				_, err = c.Write(out)
				out = append(out[:0], streamEvent...)
			}
			if err == nil {
				_, err = c.Write(streamEnd)
			}
		case method == "POST" && path == "/v1/chat/completions":
			_, err = c.Write(chatAnswer)
		case method == "GET" && path == "/metrics":
			_, err = c.Write(metricsAnswer)
		case method == "GET" && path == "/health":
			_, err = c.Write(healthAnswer)
		default:
			_, err = c.Write(notFound)
		}
		if err != nil || closing {
			return
		}
	}
}

// readRequestBody appends a request's body (length bytes, or chunked) to
// buf.
func readRequestBody(br *bufio.Reader, buf []byte, length int64, chunked bool) ([]byte, error) {
	if !chunked {
		buf = slices.Grow(buf, int(length))[:length]
		_, err := io.ReadFull(br, buf)
		return buf, err
	}
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return buf, err
		}
		size, _, _ := strings.Cut(strings.TrimSpace(string(line)), ";")
		n, err := strconv.ParseInt(size, 16, 64)
		if err != nil || n < 0 {
			return buf, fmt.Errorf("chunk size %q", size)
		}
		if n == 0 {
			for { // trailers, then the empty line
				if line, err = br.ReadSlice('\n'); err != nil || len(bytes.TrimSpace(line)) == 0 {
					return buf, err
				}
			}
		}
		at := len(buf)
		buf = slices.Grow(buf, int(n))[:at+int(n)]
		if _, err := io.ReadFull(br, buf[at:]); err != nil {
			return buf, err
		}
		if _, err := br.Discard(2); err != nil {
			return buf, err
		}
	}
}

// chatBody appends request n to dst: a system prompt of about 2,000
// common words (one token each), the same every time, and question n.
func chatBody(stream bool) func(dst []byte, n int) []byte {
	rng := rand.New(rand.NewPCG(7, 8))
	words := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which")
	var sb strings.Builder
	sb.WriteString("You are a helpful assistant.")
	for i := 0; i < 2000; i++ {
		sb.WriteByte(' ')
		sb.WriteString(words[rng.IntN(len(words))])
	}
	head := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"system","content":%q},{"role":"user","content":"Question `, stream, sb.String())
	return func(dst []byte, n int) []byte {
		dst = strconv.AppendInt(append(dst, head...), int64(n), 10)
		return append(dst, `: what is the capital of France?"}]}`...)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// headerLine reads one header line of an HTTP/1.1 message from br: its
// name and trimmed value (valid until br's next read), or end at the blank
// line that ends the header.
func headerLine(br *bufio.Reader) (k, v []byte, end bool, err error) {
	h, err := br.ReadSlice('\n')
	if err != nil {
		return nil, nil, false, err
	}
	h = bytes.TrimRight(h, "\r\n")
	if len(h) == 0 {
		return nil, nil, true, nil
	}
	k, v, _ = bytes.Cut(h, []byte(":"))
	return k, bytes.TrimSpace(v), false, nil
}
