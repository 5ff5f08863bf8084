package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/meridian-llm/meridian/scenarios/prefixcache"
)

// benchPrompt is a 2,048-token prompt (the seed's example size).
func benchPrompt() []uint32 { return seqTokens(2048, 1) }

// BenchmarkHashChain: engine hashes of a 2,048-token prompt (128 blocks).
func BenchmarkHashChain(b *testing.B) {
	chain := newHashChain("bench")
	toks := benchPrompt()
	dst := make([]uint64, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		dst = chain.appendHashes(dst[:0], toks, 16, "", "")
	}
}

// BenchmarkCacheHitPath: admit, prefill and release a 2,048-token prompt that
// is cached, as the engine does for every repeated prompt (hashes given).
func BenchmarkCacheHitPath(b *testing.B) {
	c := newPrefixCache(16, 100000, func(Event) {})
	toks := benchPrompt()
	hashes := newHashChain("bench").appendHashes(nil, toks, 16, "", "")
	h := &holding{tokens: toks, hashes: hashes, maxTokens: 16}
	h.Pinned = make([]*prefixcache.Block[blockInfo], 0, len(hashes))
	c.admit(h)
	c.prefillDone(h)
	c.release(h)
	b.ReportAllocs()
	for b.Loop() {
		h.Pinned = h.Pinned[:0]
		if !c.admit(h) {
			b.Fatal("admit failed")
		}
		c.prefillDone(h)
		c.release(h)
	}
}

// TestCacheHitPathAllocs is the allocation budget of the cache on a hit:
// nothing is allocated once a request's holding has room for its blocks.
func TestCacheHitPathAllocs(t *testing.T) {
	c := newPrefixCache(16, 100000, func(Event) {})
	toks := benchPrompt()
	hashes := newHashChain("bench").appendHashes(nil, toks, 16, "", "")
	h := &holding{tokens: toks, hashes: hashes, maxTokens: 16}
	h.Pinned = make([]*prefixcache.Block[blockInfo], 0, len(hashes))
	c.admit(h)
	c.prefillDone(h)
	c.release(h)
	allocs := testing.AllocsPerRun(100, func() {
		h.Pinned = h.Pinned[:0]
		c.admit(h)
		c.prefillDone(h)
		c.release(h)
	})
	if allocs != 0 {
		t.Fatalf("cache hit path allocates %v times per request, budget 0", allocs)
	}
}

// BenchmarkGenerate: one request through the scheduler (hashing, queue,
// admission, cache, release) with modelled times scaled to nothing, in
// process; half the prompt is shared with earlier requests.
func BenchmarkGenerate(b *testing.B) {
	cfg := DefaultConfig()
	cfg.TimeScale = 1e-12
	cfg.HashSeed = "bench"
	e, err := newEngine(cfg, "bench")
	if err != nil {
		b.Fatal(err)
	}
	e.startPipe(discardPublisher{})
	defer e.pipe.close(context.Background())
	toks := benchPrompt()
	ctx := context.Background()
	b.ReportAllocs()
	i := uint32(0)
	for b.Loop() {
		i++
		for j := 1024; j < len(toks); j++ {
			toks[j] = i*4096 + uint32(j)
		}
		if _, err := e.generate(ctx, genRequest{tokens: toks, maxTokens: 16}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHTTPCompletion: a full loopback request (2,048 prompt token ids,
// 16 output tokens) with modelled times scaled to nothing: the simulator's
// own cost per request, non-streaming and streaming.
func BenchmarkHTTPCompletion(b *testing.B) {
	cfg := DefaultConfig()
	cfg.TimeScale = 1e-12
	cfg.HashSeed = "bench"
	e, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(context.Background())
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ids, _ := json.Marshal(benchPrompt())
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			body := fmt.Sprintf(`{"model": "meridian/sim-70b", "max_tokens": 16, "stream": %v, "prompt": %s}`, stream, ids)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
