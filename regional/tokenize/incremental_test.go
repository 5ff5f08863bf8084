package tokenize

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func mustModel(t testing.TB, cfg Config) *Model {
	t.Helper()
	m, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sameEncoding(a, b *Encoding) bool {
	return a.Text() == b.Text() && reflect.DeepEqual(a.AppendIDs(nil), b.AppendIDs(nil)) && reflect.DeepEqual(a.restarts, b.restarts)
}

// Extend must equal a full encode for any pair of texts: an extension of
// the previous text, a text that diverges at a random byte (even inside a
// special token or a UTF-8 sequence), or an unrelated text.
func TestExtendEqualsFullEncode(t *testing.T) {
	tk := mustTokenizer(t, Cl100kBase, map[string]uint32{"<|im_start|>x": 300000, "[BOS]": 300001})
	rapid.Check(t, func(rt *rapid.T) {
		a := genText(rt, "a")
		var b string
		prev := tk.EncodeText(a)
		switch shape := rapid.IntRange(0, 5).Draw(rt, "shape"); {
		case shape == 0:
			b = a + genText(rt, "suffix")
		case shape == 1:
			b = a[:rapid.IntRange(0, len(a)).Draw(rt, "cut")] + genText(rt, "suffix")
		case shape <= 4:
			// Cut at the end of one of a's special tokens and continue
			// with something that may extend it into a longer one.
			cut := len(a)
			if len(prev.restarts) > 0 {
				cut = rapid.SampledFrom(prev.restarts).Draw(rt, "at").end
			}
			b = a[:cut] + rapid.SampledFrom([]string{"x", "BOS]", "|>", "hi"}).Draw(rt, "ext") + genText(rt, "suffix")
		default:
			b = genText(rt, "b")
		}
		got, reused := tk.Extend(prev, b)
		want := tk.EncodeText(b)
		if !sameEncoding(got, want) {
			rt.Fatalf("Extend(%q -> %q) = %v %v, full encode %v %v", a, b, got.AppendIDs(nil), got.restarts, want.AppendIDs(nil), want.restarts)
		}
		if reused > want.Len() {
			rt.Fatalf("reused %d of %d ids", reused, want.Len())
		}
	})
}

func genMessages(rt *rapid.T, n int) []Message {
	roles := []string{"system", "user", "assistant", "tool"}
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Role: rapid.SampledFrom(roles).Draw(rt, "role"), Content: genText(rt, "content")}
	}
	return msgs
}

// A session's turns: the next request repeats the history and adds messages.
// ExtendChat must equal EncodeChat whatever the contents (including contents
// that contain or split special tokens), under the built-in template and a
// directory template.
func TestExtendChatEqualsEncodeChat(t *testing.T) {
	models := []*Model{
		mustModel(t, DefaultConfig()),
		mustModel(t, Config{Encoding: O200kBase, Dir: "testdata/models/jinja-file"}),
	}
	rapid.Check(t, func(rt *rapid.T) {
		m := models[rapid.IntRange(0, len(models)-1).Draw(rt, "model")]
		all := genMessages(rt, rapid.IntRange(1, 8).Draw(rt, "n"))
		k := rapid.IntRange(1, len(all)).Draw(rt, "k")
		prev, err := m.EncodeChat(all[:k], rapid.Bool().Draw(rt, "prevGen"))
		if err != nil {
			rt.Fatal(err)
		}
		gen := rapid.Bool().Draw(rt, "gen")
		got, _, err := m.ExtendChat(prev, all, gen)
		if err != nil {
			rt.Fatal(err)
		}
		want, err := m.EncodeChat(all, gen)
		if err != nil {
			rt.Fatal(err)
		}
		if !sameEncoding(got, want) {
			rt.Fatalf("ExtendChat differs from EncodeChat:\n got %v\nwant %v", got.AppendIDs(nil), want.AppendIDs(nil))
		}
	})
}

// conversation returns a session of turns user/assistant messages of about
// wordsPerMessage words each, after a system prompt.
func conversation(turns, wordsPerMessage int) []Message {
	words := strings.Fields("the router keeps a block index of every pod and sends each prompt where its longest " +
		"prefix is cached so that prefill is skipped and time to first token drops from hundreds of " +
		"milliseconds to tens while residency rules decide which regions may serve it at all")
	text := func(seed int) string {
		var sb strings.Builder
		for i := range wordsPerMessage {
			if i > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(words[(seed*7+i*13)%len(words)])
			if i%17 == 16 {
				fmt.Fprintf(&sb, " %d.\n", seed*1000+i)
			}
		}
		return sb.String()
	}
	msgs := []Message{{Role: "system", Content: "You are a careful coding agent. " + text(0)}}
	for turn := 1; turn <= turns; turn++ {
		msgs = append(msgs, Message{Role: "user", Content: text(2 * turn)})
		msgs = append(msgs, Message{Role: "assistant", Content: text(2*turn + 1)})
	}
	return msgs
}

// With the ChatML layout every earlier turn is reused: the previous
// rendering ends with "<|im_start|>assistant\n", and only "assistant\n" after
// that special token is re-encoded.
func TestExtendChatReusesHistory(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	tail := len(m.Tokenizer().Encode("assistant\n"))
	msgs := conversation(20, 200)
	var prev *Encoding
	for turn := 1; turn <= 20; turn++ {
		req := msgs[:2*turn] // system, then user/assistant pairs, ending with a user message
		got, reused, err := m.ExtendChat(prev, req, true)
		if err != nil {
			t.Fatal(err)
		}
		if prev != nil && reused != prev.Len()-tail {
			t.Fatalf("turn %d: reused %d ids, want %d (all but %q)", turn, reused, prev.Len()-tail, "assistant\n")
		}
		prev = got
	}
}

// A session extended turn by turn shares its history's ids instead of
// copying them: every turn still equals encoding its text whole, its parts
// hold exactly its ids and stay within maxParts (a long session is copied
// into one array now and then), and the earlier turns it shares ids with
// are left as they were.
func TestExtendSharesAndStaysExact(t *testing.T) {
	tk := mustTokenizer(t, Cl100kBase, map[string]uint32{"<|im_start|>x": 300000, "[BOS]": 300001})
	rapid.Check(t, func(rt *rapid.T) {
		var encs []*Encoding
		var snapshots [][]uint32
		text := ""
		var prev *Encoding
		for turn := rapid.IntRange(1, 3*maxParts).Draw(rt, "turns"); turn > 0; turn-- {
			if prev != nil && rapid.IntRange(0, 4).Draw(rt, "cut") == 0 {
				text = text[:rapid.IntRange(0, len(text)).Draw(rt, "at")]
			}
			text += "<|im_start|>" + genText(rt, "turn") + "<|im_end|>"
			got, reused := tk.Extend(prev, text)
			want := tk.EncodeText(text)
			if !sameEncoding(got, want) {
				rt.Fatalf("turn %q: Extend = %v, full encode %v", text, got.AppendIDs(nil), want.AppendIDs(nil))
			}
			var flat []uint32
			for _, p := range got.AppendParts(nil) {
				flat = append(flat, p...)
			}
			if !slices.Equal(flat, want.AppendIDs(nil)) || got.Len() != len(flat) {
				rt.Fatalf("parts %v (len %d), want %v", flat, got.Len(), want.AppendIDs(nil))
			}
			if len(got.parts) > maxParts || reused > got.Len() {
				rt.Fatalf("%d parts, reused %d of %d", len(got.parts), reused, got.Len())
			}
			encs, snapshots = append(encs, got), append(snapshots, flat)
			prev = got
		}
		for i, e := range encs {
			if !slices.Equal(e.AppendIDs(nil), snapshots[i]) {
				rt.Fatalf("turn %d changed after later turns shared it", i)
			}
		}
	})
}

// BenchmarkSession20Turns tokenizes a 20-turn session (system prompt, then
// user and assistant messages of ~250 tokens) the way a router sees it: each
// turn re-sends the whole history. "full" encodes every turn from scratch;
// "extend" reuses the previous turn's ids. One op is the whole session.
func BenchmarkSession20Turns(b *testing.B) {
	m := mustModel(b, DefaultConfig())
	msgs := conversation(20, 200)
	texts := make([]string, 20)
	for turn := 1; turn <= 20; turn++ {
		var err error
		if texts[turn-1], err = m.RenderChat(msgs[:2*turn], true); err != nil {
			b.Fatal(err)
		}
	}
	tk := m.Tokenizer()
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		var tokens int
		for b.Loop() {
			tokens = 0
			for _, text := range texts {
				tokens += tk.EncodeText(text).Len()
			}
		}
		b.ReportMetric(float64(tokens), "tokens/session")
		b.ReportMetric(float64(tokens), "encoded-tokens/session")
	})
	b.Run("extend", func(b *testing.B) {
		b.ReportAllocs()
		var tokens, encoded int
		for b.Loop() {
			tokens, encoded = 0, 0
			var prev *Encoding
			for _, text := range texts {
				e, reused := tk.Extend(prev, text)
				tokens += e.Len()
				encoded += e.Len() - reused
				prev = e
			}
		}
		b.ReportMetric(float64(tokens), "tokens/session")
		b.ReportMetric(float64(encoded), "encoded-tokens/session")
	})
}

// The case the margin in Extend exists for: the previous text ends with a
// special token that the new text extends into a longer special token.
func TestExtendSpecialTokenExtendedAcrossBoundary(t *testing.T) {
	tk := mustTokenizer(t, Cl100kBase, map[string]uint32{"<|im_start|>x": 300000})
	prev := tk.EncodeText("hi<|im_start|>")
	got, _ := tk.Extend(prev, "hi<|im_start|>x")
	if want := tk.EncodeText("hi<|im_start|>x"); !sameEncoding(got, want) {
		t.Fatalf("got %v, want %v", got.AppendIDs(nil), want.AppendIDs(nil))
	}
	if got.AppendIDs(nil)[got.Len()-1] != 300000 {
		t.Fatalf("want the longer special token last, got %v", got.AppendIDs(nil))
	}
}
