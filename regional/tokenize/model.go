package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// Config names a model's tokenizer and chat template. The router and the
// engine simulator must be given the same Config for the same served model.
type Config struct {
	// Encoding is the tiktoken encoding: "cl100k_base" (default),
	// "o200k_base", "p50k_base" or "r50k_base".
	Encoding string
	// Dir is a model directory holding tokenizer_config.json (chat_template,
	// bos_token, eos_token, add_bos_token, added_tokens_decoder) and/or
	// chat_template.jinja, which wins over the JSON's template as it does in
	// transformers. Empty: no directory.
	Dir string
	// ChatTemplate is a Jinja chat template that overrides Dir's. Empty:
	// Dir's, else DefaultChatTemplate.
	ChatTemplate string
	// BOSToken and EOSToken override Dir's. Default: Dir's, else "" and
	// "<|endoftext|>".
	BOSToken, EOSToken string
	// AddBOS prepends BOSToken's id to completions prompts (Hugging Face
	// add_bos_token). Default false; true when Dir's add_bos_token is true.
	AddBOS bool
	// SpecialTokens adds special tokens (content -> id) to the encoding's own
	// and Dir's added tokens.
	SpecialTokens map[string]uint32
	// Now is the clock strftime_now reads in templates; nil = time.Now.
	Now func() time.Time
}

// DefaultConfig returns cl100k_base with the built-in ChatML template.
func DefaultConfig() Config {
	return Config{Encoding: Cl100kBase}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if _, ok := builtinSpecials[c.Encoding]; !ok {
		return fmt.Errorf("tokenize config: Encoding %q: %w", c.Encoding, ErrUnknownEncoding)
	}
	if c.Dir != "" {
		st, err := os.Stat(c.Dir)
		if err != nil {
			return fmt.Errorf("tokenize config: Dir %q: %w", c.Dir, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("tokenize config: Dir %q: not a directory", c.Dir)
		}
	}
	for s := range c.SpecialTokens {
		if s == "" {
			return errors.New("tokenize config: SpecialTokens: empty token content")
		}
	}
	return nil
}

// Model is a tokenizer plus a chat template: everything needed to turn a
// request into the ids the engine computes. Safe for concurrent use.
type Model struct {
	tok    *Tokenizer
	tmpl   *Template
	addBOS bool
	bosID  uint32
}

// tokenizerConfig is the subset of a Hugging Face tokenizer_config.json that
// decides token ids.
type tokenizerConfig struct {
	ChatTemplate       json.RawMessage       `json:"chat_template"`
	BOSToken           json.RawMessage       `json:"bos_token"`
	EOSToken           json.RawMessage       `json:"eos_token"`
	AddBOSToken        *bool                 `json:"add_bos_token"`
	AddedTokensDecoder map[string]addedToken `json:"added_tokens_decoder"`
}

type addedToken struct {
	Content string `json:"content"`
	Special bool   `json:"special"`
}

// NewModel builds a Model from cfg (see Config for what comes from where).
func NewModel(cfg Config) (*Model, error) {
	if cfg.Encoding == "" {
		cfg.Encoding = Cl100kBase
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	source, bos, eos := "", "", "<|endoftext|>"
	addBOS := cfg.AddBOS
	specials := map[string]uint32{}
	if cfg.Dir != "" {
		dc, err := readModelDir(cfg.Dir)
		if err != nil {
			return nil, err
		}
		if dc.template != "" {
			source = dc.template
		}
		if dc.bos != nil {
			bos = *dc.bos
		}
		if dc.eos != nil {
			eos = *dc.eos
		}
		addBOS = addBOS || dc.addBOS
		for s, id := range dc.added {
			specials[s] = id
		}
	}
	for s, id := range cfg.SpecialTokens {
		specials[s] = id
	}
	if cfg.ChatTemplate != "" {
		source = cfg.ChatTemplate
	}
	if source == "" {
		source = DefaultChatTemplate
	}
	if cfg.BOSToken != "" {
		bos = cfg.BOSToken
	}
	if cfg.EOSToken != "" {
		eos = cfg.EOSToken
	}
	tok, err := NewTokenizer(cfg.Encoding, specials)
	if err != nil {
		return nil, err
	}
	m := &Model{tok: tok, addBOS: addBOS}
	if addBOS {
		id, ok := tok.SpecialID(bos)
		if !ok {
			return nil, fmt.Errorf("new model: add_bos_token is set but bos_token %q is not a special token of the tokenizer", bos)
		}
		m.bosID = id
	}
	m.tmpl, err = NewTemplate(source, TemplateOptions{BOSToken: bos, EOSToken: eos, Now: cfg.Now})
	if err != nil {
		return nil, fmt.Errorf("new model: %w", err)
	}
	return m, nil
}

type dirConfig struct {
	template string
	bos, eos *string
	addBOS   bool
	added    map[string]uint32
}

// readModelDir reads tokenizer_config.json and chat_template.jinja from dir;
// either may be absent, not both.
func readModelDir(dir string) (dirConfig, error) {
	var dc dirConfig
	jsonPath := filepath.Join(dir, "tokenizer_config.json")
	raw, jsonErr := os.ReadFile(jsonPath)
	if jsonErr != nil && !errors.Is(jsonErr, fs.ErrNotExist) {
		return dc, fmt.Errorf("read model dir: %w", jsonErr)
	}
	if jsonErr == nil {
		var tc tokenizerConfig
		if err := json.Unmarshal(raw, &tc); err != nil {
			return dc, fmt.Errorf("read model dir: %s: %w", jsonPath, err)
		}
		var err error
		if dc.template, err = chatTemplateField(tc.ChatTemplate); err != nil {
			return dc, fmt.Errorf("read model dir: %s: chat_template: %w", jsonPath, err)
		}
		if dc.bos, err = tokenField(tc.BOSToken); err != nil {
			return dc, fmt.Errorf("read model dir: %s: bos_token: %w", jsonPath, err)
		}
		if dc.eos, err = tokenField(tc.EOSToken); err != nil {
			return dc, fmt.Errorf("read model dir: %s: eos_token: %w", jsonPath, err)
		}
		dc.addBOS = tc.AddBOSToken != nil && *tc.AddBOSToken
		dc.added = make(map[string]uint32, len(tc.AddedTokensDecoder))
		for k, at := range tc.AddedTokensDecoder {
			id, err := strconv.ParseUint(k, 10, 32)
			if err != nil {
				return dc, fmt.Errorf("read model dir: %s: added_tokens_decoder key %q: not a token id", jsonPath, k)
			}
			if at.Content == "" {
				return dc, fmt.Errorf("read model dir: %s: added_tokens_decoder[%s]: empty content", jsonPath, k)
			}
			dc.added[at.Content] = uint32(id)
		}
	}
	jinjaPath := filepath.Join(dir, "chat_template.jinja")
	src, jinjaErr := os.ReadFile(jinjaPath)
	if jinjaErr != nil && !errors.Is(jinjaErr, fs.ErrNotExist) {
		return dc, fmt.Errorf("read model dir: %w", jinjaErr)
	}
	if jinjaErr == nil {
		dc.template = string(src)
	}
	if jsonErr != nil && jinjaErr != nil {
		return dc, fmt.Errorf("read model dir %q: neither tokenizer_config.json nor chat_template.jinja found", dir)
	}
	return dc, nil
}

// chatTemplateField accepts a template string, or a list of named templates
// (the one named "default" is used).
func chatTemplateField(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("neither a string nor a list of {name, template}")
	}
	i := slices.IndexFunc(named, func(n struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}) bool {
		return n.Name == "default"
	})
	if i < 0 {
		return "", errors.New("no template named \"default\"")
	}
	return named[i].Template, nil
}

// tokenField accepts a token as a string or as {"content": ...}; null is
// "no token".
func tokenField(raw json.RawMessage) (*string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if string(raw) == "null" {
		empty := ""
		return &empty, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return &s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return nil, errors.New("neither a string nor {\"content\": ...}")
	}
	return obj.Content, nil
}

// Tokenizer returns the model's tokenizer.
func (m *Model) Tokenizer() *Tokenizer { return m.tok }

// Template returns the model's chat template.
func (m *Model) Template() *Template { return m.tmpl }

// RenderChat renders messages with the chat template.
func (m *Model) RenderChat(msgs []Message, addGenerationPrompt bool) (string, error) {
	return m.tmpl.Render(msgs, addGenerationPrompt)
}

// AppendChat appends the ids of a chat request: the rendered template,
// encoded without adding BOS (the template writes it).
func (m *Model) AppendChat(dst []uint32, msgs []Message, addGenerationPrompt bool) ([]uint32, error) {
	text, err := m.tmpl.Render(msgs, addGenerationPrompt)
	if err != nil {
		return dst, err
	}
	return m.tok.AppendEncode(dst, text), nil
}

// EncodeChat is AppendChat keeping the rendered text and its restart points,
// for a session's next turn (see ExtendChat).
func (m *Model) EncodeChat(msgs []Message, addGenerationPrompt bool) (*Encoding, error) {
	text, err := m.tmpl.Render(msgs, addGenerationPrompt)
	if err != nil {
		return nil, err
	}
	return m.tok.EncodeText(text), nil
}

// ExtendChat is EncodeChat reusing prev, the previous turn of the same
// session (see Tokenizer.Extend); it also returns how many ids it reused.
// The messages are rendered against prev's text: the history they repeat
// is compared with it, not copied, and shared with prev (see renderSink).
func (m *Model) ExtendChat(prev *Encoding, msgs []Message, addGenerationPrompt bool) (*Encoding, int, error) {
	var w renderSink
	maxI := -1
	if prev != nil {
		maxI = len(prev.restarts) - 1
	}
	w.reset(prev, maxI, m.tok.maxSpecial, m.tmpl.estimate(msgs))
	if err := m.tmpl.renderTo(&w, msgs, addGenerationPrompt); err != nil {
		return nil, 0, err
	}
	cut, tail := w.finish()
	e := new(Encoding)
	if cut < 0 {
		m.tok.encodePiece(e, tail)
		return e, 0, nil
	}
	m.tok.encodeAfter(e, prev, cut, tail.s)
	e.setText(prev, prev.restarts[cut].end, tail)
	return e, prev.restarts[cut].tokens, nil
}

// EncodeChatCached is EncodeChat through the prefix cache c (see
// Tokenizer.EncodeCached): it reuses the longest prefix of the rendering,
// ending at a special token, that c holds the encoding of, then caches
// the rendering's encoding; it also returns how many ids it reused. A
// request that repeats the text of the last one cached (its system
// prompt) only compares that text, and renders, scans and hashes the
// rest. A nil or empty cache encodes in full.
func (m *Model) EncodeChatCached(c *PrefixCache, msgs []Message, addGenerationPrompt bool) (*Encoding, int, error) {
	if c == nil || c.max <= 0 {
		e, err := m.EncodeChat(msgs, addGenerationPrompt)
		return e, 0, err
	}
	return m.tok.encodeCached(c, &renderInput{tmpl: m.tmpl, msgs: msgs, gen: addGenerationPrompt})
}

// AppendCompletion appends the ids of a completions prompt given as text:
// BOS first when the model adds it, then the encoded text.
func (m *Model) AppendCompletion(dst []uint32, prompt string) []uint32 {
	if m.addBOS {
		dst = append(dst, m.bosID)
	}
	return m.tok.AppendEncode(dst, prompt)
}
