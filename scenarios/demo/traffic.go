package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// app is an application whose sessions share one system prompt.
type app struct {
	name   string
	system string
}

// workload is a kind of session: who sends it, from where, how long.
type workload struct {
	tenant, class string
	app           int            // index into the apps
	origins       map[string]int // entry region -> weight
	weight        int            // share of new sessions
	turns         [2]int         // min, max turns
	words         [2]int         // min, max words of a user turn
	maxTokens     int
}

// The applications and workloads of the demo. The EU health tenant's PHI
// enters in every region and must be served in eu-west-1 (rule
// eu-health-phi); public traffic from eu-west-1 may be served in the US
// (public-from-eu), where the document assistant's long shared prompt is
// often warm; other regulated data stays in its origin zone.
var (
	appSpecs = []struct {
		name  string
		words int
	}{
		{"coding-agent", 1400},
		{"support-bot", 500},
		{"clinical-notes", 800},
		{"doc-search", 2400},
	}
	workloads = []workload{
		{tenant: "acme", class: "internal", app: 0, origins: map[string]int{"us-east-1": 5, "us-west-2": 5},
			weight: 30, turns: [2]int{4, 12}, words: [2]int{120, 500}, maxTokens: 24},
		{tenant: "globex", class: "public", app: 1, origins: map[string]int{"us-east-1": 4, "us-west-2": 3, "eu-west-1": 3},
			weight: 20, turns: [2]int{2, 6}, words: [2]int{20, 80}, maxTokens: 16},
		{tenant: "eu-health", class: "phi", app: 2, origins: map[string]int{"eu-west-1": 4, "us-east-1": 3, "us-west-2": 3},
			weight: 20, turns: [2]int{2, 8}, words: [2]int{40, 200}, maxTokens: 16},
		{tenant: "lumen", class: "public", app: 3, origins: map[string]int{"us-east-1": 4, "eu-west-1": 6},
			weight: 18, turns: [2]int{2, 6}, words: [2]int{15, 60}, maxTokens: 16},
		{tenant: "initech", class: "pii", app: 1, origins: map[string]int{"us-west-2": 5, "eu-west-1": 5},
			weight: 12, turns: [2]int{2, 6}, words: [2]int{20, 80}, maxTokens: 16},
	}
)

// roamShare is the share of turns entering at another region than the
// session's home (a client whose DNS answer changed, a user on the move):
// their history is cached elsewhere.
const roamShare = 0.15

var vocabulary = strings.Fields(`the of and to in is was for on that with by as at from it an be this are or which
has have had not but were one all also they can more other these some when time would into two only first new
about been may who over such after most then used world city year state people between during under patient
record dose follow visit note function return error test build deploy query index cache region request token
model prompt answer report table value config server client session policy audit latency memory service`)

// text returns n words of filler text.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
		if rng.IntN(9) == 0 {
			b.WriteByte(' ')
			b.WriteString(strconv.Itoa(rng.IntN(100000)))
		}
		if rng.IntN(14) == 0 {
			b.WriteString(".\n")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

func pickWeighted[K any](rng *rand.Rand, keys []K, weight func(K) int) K {
	total := 0
	for _, k := range keys {
		total += weight(k)
	}
	n := rng.IntN(total)
	for _, k := range keys {
		if n -= weight(k); n < 0 {
			return k
		}
	}
	return keys[len(keys)-1]
}

// client sends chat requests to the controllers, through a load balancer
// over each region's replicas, and reads the streamed answers, measuring
// time to first token.
type client struct {
	bal   *fleet.Balancer
	keys  map[string]string // tenant -> API key
	model string
	now   func() time.Time
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatBody struct {
	Model         string    `json:"model"`
	Messages      []message `json:"messages"`
	MaxTokens     int       `json:"max_tokens"`
	Stream        bool      `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type chunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// chat sends one streamed chat request entering at region and returns what
// the client saw, and the answer's text.
func (c *client) chat(ctx context.Context, region, tenant, class, session string, msgs []message, maxTokens int) (sample, string) {
	x := sample{entry: region, tenant: tenant, class: class, session: session}
	body := chatBody{Model: c.model, Messages: msgs, MaxTokens: maxTokens, Stream: true}
	body.StreamOptions.IncludeUsage = true
	b, err := json.Marshal(body)
	if err != nil {
		x.err = err.Error()
		return x, ""
	}
	x.sent = c.now()
	// The region's load balancer picks a replica (and retries a refused
	// connection once on another).
	resp, rep, err := c.bal.Do(region, func(base string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		// Who the client is comes from its API key (the tenant, and the
		// data classes it may send); the data class header only says which
		// of them.
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+c.keys[tenant])
		req.Header.Set(regional.HeaderDataClass, class)
		if session != "" {
			req.Header.Set(regional.HeaderSession, session)
		}
		return req, nil
	})
	if rep != nil {
		x.replica = rep.ID
	}
	if err != nil {
		x.done = c.now()
		x.err = err.Error()
		return x, ""
	}
	defer resp.Body.Close()
	x.answered = c.now()
	x.status = resp.StatusCode
	x.served = resp.Header.Get("X-Meridian-Region")
	x.pod = resp.Header.Get("X-Meridian-Pod")
	x.controller = resp.Header.Get(regional.HeaderController)
	x.forwarded = resp.Header.Get("X-Meridian-Forwarded-To") != ""
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		x.done = c.now()
		var eb errorBody
		if json.Unmarshal(raw, &eb) == nil {
			x.code, x.message = eb.Error.Code, eb.Error.Message
		} else {
			x.message = string(raw[:min(len(raw), 200)])
		}
		return x, ""
	}
	var answer strings.Builder
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	sawDone, first := false, true
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
			if ok {
				if first {
					x.ttft, first = c.now().Sub(x.sent), false
				}
				if bytes.Equal(data, []byte("[DONE]")) {
					sawDone = true
				} else {
					var ch chunk
					if json.Unmarshal(data, &ch) != nil {
						x.err = "malformed chunk: " + string(data[:min(len(data), 80)])
					} else {
						for _, c := range ch.Choices {
							answer.WriteString(c.Delta.Content)
						}
						if ch.Usage != nil {
							x.prompt = ch.Usage.PromptTokens
							if ch.Usage.PromptTokensDetails != nil {
								x.cached = ch.Usage.PromptTokensDetails.CachedTokens
							}
						}
					}
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				x.err = "stream: " + err.Error()
			}
			break
		}
	}
	x.done = c.now()
	switch {
	case x.err != "":
	case first:
		x.err = "stream without data"
	case !sawDone:
		x.err = "stream cut before [DONE]"
	case x.prompt == 0:
		x.err = "stream without usage"
	}
	return x, answer.String()
}

// generator runs the sessions.
type generator struct {
	c       *client
	st      *stats
	apps    []app
	regions []string
	seed    uint64
	think   [2]time.Duration
}

func newApps(seed uint64) []app {
	apps := make([]app, len(appSpecs))
	for i, a := range appSpecs {
		rng := rand.New(rand.NewPCG(seed, uint64(1000+i)))
		apps[i] = app{name: a.name, system: fmt.Sprintf("You are %s. Shared instructions and reference material follow.\n", a.name) + text(rng, a.words)}
	}
	return apps
}

// run starts n session loops and an embargoed-tenant loop; they stop
// sending when stop is closed (finishing the request in flight) and end
// early when ctx is done.
func (g *generator) run(ctx context.Context, stop <-chan struct{}, n int) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Go(func() { g.sessions(ctx, stop, i) })
	}
	wg.Go(func() { g.embargoed(ctx, stop) })
	wg.Wait()
}

// pause waits d, or returns false when stop is closed or ctx is done.
func pause(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

func (g *generator) thinkTime(rng *rand.Rand) time.Duration {
	return g.think[0] + time.Duration(rng.Int64N(int64(g.think[1]-g.think[0])+1))
}

// sessions runs sessions one after another in slot i.
func (g *generator) sessions(ctx context.Context, stop <-chan struct{}, slot int) {
	rng := rand.New(rand.NewPCG(g.seed, uint64(slot)))
	// Stagger the start so the first turns do not all arrive at once.
	if !pause(ctx, stop, time.Duration(rng.Int64N(int64(2*time.Second)))) {
		return
	}
	for n := 0; ; n++ {
		w := pickWeighted(rng, workloads, func(w workload) int { return w.weight })
		home := pickWeighted(rng, g.regions, func(r string) int { return w.origins[r] })
		session := fmt.Sprintf("s%d-%d", slot, n)
		msgs := []message{{Role: "system", Content: g.apps[w.app].system}}
		turns := w.turns[0] + rng.IntN(w.turns[1]-w.turns[0]+1)
		for t := 0; t < turns; t++ {
			entry := home
			if rng.Float64() < roamShare {
				entry = g.regions[rng.IntN(len(g.regions))]
			}
			msgs = append(msgs, message{Role: "user", Content: text(rng, w.words[0]+rng.IntN(w.words[1]-w.words[0]+1))})
			x, answer := g.c.chat(ctx, entry, w.tenant, w.class, session, msgs, w.maxTokens)
			if ctx.Err() != nil {
				return // cancelled: not the system's failure
			}
			g.st.record(x)
			if x.status != http.StatusOK || x.err != "" {
				break // the session gives up
			}
			msgs = append(msgs, message{Role: "assistant", Content: answer})
			if !pause(ctx, stop, g.thinkTime(rng)) {
				return
			}
		}
		if !pause(ctx, stop, g.thinkTime(rng)) {
			return
		}
	}
}

// embargoed sends a single request from an embargoed tenant every few
// seconds; the policy serves them nowhere (451).
func (g *generator) embargoed(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(g.seed, 99991))
	for {
		if !pause(ctx, stop, 2*time.Second+time.Duration(rng.Int64N(int64(2*time.Second)))) {
			return
		}
		entry := g.regions[rng.IntN(len(g.regions))]
		tenant := fmt.Sprintf("embargoed-%d", 1+rng.IntN(embargoedTenants))
		x, _ := g.c.chat(ctx, entry, tenant, "public", "", []message{{Role: "user", Content: text(rng, 30)}}, 8)
		if ctx.Err() != nil {
			return
		}
		g.st.record(x)
	}
}

// demoTenants are the API key holders of the demo: each workload's tenant
// with its data class, and the embargoed tenants.
func demoTenants() []fleet.Tenant {
	var out []fleet.Tenant
	seen := map[string]bool{}
	for _, w := range workloads {
		if !seen[w.tenant] {
			seen[w.tenant] = true
			out = append(out, fleet.Tenant{Name: w.tenant, DataClasses: []string{w.class}, DefaultDataClass: w.class})
		}
	}
	for i := 1; i <= embargoedTenants; i++ {
		out = append(out, fleet.Tenant{Name: fmt.Sprintf("embargoed-%d", i), DataClasses: []string{"public"}, DefaultDataClass: "public"})
	}
	return out
}

// embargoedTenants are embargoed-1 .. embargoed-N.
const embargoedTenants = 9
