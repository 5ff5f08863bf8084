package tokenize

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// splitPieces returns text cut into pieces at random places (empty pieces
// too), as an encoding made from others holds its text.
func splitPieces(rt *rapid.T, text string) []textPiece {
	var out []textPiece
	for text != "" || len(out) == 0 {
		n := rapid.IntRange(0, len(text)).Draw(rt, "piece")
		out = append(out, textPiece{s: text[:n], whole: n})
		text = text[n:]
		if len(out) > 6 {
			out = append(out, textPiece{s: text, whole: len(text)})
			break
		}
	}
	return out
}

// TestRenderSinkMatchesRender: a text written in random chunks into a
// sink rendering against a reference text held in random pieces is the
// reference's text up to the end of the restart reused followed by the
// sink's tail, and the restart reused is the last one, up to maxI, whose
// special token starts maxSpecial bytes or more before the first
// difference (Extend's rule).
func TestRenderSinkMatchesRender(t *testing.T) {
	tok := prefixTokenizer(t)
	rapid.Check(t, func(rt *rapid.T) {
		draw := func(label string) string {
			return strings.Join(rapid.SliceOfN(rapid.SampledFrom(prefixPieces), 0, 12).Draw(rt, label), "")
		}
		refText := draw("ref")
		text := refText[:rapid.IntRange(0, len(refText)).Draw(rt, "cut")] + draw("tail")
		var ref *Encoding
		maxI := -1
		if rapid.IntRange(0, 5).Draw(rt, "no ref") > 0 {
			ref = tok.EncodeText(refText)
			ref.text = splitPieces(rt, refText)
			maxI = rapid.IntRange(-1, len(ref.restarts)).Draw(rt, "maxI")
		}
		var w renderSink
		w.reset(ref, maxI, tok.maxSpecial, rapid.IntRange(0, 100).Draw(rt, "est"))
		for rest := text; rest != ""; {
			n := rapid.IntRange(0, len(rest)).Draw(rt, "chunk")
			w.WriteString(rest[:n])
			rest = rest[n:]
		}
		cut, tail := w.finish()
		wantCut, from := -1, 0
		if ref != nil {
			common := commonPrefix(refText, text)
			for i, r := range ref.restarts {
				if i <= maxI && r.start+tok.maxSpecial <= common {
					wantCut, from = i, r.end
				}
			}
		}
		if cut != wantCut || refText[:from]+tail.s != text || tail.whole < len(tail.s) {
			rt.Fatalf("against %q, %q: cut %d tail %q, want cut %d tail %q", refText, text, cut, tail.s, wantCut, text[from:])
		}
	})
}

// chatModels are models with each compiled template and one gonja renders
// (a directory's template), whose tokenizers know the templates' special
// tokens and longer specials that start with them or run across a
// message boundary, so that a special token can straddle the end of a
// shared prefix.
func chatModels(t testing.TB) []*Model {
	specials := map[string]uint32{}
	for i, s := range []string{"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
		"<s>", "</s>", "[INST]", "[/INST]", "<bos>", "<start_of_turn>", "<end_of_turn>",
		"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>",
		"<|im_start|>x", "<|im_end|>\n<|im_start|>us", "<end_of_turn>\n<start_of_turn>m", "[/INST]x"} {
		specials[s] = uint32(300000 + i)
	}
	var models []*Model
	for _, source := range knownSources() {
		models = append(models, mustModel(t, Config{Encoding: Cl100kBase, ChatTemplate: source, SpecialTokens: specials,
			BOSToken: "<s>", EOSToken: "</s>", Now: fixedNow}))
	}
	models = append(models, mustModel(t, Config{Encoding: O200kBase, Dir: "testdata/models/jinja-file", Now: fixedNow}))
	return models
}

// drawConversation draws the next request of a random sequence: a new
// conversation, or an earlier one continued, cut back, or with its last
// message edited, so that consecutive requests share prefixes of every
// length.
func drawConversation(rt *rapid.T, earlier [][]Message) []Message {
	content := func() string {
		return strings.Join(rapid.SliceOfN(rapid.SampledFrom(fuzzPieces), 0, 4).Draw(rt, "content"), "")
	}
	message := func(i int) Message {
		role := []string{"user", "assistant"}[i%2]
		if rapid.IntRange(0, 3).Draw(rt, "odd role") == 0 {
			role = rapid.SampledFrom(fuzzRoles).Draw(rt, "role")
		}
		return Message{Role: role, Content: content()}
	}
	var msgs []Message
	if len(earlier) > 0 && rapid.IntRange(0, 3).Draw(rt, "fresh") > 0 {
		msgs = slices.Clone(rapid.SampledFrom(earlier).Draw(rt, "base"))
		msgs = msgs[:rapid.IntRange(0, len(msgs)).Draw(rt, "keep")]
		if len(msgs) > 0 && rapid.Bool().Draw(rt, "edit") {
			last := &msgs[len(msgs)-1]
			last.Content = last.Content[:rapid.IntRange(0, len(last.Content)).Draw(rt, "edit at")] + content()
		}
	} else if rapid.Bool().Draw(rt, "system") {
		msgs = append(msgs, Message{Role: "system", Content: "You are terse. " + content()})
	}
	for i := rapid.IntRange(0, 3).Draw(rt, "more"); i > 0; i-- {
		msgs = append(msgs, message(len(msgs)))
	}
	return msgs
}

// TestEncodeChatCachedExact: chat requests in a sequence sharing prefixes
// every way, encoded through a prefix cache small enough to evict (shared
// by two models at times) and, as a session's turns, through ExtendChat
// rendering against the previous turn, give the text, ids and restart
// points of rendering and encoding each whole, or the same refusal; the
// cache's bookkeeping holds, and no encoding changes after later ones
// share its ids and text.
func TestEncodeChatCachedExact(t *testing.T) {
	models := chatModels(t)
	rapid.Check(t, func(rt *rapid.T) {
		m := rapid.SampledFrom(models).Draw(rt, "model")
		other := rapid.SampledFrom(models).Draw(rt, "other model")
		c := NewPrefixCache(int64(rapid.SampledFrom([]int{1 << 10, 1 << 14, 1 << 20}).Draw(rt, "bytes")))
		var earlier [][]Message
		var encs []*Encoding
		var texts []string
		var ids [][]uint32
		var prev *Encoding // the session's last turn
		var prevModel *Model
		for step := rapid.IntRange(1, 20).Draw(rt, "steps"); step > 0; step-- {
			msgs := drawConversation(rt, earlier)
			earlier = append(earlier, msgs)
			gen := rapid.Bool().Draw(rt, "gen")
			mm := m
			if rapid.IntRange(0, 4).Draw(rt, "other") == 0 {
				mm = other
			}
			want, werr := mm.EncodeChat(msgs, gen)
			got, reused, err := mm.EncodeChatCached(c, msgs, gen)
			if prevModel != mm {
				prev = nil // a session stays with its model
			}
			turn, treused, terr := mm.ExtendChat(prev, msgs, gen)
			if (err == nil) != (werr == nil) || (terr == nil) != (werr == nil) {
				rt.Fatalf("%s %q: errors %v, %v; whole %v", mm.Template().Family(), msgs, err, terr, werr)
			}
			if werr != nil {
				if err.Error() != werr.Error() || terr.Error() != werr.Error() {
					rt.Fatalf("errors %v, %v; whole %v", err, terr, werr)
				}
				continue
			}
			for _, e := range []*Encoding{got, turn} {
				if e.Text() != want.Text() || !slices.Equal(e.AppendIDs(nil), want.AppendIDs(nil)) || !slices.Equal(e.restarts, want.restarts) || e.tlen != len(want.Text()) {
					rt.Fatalf("%s %q gen %v: reused %d/%d:\n got  %q %v\n want %q %v", mm.Template().Family(), msgs, gen, reused, treused,
						e.Text(), e.AppendIDs(nil), want.Text(), want.AppendIDs(nil))
				}
				if len(e.text) > maxParts || len(e.parts) > maxParts {
					rt.Fatalf("%d text pieces, %d id parts", len(e.text), len(e.parts))
				}
			}
			if reused > want.Len() || treused > want.Len() {
				rt.Fatalf("reused %d and %d of %d ids", reused, treused, want.Len())
			}
			if st := c.Stats(); st.Bytes > st.MaxBytes && st.Records > 1 {
				rt.Fatalf("cache holds %d bytes, bound %d", st.Bytes, st.MaxBytes)
			}
			checkPrefixCache(rt, c)
			prev, prevModel = turn, mm
			if rapid.IntRange(0, 5).Draw(rt, "new session") == 0 {
				prev = nil
			}
			encs = append(encs, got, turn)
			texts = append(texts, want.Text(), want.Text())
			ids = append(ids, want.AppendIDs(nil), want.AppendIDs(nil))
		}
		for i, e := range encs {
			if e.Text() != texts[i] || !slices.Equal(e.AppendIDs(nil), ids[i]) {
				rt.Fatalf("encoding %d changed after later ones shared it", i)
			}
		}
	})
}

// TestExtendChatLongSession: a session of many turns, each rendered
// against the one before, keeps its text and ids in at most maxParts
// pieces each and equals rendering and encoding it whole.
func TestExtendChatLongSession(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	msgs := conversation(3*maxParts, 20)
	var prev *Encoding
	for turn := 1; turn <= 3*maxParts; turn++ {
		got, reused, err := m.ExtendChat(prev, msgs[:2*turn], true)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := m.EncodeChat(msgs[:2*turn], true)
		if got.Text() != want.Text() || !slices.Equal(got.AppendIDs(nil), want.AppendIDs(nil)) || len(got.text) > maxParts || len(got.parts) > maxParts {
			t.Fatalf("turn %d: differs from a whole encoding, or in %d pieces and %d parts", turn, len(got.text), len(got.parts))
		}
		if prev != nil && reused == 0 {
			t.Fatalf("turn %d reused nothing", turn)
		}
		prev = got
	}
}

// TestEncodeChatCachedHitAllocs: a request whose system prompt the prefix
// cache holds allocates a bounded amount, whatever the prompt's length:
// the text it repeats is compared, not copied.
func TestEncodeChatCachedHitAllocs(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	perHit := func(words int) (bytes, allocs float64) {
		system := Message{Role: "system", Content: strings.Repeat("You are a careful assistant. ", words/5)}
		c := NewPrefixCache(1 << 30)
		msgs := make([][]Message, 201)
		for i := range msgs {
			msgs[i] = []Message{system, {Role: "user", Content: fmt.Sprintf("Question %d.", i)}}
		}
		if _, _, err := m.EncodeChatCached(c, msgs[200], true); err != nil {
			t.Fatal(err)
		}
		i := 0
		hit := func() {
			_, reused, err := m.EncodeChatCached(c, msgs[i%200], true)
			i++
			if err != nil || reused < words {
				t.Fatalf("reused %d, err %v", reused, err)
			}
		}
		return perCall(hit)
	}
	smallBytes, smallAllocs := perHit(2000)
	bigBytes, bigAllocs := perHit(20000)
	t.Logf("a hit on a 2k-word system prompt: %.0f bytes in %.0f allocations; on 20k words: %.0f bytes in %.0f", smallBytes, smallAllocs, bigBytes, bigAllocs)
	if bigBytes > 2*smallBytes || bigBytes > 4096 {
		t.Errorf("a hit allocates %.0f bytes (%.0f on a tenth of the prompt): the prompt is copied", bigBytes, smallBytes)
	}
	if !raceEnabled && (smallAllocs > 3 || bigAllocs > 3) {
		t.Errorf("a hit allocates %.0f and %.0f times, budget 3", smallAllocs, bigAllocs)
	}
}
