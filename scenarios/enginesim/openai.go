package enginesim

import (
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// generateBody is the part of a /v1/completions or /v1/chat/completions body
// the simulator reads; the prompt fields are tokenize.Request's, so the
// router and the engine decode them the same way.
type generateBody struct {
	tokenize.Request
	Model               string         `json:"model"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	ReturnTokenIDs      bool           `json:"return_token_ids"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Usage is OpenAI's usage object with vLLM's prompt_tokens_details.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails carries the prompt tokens served from the prefix cache.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// completionResponse is a non-streaming /v1/completions answer, and (with
// Object "text_completion" and Usage nil or set) each streamed chunk.
type completionResponse struct {
	ID             string             `json:"id"`
	Object         string             `json:"object"`
	Created        int64              `json:"created"`
	Model          string             `json:"model"`
	Choices        []completionChoice `json:"choices"`
	Usage          *Usage             `json:"usage,omitempty"`
	PromptTokenIDs []uint32           `json:"prompt_token_ids,omitempty"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// chatResponse is a non-streaming /v1/chat/completions answer.
type chatResponse struct {
	ID             string       `json:"id"`
	Object         string       `json:"object"`
	Created        int64        `json:"created"`
	Model          string       `json:"model"`
	Choices        []chatChoice `json:"choices"`
	Usage          *Usage       `json:"usage,omitempty"`
	PromptTokenIDs []uint32     `json:"prompt_token_ids,omitempty"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// errorBody is OpenAI's error envelope.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// outputWords is the simulator's output vocabulary: token i of a response
// is outputWords[(seq + i) % len].
var outputWords = [...]string{
	" the", " cache", " holds", " a", " prefix", " of", " blocks", " and", " each", " request",
	" reuses", " what", " was", " computed", " before", " so", " time", " to", " first", " token",
	" falls", " while", " the", " router", " keeps", " every", " region", " within", " its", " rules", ".", "\n",
}
