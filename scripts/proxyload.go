//go:build ignore

// Command proxyload is the two ends of scripts/proxy-vs-nginx: a backend
// that answers OpenAI chat requests at once, and an open-loop load
// generator that measures what a proxy in front of it adds.
//
//	go run ./scripts/proxyload.go backend -addr 127.0.0.1:9100
//	go run ./scripts/proxyload.go drive -direct URL -target nginx=URL -target meridian=URL
//
// drive sends chat requests whose system prompt is about 2,000 tokens (the
// question differs each time) at a fixed rate, open loop: each request is
// due at start + i/rate and its latency counts from then, so a proxy that
// falls behind pays for the queue it builds (no coordinated omission). For
// each target it measures the backend alone and through the target, at
// the same rate, in alternating quarter-second slices, and takes the
// difference of the percentiles as what the target adds. It does that at -rate, then looks
// for the highest rate the target sustains: at least 95% of the requests
// offered completed within the phase, and p99 added at most -max-added.
// It prints one JSON line per target.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
// /health, each at once.
func backend(args []string) error {
	fs := flag.NewFlagSet("backend", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:9100", "listen address")
	_ = fs.Parse(args)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":2048,"completion_tokens":2}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl, _ := w.(http.Flusher)
		for i := 0; i < 16; i++ {
			_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}`+"\n\n")
			if fl != nil {
				fl.Flush()
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "vllm:kv_cache_usage_perc 0\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	return http.ListenAndServe(*addr, mux)
}

type targets []string

func (t *targets) String() string     { return strings.Join(*t, ",") }
func (t *targets) Set(v string) error { *t = append(*t, v); return nil }

// result is one JSON line of drive's output.
type result struct {
	Proxy        string  `json:"proxy"`
	RPS          float64 `json:"rps"`
	AddedP50us   float64 `json:"added_p50_us"`
	AddedP99us   float64 `json:"added_p99_us"`
	MaxRPS       float64 `json:"max_rps"`
	P50us        float64 `json:"p50_us"`
	P99us        float64 `json:"p99_us"`
	DirectP50us  float64 `json:"direct_p50_us"`
	DirectP99us  float64 `json:"direct_p99_us"`
	AtMaxAdded99 float64 `json:"added_p99_us_at_max"`
	Stream       bool    `json:"stream"`
	Load         string  `json:"load"`
}

func drive(args []string) error {
	fs := flag.NewFlagSet("drive", flag.ExitOnError)
	direct := fs.String("direct", "", "URL of the backend's chat endpoint (required)")
	var tgts targets
	fs.Var(&tgts, "target", "NAME=URL of a proxy's chat endpoint (repeat)")
	rate := fs.Float64("rate", 1000, "requests per second of the fixed-rate measurement")
	phase := fs.Duration("phase", 3*time.Second, "length of each measured phase")
	maxAdded := fs.Duration("max-added", time.Millisecond, "p99 added that still counts as sustained")
	maxRate := fs.Float64("max-rate", 40000, "highest rate tried")
	stream := fs.Bool("stream", false, "ask for streamed answers")
	header := fs.String("header", "", "NAME:VALUE header sent to the targets (not the backend)")
	cacert := fs.String("cacert", "", "PEM file of the CA that https targets' certificates chain to")
	workers := fs.Int("workers", 256, "requests in flight at most")
	_ = fs.Parse(args)
	if *direct == "" || len(tgts) == 0 {
		return errors.New("drive: -direct and at least one -target are required")
	}
	tr := &http.Transport{MaxIdleConns: *workers, MaxIdleConnsPerHost: *workers, DisableCompression: true, IdleConnTimeout: time.Minute}
	if *cacert != "" {
		pem, err := os.ReadFile(*cacert)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s: no certificate", *cacert)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	d := &driver{client: &http.Client{Transport: tr}, body: chatBody(*stream), workers: *workers, phase: *phase}
	if *header != "" {
		k, v, ok := strings.Cut(*header, ":")
		if !ok {
			return fmt.Errorf("-header %q: want NAME:VALUE", *header)
		}
		d.hdrKey, d.hdrVal = strings.TrimSpace(k), strings.TrimSpace(v)
	}
	for _, t := range tgts {
		name, url, ok := strings.Cut(t, "=")
		if !ok {
			return fmt.Errorf("-target %q: want NAME=URL", t)
		}
		if err := d.check(*direct, false); err != nil {
			return fmt.Errorf("backend: %w", err)
		}
		if err := d.check(url, true); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		res := result{Proxy: name, RPS: *rate, Stream: *stream}
		base, via := d.pair(*direct, url, *rate)
		res.DirectP50us, res.DirectP99us = us(base.p50), us(base.p99)
		res.P50us, res.P99us = us(via.p50), us(via.p99)
		res.AddedP50us, res.AddedP99us = us(via.p50-base.p50), us(via.p99-base.p99)
		// The highest sustained rate: up by half while sustained, then
		// halve the gap three times.
		ok1 := func(r float64) (bool, time.Duration) {
			b, v := d.pair(*direct, url, r)
			added := v.p99 - b.p99
			fmt.Fprintf(os.Stderr, "proxyload: %s at %.0f req/s: completed %.0f%%, added p50 %v p99 %v\n",
				name, r, 100*v.completed, v.p50-b.p50, added)
			return v.completed >= 0.95 && added <= *maxAdded, added
		}
		lo, hi := 0.0, 0.0
		var loAdded time.Duration
		for r := *rate; r <= *maxRate; r *= 1.5 {
			good, added := ok1(r)
			if !good {
				hi = r
				break
			}
			lo, loAdded = r, added
		}
		for i := 0; i < 3 && hi > 0 && lo > 0; i++ {
			mid := (lo + hi) / 2
			if good, added := ok1(mid); good {
				lo, loAdded = mid, added
			} else {
				hi = mid
			}
		}
		res.MaxRPS, res.AtMaxAdded99 = lo, us(loAdded)
		res.Load = loadavg()
		line, _ := json.Marshal(res)
		fmt.Println(string(line))
	}
	return nil
}

type driver struct {
	client         *http.Client
	body           func(n int) []byte
	hdrKey, hdrVal string
	workers        int
	phase          time.Duration
	seq            atomic.Int64
}

// stats of one side of a measurement: latency percentiles from each
// request's due time, and the share of the requests offered that
// completed (within their slice, plus a grace of a tenth of it and 1 s).
type stats struct {
	p50, p99  time.Duration
	completed float64
}

// slice is how long pair offers load to one side before switching.
const slice = 250 * time.Millisecond

// pair measures the backend alone and through the target at rate, in
// alternating slices of a quarter second (after a warm-up of each), so
// that both see the same moments of a busy machine: the difference of
// their percentiles is then the target's, not the machine's.
func (d *driver) pair(direct, target string, rate float64) (base, via stats) {
	d.run(direct, false, rate, slice)
	d.run(target, true, rate, slice)
	var bl, vl []time.Duration
	var bn, vn int
	for t := time.Duration(0); t < d.phase; t += slice {
		l, n := d.run(direct, false, rate, slice)
		bl, bn = append(bl, l...), bn+n
		l, n = d.run(target, true, rate, slice)
		vl, vn = append(vl, l...), vn+n
	}
	return summarize(bl, bn), summarize(vl, vn)
}

func summarize(lat []time.Duration, offered int) stats {
	var s stats
	if offered == 0 || len(lat) == 0 {
		return s
	}
	slices.Sort(lat)
	s.p50, s.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	// Requests that timed out or failed count as not completed.
	s.completed = float64(len(lat)) / float64(offered)
	return s
}

func (d *driver) check(url string, proxied bool) error {
	code, err := d.one(context.Background(), url, proxied)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("status %d", code)
	}
	return err
}

func (d *driver) one(ctx context.Context, url string, proxied bool) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.body(int(d.seq.Add(1)))))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if proxied && d.hdrKey != "" {
		req.Header.Set(d.hdrKey, d.hdrVal)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// run offers rate requests per second to url for length, open loop, and
// returns the latencies of those that succeeded and how many it offered.
func (d *driver) run(url string, proxied bool, rate float64, length time.Duration) ([]time.Duration, int) {
	n := int(rate * length.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	ctx, cancel := context.WithTimeout(context.Background(), length+length/10+time.Second)
	defer cancel()
	due := make(chan time.Time, n)
	lat := make([]time.Duration, 0, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < d.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range due {
				code, err := d.one(ctx, url, proxied)
				if err != nil || code != http.StatusOK {
					continue
				}
				l := time.Since(t)
				mu.Lock()
				lat = append(lat, l)
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		t := start.Add(time.Duration(i) * interval)
		if w := time.Until(t); w > 0 {
			time.Sleep(w)
		}
		select {
		case due <- t:
		case <-ctx.Done():
		}
	}
	close(due)
	wg.Wait()
	return lat, n
}

// chatBody returns request n: a system prompt of about 2,000 common words
// (one token each), the same every time, and question n.
func chatBody(stream bool) func(n int) []byte {
	rng := rand.New(rand.NewPCG(7, 8))
	words := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which")
	var sb strings.Builder
	sb.WriteString("You are a helpful assistant.")
	for i := 0; i < 2000; i++ {
		sb.WriteByte(' ')
		sb.WriteString(words[rng.IntN(len(words))])
	}
	head := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"system","content":%q},{"role":"user","content":"Question `, stream, sb.String())
	return func(n int) []byte {
		return []byte(head + strconv.Itoa(n) + `: what is the capital of France?"}]}`)
	}
}

func us(d time.Duration) float64 { return float64(d.Microseconds()) }

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
