package regional

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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

// BenchmarkTokenizeAndDecide is an 8k-token chat prompt, tokenized and
// hashed, then decided: the router's whole CPU cost per request.
func BenchmarkTokenizeAndDecide(b *testing.B) {
	dec, _ := routetest.Decider256(b, 16)
	prompts, err := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 64, 100)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var sb strings.Builder
	vocab := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which")
	for sb.Len() < 8000*5 {
		sb.WriteString(vocab[rng.IntN(len(vocab))])
		sb.WriteByte(' ')
	}
	req := &tokenize.Request{Messages: []tokenize.Message{{Role: "user", Content: sb.String()}}}
	p, err := prompts.Encode("m", tokenize.Chat, req, "")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p, err := prompts.Encode("m", tokenize.Chat, req, "")
		if err != nil {
			b.Fatal(err)
		}
		r := &route.Request{Model: "m", Chain: p.Chain, BlockSize: 64, PromptTokens: len(p.IDs)}
		if _, err := dec.Decide(r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(p.IDs)), "prompt-tokens")
}

// BenchmarkSessionTokenization: the 20th turn of a conversation, re-encoded
// in full versus extended from the previous turn's encoding.
func BenchmarkSessionTokenization(b *testing.B) {
	prompts, _ := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 64, 100)
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
}

// BenchmarkProxyOverhead sends requests at 1,000 per second, alternately
// straight to a pod and through the proxy, and reports each path's p50 and
// p99 latency and the p99 the proxy adds. The pod answers at once, so the
// difference is the router's own cost (parse, tokenize, decide, proxy).
//
// tls=off is a plain-http controller that believes headers; tls=on is the
// secure default: https on the controller's own listener (certificate from
// the development PKI, TLS 1.3) and an API key checked on every request.
// The pods are plain http in both, so the two sub-benchmarks' added-p99
// differ by what TLS and authentication cost on the request path.
// Connections are kept alive, as a client pool or a gateway keeps them.
func BenchmarkProxyOverhead(b *testing.B) {
	for _, secure := range []bool{false, true} {
		name := "tls=off"
		if secure {
			name = "tls=on"
		}
		b.Run(name, func(b *testing.B) { benchProxyOverhead(b, secure) })
	}
}

func benchProxyOverhead(b *testing.B, secure bool) {
	pod := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":600,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":576}}}`)
	}
	proxyTransport := &http.Transport{MaxIdleConnsPerHost: 64}
	var key string
	f := newServerFixture(b, []http.HandlerFunc{pod, pod, pod, pod}, func(fc *fixtureConfig) {
		if !secure {
			return
		}
		fc.tls, proxyTransport.TLSClientConfig, fc.auth, key = secureFixture(b)
	})
	body := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 80) + `"},{"role":"user","content":"What is the capital of France?"}]}`
	directClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	proxyClient := &http.Client{Transport: proxyTransport}
	do := func(c *http.Client, url string) time.Duration {
		t0 := time.Now()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
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
	direct := f.pods[0].srv.URL + "/v1/chat/completions"
	proxied := f.url + "/v1/chat/completions"
	do(directClient, direct)
	do(proxyClient, proxied)
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
				d := do(directClient, direct)
				mu.Lock()
				dl = append(dl, d)
				mu.Unlock()
			} else {
				d := do(proxyClient, proxied)
				mu.Lock()
				pl = append(pl, d)
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	b.StopTimer()
	routetest.ReportPercentiles(b, dl, "direct-")
	routetest.ReportPercentiles(b, pl, "proxy-")
	if len(dl) > 0 && len(pl) > 0 {
		b.ReportMetric(float64(pl[len(pl)*99/100]-dl[len(dl)*99/100]), "added-p99-ns")
	}
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
