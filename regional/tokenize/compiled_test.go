package tokenize

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// knownSources lists every recognised source, sorted, so that draws are
// reproducible.
func knownSources() []string {
	var out []string
	for s := range knownTemplates {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Pieces of message contents and roles that exercise the templates: the
// roles they branch on and others, whitespace their trim removes (Unicode
// spaces too), special tokens of several families, </think> (DeepSeek
// drops what precedes the last one), Jinja syntax (content must never be
// interpreted), quotes and non-ASCII text.
var (
	fuzzRoles  = []string{"user", "assistant", "system", "tool", "tool", "ipython", "model", "User", "", "developer"}
	fuzzPieces = []string{"", "hello", " ", "  ", "\n", "\t", "\r\n", "\u00a0", "\u3000", "\u2028", "\v", "x y",
		"<|im_start|>", "<|im_end|>", "<|eot_id|>", "<start_of_turn>", "[INST]", "<｜User｜>", "<｜Assistant｜>",
		"</think>", "</think>", "<think>", "{{ messages }}", "{% if %}", "'", "\"", "\\n", "日本語", "é", "🙂", "%s", "None"}
)

// renderBoth renders msgs with the compiled form of source and with gonja,
// and fails when they differ in text or error.
func renderBoth(t interface{ Fatalf(string, ...any) }, source string, msgs []Message, gen bool, bos, eos string) {
	opts := TemplateOptions{BOSToken: bos, EOSToken: eos, Now: fixedNow}
	fast, err := NewTemplate(source, opts)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if fast.fast == nil {
		t.Fatalf("source not recognised: %.60q", source)
	}
	want, werr := fast.renderGonja(msgs, gen)
	got, gerr := fast.Render(msgs, gen)
	if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
		t.Fatalf("%s: errors differ:\n compiled %v\n gonja    %v\nmessages %q gen %v", fast.Family(), gerr, werr, msgs, gen)
	}
	if got != want {
		t.Fatalf("%s: renderings differ:\n compiled %q\n gonja    %q\nmessages %q gen %v bos %q eos %q", fast.Family(), got, want, msgs, gen, bos, eos)
	}
}

// TestCompiledMatchesGonja renders random message lists with every known
// template, compiled and through gonja, and requires the same bytes (and
// the same error, where the template refuses the conversation). Half the
// lists alternate user and assistant (optionally after a system message),
// which the strict templates require; the others mix every role.
func TestCompiledMatchesGonja(t *testing.T) {
	sources := knownSources()
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 6).Draw(rt, "messages")
		msgs := make([]Message, n)
		alternate := rapid.Bool().Draw(rt, "alternate")
		for i := range msgs {
			role := rapid.SampledFrom(fuzzRoles).Draw(rt, "role")
			if alternate {
				role = []string{"user", "assistant"}[i%2]
				if i == 0 && rapid.Bool().Draw(rt, "system") {
					role = "system"
				}
			}
			parts := rapid.SliceOfN(rapid.SampledFrom(fuzzPieces), 0, 5).Draw(rt, "content")
			msgs[i] = Message{Role: role, Content: strings.Join(parts, "")}
			if rapid.IntRange(0, 9).Draw(rt, "named") == 0 {
				msgs[i].Name = "ana"
			}
		}
		bos := rapid.SampledFrom([]string{"", "<s>", "<|begin_of_text|>", "<bos>", "<｜begin▁of▁sentence｜>"}).Draw(rt, "bos")
		eos := rapid.SampledFrom([]string{"", "</s>", "<|eot_id|>", "<eos>"}).Draw(rt, "eos")
		gen := rapid.Bool().Draw(rt, "gen")
		for _, source := range sources {
			renderBoth(rt, source, msgs, gen, bos, eos)
		}
	})
}

// FuzzCompiledTemplates is TestCompiledMatchesGonja driven by the fuzzer:
// the input gives each message's role and its content (any bytes), the
// generation prompt and the BOS token; every known template renders it.
func FuzzCompiledTemplates(f *testing.F) {
	sources := knownSources()
	f.Add(uint8(0), true, []byte("\x00hello\x00\x01 hi \x00\x02sys"))
	f.Add(uint8(3), false, []byte("\x01</think>answer\x00\x00  q  \x00\x03tool out"))
	f.Add(uint8(7), true, []byte("\x02\u00a0x\u3000\x00\x01{{ x }}"))
	f.Fuzz(func(t *testing.T, which uint8, gen bool, data []byte) {
		var msgs []Message
		for len(data) > 0 && len(msgs) < 16 {
			role := fuzzRoles[int(data[0])%len(fuzzRoles)]
			data = data[1:]
			end := slices.Index(data, 0)
			if end < 0 {
				end = len(data)
			}
			msgs = append(msgs, Message{Role: role, Content: string(data[:end])})
			data = data[min(end+1, len(data)):]
		}
		bos := []string{"", "<s>", "<|begin_of_text|>"}[binary.LittleEndian.Uint16([]byte{which, 0})%3]
		for _, source := range sources {
			renderBoth(t, source, msgs, gen, bos, "</s>")
		}
	})
}

// TestKnownTemplatesRecognised: each family's published source, and the
// built-in default, get a compiled form; an edited source does not.
func TestKnownTemplatesRecognised(t *testing.T) {
	for _, c := range []struct{ source, family string }{
		{DefaultChatTemplate, "chatml"}, {chatMLSource, "chatml"}, {qwen25Source, "qwen2.5"},
		{llama3Source, "llama3"}, {strings.ReplaceAll(llama3Source, "\n", `\n`), "llama3"},
		{mistralSource, "mistral"}, {mixtralSource, "mixtral"}, {gemmaSource, "gemma"},
		{deepSeekR1Source, "deepseek-r1"}, {deepSeekR1ThinkSource, "deepseek-r1"},
	} {
		tpl, err := NewTemplate(c.source, TemplateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if tpl.Family() != c.family {
			t.Errorf("%.40q: family %q, want %q", c.source, tpl.Family(), c.family)
		}
		edited, err := NewTemplate(c.source+" ", TemplateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if edited.Family() != "" {
			t.Errorf("an edited %s template was recognised", c.family)
		}
	}
}

// TestCompiledEdgeCases renders, with every known template, conversations
// chosen for the branches random lists reach rarely.
func TestCompiledEdgeCases(t *testing.T) {
	convs := [][]Message{
		nil,
		{{Role: "user", Content: "a"}, {Role: "assistant", Content: "x</think>y</think> z "}, {Role: "user", Content: "b"}},
		{{Role: "system", Content: " s "}, {Role: "user", Content: "q"}, {Role: "tool", Content: "t1"}, {Role: "tool", Content: "t2"},
			{Role: "assistant", Content: "after tools"}, {Role: "tool", Content: "t3"}},
		{{Role: "tool", Content: "first"}, {Role: "user", Content: "u"}},
		{{Role: "system", Content: "one"}, {Role: "system", Content: "two"}, {Role: "user", Content: "\u00a0\u2003spaces\u3000\n"}},
		{{Role: "user", Content: "u"}, {Role: "user", Content: "u again"}},
		{{Role: "assistant", Content: "starts with the model"}},
		{{Role: "user", Content: "{{ bos_token }}{% raise %}"}, {Role: "assistant", Content: "'\"\\"}},
	}
	for _, source := range knownSources() {
		for _, msgs := range convs {
			for _, gen := range []bool{false, true} {
				renderBoth(t, source, msgs, gen, "<s>", "</s>")
			}
		}
	}
}
