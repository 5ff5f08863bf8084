package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

const smallCompletion = `{"model": "meridian/sim-70b", "max_tokens": 3, "prompt": "fault injection test"}`

func waitStats(t *testing.T, te *testEngine, cond func(Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := te.waitUntil(ctx, cond); err != nil {
		t.Fatalf("engine never reached the expected state: %+v", te.Stats())
	}
}

func TestFaultErrors(t *testing.T) {
	te := openTestEngine(t, fastConfig())
	status, b := te.post(context.Background(), "/admin/faults", `{"error_next": 2}`)
	if status != 200 {
		t.Fatalf("set faults: %d %s", status, b)
	}
	for i, want := range []int{500, 500, 200} {
		if status, b := te.post(context.Background(), "/v1/completions", smallCompletion); status != want {
			t.Fatalf("request %d: %d %s, want %d", i, status, b, want)
		}
	}
	te.post(context.Background(), "/admin/faults", `{"error_rate": 1}`)
	for range 3 {
		if status, _ := te.post(context.Background(), "/v1/completions", smallCompletion); status != 500 {
			t.Fatalf("error_rate 1: status %d", status)
		}
	}
	te.post(context.Background(), "/admin/faults", `{}`)
	if status, _ := te.post(context.Background(), "/v1/completions", smallCompletion); status != 200 {
		t.Fatalf("faults off: status %d", status)
	}
	if got := metricValue(t, te.Engine, "meridian_enginesim_faults_injected_total"); got != 5 {
		t.Fatalf("faults counted %v, want 5", got)
	}
	if st := te.Stats(); st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A stall until released holds the request before its first byte (not
// queued, no slot used) until POST /admin/faults/release; a timed stall
// ends by itself; a client that gives up during a stall leaves nothing.
func TestFaultStalls(t *testing.T) {
	te := openTestEngine(t, fastConfig())
	te.post(context.Background(), "/admin/faults", `{"stall_next": 1}`)
	done := make(chan int, 1)
	go func() {
		resp, err := te.client.Post(te.URL()+"/v1/completions", "application/json", strings.NewReader(smallCompletion))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	waitStats(t, te, func(s Stats) bool { return s.Stalled == 1 })
	select {
	case s := <-done:
		t.Fatalf("stalled request answered %d before release", s)
	default:
	}
	if st := te.Stats(); st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("a stalled request holds a slot: %+v", st)
	}
	if status, _ := te.post(context.Background(), "/admin/faults/release", ""); status != 200 {
		t.Fatalf("release: %d", status)
	}
	if s := <-done; s != 200 {
		t.Fatalf("released request: %d", s)
	}

	te.post(context.Background(), "/admin/faults", `{"stall_next": 1, "stall_for": "30ms"}`)
	start := time.Now()
	if status, _ := te.post(context.Background(), "/v1/completions", smallCompletion); status != 200 {
		t.Fatalf("timed stall: %d", status)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("timed stall of 30ms answered after %v", d)
	}

	te.post(context.Background(), "/admin/faults", `{"stall_next": 1}`)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, te.URL()+"/v1/completions", strings.NewReader(smallCompletion))
		resp, err := te.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitStats(t, te, func(s Stats) bool { return s.Stalled == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled stalled request: %v", err)
	}
	waitStats(t, te, func(s Stats) bool { return s.Stalled == 0 && s.Running == 0 && s.Waiting == 0 })
}

// A dying stream sends DieAfterChunks chunks then loses its connection; the
// engine frees the request; the next request is served normally. A dying
// non-streaming request gets no response at all.
func TestFaultDie(t *testing.T) {
	te := openTestEngine(t, fastConfig())
	var f Faults
	status, b := te.post(context.Background(), "/admin/faults", `{"die_next": 1, "die_after_chunks": 2}`)
	if status != 200 || json.Unmarshal(b, &f) != nil || f.DieNext != 1 || f.DieAfterChunks != 2 {
		t.Fatalf("set faults: %d %s", status, b)
	}
	stream := `{"model": "meridian/sim-70b", "stream": true, "max_tokens": 10, "prompt": "a dying stream"}`
	resp, sse := te.openStream(context.Background(), "/v1/completions", stream)
	for i := range 2 {
		if _, err := sse.next(); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
	}
	if _, err := sse.next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after %d chunks: %v, want the connection cut (unexpected EOF)", 2, err)
	}
	resp.Body.Close()
	waitStats(t, te, func(s Stats) bool { return s.Running == 0 && s.KVUsage == 0 })

	resp, sse = te.openStream(context.Background(), "/v1/completions", stream)
	n := 0
	for {
		data, err := sse.next()
		if err != nil {
			t.Fatalf("healthy stream after a death: %v after %d events", err, n)
		}
		n++
		if data == "[DONE]" {
			break
		}
	}
	resp.Body.Close()
	if n != 11 {
		t.Fatalf("healthy stream had %d events, want 10 tokens + [DONE]", n)
	}

	for _, body := range []string{smallCompletion, stream} {
		te.post(context.Background(), "/admin/faults", `{"die_next": 1}`)
		resp, err := te.client.Post(te.URL()+"/v1/completions", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("die before the first byte: got status %d", resp.StatusCode)
		}
	}
	if got := te.Faults(); got.DieNext != 0 {
		t.Fatalf("faults after use %+v", got)
	}
	waitStats(t, te, func(s Stats) bool { return s.Running == 0 && s.Waiting == 0 && s.KVUsage == 0 })
}

// Faults in Config apply from the start; draws follow the seeded order
// error, stall, die.
func TestFaultsFromConfig(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults = Faults{ErrorNext: 1, DieNext: 1}
	te := openTestEngine(t, cfg)
	if status, _ := te.post(context.Background(), "/v1/completions", smallCompletion); status != 500 {
		t.Fatalf("first request: %d, want the configured 500", status)
	}
	if resp, err := te.client.Post(te.URL()+"/v1/completions", "application/json", strings.NewReader(smallCompletion)); err == nil {
		resp.Body.Close()
		t.Fatalf("second request: %d, want the configured death", resp.StatusCode)
	}
	if status, _ := te.post(context.Background(), "/v1/completions", smallCompletion); status != 200 {
		t.Fatalf("third request: %d", status)
	}
	status, b := te.get("/admin/faults")
	if status != 200 || strings.TrimSpace(string(b)) != "{}" {
		t.Fatalf("GET /admin/faults: %d %s", status, b)
	}
}

func TestDurationJSON(t *testing.T) {
	var f Faults
	if err := json.Unmarshal([]byte(`{"stall_for": "1.5s"}`), &f); err != nil || time.Duration(f.StallFor) != 1500*time.Millisecond {
		t.Fatalf("%v %v", f.StallFor, err)
	}
	if err := json.Unmarshal([]byte(`{"stall_for": 2000}`), &f); err != nil || f.StallFor != 2000 {
		t.Fatalf("%v %v", f.StallFor, err)
	}
	if err := json.Unmarshal([]byte(`{"stall_for": "soon"}`), &f); err == nil {
		t.Fatal("bad duration accepted")
	}
	b, _ := json.Marshal(Faults{StallFor: Duration(time.Second)})
	if string(b) != `{"stall_for":"1s"}` {
		t.Fatalf("marshal %s", b)
	}
}
