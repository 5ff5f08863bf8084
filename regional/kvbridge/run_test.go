package kvbridge

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The operator endpoints: /healthz while the process serves, /readyz 503
// while no engine is connected, /metrics with the bridge's series, /streams
// as JSON. Run returns nil when its context ends.
func TestOperatorEndpointsAndRun(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "tcp://" + ln.Addr().String()
	ln.Close()
	cfg := DefaultConfig()
	cfg.Region, cfg.Brokers = "t", cluster.ListenAddrs()
	cfg.Pods = []PodConfig{{Name: "gone", Endpoint: dead}}
	cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	b, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitFor(ctx, func(s Stats) bool { return s.ConnectErrors > 0 }); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b.handler(reg))
	defer srv.Close()
	if code, _ := get(t, srv.URL+"/healthz"); code != 200 {
		t.Errorf("/healthz %d", code)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != 503 || !strings.Contains(body, "no engine") {
		t.Errorf("/readyz %d %q", code, body)
	}
	if code, body := get(t, srv.URL+"/metrics"); code != 200 || !strings.Contains(body, "meridian_kvbridge_connect_errors_total") ||
		!strings.Contains(body, "meridian_kvbridge_lag_batches 0") || !strings.Contains(body, "meridian_kvbridge_replays_unavailable_total 0") {
		t.Errorf("/metrics %d:\n%s", code, body)
	}
	code, body := get(t, srv.URL+"/streams")
	var doc struct {
		Stats   Stats
		Streams []StreamStats
	}
	if err := json.Unmarshal([]byte(body), &doc); code != 200 || err != nil || doc.Stats.ConnectErrors == 0 {
		t.Errorf("/streams %d %v %q", code, err, body)
	}

	cfg.Registerer = nil
	cfg.MetricsAddr = "127.0.0.1:0"
	rctx, rcancel := context.WithCancel(context.Background())
	rcancel()
	if err := Run(rctx, cfg); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
