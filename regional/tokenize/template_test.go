package tokenize

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

var fixedNow = func() time.Time { return time.Date(2026, 7, 4, 9, 5, 0, 0, time.UTC) }

// TestChatGolden renders conversations with each model configuration and
// compares the text and ids with testdata/chat.golden.txt (go test -update
// rewrites it). The ids are what the router and the engine simulator both
// compute for the request.
func TestChatGolden(t *testing.T) {
	models := []struct {
		name string
		cfg  Config
	}{
		{"default cl100k_base", Config{Encoding: Cl100kBase}},
		{"default o200k_base", Config{Encoding: O200kBase}},
		{"dir header-style cl100k_base", Config{Encoding: Cl100kBase, Dir: "testdata/models/header-style", Now: fixedNow}},
		{"dir jinja-file o200k_base", Config{Encoding: O200kBase, Dir: "testdata/models/jinja-file"}},
	}
	convs := []struct {
		name string
		gen  bool
		msgs []Message
	}{
		{"one user turn", true, []Message{{Role: "user", Content: "What is a KV cache?"}}},
		{"system and two turns", true, []Message{
			{Role: "system", Content: "  Answer in one line.  "},
			{Role: "user", Content: "Hi", Name: "ana"},
			{Role: "assistant", Content: "Hello!"},
			{Role: "user", Content: "Route me <|im_end|> please"},
		}},
		{"no generation prompt", false, []Message{{Role: "user", Content: "naïve café 日本"}}},
	}
	var out strings.Builder
	for _, mc := range models {
		m := mustModel(t, mc.cfg)
		for _, c := range convs {
			fmt.Fprintf(&out, "== %s: %s (add_generation_prompt=%v)\n", mc.name, c.name, c.gen)
			text, err := m.RenderChat(c.msgs, c.gen)
			if err != nil {
				fmt.Fprintf(&out, "error: %v\n\n", err)
				continue
			}
			ids, err := m.AppendChat(nil, c.msgs, c.gen)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&out, "text: %q\nids: %v\n\n", text, ids)
		}
		fmt.Fprintf(&out, "== %s: completion prompt %q\nids: %v\n\n", mc.name, "Hello world", m.AppendCompletion(nil, "Hello world"))
	}
	golden := filepath.Join("testdata", "chat.golden.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if out.String() != string(want) {
		t.Errorf("output differs from %s (go test -update to accept):\n%s", golden, out.String())
	}
}

func TestTemplateRaiseException(t *testing.T) {
	m := mustModel(t, Config{Encoding: Cl100kBase, Dir: "testdata/models/header-style", Now: fixedNow})
	_, err := m.AppendChat(nil, []Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, true)
	if !errors.Is(err, ErrInvalidPrompt) || !strings.Contains(err.Error(), "roles must alternate") {
		t.Fatalf("got %v, want ErrInvalidPrompt naming the template's message", err)
	}
}

func TestTemplateParseError(t *testing.T) {
	if _, err := NewTemplate("{% for m in messages %}", TemplateOptions{}); err == nil {
		t.Fatal("unterminated for: no error")
	}
	if _, err := NewModel(Config{Encoding: Cl100kBase, ChatTemplate: "{{ unclosed"}); err == nil {
		t.Fatal("NewModel with a broken template: no error")
	}
}

func TestStrftime(t *testing.T) {
	tm := time.Date(2026, 1, 5, 15, 4, 5, 0, time.UTC)
	got := strftime(tm, "%Y-%m-%d %e %b %B %a %A %H:%M:%S %I%p %j %y %% %Q")
	want := "2026-01-05  5 Jan January Mon Monday 15:04:05 03PM 005 26 % %Q"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestModelDirFields(t *testing.T) {
	m := mustModel(t, Config{Encoding: Cl100kBase, Dir: "testdata/models/header-style", Now: fixedNow})
	if ids := m.AppendCompletion(nil, "hi"); !slices.Equal(ids, []uint32{128000, 6151}) {
		t.Errorf("add_bos_token: completion ids %v, want BOS 128000 first", ids)
	}
	if id, ok := m.Tokenizer().SpecialID("<|eot_id|>"); !ok || id != 128009 {
		t.Errorf("added token <|eot_id|>: %d %v", id, ok)
	}
	// chat_template.jinja wins over tokenizer_config.json's template.
	j := mustModel(t, Config{Encoding: O200kBase, Dir: "testdata/models/jinja-file"})
	if strings.Contains(j.Template().Source(), "ignored") {
		t.Error("chat_template.jinja did not win over the JSON template")
	}
	// Config overrides the directory.
	o := mustModel(t, Config{Encoding: O200kBase, Dir: "testdata/models/jinja-file", ChatTemplate: "{{ messages[0].content }}"})
	if s, _ := o.RenderChat([]Message{{Role: "user", Content: "only"}}, true); s != "only" {
		t.Errorf("ChatTemplate override: rendered %q", s)
	}
}

func TestModelDirErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if content != "" {
			if err := os.WriteFile(filepath.Join(d, "tokenizer_config.json"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	cases := []struct {
		name, json, want string
	}{
		{"empty", "", "neither tokenizer_config.json nor chat_template.jinja"},
		{"badjson", "{", "unexpected end of JSON"},
		{"badtemplate", `{"chat_template": 7}`, "chat_template: neither a string"},
		{"nodefault", `{"chat_template": [{"name": "tool_use", "template": "x"}]}`, `no template named "default"`},
		{"badbos", `{"bos_token": 5}`, "bos_token: neither a string"},
		{"badkey", `{"added_tokens_decoder": {"x": {"content": "<a>"}}}`, `added_tokens_decoder key "x"`},
		{"nobos", `{"add_bos_token": true, "bos_token": "<s>"}`, `bos_token "<s>" is not a special token`},
		{"collide", `{"added_tokens_decoder": {"15339": {"content": "<a>"}}}`, "collides with an ordinary token"},
	}
	for _, c := range cases {
		_, err := NewModel(Config{Encoding: Cl100kBase, Dir: write(c.name, c.json)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := NewModel(Config{Encoding: Cl100kBase, Dir: filepath.Join(dir, "missing")}); err == nil || !strings.Contains(err.Error(), "Dir") {
		t.Errorf("missing dir: got %v, want an error naming Dir", err)
	}
	if err := (Config{Encoding: "nope"}).Validate(); !errors.Is(err, ErrUnknownEncoding) || !strings.Contains(err.Error(), "Encoding") {
		t.Errorf("bad encoding: got %v", err)
	}
}

func TestTemplateConcurrentRender(t *testing.T) {
	m := mustModel(t, Config{Encoding: Cl100kBase, Dir: "testdata/models/header-style", Now: fixedNow})
	msgs := conversation(3, 20)[:4]
	want, err := m.RenderChat(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 20 {
				got, err := m.RenderChat(msgs, true)
				if err == nil && got != want {
					err = errors.New("concurrent render differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
