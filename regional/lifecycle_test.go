package regional_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

// slowPod answers a chat request once release is closed (or never: the
// request then waits until its context ends).
func slowPod(t *testing.T, release <-chan struct{}) (*httptest.Server, <-chan struct{}) {
	t.Helper()
	done := make(chan struct{})
	cancelled := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // as a server does: it then notices a client gone
		select {
		case <-release:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":3}}`)
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })
	return srv, cancelled
}

func lifecycleController(t *testing.T, pod string, shutdown regional.ShutdownConfig) *regional.Controller {
	t.Helper()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, kvevents.TopicFor("test")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	cfg := regional.DefaultConfig()
	cfg.Region, cfg.ControllerID, cfg.Listen = "test", "ctl-1", "127.0.0.1:0"
	cfg.Kafka.Brokers = broker.ListenAddrs()
	cfg.Pods.Static = []route.PodInfo{{Name: "slow", Endpoint: pod, Profile: "h100"}}
	cfg.Shutdown = shutdown
	ctl, err := regional.Open(context.Background(), cfg, regional.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ctl.Close(context.Background())
		client.CloseIdleConnections()
	})
	waitFor(t, "the controller ready (its index caught up)", ctl.Ready)
	return ctl
}

type answer struct {
	status int
	code   string
	retry  string
	err    error
}

// client is the tests' own: its connections are closed when they end.
var client = &http.Client{Transport: &http.Transport{}}

func send(url string) answer {
	body, _ := json.Marshal(map[string]any{"model": "default", "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": "hello"}}})
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return answer{status: resp.StatusCode, code: e.Error.Code, retry: resp.Header.Get("Retry-After")}
}

func readyzOf(url string) int {
	resp, err := client.Get(url + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A graceful stop: /readyz turns 503 at once while requests are still
// taken for the drain delay; then new connections are refused; a request
// in flight that finishes within the grace is answered; Shutdown returns
// once it has.
func TestShutdownDrainsInFlight(t *testing.T) {
	release := make(chan struct{})
	pod, _ := slowPod(t, release)
	ctl := lifecycleController(t, pod.URL, regional.ShutdownConfig{DrainDelay: 500 * time.Millisecond, Grace: 30 * time.Second})
	url := ctl.URL()
	if readyzOf(url) != http.StatusOK {
		t.Fatal("not ready before the stop")
	}
	inflight := make(chan answer, 1)
	go func() { inflight <- send(url) }()
	waitInFlight(t, ctl, 1)

	stopped := make(chan error, 1)
	go func() { stopped <- ctl.Shutdown(context.Background()) }()
	waitFor(t, "readyz 503", func() bool { return readyzOf(url) == http.StatusServiceUnavailable })
	// Still taken during the drain delay (a balancer may not have seen
	// /readyz yet).
	during := make(chan answer, 1)
	go func() { during <- send(url) }()
	waitInFlight(t, ctl, 2)
	waitFor(t, "new connections refused", func() bool {
		resp, err := client.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return errors.Is(err, syscall.ECONNREFUSED)
	})
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned with requests in flight: %v", err)
	default:
	}
	close(release)
	for _, ch := range []chan answer{inflight, during} {
		if a := <-ch; a.err != nil || a.status != http.StatusOK {
			t.Errorf("a request in flight at the stop: %+v", a)
		}
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// A request still without an answer when the grace is over is handed back
// with a retryable 503, not cut.
func TestShutdownHandsBackAfterGrace(t *testing.T) {
	pod, cancelled := slowPod(t, make(chan struct{}))
	ctl := lifecycleController(t, pod.URL, regional.ShutdownConfig{Grace: 300 * time.Millisecond})
	inflight := make(chan answer, 1)
	go func() { inflight <- send(ctl.URL()) }()
	waitInFlight(t, ctl, 1)
	err := ctl.Shutdown(context.Background())
	if err == nil {
		t.Error("Shutdown with a request handed back returned no error")
	}
	a := <-inflight
	if a.err != nil || a.status != http.StatusServiceUnavailable || a.code != "shutting_down" || a.retry == "" {
		t.Errorf("the request in flight after the grace: %+v", a)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Error("the pod's request was not cancelled when the request was handed back")
	}
}

func waitInFlight(t *testing.T, ctl *regional.Controller, n int64) {
	t.Helper()
	waitFor(t, "requests in flight", func() bool {
		var sum int64
		for _, p := range ctl.Registry.Pods() {
			sum += p.InFlight()
		}
		return sum >= n
	})
}
