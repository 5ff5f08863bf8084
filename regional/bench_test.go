package regional

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/summary"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// decisionFixture: 256 pods; the query chain is 128 blocks (8k tokens at 64
// tokens per block); pods hold prefixes of it at `depths` distinct depths,
// plus 1k blocks each of their own; loads vary.
func decisionFixture(b *testing.B, depths int) (*Decider, *RouteRequest) {
	idx, _ := index.New(index.DefaultConfig())
	reg := NewRegistry(idx)
	c := chain(1, 128)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 256; i++ {
		p, _, _ := reg.Upsert(PodInfo{Name: fmt.Sprintf("pod-%03d", i), Model: "m", Profile: "h100"})
		_ = idx.Register(p.ID, index.TierGPU, c[:128*(1+i%depths)/depths])
		_ = idx.Register(p.ID, index.TierGPU, chain(uint64(1000+i), 1024))
		for k := rng.IntN(8); k > 0; k-- {
			n := rng.IntN(4000)
			p.Admit(n, time.Duration(n)*360*time.Microsecond, time.Now())
		}
	}
	model, _ := gorgo.New(gorgo.DefaultConfig())
	dec, _ := NewDecider(DefaultDecisionConfig(), idx, reg, model, time.Now)
	return dec, &RouteRequest{Model: "m", Chain: c, BlockSize: 64, PromptTokens: 128*64 + 10}
}

// BenchmarkDecide is the decision alone (no tokenization) at 256 pods; it
// reports the median and p99 of individual decisions.
func BenchmarkDecide(b *testing.B) {
	for _, depths := range []int{4, 16, 128} {
		b.Run(fmt.Sprintf("pods=256/blocks=128/depths=%d", depths), func(b *testing.B) {
			dec, r := decisionFixture(b, depths)
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				d, err := dec.Decide(r)
				lat = append(lat, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				_ = d
			}
			reportPercentiles(b, lat, "")
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration, prefix string) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), prefix+"p99-ns")
}

// BenchmarkTokenizeAndDecide is an 8k-token chat prompt, tokenized and
// hashed, then decided: the router's whole CPU cost per request.
func BenchmarkTokenizeAndDecide(b *testing.B) {
	dec, _ := decisionFixture(b, 16)
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
		r := &RouteRequest{Model: "m", Chain: p.Chain, BlockSize: 64, PromptTokens: len(p.IDs)}
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
func BenchmarkProxyOverhead(b *testing.B) {
	pod := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":600,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":576}}}`)
	}
	f := newServerFixture(b, []http.HandlerFunc{pod, pod, pod, pod}, nil)
	body := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 80) + `"},{"role":"user","content":"What is the capital of France?"}]}`
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	do := func(url string) time.Duration {
		t0 := time.Now()
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(t0)
	}
	direct := f.pods[0].srv.URL + "/v1/chat/completions"
	proxied := f.url + "/v1/chat/completions"
	do(direct)
	do(proxied)
	var mu sync.Mutex
	var dl, pl []time.Duration
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		<-tick.C
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if i%2 == 0 {
				d := do(direct)
				mu.Lock()
				dl = append(dl, d)
				mu.Unlock()
			} else {
				d := do(proxied)
				mu.Lock()
				pl = append(pl, d)
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	b.StopTimer()
	reportPercentiles(b, dl, "direct-")
	reportPercentiles(b, pl, "proxy-")
	if len(dl) > 0 && len(pl) > 0 {
		b.ReportMetric(float64(pl[len(pl)*99/100]-dl[len(dl)*99/100]), "added-p99-ns")
	}
}

// BenchmarkPlace is the whole placement at 256 local pods and 3 or 10
// remote regions: the local decision, each remote region's candidate from
// its summary (a filter-based depth estimate over 1M blocks), and the cost
// comparison. Tokenization excluded. Reports the median and p99.
func BenchmarkPlace(b *testing.B) {
	for _, remotes := range []int{3, 10} {
		b.Run(fmt.Sprintf("pods=256/remotes=%d", remotes), func(b *testing.B) {
			dec, r := decisionFixture(b, 16)
			var sums []*summary.Summary
			for i := 0; i < remotes; i++ {
				hashes := make([]uint64, 0, 1<<20)
				hashes = append(hashes, r.Chain[:64*(i%2+1)]...)
				for j := len(hashes); j < 1<<20; j++ {
					hashes = append(hashes, splitmixBench(uint64(i)<<40|uint64(j)))
				}
				s, err := summary.Build(summary.Input{Region: fmt.Sprintf("remote-%d", i), Generation: 1, BuiltAt: time.Now(), BlockSize: 64,
					Models: []string{"m"}, Load: []summary.ProfileLoad{{Profile: "h100", Pods: 8, Running: 16, Slots: 2048}}}, hashes, summary.DefaultBuildConfig())
				if err != nil {
					b.Fatal(err)
				}
				sums = append(sums, s)
			}
			shares := gorgo.NewShareTracker(time.Minute)
			cands := make([]gorgo.Candidate, 0, remotes)
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				now := t0
				cands = cands[:0]
				for j, s := range sums {
					c := s.Candidate(now, r.Chain, r.PromptTokens)
					c.RTTMs = float64(65 + 10*j)
					cands = append(cands, c)
				}
				pl, err := dec.Place(r, "home", true, cands, shares)
				if err != nil {
					b.Fatal(err)
				}
				pl.Record(shares, now)
				lat = append(lat, time.Since(t0))
			}
			reportPercentiles(b, lat, "")
		})
	}
}

func splitmixBench(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31) | 1
}
