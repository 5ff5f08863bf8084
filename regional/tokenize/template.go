package tokenize

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// DefaultChatTemplate is the built-in ChatML template used when a model
// configures none: each message as <|im_start|>role\ncontent<|im_end|>\n, and
// <|im_start|>assistant\n when a generation prompt is asked for.
const DefaultChatTemplate = `{% for message in messages %}` +
	`{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}` +
	`{% endfor %}` +
	`{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

// Message is one chat message as the template sees it.
type Message struct {
	Role    string
	Content string
	Name    string // optional participant name; empty when absent
}

// Template is a parsed Jinja chat template. It renders the way Hugging Face
// transformers' apply_chat_template does: trim_blocks and lstrip_blocks on;
// `messages`, `add_generation_prompt`, `bos_token` and `eos_token` defined;
// `raise_exception(msg)` fails the render with msg; `strftime_now(fmt)`
// formats the injected clock's time. Safe for concurrent use.
type Template struct {
	source string
	tpl    *exec.Template
	bos    string
	eos    string
	// fast renders the template without gonja when its source is a known
	// one (compiled.go); nil otherwise.
	fast *compiled
}

// TemplateOptions are the values a template sees besides the messages.
type TemplateOptions struct {
	BOSToken string           // bos_token, e.g. "<|begin_of_text|>"; "" when the model has none
	EOSToken string           // eos_token
	Now      func() time.Time // clock for strftime_now; nil = time.Now
}

const templateName = "/chat_template.jinja"

// NewTemplate parses a Jinja chat template. The templates of the common
// model families (Family) are recognised by their source and rendered by
// compiled Go code, byte for byte as gonja renders them; gonja renders
// every other template.
func NewTemplate(source string, opts TemplateOptions) (*Template, error) {
	t, err := newTemplate(source, opts)
	if err != nil {
		return nil, err
	}
	if c, ok := compiledFor(source); ok {
		t.fast = &c
	}
	return t, nil
}

// Family names the compiled form rendering the template ("chatml",
// "llama3", "qwen2.5", "mistral", "mixtral", "gemma", "deepseek-r1"), or
// is "" when gonja renders it.
func (t *Template) Family() string {
	if t.fast == nil {
		return ""
	}
	return t.fast.family
}

// newTemplate is NewTemplate with gonja alone.
func newTemplate(source string, opts TemplateOptions) (*Template, error) {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	// Our own context on top of gonja's global functions: nothing of the
	// package-level gonja environment is modified.
	ctx := exec.EmptyContext().
		Update(builtins.GlobalFunctions).
		Update(builtins.GlobalVariables).
		Update(exec.NewContext(map[string]any{
			"raise_exception": func(msg string) (string, error) {
				return "", fmt.Errorf("template raised: %s", msg)
			},
			"strftime_now": func(format string) string {
				return strftime(now(), format)
			},
		}))
	env := &exec.Environment{
		Context:           ctx,
		Filters:           builtins.Filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	loader, err := loaders.NewMemoryLoader(map[string]string{templateName: source})
	if err != nil {
		return nil, fmt.Errorf("parse chat template: %w", err)
	}
	tpl, err := exec.NewTemplate(templateName, cfg, loader, env)
	if err != nil {
		return nil, fmt.Errorf("parse chat template: %w", err)
	}
	return &Template{source: source, tpl: tpl, bos: opts.BOSToken, eos: opts.EOSToken}, nil
}

// Source returns the template's Jinja source.
func (t *Template) Source() string { return t.source }

// Render renders messages. An error caused by the messages (the template
// raised, or rendering failed) wraps ErrInvalidPrompt.
func (t *Template) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	var w renderSink
	w.reset(nil, -1, 0, t.estimate(msgs))
	if err := t.renderTo(&w, msgs, addGenerationPrompt); err != nil {
		return "", err
	}
	_, text := w.finish()
	return text.s, nil
}

// estimate is about the length of a rendering of msgs (room to render
// into).
func (t *Template) estimate(msgs []Message) int {
	size := 64 + len(t.bos) + len(t.eos)
	for i := range msgs {
		size += len(msgs[i].Content) + len(msgs[i].Role) + 32
	}
	return size
}

// renderTo renders messages into w.
func (t *Template) renderTo(w *renderSink, msgs []Message, addGenerationPrompt bool) error {
	if t.fast != nil {
		ok, err := t.fast.render(w, msgs, addGenerationPrompt, t.bos, t.eos)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		w.rewind()
	}
	out, err := t.renderGonja(msgs, addGenerationPrompt)
	if err != nil {
		return err
	}
	w.WriteString(out)
	return nil
}

// renderGonja renders with the interpreter.
func (t *Template) renderGonja(msgs []Message, addGenerationPrompt bool) (string, error) {
	list := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		v := map[string]any{"role": m.Role, "content": m.Content}
		if m.Name != "" {
			v["name"] = m.Name
		}
		list[i] = v
	}
	out, err := t.tpl.ExecuteToString(exec.NewContext(map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
	}))
	if err != nil {
		return "", fmt.Errorf("%w: render chat template: %w", ErrInvalidPrompt, unwrapAll(err))
	}
	return out, nil
}

// unwrapAll drops gonja's layers of "unable to execute template" wrapping
// down to the innermost message, which is what a client can act on.
func unwrapAll(err error) error {
	for {
		inner := errors.Unwrap(err)
		if inner == nil {
			return err
		}
		err = inner
	}
}

// strftime formats t with a Python strftime format (the directives chat
// templates use: %Y %y %m %d %e %B %b %A %a %H %I %M %S %p %j %Z %z %%);
// an unknown directive is copied as is.
func strftime(t time.Time, format string) string {
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&sb, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&sb, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&sb, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&sb, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&sb, "%2d", t.Day())
		case 'B':
			sb.WriteString(t.Month().String())
		case 'b':
			sb.WriteString(t.Month().String()[:3])
		case 'A':
			sb.WriteString(t.Weekday().String())
		case 'a':
			sb.WriteString(t.Weekday().String()[:3])
		case 'H':
			fmt.Fprintf(&sb, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&sb, "%02d", h)
		case 'M':
			fmt.Fprintf(&sb, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&sb, "%02d", t.Second())
		case 'p':
			if t.Hour() < 12 {
				sb.WriteString("AM")
			} else {
				sb.WriteString("PM")
			}
		case 'j':
			fmt.Fprintf(&sb, "%03d", t.YearDay())
		case 'Z':
			name, _ := t.Zone()
			sb.WriteString(name)
		case 'z':
			sb.WriteString(t.Format("-0700"))
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteByte('%')
			sb.WriteByte(format[i])
		}
	}
	return sb.String()
}
