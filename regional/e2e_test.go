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
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

const simModel = "meridian/sim-70b"

// fleet is one region on loopback: a Kafka-protocol broker, engine
// simulators publishing their KV events to it, and one controller.
type fleet struct {
	broker  *kfake.Cluster
	engines []*enginesim.Engine
	ctl     *regional.Controller
	clock   *manualClock
}

// manualClock is the controller's decision clock: real time plus a manual
// offset, so a test can move past an ejection without sleeping.
type manualClock struct{ off atomic.Int64 }

func (c *manualClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *manualClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

func startFleet(t testing.TB, pods, cacheBlocks int, mut func(*regional.Config)) *fleet {
	t.Helper()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{broker: broker, clock: &manualClock{}}
	t.Cleanup(broker.Close)
	for i := 0; i < pods; i++ {
		cfg := enginesim.DefaultConfig()
		cfg.Name = fmt.Sprintf("pod-%d", i)
		cfg.Region = "test"
		cfg.TimeScale = 0.25
		cfg.CacheBlocks = cacheBlocks
		cfg.HashSeed = "e2e"
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
	cfg.Server.AllowPolicyOverride = true
	cfg.ScrapeInterval = 100 * time.Millisecond
	if mut != nil {
		mut(&cfg)
	}
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
	// Ready once every pod has announced itself with its endpoint.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ctl.Ingester.WaitFor(ctx, func() bool {
		n := 0
		for _, p := range ctl.Registry.Pods() {
			if p.Info().Endpoint != "" {
				n++
			}
		}
		return n == pods
	}); err != nil {
		t.Fatalf("pods did not register: %v", err)
	}
	return f
}

// result is what a client saw of one request.
type result struct {
	status       int
	ttft         time.Duration
	promptTokens int
	cachedTokens int
	pod          string
	predicted    int
	err          error
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chat sends a streaming chat request with usage and measures TTFT as the
// time to the first SSE data line.
func chat(ctx context.Context, url string, msgs []chatMsg, session, policy string) result {
	body, _ := json.Marshal(map[string]any{"model": simModel, "stream": true, "max_tokens": 4,
		"stream_options": map[string]bool{"include_usage": true}, "messages": msgs})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	if policy != "" {
		req.Header.Set("X-Meridian-Policy", policy)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	res := result{status: resp.StatusCode, pod: resp.Header.Get("X-Meridian-Pod")}
	fmt.Sscan(resp.Header.Get("X-Meridian-Predicted-Cached-Tokens"), &res.predicted)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		res.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if res.ttft == 0 {
			res.ttft = time.Since(start)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var chunk struct {
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && chunk.Usage != nil {
			res.promptTokens = chunk.Usage.PromptTokens
			if chunk.Usage.PromptTokensDetails != nil {
				res.cachedTokens = chunk.Usage.PromptTokensDetails.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		res.err = err
	} else if !done {
		res.err = fmt.Errorf("stream ended without [DONE]")
	}
	return res
}

// words makes deterministic text of n words.
func words(rng *rand.Rand, n int) string {
	vocab := strings.Fields("the of and to in is was for on that with by as at from it an be this are or which his her their has have had not but were one all also they can more other these some when time would into two only first new about been may who over such after most then used world city year state people between during under")
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[rng.IntN(len(vocab))])
		if rng.IntN(9) == 0 {
			fmt.Fprintf(&b, " %d", rng.IntN(10000))
		}
	}
	return b.String()
}

// conversation is one client's sequence of turns: a shared system prompt,
// then questions; multi-turn ones keep their history.
type conversation struct {
	session string
	turns   [][]chatMsg
}

// sharedPrefixWorkload: several long system prompts, many one-question
// conversations on each, and some multi-turn sessions.
func sharedPrefixWorkload(seed uint64, systems, conversations, multiTurn int) []conversation {
	rng := rand.New(rand.NewPCG(seed, 2))
	sys := make([]string, systems)
	for i := range sys {
		sys[i] = fmt.Sprintf("System prompt %d. ", i) + words(rng, 1200)
	}
	var out []conversation
	for i := 0; i < conversations; i++ {
		s := sys[rng.IntN(systems)]
		out = append(out, conversation{turns: [][]chatMsg{{{"system", s}, {"user", words(rng, 40)}}}})
	}
	for i := 0; i < multiTurn; i++ {
		c := conversation{session: fmt.Sprintf("sess-%d-%d", seed, i)}
		hist := []chatMsg{{"system", sys[rng.IntN(systems)]}}
		for turn := 0; turn < 4; turn++ {
			hist = append(slices.Clone(hist), chatMsg{"user", words(rng, 60)})
			c.turns = append(c.turns, hist)
			hist = append(slices.Clone(hist), chatMsg{"assistant", words(rng, 30)})
		}
		out = append(out, c)
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// run plays the conversations with `clients` concurrent clients (turns of a
// conversation in order) and returns every result.
func run(t testing.TB, url string, convs []conversation, clients int, policy string) []result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var mu sync.Mutex
	var out []result
	work := make(chan conversation)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for conv := range work {
				for _, msgs := range conv.turns {
					r := chat(ctx, url, msgs, conv.session, policy)
					mu.Lock()
					out = append(out, r)
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
	return out
}

type summary struct {
	n, errors int
	hitRate   float64 // engine-reported cached / prompt tokens
	ttftP50   time.Duration
	perPod    map[string]int
}

func summarize(rs []result) summary {
	s := summary{perPod: map[string]int{}}
	var prompt, cached int
	var ttfts []time.Duration
	for _, r := range rs {
		s.n++
		if r.err != nil {
			s.errors++
			continue
		}
		prompt += r.promptTokens
		cached += r.cachedTokens
		ttfts = append(ttfts, r.ttft)
		s.perPod[r.pod]++
	}
	if prompt > 0 {
		s.hitRate = float64(cached) / float64(prompt)
	}
	slices.Sort(ttfts)
	if len(ttfts) > 0 {
		s.ttftP50 = ttfts[len(ttfts)/2]
	}
	return s
}

func metricValue(t testing.TB, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// Issue acceptance: one system prompt shared by all traffic: no pod takes
// more than 2x its fair share, and the hit rate stays above 80%.
func TestE2EHotPrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	f := startFleet(t, 8, 2000, nil)
	convs := sharedPrefixWorkload(3, 1, 400, 0)
	res := summarize(run(t, f.ctl.URL(), convs, 24, ""))
	t.Logf("hot prefix: %d requests, hit rate %.3f, per pod %v", res.n, res.hitRate, res.perPod)
	if res.errors > 0 {
		t.Fatalf("%d errors", res.errors)
	}
	fair := float64(res.n) / 8
	for pod, n := range res.perPod {
		if float64(n) > 2*fair {
			t.Errorf("%s took %d requests, more than 2x its fair share %.0f", pod, n, fair)
		}
	}
	if res.hitRate <= 0.8 {
		t.Errorf("hit rate %.3f, want > 0.8", res.hitRate)
	}
}
