package tokenize

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
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
		var encs []*Encoding
		var snapshots [][]uint32
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
			if !slices.Equal(got.AppendIDs(nil), want.AppendIDs(nil)) {
				rt.Fatalf("EncodeCached(%q) reused %d:\n got  %v\n want %v", text, reused, got.AppendIDs(nil), want.AppendIDs(nil))
			}
			if !slices.Equal(got.restarts, want.restarts) || got.Text() != text {
				rt.Fatalf("EncodeCached(%q): restarts %v, want %v", text, got.restarts, want.restarts)
			}
			if reused > want.Len() {
				rt.Fatalf("reused %d of %d ids", reused, want.Len())
			}
			if st := c.Stats(); st.Bytes > st.MaxBytes && st.Records > 1 {
				rt.Fatalf("cache holds %d bytes, bound %d", st.Bytes, st.MaxBytes)
			}
			checkPrefixCache(rt, c)
			encs, snapshots = append(encs, got), append(snapshots, want.AppendIDs(nil))
		}
		// Hits share the cached ids: none of them was written since.
		for i, e := range encs {
			if !slices.Equal(e.AppendIDs(nil), snapshots[i]) {
				rt.Fatalf("encoding %d (%q) changed after later hits shared it", i, e.Text())
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
	if reused < first.Len()-4 {
		t.Fatalf("next turn reused %d of the previous turn's %d ids", reused, first.Len())
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
				if want := tok.EncodeText(text); !slices.Equal(got.AppendIDs(nil), want.AppendIDs(nil)) {
					t.Errorf("goroutine %d turn %d: ids differ", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestPrefixCacheHitSharesPrefix: a hit does not copy the cached prefix's
// ids; what it allocates is the same for a prefix of 2,000 tokens and of
// 20,000, and far less than the prefix.
func TestPrefixCacheHitSharesPrefix(t *testing.T) {
	tok := mustModel(t, DefaultConfig()).Tokenizer()
	perHit := func(words int) (bytes, allocs float64, prefixIDs int) {
		system := "<|im_start|>system\n" + strings.Repeat("You are a careful assistant. ", words/5) + "<|im_end|>\n<|im_start|>user\n"
		c := NewPrefixCache(1 << 30)
		_, _ = tok.EncodeCached(c, system+"The first question.<|im_end|>\n<|im_start|>assistant\n")
		texts := make([]string, 201) // each asked once
		for i := range texts {
			texts[i] = system + fmt.Sprintf("Question %d.<|im_end|>\n<|im_start|>assistant\n", i)
		}
		// Reused up to the end of the system prompt's last special token.
		prefixIDs = len(tok.Encode(system[:strings.LastIndex(system, "<|im_start|>")+len("<|im_start|>")]))
		i := 0
		hit := func() {
			_, reused := tok.EncodeCached(c, texts[i%len(texts)])
			i++
			if reused != prefixIDs {
				t.Fatalf("reused %d ids, want the system prompt's %d", reused, prefixIDs)
			}
		}
		bytes, allocs = perCall(hit)
		return bytes, allocs, prefixIDs
	}
	smallBytes, smallAllocs, smallIDs := perHit(2000)
	bigBytes, bigAllocs, bigIDs := perHit(20000)
	t.Logf("a hit on %d ids: %.0f bytes in %.0f allocations; on %d ids: %.0f bytes in %.0f", smallIDs, smallBytes, smallAllocs, bigIDs, bigBytes, bigAllocs)
	if bigBytes > 2*smallBytes || bigBytes > float64(bigIDs*4)/8 {
		t.Errorf("a hit on a %d-id prefix allocates %.0f bytes (on %d ids %.0f): the prefix is copied", bigIDs, bigBytes, smallIDs, smallBytes)
	}
	if !raceEnabled && (smallAllocs > 3 || bigAllocs > 3) {
		t.Errorf("a hit allocates %.0f and %.0f times, budget 3", smallAllocs, bigAllocs)
	}
}

// naiveKeys returns the key points of text, found by scanning all of it,
// and their keys, each the xxhash of the text since the previous point
// seeded with the previous key: the reference for tailKeys.
func naiveKeys(tok *Tokenizer, text string) ([]int, []uint64) {
	var points []int
	for pos := 0; pos < len(text); {
		_, end, _, ok := tok.nextSpecial(text, pos)
		if !ok {
			break
		}
		points = append(points, end)
		pos = end
	}
	var sums []uint64
	at, h := 0, uint64(0)
	for _, p := range points {
		d := xxhash.NewWithSeed(h)
		_, _ = d.WriteString(text[at:p])
		h, at = d.Sum64(), p
		sums = append(sums, h)
	}
	return points, sums
}

// BenchmarkKeyPoints finds the restart points of a ChatML prompt with an
// 11 KB system prompt and a question, and their keys: what a prefix-cache
// lookup scans and hashes when nothing of the text is known.
func BenchmarkKeyPoints(b *testing.B) {
	tok := mustModel(b, DefaultConfig()).Tokenizer()
	text := "<|im_start|>system\n" + strings.Repeat("You are a careful assistant, <b>bold</b> x < y. ", 230) +
		"<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
	var buf [16]int
	var sums [16]uint64
	b.ReportAllocs()
	for b.Loop() {
		if points, _ := tok.tailKeys(text, 0, 0, buf[:0], sums[:0]); len(points) != 5 {
			b.Fatalf("%d points", len(points))
		}
	}
}

// TestTailKeysMatchesNaive: the key points and keys of a text from one of
// its key points on, given the key there, are those of scanning and
// hashing the whole text.
func TestTailKeysMatchesNaive(t *testing.T) {
	tok := prefixTokenizer(t)
	rapid.Check(t, func(rt *rapid.T) {
		text := strings.Join(rapid.SliceOfN(rapid.SampledFrom(prefixPieces), 0, 16).Draw(rt, "text"), "")
		wantPoints, wantSums := naiveKeys(tok, text)
		k := rapid.IntRange(0, len(wantPoints)).Draw(rt, "known")
		base, h := 0, uint64(0)
		if k > 0 {
			base, h = wantPoints[k-1], wantSums[k-1]
		}
		points, sums := tok.tailKeys(text[base:], base, h, []int{-1}, []uint64{7})
		if !slices.Equal(points[1:], wantPoints[k:]) || !slices.Equal(sums[1:], wantSums[k:]) || points[0] != -1 || sums[0] != 7 {
			rt.Fatalf("tailKeys(%q from %d): points %v sums %x, want %v %x", text, base, points[1:], sums[1:], wantPoints[k:], wantSums[k:])
		}
	})
}

// TestCommonPrefixMatchesNaive: commonPrefix's chunked compares give the
// byte-by-byte answer wherever the first difference lies.
func TestCommonPrefixMatchesNaive(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		a := strings.Repeat("ab", rapid.IntRange(0, 3000).Draw(rt, "len"))
		b := a
		if len(a) > 0 && rapid.Bool().Draw(rt, "differ") {
			i := rapid.IntRange(0, len(a)-1).Draw(rt, "at")
			b = a[:i] + "x" + a[i+1:]
		}
		b = b[:rapid.IntRange(0, len(b)).Draw(rt, "cut")]
		naive := 0
		for naive < min(len(a), len(b)) && a[naive] == b[naive] {
			naive++
		}
		if got := commonPrefix(a, b); got != naive {
			rt.Fatalf("commonPrefix: %d, want %d", got, naive)
		}
	})
}

// BenchmarkCommonPrefix compares two 11 KB texts that differ near the end.
func BenchmarkCommonPrefix(b *testing.B) {
	x := strings.Repeat("the of and to in is was ", 460)
	y := x[:len(x)-40] + "X" + x[len(x)-39:]
	for b.Loop() {
		if commonPrefix(x, y) != len(x)-40 {
			b.Fatal("wrong")
		}
	}
}

// checkPrefixCache checks the cache's bookkeeping: every key leads to a
// record in the ring, at a restart point whose sum it is and that the
// record owns; every record in the ring counts and owns exactly the keys
// that lead to it; the bytes add up.
func checkPrefixCache(t interface{ Fatalf(string, ...any) }, c *PrefixCache) {
	c.mu.Lock()
	defer c.mu.Unlock()
	inRing := map[*prefixRecord]bool{}
	var used int64
	for rec := c.lru.next; rec != &c.lru; rec = rec.next {
		inRing[rec] = true
		used += rec.bytes
	}
	if len(inRing) != c.recs || used != c.used {
		t.Fatalf("ring holds %d records of %d bytes, counted %d of %d", len(inRing), used, c.recs, c.used)
	}
	leading := map[*prefixRecord]int{}
	for k, ref := range c.keys {
		if !inRing[ref.rec] || ref.i >= len(ref.rec.sums) || ref.rec.sums[ref.i] != k.sum || k.tok != ref.rec.tok {
			t.Fatalf("key %x leads to a record out of the ring or to another sum", k.sum)
		}
		if ref.i < 64 && ref.rec.owned&(1<<ref.i) == 0 {
			t.Fatalf("key %x leads to restart %d of a record that does not own it", k.sum, ref.i)
		}
		leading[ref.rec]++
	}
	for rec := range inRing {
		owned := 0
		for i := range min(len(rec.sums), 64) {
			if rec.owned&(1<<i) != 0 {
				owned++
				if ref, ok := c.keys[prefixKey{rec.tok, rec.sums[i]}]; !ok || ref.rec != rec || ref.i != i {
					t.Fatalf("a record owns restart %d, whose key leads elsewhere", i)
				}
			}
		}
		if rec.keys != leading[rec] || rec.keys == 0 || (len(rec.sums) <= 64 && owned != rec.keys) {
			t.Fatalf("a record counts %d keys and owns %d; %d lead to it", rec.keys, owned, leading[rec])
		}
	}
}

// perCall is what f allocates per call: bytes and allocations, averaged
// over 100 calls.
func perCall(f func()) (bytes, allocs float64) {
	allocs = testing.AllocsPerRun(100, f)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / 100, allocs
}
