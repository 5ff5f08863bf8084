package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/tokenize"
)

// fastConfig is a loopback engine whose modelled times are microseconds.
func fastConfig() Config {
	cfg := DefaultConfig()
	cfg.HashSeed = "test"
	cfg.TimeScale = 0.001
	cfg.BlockSize = 4
	cfg.CacheBlocks = 4096
	return cfg
}

type testEngine struct {
	*Engine
	t      *testing.T
	client *http.Client
	pub    *MemoryPublisher
}

func openTestEngine(t *testing.T, cfg Config) *testEngine {
	t.Helper()
	pub := NewMemoryPublisher()
	if cfg.Publisher == nil && cfg.Kafka == nil {
		cfg.Publisher = pub
	}
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	te := &testEngine{Engine: e, t: t, client: &http.Client{Transport: tr}, pub: pub}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Error(err)
		}
		tr.CloseIdleConnections()
	})
	return te
}

// post sends a JSON body and returns the status and the body.
func (te *testEngine) post(ctx context.Context, path, body string) (int, []byte) {
	te.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, te.URL()+path, strings.NewReader(body))
	if err != nil {
		te.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := te.client.Do(req)
	if err != nil {
		te.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		te.t.Fatalf("POST %s: read body: %v", path, err)
	}
	return resp.StatusCode, b
}

func (te *testEngine) get(path string) (int, []byte) {
	te.t.Helper()
	resp, err := te.client.Get(te.URL() + path)
	if err != nil {
		te.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

type usageResponse struct {
	Usage          Usage    `json:"usage"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	Object         string   `json:"object"`
	Choices        []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

func decodeUsage(t *testing.T, b []byte) usageResponse {
	t.Helper()
	var u usageResponse
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return u
}

// The ids the engine computes for a request are the ids regional/tokenize
// gives for the same body with the same configuration — what the router
// computes — and cached_tokens reports the cache at admission.
func TestHTTPTokenIDsMatchRouterAndCachedTokens(t *testing.T) {
	cfg := fastConfig()
	te := openTestEngine(t, cfg)
	router, err := tokenize.NewModel(cfg.Tokenizer)
	if err != nil {
		t.Fatal(err)
	}
	chat := `{"model": "meridian/sim-70b", "max_tokens": 3, "return_token_ids": true, "messages": [
		{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain prefix caching in one sentence, please."}]}`
	var body tokenize.Request
	if err := json.Unmarshal([]byte(chat), &body); err != nil {
		t.Fatal(err)
	}
	want, err := router.AppendRequest(nil, tokenize.Chat, &body)
	if err != nil {
		t.Fatal(err)
	}
	status, b := te.post(context.Background(), "/v1/chat/completions", chat)
	if status != 200 {
		t.Fatalf("status %d: %s", status, b)
	}
	first := decodeUsage(t, b)
	if !slices.Equal(first.PromptTokenIDs, want) {
		t.Fatalf("engine ids %v, router ids %v", first.PromptTokenIDs, want)
	}
	if first.Object != "chat.completion" || first.Choices[0].Message.Role != "assistant" || first.Choices[0].FinishReason != "length" {
		t.Fatalf("response %s", b)
	}
	if u := first.Usage; u.PromptTokens != len(want) || u.CompletionTokens != 3 || u.TotalTokens != len(want)+3 || u.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first usage %+v", u)
	}
	status, b = te.post(context.Background(), "/v1/chat/completions", chat)
	if status != 200 {
		t.Fatalf("status %d: %s", status, b)
	}
	if got, wantCached := decodeUsage(t, b).Usage.PromptTokensDetails.CachedTokens, (len(want)-1)/4*4; got != wantCached {
		t.Fatalf("second request cached %d tokens, want %d", got, wantCached)
	}
	// The same prompt as ids through /v1/completions hits the same blocks.
	ids, _ := json.Marshal(want)
	status, b = te.post(context.Background(), "/v1/completions", fmt.Sprintf(`{"model": "meridian/sim-70b", "max_tokens": 1, "prompt": %s}`, ids))
	if status != 200 {
		t.Fatalf("status %d: %s", status, b)
	}
	if got := decodeUsage(t, b).Usage.PromptTokensDetails.CachedTokens; got != (len(want)-1)/4*4 {
		t.Fatalf("completions with the same ids cached %d tokens", got)
	}
	if hits, queries := metricValue(t, te.Engine, "vllm:prefix_cache_hits_total"), metricValue(t, te.Engine, "vllm:prefix_cache_queries_total"); hits != float64(2*((len(want)-1)/4*4)) || queries != float64(3*len(want)) {
		t.Fatalf("prefix cache metrics: hits %v queries %v", hits, queries)
	}
}

// sseReader reads server-sent events one at a time.
type sseReader struct {
	r *bufio.Reader
}

// next returns the data of the next event ("[DONE]" included).
func (s *sseReader) next() (string, error) {
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			return data, nil
		}
	}
}

func (te *testEngine) openStream(ctx context.Context, path, body string) (*http.Response, *sseReader) {
	te.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, te.URL()+path, strings.NewReader(body))
	resp, err := te.client.Do(req)
	if err != nil {
		te.t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		te.t.Fatalf("stream: status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp, &sseReader{r: bufio.NewReader(resp.Body)}
}

// Chunks arrive as tokens are produced, not when the response is complete:
// with an hour between output tokens, the first chunks still arrive. Then
// the client hangs up and the engine frees the request.
func TestHTTPStreamingArrivesChunkByChunkAndCancellationFrees(t *testing.T) {
	cfg := fastConfig()
	cfg.TimeScale = 1
	cfg.Timing = Timing{PrefillOverhead: time.Millisecond, PrefillPerToken: time.Microsecond, DecodeInterval: time.Hour, LoadFactor: 1}
	te := openTestEngine(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, sse := te.openStream(ctx, "/v1/chat/completions",
		`{"model": "meridian/sim-70b", "stream": true, "max_tokens": 5, "messages": [{"role": "user", "content": "one two three four five six seven eight"}]}`)
	defer resp.Body.Close()
	var chunks []chatResponse
	for range 2 { // role chunk, first token
		data, err := sse.next()
		if err != nil {
			t.Fatal(err)
		}
		var c chatResponse
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		chunks = append(chunks, c)
	}
	if chunks[0].Choices[0].Delta.Role != "assistant" || chunks[1].Choices[0].Delta.Content == "" || chunks[1].Object != "chat.completion.chunk" {
		t.Fatalf("chunks %+v", chunks)
	}
	if st := te.Stats(); st.Running != 1 || st.KVUsage == 0 {
		t.Fatalf("while streaming: %+v", st)
	}
	cancel()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := te.waitUntil(wctx, func(s Stats) bool { return s.Running == 0 && s.KVUsage == 0 }); err != nil {
		t.Fatalf("request not freed after the client left: %+v", te.Stats())
	}
	for _, b := range te.CachedBlocks() {
		if b.Refs != 0 {
			t.Fatalf("block %x still referenced", b.Hash)
		}
	}
}

// A complete stream: a role chunk, one chunk per token, the finish reason on
// the last, a usage chunk when asked, then [DONE].
func TestHTTPStreamingComplete(t *testing.T) {
	te := openTestEngine(t, fastConfig())
	for _, c := range []struct{ path, body, object string }{
		{"/v1/chat/completions", `{"model": "meridian/sim-70b", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}]}`, "chat.completion.chunk"},
		{"/v1/completions", `{"model": "meridian/sim-70b", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 4, "prompt": "hello there"}`, "text_completion"},
	} {
		resp, sse := te.openStream(context.Background(), c.path, c.body)
		var events []string
		for {
			data, err := sse.next()
			if err != nil {
				t.Fatalf("%s: %v after %d events", c.path, err, len(events))
			}
			events = append(events, data)
			if data == "[DONE]" {
				break
			}
		}
		resp.Body.Close()
		wantEvents := 4 + 1 + 1 // tokens, usage, [DONE]
		if c.object == "chat.completion.chunk" {
			wantEvents++ // role chunk
		}
		if len(events) != wantEvents {
			t.Fatalf("%s: %d events: %q", c.path, len(events), events)
		}
		var last, usage usageResponse
		_ = json.Unmarshal([]byte(events[len(events)-3]), &last)
		_ = json.Unmarshal([]byte(events[len(events)-2]), &usage)
		if last.Choices[0].FinishReason != "length" || last.Object != c.object {
			t.Fatalf("%s: last token chunk %s", c.path, events[len(events)-3])
		}
		if usage.Usage.CompletionTokens != 4 || usage.Usage.PromptTokens == 0 || len(usage.Choices) != 0 || usage.Usage.PromptTokensDetails == nil {
			t.Fatalf("%s: usage chunk %s", c.path, events[len(events)-2])
		}
	}
}

func TestHTTPErrors(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 64
	cfg.CacheBlocks = 8
	cfg.MaxBodyBytes = 1024
	te := openTestEngine(t, cfg)
	long := strings.Repeat("word ", 100)
	cases := []struct {
		path, body string
		status     int
		want       string
	}{
		{"/v1/completions", `{`, 400, "invalid JSON body"},
		{"/v1/completions", `{"model": "other", "prompt": "x"}`, 404, "The model `other` does not exist."},
		{"/v1/completions", `{"model": "meridian/sim-70b"}`, 400, "prompt: missing"},
		{"/v1/completions", `{"model": "meridian/sim-70b", "prompt": ["a", "b"]}`, 400, "a batch of 2 prompts"},
		{"/v1/completions", `{"model": "meridian/sim-70b", "prompt": "x", "max_tokens": 0}`, 400, "max_tokens must be at least 1"},
		{"/v1/completions", `{"model": "meridian/sim-70b", "prompt": [1, 2, 3], "max_tokens": 62}`, 400, "maximum context length is 64 tokens"},
		{"/v1/completions", `{"model": "meridian/sim-70b", "prompt": [1, 2, 3], "max_tokens": 40}`, 400, "needs 11 KV-cache blocks but the cache holds 8"},
		{"/v1/completions", `{"model": "meridian/sim-70b", "prompt": "` + long + long + long + `"}`, 413, "larger than 1024 bytes"},
		{"/v1/chat/completions", `{"model": "meridian/sim-70b", "messages": []}`, 400, "messages: empty"},
		{"/v1/chat/completions", `{"model": "meridian/sim-70b", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, 400, "not supported"},
		{"/admin/faults", `{"error_rate": 2}`, 400, "ErrorRate 2: must be within [0, 1]"},
		{"/admin/faults", `{"error_rat": 1}`, 400, "unknown field"},
	}
	for _, c := range cases {
		status, b := te.post(context.Background(), c.path, c.body)
		var eb errorBody
		if status != c.status || json.Unmarshal(b, &eb) != nil || !strings.Contains(eb.Error.Message, c.want) || eb.Error.Code != c.status {
			t.Errorf("%s %.60s: status %d body %s; want %d containing %q", c.path, c.body, status, b, c.status, c.want)
		}
	}
	resp, err := te.client.Get(te.URL() + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/completions: %d", resp.StatusCode)
	}
	if st := te.Stats(); st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 {
		t.Errorf("refused requests left state behind: %+v", st)
	}
}

func TestHTTPModelsHealthMetrics(t *testing.T) {
	cfg := fastConfig()
	cfg.LoRAs = []string{"sql-adapter"}
	te := openTestEngine(t, cfg)
	status, b := te.get("/v1/models")
	var ml modelList
	if status != 200 || json.Unmarshal(b, &ml) != nil || len(ml.Data) != 2 || ml.Data[0].ID != "meridian/sim-70b" || ml.Data[1].ID != "sql-adapter" || *ml.Data[1].Parent != "meridian/sim-70b" {
		t.Fatalf("models: %d %s", status, b)
	}
	if status, _ := te.get("/health"); status != 200 {
		t.Fatalf("health: %d", status)
	}
	// A LoRA request caches under its own chain: the base model does not hit it.
	body := `{"model": "%s", "max_tokens": 1, "prompt": [1,2,3,4,5,6,7,8,9]}`
	te.post(context.Background(), "/v1/completions", fmt.Sprintf(body, "sql-adapter"))
	_, b = te.post(context.Background(), "/v1/completions", fmt.Sprintf(body, "meridian/sim-70b"))
	if c := decodeUsage(t, b).Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Fatalf("base model hit %d tokens cached by a LoRA", c)
	}
	_, b = te.post(context.Background(), "/v1/completions", fmt.Sprintf(body, "sql-adapter"))
	if c := decodeUsage(t, b).Usage.PromptTokensDetails.CachedTokens; c != 8 {
		t.Fatalf("LoRA hit %d tokens, want 8", c)
	}
	status, b = te.get("/metrics")
	if status != 200 {
		t.Fatalf("metrics: %d", status)
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		`vllm:prefix_cache_hits_total{engine="0",model_name="meridian/sim-70b"} 8`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="meridian/sim-70b"} 27`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="meridian/sim-70b"} 3`,
		`meridian_enginesim_kv_events_total{type="BlockStored"}`} {
		if !bytes.Contains(b, []byte(name)) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
}

// Replaying the published events in order into a set gives exactly the
// cache's blocks, through evictions and a reset; PodUp comes first and
// PodDown last, both with the engine's epoch; batch sequence numbers run
// from 0 without gaps.
func TestHTTPEventsReplayToCache(t *testing.T) {
	cfg := fastConfig()
	cfg.CacheBlocks = 40 // small: the workload below evicts
	cfg.Region = "eu-west-1"
	te := openTestEngine(t, cfg)
	docs := []string{strings.Repeat("alpha beta ", 30), strings.Repeat("gamma delta ", 25), strings.Repeat("epsilon ", 40)}
	for i := range 30 {
		prompt := docs[i%3] + fmt.Sprintf(" question %d", i)
		status, b := te.post(context.Background(), "/v1/completions", fmt.Sprintf(`{"model": "meridian/sim-70b", "max_tokens": 2, "prompt": %q}`, prompt))
		if status != 200 {
			t.Fatalf("request %d: %d %s", i, status, b)
		}
		if i == 20 {
			if status, _ := te.post(context.Background(), "/reset_prefix_cache", ""); status != 200 {
				t.Fatalf("reset: %d", status)
			}
		}
	}
	want := map[uint64]bool{}
	for _, b := range te.CachedBlocks() {
		want[b.Hash] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := te.pub.WaitFor(ctx, func(events []Event) bool { return maps.Equal(replay(events), want) })
	if err != nil {
		t.Fatalf("replayed events never matched the cache: %v", err)
	}
	var removed, cleared int
	for _, ev := range te.pub.Events() {
		switch ev.Kind {
		case BlockRemoved:
			removed++
		case AllBlocksCleared:
			cleared++
		}
	}
	if removed == 0 || cleared != 1 {
		t.Fatalf("workload produced %d BlockRemoved and %d AllBlocksCleared; want evictions and one reset", removed, cleared)
	}
	epoch := te.Epoch()
	te.Close(ctx)
	batches := te.pub.Batches()
	for i, b := range batches {
		if b.Seq != uint64(i) || b.Epoch != epoch || b.Pod != te.Name() {
			t.Fatalf("batch %d: seq %d epoch %d pod %s", i, b.Seq, b.Epoch, b.Pod)
		}
	}
	events := te.pub.Events()
	up, down := events[0], events[len(events)-1]
	if up.Kind != PodUp || up.Pod.Epoch != epoch || up.Pod.Endpoint != te.URL() || up.Pod.Region != "eu-west-1" || up.Pod.Hardware != "h100" {
		t.Fatalf("first event %+v", up)
	}
	if down.Kind != PodDown || down.Pod.Epoch != epoch || down.Pod.Name != te.Name() {
		t.Fatalf("last event %+v", down)
	}
}

func TestAdminToken(t *testing.T) {
	cfg := fastConfig()
	cfg.AdminToken = "s3cret"
	te := openTestEngine(t, cfg)
	if status, _ := te.post(context.Background(), "/reset_prefix_cache", ""); status != http.StatusUnauthorized {
		t.Fatalf("reset without token: %d", status)
	}
	req, _ := http.NewRequest(http.MethodPost, te.URL()+"/admin/faults", strings.NewReader(`{"error_next": 1}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := te.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || te.Faults().ErrorNext != 1 {
		t.Fatalf("set faults with token: %d, faults %+v", resp.StatusCode, te.Faults())
	}
}

func TestCloseIsIdempotentAndCancelsRequests(t *testing.T) {
	cfg := fastConfig()
	cfg.TimeScale = 1
	cfg.Timing = Timing{PrefillOverhead: time.Hour, LoadFactor: 1}
	te := openTestEngine(t, cfg)
	errs := make(chan error, 1)
	go func() {
		resp, err := te.client.Post(te.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model": "meridian/sim-70b", "prompt": "x"}`))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		errs <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := te.waitUntil(ctx, func(s Stats) bool { return s.Running == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := te.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := te.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := <-errs; err == nil {
		t.Fatal("the in-flight request succeeded across Close")
	}
	if st := te.Stats(); st.Running != 0 || st.UsedBlocks != 0 {
		t.Fatalf("after Close: %+v", st)
	}
	var last Event
	if ev := te.pub.Events(); len(ev) > 0 {
		last = ev[len(ev)-1]
	}
	if last.Kind != PodDown {
		t.Fatalf("last event %v, want PodDown", last.Kind)
	}
}

// Setting Hardware on DefaultConfig is enough to get that profile's timing,
// cache and concurrency; explicit values still win.
func TestDefaultConfigTakesTheProfile(t *testing.T) {
	for name, p := range Profiles() {
		cfg := DefaultConfig()
		cfg.Hardware = name
		got := cfg.withDefaults()
		want := p.Timing
		want.PrefillSlots = 1
		if got.Timing != want || got.CacheBlocks != p.CacheBlocks || got.MaxConcurrency != p.MaxConcurrency {
			t.Errorf("%s: timing %+v, %d blocks, %d running; want the profile's %+v, %d, %d",
				name, got.Timing, got.CacheBlocks, got.MaxConcurrency, want, p.CacheBlocks, p.MaxConcurrency)
		}
	}
	cfg := DefaultConfig()
	cfg.Hardware, cfg.CacheBlocks, cfg.Timing.DecodeInterval = "b200", 7, time.Second
	if got := cfg.withDefaults(); got.CacheBlocks != 7 || got.Timing.DecodeInterval != time.Second ||
		got.Timing.PrefillPerToken != Profiles()["b200"].Timing.PrefillPerToken {
		t.Errorf("overrides: %+v", got)
	}
	if got := DefaultConfig().withDefaults(); got.Hardware != "h100" || got.CacheBlocks != Profiles()["h100"].CacheBlocks {
		t.Errorf("default: %s, %d blocks", got.Hardware, got.CacheBlocks)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Hardware = "tpu" }, `Hardware "tpu": unknown profile`},
		{func(c *Config) { c.TimeScale = -1 }, "TimeScale -1"},
		{func(c *Config) { c.Timing.LoadFactor = 0.5 }, "Timing.LoadFactor 0.5"},
		{func(c *Config) { c.BlockSize = -1 }, "BlockSize -1"},
		{func(c *Config) { c.Timing.PrefillPerToken = -1 }, "Timing.PrefillPerToken"},
		{func(c *Config) { c.MaxPendingEvents = 2; c.EventBatchSize = 4 }, "MaxPendingEvents 2"},
		{func(c *Config) { c.Kafka = &KafkaConfig{} }, "Kafka.Brokers: empty"},
		{func(c *Config) { c.Kafka = &KafkaConfig{Brokers: []string{"x:1"}} }, "Region: required"},
		{func(c *Config) { c.Kafka = &KafkaConfig{Brokers: []string{"x:1"}}; c.Publisher = discardPublisher{} }, "set at most one"},
		{func(c *Config) { c.LoRAs = []string{""} }, "LoRAs[0]"},
		{func(c *Config) { c.Faults.DieRate = 1.5 }, "Faults: DieRate 1.5"},
		{func(c *Config) { c.Tokenizer.Encoding = "nope" }, "Tokenizer: tokenize config: Encoding"},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.mod(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an error containing %q", err, c.want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Hardware: "tpu"}); err == nil {
		t.Fatal("Open with a bad config: no error")
	}
	if err := (Config{Hardware: "B200"}).Validate(); err != nil {
		t.Fatalf("profile names are case-insensitive: %v", err)
	}
}
