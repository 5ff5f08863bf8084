package regional

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/regional/route/routetest"
	"github.com/meridian-llm/meridian/regional/tokenize"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkTokenizeAndDecide is a chat prompt of about `tokens` tokens,
// rendered, tokenized and hashed, then decided: the router's whole CPU cost
// per request. It reports the median and 99th percentile of single
// requests besides the mean. It is cold: no session id, and the prompts rotate among 8
// that share nothing but the template's first tokens, so nothing a cache
// kept from an earlier request helps.
func BenchmarkTokenizeAndDecide(b *testing.B) {
	for _, tokens := range []int{8192} {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			dec, _ := routetest.Decider256(b, 16)
			prompts, err := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 64, 100)
			if err != nil {
				b.Fatal(err)
			}
			prompts.SetPrefixCache(0) // cold: nothing reused
			reqs := make([]*tokenize.Request, 8)
			for i := range reqs {
				reqs[i] = chatOfTokens(b, prompts, tokens, uint64(i))
			}
			var n int
			lat := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				t0 := time.Now()
				p, err := prompts.Encode("m", tokenize.Chat, reqs[i%len(reqs)], "")
				if err != nil {
					b.Fatal(err)
				}
				i++
				n = p.Tokens
				r := &route.Request{Model: "m", Chain: p.Chain, BlockSize: 64, PromptTokens: p.Tokens}
				if _, err := dec.Decide(r); err != nil {
					b.Fatal(err)
				}
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
			}
			b.ReportMetric(float64(n), "prompt-tokens")
			// On a shared machine the mean counts the time the benchmark
			// was not running; the median of single requests does not.
			b.StopTimer()
			routetest.ReportPercentiles(b, lat, "")
			routetest.ReportMachineFloor(b, lat)
		})
	}
}

// chatOfTokens is a one-message chat request of common English words whose
// rendering is tokens tokens long (give or take one), seeded by seed.
func chatOfTokens(tb testing.TB, prompts *Prompts, tokens int, seed uint64) *tokenize.Request {
	tb.Helper()
	rng := rand.New(rand.NewPCG(3, 4+seed))
	vocab := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which")
	var sb strings.Builder
	fmt.Fprintf(&sb, "Request %d. ", seed)
	for {
		for k := 0; k < 256; k++ {
			sb.WriteString(vocab[rng.IntN(len(vocab))])
			sb.WriteByte(' ')
		}
		req := &tokenize.Request{Messages: []tokenize.Message{{Role: "user", Content: sb.String()}}}
		p, err := prompts.Encode("m", tokenize.Chat, req, "")
		if err != nil {
			tb.Fatal(err)
		}
		if p.Tokens >= tokens-256 {
			// Each word is one token: pad with the rest.
			for k := p.Tokens; k < tokens; k++ {
				sb.WriteString(vocab[rng.IntN(len(vocab))])
				sb.WriteByte(' ')
			}
			return &tokenize.Request{Messages: []tokenize.Message{{Role: "user", Content: sb.String()}}}
		}
	}
}

// BenchmarkSessionTokenization: the 20th turn of a conversation, re-encoded
// in full, extended from the previous turn's encoding (the session's), and
// taken from the prefix cache (any session's earlier encoding of the same
// history).
func BenchmarkSessionTokenization(b *testing.B) {
	prompts, _ := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 64, 100)
	prompts.SetPrefixCache(0)
	rng := rand.New(rand.NewPCG(5, 6))
	vocab := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which")
	text := func(n int) string {
		var sb strings.Builder
		for i := 0; i < n; i++ {
			sb.WriteString(vocab[rng.IntN(len(vocab))])
			sb.WriteByte(' ')
		}
		return sb.String()
	}
	var msgs []tokenize.Message
	msgs = append(msgs, tokenize.Message{Role: "system", Content: text(1500)})
	for turn := 0; turn < 19; turn++ {
		msgs = append(msgs, tokenize.Message{Role: "user", Content: text(300)}, tokenize.Message{Role: "assistant", Content: text(200)})
	}
	last := append(slices.Clone(msgs), tokenize.Message{Role: "user", Content: text(300)})
	prev := &tokenize.Request{Messages: msgs}
	next := &tokenize.Request{Messages: last}
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := prompts.Encode("m", tokenize.Chat, next, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("session", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			prompts.remember("m\x00s", nil)
			if _, err := prompts.Encode("m", tokenize.Chat, prev, "s"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			p, err := prompts.Encode("m", tokenize.Chat, next, "s")
			if err != nil || p.Reused == 0 {
				b.Fatalf("reused %d, err %v", p.Reused, err)
			}
		}
	})
	b.Run("prefix-cache", func(b *testing.B) {
		cached, _ := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 64, 100)
		if _, err := cached.Encode("m", tokenize.Chat, prev, ""); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			p, err := cached.Encode("m", tokenize.Chat, next, "")
			if err != nil || p.Reused == 0 {
				b.Fatalf("reused %d, err %v", p.Reused, err)
			}
		}
	})
}

// BenchmarkProxyOverhead sends chat requests with a 2k-token system prompt
// (the user's question differs each time, so only the system prompt's
// encoding can be reused) at 1,000 per second, alternately straight to a
// pod and through the proxy, and reports each path's p50 and p99 latency
// to the last byte and what the proxy adds at each. The pod answers at
// once, so the difference is the router's own cost (parse, tokenize,
// decide, proxy).
//
// tls=off is a plain-http controller that believes headers; tls=on is the
// secure default: https on the controller's own listener (certificate from
// the development PKI, TLS 1.3) and an API key checked on every request.
// The pods are plain http in both, so the two sub-benchmarks' added
// latencies differ by what TLS and authentication cost on the request
// path. stream=true asks for, and gets, a server-sent event stream of 16
// chunks, each flushed. Connections are kept alive, as a client pool or a
// gateway keeps them.
func BenchmarkProxyOverhead(b *testing.B) {
	for _, secure := range []bool{false, true} {
		for _, stream := range []bool{false, true} {
			name := fmt.Sprintf("tls=off/stream=%v", stream)
			if secure {
				name = fmt.Sprintf("tls=on/stream=%v", stream)
			}
			b.Run(name, func(b *testing.B) { benchProxyOverhead(b, secure, stream) })
		}
	}
}

// proxyBenchPod answers a chat request at once: one JSON body, or with
// "stream":true 16 server-sent events, each flushed, and [DONE].
func proxyBenchPod(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if !bytes.Contains(body, []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":2048,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1984}}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	for i := 0; i < 16; i++ {
		_, _ = io.WriteString(w, `data: {"id":"x","choices":[{"index":0,"delta":{"content":"tok "}}]}`+"\n\n")
		if fl != nil {
			fl.Flush()
		}
	}
	_, _ = io.WriteString(w, `data: {"id":"x","choices":[],"usage":{"prompt_tokens":2048,"completion_tokens":16}}`+"\n\ndata: [DONE]\n\n")
}

// chatBody2k returns the chat request whose system prompt is system (the
// same each time) and whose question is number n.
func chatBody2k(system string, stream bool) func(n int) string {
	head := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"system","content":%q},{"role":"user","content":"Question `, stream, system)
	return func(n int) string {
		return head + strconv.Itoa(n) + `: what is the capital of France?"}]}`
	}
}

// systemPrompt2k is about 2,000 tokens: one common word each.
func systemPrompt2k() string {
	rng := rand.New(rand.NewPCG(7, 8))
	vocab := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which")
	var sb strings.Builder
	sb.WriteString("You are a helpful assistant.")
	for i := 0; i < 2000; i++ {
		sb.WriteByte(' ')
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return sb.String()
}

func benchProxyOverhead(b *testing.B, secure, stream bool) {
	proxyTransport := &http.Transport{MaxIdleConnsPerHost: 64}
	var key string
	f := newServerFixture(b, []http.HandlerFunc{proxyBenchPod, proxyBenchPod, proxyBenchPod, proxyBenchPod}, func(fc *fixtureConfig) {
		if !secure {
			return
		}
		fc.tls, proxyTransport.TLSClientConfig, fc.auth, key = secureFixture(b)
	})
	measureAdded(b, f.pods[0].srv.URL+"/v1/chat/completions", f.url+"/v1/chat/completions", proxyTransport, key, stream)
}

// measureAdded sends chat requests with a 2k-token system prompt at 1,000
// per second, alternately to direct and through proxied (with proxyTransport,
// and key as a bearer token when set), and reports each path's p50 and p99
// latency to the last byte and what proxied adds at each.
func measureAdded(b *testing.B, direct, proxied string, proxyTransport *http.Transport, key string, stream bool) {
	body := chatBody2k(systemPrompt2k(), stream)
	directClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	proxyClient := &http.Client{Transport: proxyTransport}
	do := func(c *http.Client, url string, n int) time.Duration {
		t0 := time.Now()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body(n)))
		req.Header.Set("Content-Type", "application/json")
		if key != "" && c == proxyClient {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: status %d", url, resp.StatusCode)
		}
		return time.Since(t0)
	}
	do(directClient, direct, -1)
	do(proxyClient, proxied, -1)
	var mu sync.Mutex
	var dl, pl []time.Duration
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		<-tick.C
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if i%2 == 0 {
				d := do(directClient, direct, i)
				mu.Lock()
				dl = append(dl, d)
				mu.Unlock()
			} else {
				d := do(proxyClient, proxied, i)
				mu.Lock()
				pl = append(pl, d)
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	b.StopTimer()
	if len(dl) == 0 || len(pl) == 0 {
		return
	}
	slices.Sort(dl)
	slices.Sort(pl)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	d50, d99 := dl[len(dl)/2], dl[len(dl)*99/100]
	p50, p99 := pl[len(pl)/2], pl[len(pl)*99/100]
	b.ReportMetric(us(d50), "direct-p50-us")
	b.ReportMetric(us(d99), "direct-p99-us")
	b.ReportMetric(us(p50), "proxy-p50-us")
	b.ReportMetric(us(p99), "proxy-p99-us")
	b.ReportMetric(us(p50-d50), "added-p50-us")
	b.ReportMetric(us(p99-d99), "added-p99-us")
}

// BenchmarkProxyHopFloor is BenchmarkProxyOverhead's harness (tls=off,
// not streamed) with a bare hop in the controller's place: it reads the
// body and relays it, and the answer, through the proxy's own pod client
// (postToPod), with no parsing, tokenizing, deciding or accounting. What
// it adds is the floor of a Go proxy hop on this machine; what
// BenchmarkProxyOverhead adds above it is the router's own work.
func BenchmarkProxyHopFloor(b *testing.B) {
	f := newServerFixture(b, []http.HandlerFunc{proxyBenchPod}, nil)
	pod := f.pods[0].srv.URL + "/v1/chat/completions"
	hop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		resp, err := f.srv.postToPod(r.Context(), f.srv.client, nil, pod, r.Header, keepRelayed, nil, body)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		for k, vs := range resp.Header {
			if !hopHeaders[k] {
				w.Header()[k] = vs
			}
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(out)
	}))
	b.Cleanup(hop.Close)
	measureAdded(b, pod, hop.URL+"/v1/chat/completions", &http.Transport{MaxIdleConnsPerHost: 64}, "", false)
}

// secureFixture is a secure controller's API side: a server TLS config
// from a fresh development PKI, the client's TLS config trusting its CA,
// and api_keys authentication with one key (returned) for tenant acme.
func secureFixture(tb testing.TB) (server, client *tls.Config, a *ClientAuth, key string) {
	tb.Helper()
	dir := tb.TempDir()
	pki, err := identity.InitDevPKI(filepath.Join(dir, "pki"), []string{"us-east-1"}, identity.PKIOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := identity.DefaultTLSConfig()
	cfg.Cert, cfg.Key, cfg.ClientCA = pki.Controllers[0].Cert, pki.Controllers[0].Key, pki.CACert
	src, err := identity.Open(context.Background(), cfg, identity.Deps{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = src.Close(context.Background()) })
	caPEM, err := os.ReadFile(pki.CACert)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	key, digest, err := auth.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	keys := filepath.Join(dir, "keys.yaml")
	if err := os.WriteFile(keys, []byte("keys:\n  - {name: bench, tenant: acme, sha256: "+digest+", rate_limit: {requests_per_second: 100000, burst: 100000}}\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	ac := AuthConfig{Config: auth.DefaultConfig()}
	ac.Mode, ac.APIKeys.File = auth.ModeAPIKeys, keys
	if a, err = OpenClientAuth(context.Background(), ac, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = a.Close(context.Background()) })
	return src.ServerConfig(false), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}, a, key
}
