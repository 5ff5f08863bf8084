package regional

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// TestPromptsCachedExact: chat requests from several sessions sharing
// system prompts and histories, through the session cache and a prefix
// cache small enough to evict, give the ids and chain hashes of encoding
// each prompt whole.
func TestPromptsCachedExact(t *testing.T) {
	models := []ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}
	rapid.Check(t, func(rt *rapid.T) {
		bs := rapid.SampledFrom([]int{1, 4, 16}).Draw(rt, "block")
		cached, err := NewPrompts(models, bs, 3)
		if err != nil {
			rt.Fatal(err)
		}
		cached.SetPrefixCache(int64(rapid.SampledFrom([]int{2 << 10, 64 << 10}).Draw(rt, "bytes")))
		whole, _ := NewPrompts(models, bs, 3)
		whole.SetPrefixCache(0)
		systems := []string{"You are terse.", strings.Repeat("Policy text. ", 40), "<|im_end|> tricky"}
		histories := map[string][]tokenize.Message{}
		for step := rapid.IntRange(1, 25).Draw(rt, "steps"); step > 0; step-- {
			session := rapid.SampledFrom([]string{"", "a", "b", "c", "d"}).Draw(rt, "session")
			msgs := histories[session]
			if len(msgs) == 0 || session == "" || rapid.IntRange(0, 4).Draw(rt, "restart") == 0 {
				msgs = []tokenize.Message{{Role: "system", Content: rapid.SampledFrom(systems).Draw(rt, "system")}}
			}
			msgs = append(slices.Clone(msgs), tokenize.Message{Role: "user", Content: fmt.Sprint("question ", rapid.IntRange(0, 3).Draw(rt, "q"))})
			// A salt changes the chain's seed: cached hashes must not
			// cross namespaces.
			req := &tokenize.Request{Messages: msgs, CacheSalt: rapid.SampledFrom([]string{"", "", "t"}).Draw(rt, "salt")}
			got, err := cached.Encode("m", tokenize.Chat, req, session)
			if err != nil {
				rt.Fatal(err)
			}
			want, err := whole.Encode("m", tokenize.Chat, req, "")
			if err != nil {
				rt.Fatal(err)
			}
			naive := index.ChainHashes(index.Namespace{Model: "m", CacheSalt: req.CacheSalt, BlockSize: bs}, want.AppendIDs(nil), nil)
			if !slices.Equal(got.AppendIDs(nil), want.AppendIDs(nil)) || !slices.Equal(got.Chain, naive) || !slices.Equal(want.Chain, naive) {
				rt.Fatalf("session %q, %d messages: reused %d, ids or chain differ from a whole encoding", session, len(msgs), got.Reused)
			}
			histories[session] = append(msgs, tokenize.Message{Role: "assistant", Content: "answer"})
		}
	})
}

// TestPromptsHitAllocs is the allocation budget of a chat prompt whose
// 2k-token system prompt is in the prefix cache: the rendered text, and a
// bounded rest; the reused ids are not copied.
func TestPromptsHitAllocs(t *testing.T) {
	p, err := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 64, 100)
	if err != nil {
		t.Fatal(err)
	}
	system := systemPrompt2k()
	reqs := make([]*tokenize.Request, 202) // each asked once
	for i := range reqs {
		reqs[i] = &tokenize.Request{Messages: []tokenize.Message{{Role: "system", Content: system},
			{Role: "user", Content: fmt.Sprintf("Question %d: what is the capital of France?", i)}}}
	}
	text, err := p.fallback.RenderChat(reqs[0].Messages, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Encode("m", tokenize.Chat, reqs[0], ""); err != nil { // fills the cache
		t.Fatal(err)
	}
	i := 1
	hit := func() {
		got, err := p.Encode("m", tokenize.Chat, reqs[i], "")
		i++
		if err != nil || got.Reused < 2000 {
			t.Fatalf("reused %d ids, err %v", got.Reused, err)
		}
	}
	allocs := testing.AllocsPerRun(100, hit)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		hit()
	}
	runtime.ReadMemStats(&after)
	bytes := (after.TotalAlloc - before.TotalAlloc) / 100
	t.Logf("a hit: %.0f allocations, %d bytes (text %d bytes)", allocs, bytes, len(text))
	if bytes > uint64(len(text))+4096 {
		t.Errorf("a hit allocates %d bytes: more than its text (%d) and 4 KiB: the reused ids are copied", bytes, len(text))
	}
	if !raceEnabled && allocs > 7 {
		t.Errorf("a hit allocates %.0f times, budget 7", allocs)
	}
}

// BenchmarkPromptHit is the prompt work of one BenchmarkProxyOverhead
// request (tls=off, not streamed) on its own: the chat body with the
// 2k-token system prompt, whose encoding the prefix cache holds, and a
// question that differs each time. parse is ParseBodyShared alone, encode
// Prompts.Encode of the parsed body alone, both is the two. Besides the
// wall time it reports cpu-ns/op, the CPU time of the benchmark's own
// thread (locked to it) per op: what the work costs on one core, however
// busy the shared machine is (background GC work not counted).
func BenchmarkPromptHit(b *testing.B) {
	body := chatBody2k(systemPrompt2k(), false)
	const distinct = 1 << 12
	raws := make([][]byte, distinct)
	for i := range raws {
		raws[i] = []byte(body(i))
	}
	newPrompts := func(b *testing.B) *Prompts {
		p, err := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 64, 100)
		if err != nil {
			b.Fatal(err)
		}
		var tb tokenize.Body
		if err := tokenize.ParseBodyShared([]byte(body(-1)), &tb); err != nil {
			b.Fatal(err)
		}
		if _, err := p.Encode(tb.Model, tokenize.Chat, &tb.Request, ""); err != nil {
			b.Fatal(err)
		}
		return p
	}
	b.Run("parse", func(b *testing.B) {
		var tb tokenize.Body
		b.ReportAllocs()
		defer reportThreadCPU(b)()
		i := 0
		for b.Loop() {
			if err := tokenize.ParseBodyShared(raws[i%distinct], &tb); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("encode", func(b *testing.B) {
		p := newPrompts(b)
		bodies := make([]tokenize.Body, distinct)
		for i := range bodies {
			if err := tokenize.ParseBodyShared(raws[i], &bodies[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		defer reportThreadCPU(b)()
		i := 0
		for b.Loop() {
			tb := &bodies[i%distinct]
			i++
			if out, err := p.Encode(tb.Model, tokenize.Chat, &tb.Request, ""); err != nil || out.Reused < 2000 {
				b.Fatalf("reused %d, err %v", out.Reused, err)
			}
		}
	})
	b.Run("both", func(b *testing.B) {
		p := newPrompts(b)
		var tb tokenize.Body
		b.ReportAllocs()
		defer reportThreadCPU(b)()
		i := 0
		for b.Loop() {
			if err := tokenize.ParseBodyShared(raws[i%distinct], &tb); err != nil {
				b.Fatal(err)
			}
			i++
			if out, err := p.Encode(tb.Model, tokenize.Chat, &tb.Request, ""); err != nil || out.Reused < 2000 {
				b.Fatalf("reused %d, err %v", out.Reused, err)
			}
		}
	})
}

// reportThreadCPU locks the benchmark to its thread and returns the
// function that reports the thread's CPU time per op as cpu-ns/op (when
// the platform tells it) and unlocks it.
func reportThreadCPU(b *testing.B) func() {
	lockThread()
	c0, ok := threadCPU()
	return func() {
		defer unlockThread()
		if c1, ok1 := threadCPU(); ok && ok1 && b.N > 0 {
			b.ReportMetric(float64(c1-c0)/float64(b.N), "cpu-ns/op")
		}
	}
}

// EncodeInto overwrites the prompt it is given whole: chat and completion
// prompts encoded one after another into one Prompt (as the pooled parsed
// request keeps it) read as each encoded into a fresh one.
func TestEncodeIntoReused(t *testing.T) {
	models := []ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}
	rapid.Check(t, func(rt *rapid.T) {
		into, _ := NewPrompts(models, 4, 3)
		fresh, _ := NewPrompts(models, 4, 3)
		var kept Prompt
		for step := rapid.IntRange(1, 10).Draw(rt, "steps"); step > 0; step-- {
			k := tokenize.Chat
			req := &tokenize.Request{Messages: []tokenize.Message{{Role: "user", Content: strings.Repeat("word ", rapid.IntRange(0, 40).Draw(rt, "words"))}}}
			if rapid.Bool().Draw(rt, "completion") {
				k = tokenize.Completion
				req = &tokenize.Request{Prompt: []byte(`"` + strings.Repeat("text ", rapid.IntRange(1, 40).Draw(rt, "words")) + `"`)}
			}
			if err := into.EncodeInto("m", k, req, "", &kept); err != nil {
				rt.Fatal(err)
			}
			want, err := fresh.Encode("m", k, req, "")
			if err != nil {
				rt.Fatal(err)
			}
			if kept.Tokens != want.Tokens || kept.Reused != want.Reused || !slices.Equal(kept.Chain, want.Chain) ||
				!slices.Equal(kept.AppendIDs(nil), want.AppendIDs(nil)) {
				rt.Fatalf("kind %v: %d tokens, %d reused, %d blocks; fresh %d, %d, %d", k, kept.Tokens, kept.Reused, len(kept.Chain),
					want.Tokens, want.Reused, len(want.Chain))
			}
		}
	})
}
