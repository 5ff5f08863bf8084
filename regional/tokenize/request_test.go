package tokenize

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestAppendRequestCompletionForms(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	want := m.AppendCompletion(nil, "hello world")
	cases := []string{
		`{"prompt": "hello world"}`,
		`{"prompt": ["hello world"]}`,
		`{"prompt": [15339, 1917]}`,
		`{"prompt": [[15339, 1917]]}`,
		`{"prompt_token_ids": [15339, 1917]}`,
		`{"prompt": "ignored", "prompt_token_ids": [15339, 1917]}`,
	}
	for _, body := range cases {
		var r Request
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		got, err := m.AppendRequest(nil, Completion, &r)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: got %v %v, want %v", body, got, err, want)
		}
	}
}

func TestAppendRequestErrors(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	cases := []struct {
		kind       Kind
		body, want string
	}{
		{Completion, `{}`, "prompt: missing"},
		{Completion, `{"prompt": 7}`, "want a string"},
		{Completion, `{"prompt": []}`, "empty list"},
		{Completion, `{"prompt": ["a", "b"]}`, "a batch of 2 prompts"},
		{Completion, `{"prompt": [1, -2]}`, "prompt[1]: -2 is not a token id"},
		{Completion, `{"prompt": [1, "x"]}`, `prompt[1]: "x" is not a token id`},
		{Chat, `{"messages": []}`, "messages: empty"},
		{Kind(9), `{}`, "unknown request kind"},
	}
	for _, c := range cases {
		var r Request
		if err := json.Unmarshal([]byte(c.body), &r); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		_, err := m.AppendRequest(nil, c.kind, &r)
		if !IsInvalidPrompt(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want ErrInvalidPrompt containing %q", c.body, err, c.want)
		}
	}
}

func TestMessageContentForms(t *testing.T) {
	m := mustModel(t, DefaultConfig())
	want, err := m.AppendChat(nil, []Message{{Role: "user", Content: "line one\nline two"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"messages": [{"role": "user", "content": "line one\nline two"}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]}]}`,
		`{"messages": [{"role": "user", "content": "line one\nline two"}], "add_generation_prompt": true}`,
	} {
		var r Request
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		got, err := m.AppendRequest(nil, Chat, &r)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: got %v %v, want %v", body, got, err, want)
		}
	}
	var r Request
	if err := json.Unmarshal([]byte(`{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false}`), &r); err != nil {
		t.Fatal(err)
	}
	got, _ := m.AppendRequest(nil, Chat, &r)
	if slices.Equal(got, want) {
		t.Error("add_generation_prompt false rendered the generation prompt")
	}
	for body, msg := range map[string]string{
		`{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}`: `type "image_url" is not supported`,
		`{"content": "x"}`:               "role missing",
		`{"role": "user", "content": 5}`: "want a string or a list of parts",
	} {
		var msgv Message
		err := json.Unmarshal([]byte(body), &msgv)
		if !IsInvalidPrompt(err) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: got %v, want ErrInvalidPrompt containing %q", body, err, msg)
		}
	}
	var nullContent Message
	if err := json.Unmarshal([]byte(`{"role": "assistant", "content": null}`), &nullContent); err != nil || nullContent.Content != "" {
		t.Errorf("null content: %+v %v", nullContent, err)
	}
	b, _ := json.Marshal(Message{Role: "user", Content: "hi"})
	if string(b) != `{"role":"user","content":"hi"}` {
		t.Errorf("marshal: %s", b)
	}
}

// Two Models built independently from the same Config (as the router and
// an engine simulator each build theirs) give identical ids for the same
// request bodies; the engine simulator's HTTP test checks the same through
// its API.
func TestIndependentModelsAgree(t *testing.T) {
	cfg := Config{Encoding: Cl100kBase, Dir: "testdata/models/header-style", Now: fixedNow}
	router, engine := mustModel(t, cfg), mustModel(t, cfg)
	bodies := []struct {
		kind Kind
		body string
	}{
		{Chat, `{"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello <|eot_id|> world"}]}`},
		{Completion, `{"prompt": "Once upon a time"}`},
		{Completion, `{"prompt": [1, 2, 3]}`},
	}
	for _, b := range bodies {
		var r1, r2 Request
		if err := json.Unmarshal([]byte(b.body), &r1); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(b.body), &r2); err != nil {
			t.Fatal(err)
		}
		a, err1 := router.AppendRequest(nil, b.kind, &r1)
		e, err2 := engine.AppendRequest(nil, b.kind, &r2)
		if err1 != nil || err2 != nil || !slices.Equal(a, e) || len(a) == 0 {
			t.Errorf("%s: router %v %v, engine %v %v", b.body, a, err1, e, err2)
		}
	}
}

func BenchmarkAppendRequestChat8k(b *testing.B) {
	m := mustModel(b, DefaultConfig())
	msgs := conversation(16, 250)
	var r Request
	r.Messages = msgs
	dst := make([]uint32, 0, 1<<14)
	var n int
	b.ReportAllocs()
	for b.Loop() {
		ids, err := m.AppendRequest(dst[:0], Chat, &r)
		if err != nil {
			b.Fatal(err)
		}
		n = len(ids)
	}
	b.ReportMetric(float64(n), "tokens/op")
}

func BenchmarkEncode(b *testing.B) {
	tk := mustTokenizer(b, Cl100kBase, nil)
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; func main() { fmt.Println(\"héllo\") }\n", 100)
	dst := make([]uint32, 0, 1<<13)
	var n int
	b.ReportAllocs()
	for b.Loop() {
		n = len(tk.AppendEncode(dst[:0], text))
	}
	b.ReportMetric(float64(n), "tokens/op")
}

// BenchmarkEncodeProse is BenchmarkEncode on English prose (proseText):
// the words of a request to a chat model, of every length.
func BenchmarkEncodeProse(b *testing.B) {
	tk := mustTokenizer(b, Cl100kBase, nil)
	text := proseText(1, 32<<10)
	dst := make([]uint32, 0, 1<<14)
	var n int
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		n = len(tk.AppendEncode(dst[:0], text))
	}
	b.ReportMetric(float64(n), "tokens/op")
}

// proseText is about size bytes of English prose, seeded by seed: sentences
// of common short words and less common long ones, capitalised, with
// commas, numbers and paragraphs. A fifth of its pre-tokens are words of 8
// to 15 bytes with their space, about as in written English.
func proseText(seed uint64, size int) string {
	short := strings.Fields(`the of and to a in is that it was for on are as with his they be at one have
		this from or had by not but what some we can out other were all there when up use your how said an
		each she which do their time if will way about many then them would write like so these her long
		make thing see him two has look more day could go come did number sound no most people my over
		know water than call first who may down side been now find any new work part take get place made
		live where after back little only round man year came show every good me give our under name very
		through just form much great think say help low line before turn cause same mean differ move right
		boy old too does tell sentence set three want air well also play small end put home read hand port`)
	long := strings.Fields(`information important government development international understanding
		particularly environment relationship responsibility organization experience themselves
		community education everything something political economic individual significant
		performance technology management especially situation available democratic conference
		particular population production knowledge throughout increasingly communication
		requirements approximately administration configuration implementation infrastructure
		characteristic representative recommendation nevertheless unfortunately independently
		transformation opportunities considerable professional traditional occasionally
		neighbourhood straightforward questionnaire troubleshooting acknowledgement
		interpretation sophisticated extraordinary circumstances consequences investigation
		tokenization latency throughput deployment scheduling inference replication bandwidth`)
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b9))
	var sb strings.Builder
	for sb.Len() < size {
		for range 3 + rng.IntN(5) { // sentences in a paragraph
			words := 6 + rng.IntN(18)
			for k := range words {
				var w string
				if rng.IntN(4) == 0 {
					w = long[rng.IntN(len(long))]
				} else {
					w = short[min(rng.IntN(len(short)), rng.IntN(len(short)))] // the first ones more often
				}
				switch {
				case k == 0:
					w = strings.ToUpper(w[:1]) + w[1:]
				case rng.IntN(40) == 0:
					w = strconv.Itoa(rng.IntN(2000))
				}
				sb.WriteString(w)
				switch {
				case k == words-1:
					sb.WriteString(". ")
				case rng.IntN(9) == 0:
					sb.WriteString(", ")
				default:
					sb.WriteByte(' ')
				}
			}
		}
		sb.WriteString("\n\n")
	}
	return sb.String()
}

// BenchmarkEncodeLibrary is BenchmarkEncode through
// github.com/tiktoken-go/tokenizer itself, for comparison with the fast path.
func BenchmarkEncodeLibrary(b *testing.B) {
	tk := mustTokenizer(b, Cl100kBase, nil)
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; func main() { fmt.Println(\"héllo\") }\n", 100)
	dst := make([]uint32, 0, 1<<13)
	var n int
	b.ReportAllocs()
	for b.Loop() {
		n = len(tk.appendLibrary(dst[:0], text))
	}
	b.ReportMetric(float64(n), "tokens/op")
}
