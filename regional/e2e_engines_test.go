package regional_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// startMixedFleet is startFleet with one engine kind per pod: vLLM, SGLang
// and TensorRT-LLM simulators publishing their own event forms to one
// Kafka-protocol broker, and a real controller ingesting them.
func startMixedFleet(t testing.TB, kinds []string, cacheBlocks int) *fleet {
	t.Helper()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{broker: broker, clock: &manualClock{}}
	t.Cleanup(broker.Close)
	for i, kind := range kinds {
		cfg := enginesim.DefaultConfig()
		cfg.Name = fmt.Sprintf("%s-%d", kind, i)
		cfg.Engine = kind
		cfg.Region = "test"
		cfg.TimeScale = 0.1
		cfg.CacheBlocks = cacheBlocks
		cfg.HashSeed = "e2e-engines"
		cfg.DefaultMaxTokens = 4
		cfg.Kafka = &enginesim.KafkaConfig{Brokers: broker.ListenAddrs()}
		e, err := enginesim.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		f.engines = append(f.engines, e)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		})
	}
	cfg := regional.DefaultConfig()
	cfg.Region, cfg.ControllerID, cfg.Listen = "test", "ctl-1", "127.0.0.1:0"
	cfg.Kafka.Brokers = broker.ListenAddrs()
	cfg.Models = []regional.ModelConfig{{Name: simModel, Tokenizer: enginesim.DefaultConfig().Tokenizer}}
	cfg.ScrapeInterval = 100 * time.Millisecond
	ctl, err := regional.Open(context.Background(), cfg, regional.Deps{Clock: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	f.ctl = ctl
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ctl.Close(ctx); err != nil {
			t.Errorf("controller close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ctl.Ingester.WaitFor(ctx, func() bool {
		n := 0
		for _, p := range ctl.Registry.Pods() {
			if p.Info().Endpoint != "" && p.Info().Engine != "" {
				n++
			}
		}
		return n == len(kinds)
	}); err != nil {
		t.Fatalf("pods did not register: %v", err)
	}
	return f
}

// saltedResult is one request of the mixed-fleet test.
type saltedResult struct {
	salt, pod         string
	predicted, cached int
	err               error
}

// chatSalted sends a streaming chat request with a cache_salt ("" for
// none) and returns what Meridian predicted and what the engine reported.
func chatSalted(ctx context.Context, url string, msgs []chatMsg, salt string) saltedResult {
	req := map[string]any{"model": simModel, "stream": true, "max_tokens": 4,
		"stream_options": map[string]bool{"include_usage": true}, "messages": msgs}
	if salt != "" {
		req["cache_salt"] = salt
	}
	body, _ := json.Marshal(req)
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return saltedResult{salt: salt, err: err}
	}
	defer resp.Body.Close()
	res := saltedResult{salt: salt, pod: resp.Header.Get("X-Meridian-Pod")}
	fmt.Sscan(resp.Header.Get("X-Meridian-Predicted-Cached-Tokens"), &res.predicted)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		res.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Usage *struct {
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && chunk.Usage != nil && chunk.Usage.PromptTokensDetails != nil {
			res.cached = chunk.Usage.PromptTokensDetails.CachedTokens
		}
	}
	res.err = sc.Err()
	return res
}

// Issue 14 acceptance: a mixed fleet (two vLLM, two SGLang and two
// TensorRT-LLM simulators, each publishing its own event form) serves two
// salted tenants and unsalted traffic over the same system prompts. The
// index's predicted cached tokens stay within 5% of what the engines
// report, and no request is ever predicted a hit the engine could not
// serve: the same prompt under another salt (or none) shares no block, and
// TensorRT-LLM pods, whose events cannot carry a salt, get no salted
// traffic. These are token counts, not timings.
func TestE2EMixedEngineFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	kinds := []string{kvevents.EngineVLLM, kvevents.EngineSGLang, kvevents.EngineTRTLLM,
		kvevents.EngineVLLM, kvevents.EngineSGLang, kvevents.EngineTRTLLM}
	// Room for the whole working set: an index that is ever ahead of an
	// engine is then a prediction error, never an eviction in flight.
	f := startMixedFleet(t, kinds, 20000)
	url := f.ctl.URL()
	predBefore := metricValue(t, url, "meridian_router_predicted_cached_tokens_total")
	repBefore := metricValue(t, url, "meridian_router_reported_cached_tokens_total")

	rng := rand.New(rand.NewPCG(14, 14))
	systems := make([]string, 4)
	for i := range systems {
		systems[i] = fmt.Sprintf("System prompt %d. ", i) + words(rng, 700)
	}
	type conv struct {
		salt  string
		turns [][]chatMsg
	}
	var convs []conv
	for i := 0; i < 120; i++ {
		salt := []string{"", "tenant-a", "tenant-b"}[i%3]
		hist := []chatMsg{{"system", systems[rng.IntN(len(systems))]}}
		c := conv{salt: salt}
		for turn := 0; turn < 1+rng.IntN(2); turn++ {
			hist = append(slices.Clone(hist), chatMsg{"user", words(rng, 40)})
			c.turns = append(c.turns, hist)
			hist = append(slices.Clone(hist), chatMsg{"assistant", words(rng, 20)})
		}
		convs = append(convs, c)
	}
	rng.Shuffle(len(convs), func(i, j int) { convs[i], convs[j] = convs[j], convs[i] })

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var mu sync.Mutex
	var results []saltedResult
	work := make(chan conv)
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				for _, msgs := range c.turns {
					r := chatSalted(ctx, url, msgs, c.salt)
					mu.Lock()
					results = append(results, r)
					mu.Unlock()
				}
			}
		}()
	}
	for _, c := range convs {
		work <- c
	}
	close(work)
	wg.Wait()

	engineOf := map[string]string{}
	for _, e := range f.engines {
		engineOf[e.Name()] = e.Config().Engine
	}
	perEngine := map[string]int{}
	for _, r := range results {
		if r.err != nil {
			t.Fatalf("request failed: %v", r.err)
		}
		perEngine[engineOf[r.pod]+"/"+map[bool]string{true: "salted", false: "plain"}[r.salt != ""]]++
		// Never ahead of the engine by more than a router block (the
		// engine recomputes a prompt's last token; the router counts whole
		// 64-token blocks): more would be a hit the engine refused, as a
		// block of another salt is.
		if r.predicted > r.cached+64 {
			t.Errorf("%s request (salt %q) predicted %d cached tokens, the engine served %d", r.pod, r.salt, r.predicted, r.cached)
		}
		if r.salt != "" && engineOf[r.pod] == kvevents.EngineTRTLLM {
			t.Errorf("salted request sent to %s, whose events cannot carry its salt", r.pod)
		}
	}
	pred := metricValue(t, url, "meridian_router_predicted_cached_tokens_total") - predBefore
	rep := metricValue(t, url, "meridian_router_reported_cached_tokens_total") - repBefore
	t.Logf("%d requests by engine and salting %v; predicted %.0f cached tokens, engines reported %.0f (%.2f%%)",
		len(results), perEngine, pred, rep, 100*(pred-rep)/rep)
	if rep == 0 || (pred-rep)/rep > 0.05 || (rep-pred)/rep > 0.05 {
		t.Errorf("predicted %.0f vs reported %.0f cached tokens: off by more than 5%%", pred, rep)
	}
	for _, kind := range []string{kvevents.EngineVLLM, kvevents.EngineSGLang, kvevents.EngineTRTLLM} {
		if perEngine[kind+"/plain"]+perEngine[kind+"/salted"] == 0 {
			t.Errorf("no request served by a %s pod", kind)
		}
	}
	// A salt no request used matches nothing anywhere, though its prompts
	// are cached under three other namespaces on every engine kind.
	for _, sys := range systems {
		b, _ := json.Marshal(map[string]any{"model": simModel, "cache_salt": "tenant-z",
			"messages": []chatMsg{{"system", sys}, {"user", "hello"}}})
		resp, err := http.Post(url+"/v1/route", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			MatchedBlocks int `json:"matched_blocks"`
		}
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if err != nil || d.MatchedBlocks != 0 {
			t.Fatalf("an unused salt matched %d blocks (%v)", d.MatchedBlocks, err)
		}
	}
}
