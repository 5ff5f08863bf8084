package enginesim

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meridian-llm/meridian/regional/tokenize"
)

// Handler returns the engine's HTTP API (what Open serves).
func (e *Engine) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.handleGenerate(tokenize.Completion))
	mux.HandleFunc("POST /v1/chat/completions", e.handleGenerate(tokenize.Chat))
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /reset_prefix_cache", e.admin(func(w http.ResponseWriter, _ *http.Request) {
		e.ResetPrefixCache()
		w.WriteHeader(http.StatusOK)
	}))
	mux.HandleFunc("GET /admin/faults", e.admin(e.handleGetFaults))
	mux.HandleFunc("POST /admin/faults", e.admin(e.handleSetFaults))
	mux.HandleFunc("POST /admin/faults/release", e.admin(func(w http.ResponseWriter, _ *http.Request) {
		e.ReleaseStalls()
		w.WriteHeader(http.StatusOK)
	}))
	return mux
}

// admin wraps a handler with the bearer-token check when one is configured.
func (e *Engine) admin(h http.HandlerFunc) http.HandlerFunc {
	if e.cfg.AdminToken == "" {
		return h
	}
	want := []byte("Bearer " + e.cfg.AdminToken)
	return func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeError(w, http.StatusUnauthorized, "AuthenticationError", "missing or wrong bearer token")
			return
		}
		h(w, r)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, errorBody{Error: errorDetail{Message: msg, Type: typ, Code: status}})
}

func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	list := modelList{Object: "list"}
	list.Data = append(list.Data, modelCard{ID: e.cfg.Model, Object: "model", Created: e.created, OwnedBy: "vllm",
		Root: e.cfg.Model, MaxModelLen: e.cfg.MaxModelLen})
	for _, l := range e.cfg.LoRAs {
		parent := e.cfg.Model
		list.Data = append(list.Data, modelCard{ID: l, Object: "model", Created: e.created, OwnedBy: "vllm",
			Root: l, Parent: &parent, MaxModelLen: e.cfg.MaxModelLen})
	}
	writeJSON(w, http.StatusOK, list)
}

func (e *Engine) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.Faults())
}

func (e *Engine) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "faults: "+err.Error())
		return
	}
	if err := e.SetFaults(f); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, e.Faults())
}

func (e *Engine) handleGenerate(kind tokenize.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body generateBody
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes))
		if err := dec.Decode(&body); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(w, http.StatusRequestEntityTooLarge, "BadRequestError", fmt.Sprintf("request body larger than %d bytes", tooBig.Limit))
				return
			}
			writeError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
			return
		}
		lora, ok := e.resolveModel(body.Model)
		if !ok {
			writeError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", body.Model))
			return
		}
		ids, err := e.model.AppendRequest(nil, kind, &body.Request)
		if err != nil {
			writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
		if len(ids) == 0 {
			writeError(w, http.StatusBadRequest, "BadRequestError", "the prompt is empty")
			return
		}
		maxTokens := e.cfg.DefaultMaxTokens
		if body.MaxCompletionTokens != nil {
			maxTokens = *body.MaxCompletionTokens
		} else if body.MaxTokens != nil {
			maxTokens = *body.MaxTokens
		}
		if maxTokens < 1 {
			writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("max_tokens must be at least 1, got %d", maxTokens))
			return
		}
		if len(ids)+maxTokens > e.cfg.MaxModelLen {
			writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf(
				"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion).",
				e.cfg.MaxModelLen, len(ids)+maxTokens, len(ids), maxTokens))
			return
		}
		if need := e.cache.blocksFor(len(ids) + maxTokens); need > e.cfg.CacheBlocks {
			writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf(
				"the request needs %d KV-cache blocks but the cache holds %d", need, e.cfg.CacheBlocks))
			return
		}

		kindOfFault, faults, released := e.faults.draw()
		if kindOfFault != faultNone {
			e.m.faults.WithLabelValues(kindOfFault.String()).Inc()
		}
		switch kindOfFault {
		case faultError:
			writeError(w, http.StatusInternalServerError, "InternalServerError", "injected failure")
			return
		case faultStall:
			if !e.stall(r.Context(), time.Duration(faults.StallFor), released) {
				return
			}
		case faultDie:
			if !body.Stream || faults.DieAfterChunks == 0 {
				panic(http.ErrAbortHandler) // the server closes the connection without a response
			}
		}
		dieAfter := -1
		if kindOfFault == faultDie {
			dieAfter = faults.DieAfterChunks
		}

		g := genRequest{tokens: ids, lora: lora, salt: body.CacheSalt, maxTokens: maxTokens}
		seq := e.reqIDs.Add(1)
		rs := &responder{e: e, w: w, kind: kind, body: &body, ids: ids, seq: seq, dieAfter: dieAfter}
		if body.Stream {
			rs.stream(r.Context(), g)
		} else {
			rs.whole(r.Context(), g)
		}
	}
}

// resolveModel maps a request's model to the LoRA adapter it names ("" for
// the base model); ok is false for a model the pod does not serve.
func (e *Engine) resolveModel(model string) (lora string, ok bool) {
	if model == e.cfg.Model {
		return "", true
	}
	if e.loras[model] {
		return model, true
	}
	return "", false
}

// stall hangs before the first byte for d (0: until released), or until the
// client leaves; it reports whether the request should go on.
func (e *Engine) stall(ctx context.Context, d time.Duration, released <-chan struct{}) bool {
	e.stallBegin()
	defer e.stallEnd()
	var timerC <-chan time.Time
	if d > 0 {
		t := e.clock.NewTimer(d)
		defer t.Stop()
		timerC = t.C()
	}
	select {
	case <-timerC:
		return true
	case <-released:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// responder writes one generation's response.
type responder struct {
	e        *Engine
	w        http.ResponseWriter
	kind     tokenize.Kind
	body     *generateBody
	ids      []uint32
	seq      uint64
	dieAfter int // chunks before the connection is cut; -1 = never
	chunks   int
	bw       *bufio.Writer
}

func (rs *responder) id() string {
	if rs.kind == tokenize.Chat {
		return "chatcmpl-" + strconv.FormatUint(rs.e.epoch, 36) + "-" + strconv.FormatUint(rs.seq, 10)
	}
	return "cmpl-" + strconv.FormatUint(rs.e.epoch, 36) + "-" + strconv.FormatUint(rs.seq, 10)
}

func (rs *responder) word(i int) string {
	return outputWords[(int(rs.seq)+i)%len(outputWords)]
}

func (rs *responder) usage(res genResult) *Usage {
	return &Usage{
		PromptTokens:        len(rs.ids),
		CompletionTokens:    res.tokens,
		TotalTokens:         len(rs.ids) + res.tokens,
		PromptTokensDetails: &PromptTokensDetails{CachedTokens: res.cachedTokens},
	}
}

func (rs *responder) promptIDs() []uint32 {
	if rs.body.ReturnTokenIDs {
		return rs.ids
	}
	return nil
}

// whole answers a non-streaming request once generation is done.
func (rs *responder) whole(ctx context.Context, g genRequest) {
	res, err := rs.e.generate(ctx, g, nil)
	if err != nil {
		return // the client left or the engine is closing: nobody to answer
	}
	var text []byte
	for i := range res.tokens {
		text = append(text, rs.word(i)...)
	}
	finish := "length"
	if rs.kind == tokenize.Chat {
		writeJSON(rs.w, http.StatusOK, chatResponse{
			ID: rs.id(), Object: "chat.completion", Created: rs.e.clock.Now().Unix(), Model: rs.body.Model,
			Choices:        []chatChoice{{Message: &chatMessage{Role: "assistant", Content: string(text)}, FinishReason: &finish}},
			Usage:          rs.usage(res),
			PromptTokenIDs: rs.promptIDs(),
		})
		return
	}
	writeJSON(rs.w, http.StatusOK, completionResponse{
		ID: rs.id(), Object: "text_completion", Created: rs.e.clock.Now().Unix(), Model: rs.body.Model,
		Choices:        []completionChoice{{Text: string(text), FinishReason: &finish}},
		Usage:          rs.usage(res),
		PromptTokenIDs: rs.promptIDs(),
	})
}

// stream answers with server-sent events, one chunk per output token, each
// flushed as it is produced.
func (rs *responder) stream(ctx context.Context, g genRequest) {
	h := rs.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	rs.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(rs.w)
	_ = rc.Flush()
	rs.bw = bufio.NewWriterSize(rs.w, 512)
	created := rs.e.clock.Now().Unix()
	id := rs.id()

	emit := func(i int, res genResult) error {
		var finish *string
		if i == g.maxTokens-1 {
			f := "length"
			finish = &f
		}
		if rs.kind == tokenize.Chat {
			if i == 0 {
				if err := rs.chunk(rc, chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: rs.body.Model,
					Choices: []chatChoice{{Delta: &chatMessage{Role: "assistant", Content: ""}}}, PromptTokenIDs: rs.promptIDs()}); err != nil {
					return err
				}
			}
			return rs.chunk(rc, chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: rs.body.Model,
				Choices: []chatChoice{{Delta: &chatMessage{Content: rs.word(i)}, FinishReason: finish}}})
		}
		var ids []uint32
		if i == 0 {
			ids = rs.promptIDs()
		}
		return rs.chunk(rc, completionResponse{ID: id, Object: "text_completion", Created: created, Model: rs.body.Model,
			Choices: []completionChoice{{Text: rs.word(i), FinishReason: finish}}, PromptTokenIDs: ids})
	}
	res, err := rs.e.generate(ctx, g, emit)
	if err != nil {
		if errors.Is(err, errStop) {
			panic(http.ErrAbortHandler)
		}
		return
	}
	if rs.body.StreamOptions != nil && rs.body.StreamOptions.IncludeUsage {
		var err error
		if rs.kind == tokenize.Chat {
			err = rs.chunk(rc, chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: rs.body.Model,
				Choices: []chatChoice{}, Usage: rs.usage(res)})
		} else {
			err = rs.chunk(rc, completionResponse{ID: id, Object: "text_completion", Created: created, Model: rs.body.Model,
				Choices: []completionChoice{}, Usage: rs.usage(res)})
		}
		if err != nil {
			if errors.Is(err, errStop) {
				panic(http.ErrAbortHandler)
			}
			return
		}
	}
	if rs.dieAfter >= 0 {
		panic(http.ErrAbortHandler) // cut before [DONE] when the stream was shorter than DieAfterChunks
	}
	_, _ = rs.bw.WriteString("data: [DONE]\n\n")
	_ = rs.bw.Flush()
	_ = rc.Flush()
}

// chunk writes one SSE event and flushes it to the client; once the stream
// has sent dieAfter chunks it returns errStop instead.
func (rs *responder) chunk(rc *http.ResponseController, v any) error {
	if rs.dieAfter >= 0 && rs.chunks >= rs.dieAfter {
		return errStop
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode chunk: %w", err)
	}
	_, _ = rs.bw.WriteString("data: ")
	_, _ = rs.bw.Write(b)
	_, _ = rs.bw.WriteString("\n\n")
	if err := rs.bw.Flush(); err != nil {
		return fmt.Errorf("write chunk: %w", err)
	}
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("flush chunk: %w", err)
	}
	rs.chunks++
	return nil
}
