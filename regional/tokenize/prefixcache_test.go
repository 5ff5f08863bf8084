package tokenize

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// prefixTokenizer has special tokens of several lengths, some the start of
// others, so that which special matches depends on text beyond the
// shorter one: what the cache's keys must cover.
func prefixTokenizer(t testing.TB) *Tokenizer {
	tok, err := NewTokenizer(Cl100kBase, map[string]uint32{
		"<|im_start|>x": 100300, "<|a|>": 100301, "<|a|><|a|><|a|>": 100302, "<|tool_call_begin_long|>": 100303,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

var prefixPieces = []string{"<|im_start|>", "<|im_end|>", "<|im_start|>x", "<|a|>", "<|", "|>", "x", "user\n", "hello ",
	" world", "\n\n", "日本", "'s", "123", "<|tool_call_begin_long|>", "<|tool_call_", "a"}

// TestPrefixCacheExact: through a sequence of texts that share prefixes
// in every way (a common start, one text extending another, a special
// token completed or lengthened right after the shared part), with a cache
// small enough to evict, every cached encoding equals encoding the text
// whole.
func TestPrefixCacheExact(t *testing.T) {
	tok := prefixTokenizer(t)
	rapid.Check(t, func(rt *rapid.T) {
		c := NewPrefixCache(int64(rapid.SampledFrom([]int{1 << 10, 1 << 14, 1 << 20}).Draw(rt, "bytes")))
		var texts []string
		for step := rapid.IntRange(1, 30).Draw(rt, "steps"); step > 0; step-- {
			var text string
			if len(texts) > 0 && rapid.IntRange(0, 3).Draw(rt, "fresh") > 0 {
				base := rapid.SampledFrom(texts).Draw(rt, "base")
				text = base[:rapid.IntRange(0, len(base)).Draw(rt, "cut")]
			}
			text += strings.Join(rapid.SliceOfN(rapid.SampledFrom(prefixPieces), 0, 12).Draw(rt, "tail"), "")
			texts = append(texts, text)
			got, reused := tok.EncodeCached(c, text)
			want := tok.EncodeText(text)
			if !slices.Equal(got.IDs, want.IDs) {
				rt.Fatalf("EncodeCached(%q) reused %d:\n got  %v\n want %v", text, reused, got.IDs, want.IDs)
			}
			if !slices.Equal(got.restarts, want.restarts) || got.Text != text {
				rt.Fatalf("EncodeCached(%q): restarts %v, want %v", text, got.restarts, want.restarts)
			}
			if reused > len(want.IDs) {
				rt.Fatalf("reused %d of %d ids", reused, len(want.IDs))
			}
			if st := c.Stats(); st.Bytes > st.MaxBytes && st.Records > 1 {
				rt.Fatalf("cache holds %d bytes, bound %d", st.Bytes, st.MaxBytes)
			}
		}
	})
}

// TestPrefixCacheReuses: a second session with the same long system prompt
// reuses its encoding; a conversation's next turn reuses its history.
func TestPrefixCacheReuses(t *testing.T) {
	m := mustModel(t, Config{Encoding: Cl100kBase})
	c := NewPrefixCache(1 << 20)
	system := Message{Role: "system", Content: strings.Repeat("You are a careful assistant. ", 100)}
	render := func(msgs ...Message) string {
		text, err := m.RenderChat(msgs, true)
		if err != nil {
			t.Fatal(err)
		}
		return text
	}
	first, reused := m.Tokenizer().EncodeCached(c, render(system, Message{Role: "user", Content: "Hi"}))
	if reused != 0 {
		t.Fatalf("cold cache reused %d", reused)
	}
	_, reused = m.Tokenizer().EncodeCached(c, render(system, Message{Role: "user", Content: "Another user"}))
	if reused < 500 {
		t.Fatalf("same system prompt: reused %d ids", reused)
	}
	turn2 := render(system, Message{Role: "user", Content: "Hi"}, Message{Role: "assistant", Content: "Hello"}, Message{Role: "user", Content: "More"})
	_, reused = m.Tokenizer().EncodeCached(c, turn2)
	if reused < len(first.IDs)-4 {
		t.Fatalf("next turn reused %d of the previous turn's %d ids", reused, len(first.IDs))
	}
	if st := c.Stats(); st.Hits != 2 || st.Lookups != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPrefixCacheConcurrent: sessions encoding at once through one cache
// (run it with -race) all get exact encodings.
func TestPrefixCacheConcurrent(t *testing.T) {
	tok := prefixTokenizer(t)
	c := NewPrefixCache(1 << 14)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			text := "<|im_start|>system\nshared prompt<|im_end|>"
			for i := range 50 {
				text += fmt.Sprintf("<|im_start|>user\nturn %d of %d<|im_end|>", i, g)
				got, _ := tok.EncodeCached(c, text)
				if want := tok.EncodeText(text); !slices.Equal(got.IDs, want.IDs) {
					t.Errorf("goroutine %d turn %d: ids differ", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
}
