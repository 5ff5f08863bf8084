package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Kind is the endpoint a request came to.
type Kind uint8

const (
	// Chat is POST /v1/chat/completions: messages rendered by the template.
	Chat Kind = iota
	// Completion is POST /v1/completions: prompt text or ids.
	Completion
)

// Request holds the fields of an OpenAI-compatible request body that decide
// the prompt's token ids. Embed it in a body struct to decode them along
// with the rest; the router and the engine simulator both do, then call
// Model.AppendRequest.
type Request struct {
	// Messages of a chat request.
	Messages []Message `json:"messages,omitempty"`
	// Prompt of a completions request: a string, a list of one string, a
	// list of token ids, or a list of one list of token ids.
	Prompt json.RawMessage `json:"prompt,omitempty"`
	// PromptTokenIDs, when set, are a completions prompt's ids as they are.
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
	// AddGenerationPrompt (vLLM extension; default true) ends a chat
	// rendering with the assistant's header.
	AddGenerationPrompt *bool `json:"add_generation_prompt,omitempty"`
	// CacheSalt (vLLM's and SGLang's cache_salt) isolates the request's
	// prefix cache: it does not change the tokens, but a salted request can
	// only reuse blocks stored under the same salt, so the router hashes
	// its chain in the salt's namespace.
	CacheSalt string `json:"cache_salt,omitempty"`
}

// AppendRequest appends the ids of r, a request of kind k, to dst. Errors
// caused by the request wrap ErrInvalidPrompt.
func (m *Model) AppendRequest(dst []uint32, k Kind, r *Request) ([]uint32, error) {
	switch k {
	case Chat:
		if len(r.Messages) == 0 {
			return dst, fmt.Errorf("%w: messages: empty", ErrInvalidPrompt)
		}
		gen := r.AddGenerationPrompt == nil || *r.AddGenerationPrompt
		return m.AppendChat(dst, r.Messages, gen)
	case Completion:
		if len(r.PromptTokenIDs) > 0 {
			return append(dst, r.PromptTokenIDs...), nil
		}
		text, ids, isIDs, err := parsePrompt(r.Prompt)
		if err != nil {
			return dst, err
		}
		if isIDs {
			return append(dst, ids...), nil
		}
		return m.AppendCompletion(dst, text), nil
	default:
		return dst, fmt.Errorf("%w: unknown request kind %d", ErrInvalidPrompt, k)
	}
}

// parsePrompt decodes a completions prompt: "text", ["text"], [1,2,3] or
// [[1,2,3]]. Batches of several prompts are refused.
func parsePrompt(raw json.RawMessage) (text string, ids []uint32, isIDs bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, false, fmt.Errorf("%w: prompt: missing", ErrInvalidPrompt)
	}
	switch raw[0] {
	case '"':
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", nil, false, fmt.Errorf("%w: prompt: %v", ErrInvalidPrompt, err)
		}
		return text, nil, false, nil
	case '[':
	default:
		return "", nil, false, fmt.Errorf("%w: prompt: want a string, a list of one string or a list of token ids", ErrInvalidPrompt)
	}
	// Fast path: a flat list of token ids decodes in one allocation.
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return "", nil, false, fmt.Errorf("%w: prompt: empty list", ErrInvalidPrompt)
		}
		return "", ids, true, nil
	}
	ids = nil
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return "", nil, false, fmt.Errorf("%w: prompt: %v", ErrInvalidPrompt, err)
	}
	if len(items) == 0 {
		return "", nil, false, fmt.Errorf("%w: prompt: empty list", ErrInvalidPrompt)
	}
	first := bytes.TrimSpace(items[0])
	switch {
	case len(first) > 0 && (first[0] == '"' || first[0] == '['):
		if len(items) != 1 {
			return "", nil, false, fmt.Errorf("%w: prompt: a batch of %d prompts; send one prompt per request", ErrInvalidPrompt, len(items))
		}
		return parsePrompt(first)
	default:
		ids = make([]uint32, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &ids[i]); err != nil {
				return "", nil, false, fmt.Errorf("%w: prompt[%d]: %s is not a token id", ErrInvalidPrompt, i, string(it))
			}
		}
		return "", ids, true, nil
	}
}

// UnmarshalJSON decodes an OpenAI chat message. content may be a string,
// null, or a list of parts of which only {"type":"text","text":...} are
// accepted; text parts are joined with "\n", as vLLM does for the "string"
// content format.
func (msg *Message) UnmarshalJSON(b []byte) error {
	var wire struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Name    string          `json:"name"`
	}
	if err := json.Unmarshal(b, &wire); err != nil {
		return fmt.Errorf("%w: message: %v", ErrInvalidPrompt, err)
	}
	if wire.Role == "" {
		return fmt.Errorf("%w: message: role missing", ErrInvalidPrompt)
	}
	msg.Role, msg.Name, msg.Content = wire.Role, wire.Name, ""
	c := bytes.TrimSpace(wire.Content)
	if len(c) == 0 || string(c) == "null" {
		return nil
	}
	if c[0] == '"' {
		if err := json.Unmarshal(c, &msg.Content); err != nil {
			return fmt.Errorf("%w: message content: %v", ErrInvalidPrompt, err)
		}
		return nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return fmt.Errorf("%w: message content: want a string or a list of parts", ErrInvalidPrompt)
	}
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return fmt.Errorf("%w: message content part %d: type %q is not supported (only text)", ErrInvalidPrompt, i, p.Type)
		}
		texts = append(texts, *p.Text)
	}
	msg.Content = strings.Join(texts, "\n")
	return nil
}

// MarshalJSON writes the message in OpenAI form.
func (msg Message) MarshalJSON() ([]byte, error) {
	type wire struct {
		Role    string `json:"role"`
		Content string `json:"content"`
		Name    string `json:"name,omitempty"`
	}
	return json.Marshal(wire(msg))
}

// IsInvalidPrompt reports whether err was caused by the request.
func IsInvalidPrompt(err error) bool { return errors.Is(err, ErrInvalidPrompt) }
