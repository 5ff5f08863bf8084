package regional

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/meridian-llm/meridian/regional/tokenize"
)

// lateBodyTransport answers every request at once and reads its body
// only when asked (check), after the requests are over: a RoundTripper
// may read and close a request's body after RoundTrip returns.
type lateBodyTransport struct {
	mu     sync.Mutex
	bodies []io.ReadCloser
	sums   []string
}

func (t *lateBodyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	t.bodies, t.sums = append(t.bodies, req.Body), append(t.sums, req.Header.Get("X-Body-Sum"))
	t.mu.Unlock()
	const answer = `{"id":"x","choices":[]}`
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(answer)),
		ContentLength: int64(len(answer)), Request: req}, nil
}

// check reads the bodies kept and reports how many differ from what the
// client sent.
func (t *lateBodyTransport) check() (bad, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, b := range t.bodies {
		body, _ := io.ReadAll(b)
		_ = b.Close()
		sum := sha256.Sum256(body)
		if hex.EncodeToString(sum[:]) != t.sums[i] {
			bad++
		}
	}
	return bad, len(t.bodies)
}

// TestBodyBuffersOutliveNoRequest proxies many concurrent requests of
// different sizes, with pooled body buffers poisoned as they are given
// back, through the path that copies the body (postToPod) and the one that
// hands it to an http.Client (a pod answering a redirect, which the client
// follows with the body read again): every body reaches a pod intact (a
// pooled buffer is never reused, or poisoned, while still read; the race
// detector also sees it), and the prompts' caches hold nothing over a
// buffer (a session's next turn reuses its previous one).
func TestBodyBuffersOutliveNoRequest(t *testing.T) {
	var bad, checked atomic.Int64
	check := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		if hex.EncodeToString(sum[:]) != r.Header.Get("X-Body-Sum") {
			bad.Add(1)
		}
		checked.Add(1)
		okJSON(w, r)
	}
	target := newFakePod(t, check)
	redirect := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, target.srv.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}
	f := newServerFixture(t, []http.HandlerFunc{check, redirect, check}, func(c *fixtureConfig) {
		c.poisonBodies = true
		c.decision.SpeculationTTL = 0
	})
	body := func(worker, i int) string {
		// Sizes across several classes; the same system prompt per
		// worker, a different question each time.
		words := []int{100, 1500, 3000, 40000}[worker%4]
		sys := strings.Repeat(fmt.Sprintf("worker %d says ", worker), words/3)
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, sys, i)
	}
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				b := body(g, i)
				sum := sha256.Sum256([]byte(b))
				req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(b))
				req.Header.Set("X-Body-Sum", hex.EncodeToString(sum[:]))
				req.Header.Set(HeaderSession, fmt.Sprintf("s%d", g))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("worker %d request %d: status %d", g, i, resp.StatusCode)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if bad.Load() != 0 || checked.Load() != workers*each {
		t.Fatalf("%d of %d bodies reached their pod changed (want %d checked)", bad.Load(), checked.Load(), workers*each)
	}
	if target.calls.Load() == 0 {
		t.Fatal("no request took the redirect (the http.Client path)")
	}
	checkPrompts(t, f, body, workers, each)
}

// TestBodyBufferEscapes: a body handed to an http.Client whose transport
// reads it after the request is over (as RoundTrip may) is not given back
// to the pool: it reads as the client sent it.
func TestBodyBufferEscapes(t *testing.T) {
	late := &lateBodyTransport{}
	f := newServerFixture(t, []http.HandlerFunc{okJSON}, func(c *fixtureConfig) {
		c.poisonBodies = true
		c.transport = late
	})
	var want int
	for _, words := range []int{10, 1000, 3000, 10000, 10, 3000} {
		want++
		b := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("late ", words)+fmt.Sprint(want))
		sum := sha256.Sum256([]byte(b))
		resp, _ := post(t, f.url+"/v1/chat/completions", b, "X-Body-Sum", hex.EncodeToString(sum[:]))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if bad, n := late.check(); bad != 0 || n != want {
		t.Fatalf("%d of %d bodies read late were changed (want %d read)", bad, n, want)
	}
}

// checkPrompts: each session's last turn, sent again, extends what the
// session kept (read after its buffer was poisoned and reused), to the
// ids a fresh encoder gives.
func checkPrompts(t *testing.T, f *serverFixture, body func(worker, i int) string, workers, each int) {
	t.Helper()
	fresh, err := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 16, 100)
	if err != nil {
		t.Fatal(err)
	}
	fresh.SetPrefixCache(0)
	for g := 0; g < workers; g++ {
		var b tokenize.Body
		if err := tokenize.ParseBody([]byte(body(g, each-1)), &b); err != nil {
			t.Fatal(err)
		}
		got, err := f.srv.prompts.Encode("m", tokenize.Chat, &b.Request, fmt.Sprintf("s%d", g))
		if err != nil {
			t.Fatal(err)
		}
		want, err := fresh.Encode("m", tokenize.Chat, &b.Request, "")
		if err != nil {
			t.Fatal(err)
		}
		if got.Reused*2 < got.Tokens || !slices.Equal(got.Chain, want.Chain) {
			t.Errorf("worker %d: reused %d of %d tokens (want most), chains equal %v", g, got.Reused, got.Tokens, slices.Equal(got.Chain, want.Chain))
		}
	}
}
