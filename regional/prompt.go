package regional

import (
	"container/list"
	"errors"
	"fmt"
	"sync"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// ModelConfig names a served model and how to tokenize its prompts exactly
// as its engines do (give the engines the same settings).
type ModelConfig struct {
	Name string `yaml:"name"`
	// Encoding is the tiktoken encoding; default cl100k_base.
	Encoding string `yaml:"encoding"`
	// Dir is a model directory with tokenizer_config.json and/or
	// chat_template.jinja.
	Dir string `yaml:"dir,omitempty"`
	// ChatTemplate overrides Dir's template (Jinja source).
	ChatTemplate string `yaml:"chat_template,omitempty"`
	// BOSToken, EOSToken and AddBOS override Dir's.
	BOSToken string `yaml:"bos_token,omitempty"`
	EOSToken string `yaml:"eos_token,omitempty"`
	AddBOS   bool   `yaml:"add_bos,omitempty"`
	// Tokenizer, when its Encoding is set, is used as it is instead of the
	// fields above (for programs that build the configuration in Go).
	Tokenizer tokenize.Config `yaml:"-"`
}

// TokenizerConfig is the tokenize.Config the model's fields describe.
func (m ModelConfig) TokenizerConfig() tokenize.Config {
	if m.Tokenizer.Encoding != "" {
		return m.Tokenizer
	}
	c := tokenize.DefaultConfig()
	if m.Encoding != "" {
		c.Encoding = m.Encoding
	}
	c.Dir, c.ChatTemplate, c.BOSToken, c.EOSToken, c.AddBOS = m.Dir, m.ChatTemplate, m.BOSToken, m.EOSToken, m.AddBOS
	return c
}

// Prompts turns request bodies into token ids and chain hashes. Chat
// prompts repeat themselves: sessions re-send their whole history each
// turn, and many sessions share a system prompt. For a chat request with a
// session id, the previous turn's encoding is kept (in a bounded LRU) and
// only the text after its last safe restart point is tokenized again; any
// other chat request reuses the longest prefix, ending at a special token,
// that any earlier request encoded (a tokenize.PrefixCache shared by all
// sessions, bounded in bytes). Both are exact: the ids are those of
// encoding the whole prompt.
type Prompts struct {
	models    map[string]*tokenize.Model
	fallback  *tokenize.Model
	blockSize int
	prefixes  *tokenize.PrefixCache

	mu       sync.Mutex
	sessions map[string]*list.Element // session key -> element of lru
	lru      *list.List               // of *sessionEncoding, most recent first
	max      int
}

type sessionEncoding struct {
	key string
	enc *tokenize.Encoding
}

// DefaultPrefixCacheBytes bounds the cache of chat prompts' encodings
// that NewPrompts makes: about 4,000 prompts of 2k tokens.
const DefaultPrefixCacheBytes = 64 << 20

// NewPrompts loads the models' tokenizers. Requests naming a model not in
// the list use the first one (the list must not be empty).
func NewPrompts(models []ModelConfig, blockSize, maxSessions int) (*Prompts, error) {
	if len(models) == 0 {
		return nil, errors.New("prompts: at least one model is required")
	}
	p := &Prompts{models: map[string]*tokenize.Model{}, blockSize: blockSize,
		prefixes: tokenize.NewPrefixCache(DefaultPrefixCacheBytes),
		sessions: map[string]*list.Element{}, lru: list.New(), max: maxSessions}
	for i, mc := range models {
		m, err := tokenize.NewModel(mc.TokenizerConfig())
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", mc.Name, err)
		}
		p.models[mc.Name] = m
		if i == 0 {
			p.fallback = m
		}
	}
	return p, nil
}

// SetPrefixCache replaces the cache of chat prompts' encodings with one of
// maxBytes (0 turns it off). Call it before the first Encode.
func (p *Prompts) SetPrefixCache(maxBytes int64) {
	p.prefixes = tokenize.NewPrefixCache(maxBytes)
}

// PrefixCacheStats reports the cache of chat prompts' encodings.
func (p *Prompts) PrefixCacheStats() tokenize.PrefixCacheStats { return p.prefixes.Stats() }

// Prompt is a tokenized request.
type Prompt struct {
	Tokens int // how many ids
	// Chain is the hashes of the full blocks. A chat prompt's is shared
	// with the caches: read it, never modify it.
	Chain  []uint64
	Reused int // ids taken from the session's previous turn or the prefix cache

	// The ids: a chat prompt's encoding, whose ids are shared with the
	// caches (never modified), or the ids of any other prompt.
	enc *tokenize.Encoding
	ids []uint32
}

// AppendIDs appends the prompt's token ids to dst and returns the extended
// slice.
func (p *Prompt) AppendIDs(dst []uint32) []uint32 {
	if p.enc != nil {
		return p.enc.AppendIDs(dst)
	}
	return append(dst, p.ids...)
}

// Encode tokenizes r (of kind k, for model) and hashes its full blocks.
// Errors caused by the request wrap tokenize.ErrInvalidPrompt.
func (p *Prompts) Encode(model string, k tokenize.Kind, r *tokenize.Request, sessionID string) (*Prompt, error) {
	out := &Prompt{}
	if err := p.EncodeInto(model, k, r, sessionID, out); err != nil {
		return nil, err
	}
	return out, nil
}

// EncodeInto is Encode writing the prompt into out (overwritten whole),
// so that a caller can keep it in memory of its own (the pooled parsed
// request). On an error out's contents are unspecified.
func (p *Prompts) EncodeInto(model string, k tokenize.Kind, r *tokenize.Request, sessionID string, out *Prompt) error {
	m, ok := p.models[model]
	if !ok {
		m = p.fallback
	}
	*out = Prompt{}
	// A salted request matches only blocks stored under its salt, from any
	// engine (the re-keyer seeds their chains the same way).
	ns := index.Namespace{Model: model, CacheSalt: r.CacheSalt, BlockSize: p.blockSize}
	if k == tokenize.Chat && len(r.Messages) > 0 {
		gen := r.AddGenerationPrompt == nil || *r.AddGenerationPrompt
		var prev *tokenize.Encoding
		var key string
		if sessionID != "" {
			key = model + "\x00" + sessionID
			prev = p.session(key)
		}
		// Rendered against the encoding reused: the text repeated from it
		// is compared, not copied, scanned or hashed again.
		var enc *tokenize.Encoding
		var err error
		if prev != nil {
			enc, out.Reused, err = m.ExtendChat(prev, r.Messages, gen)
		} else {
			enc, out.Reused, err = m.EncodeChatCached(p.prefixes, r.Messages, gen)
		}
		if err != nil {
			return err
		}
		if sessionID != "" {
			p.remember(key, enc)
		}
		// The reused ids are the caches' own, in parts, hashed where they
		// lie; the blocks within a reused prefix whose encoding was hashed
		// under ns before are not hashed again.
		out.enc, out.Tokens = enc, enc.Len()
		out.Chain = enc.Chain(chainHasher, ns.Seed(), p.blockSize)
		return nil
	}
	ids, err := m.AppendRequest(nil, k, r)
	if err != nil {
		return err
	}
	out.ids, out.Tokens = ids, len(ids)
	out.Chain = index.ChainHashes(ns, ids, make([]uint64, 0, len(ids)/p.blockSize))
	return nil
}

// chainHasher chains blocks for Encoding.Chain as index.ChainHashes does.
var chainHasher = &tokenize.BlockHasher{Extend: index.Extend}

func (p *Prompts) session(key string) *tokenize.Encoding {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.sessions[key]; ok {
		p.lru.MoveToFront(e)
		return e.Value.(*sessionEncoding).enc
	}
	return nil
}

func (p *Prompts) remember(key string, enc *tokenize.Encoding) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.sessions[key]; ok {
		e.Value.(*sessionEncoding).enc = enc
		p.lru.MoveToFront(e)
		return
	}
	p.sessions[key] = p.lru.PushFront(&sessionEncoding{key: key, enc: enc})
	for p.lru.Len() > p.max {
		old := p.lru.Back()
		p.lru.Remove(old)
		delete(p.sessions, old.Value.(*sessionEncoding).key)
	}
}
