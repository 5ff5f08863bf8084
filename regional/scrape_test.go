package regional

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

// TestParseEngineMetrics: each engine kind's /metrics, with the metric
// names (and labels) its current and previous releases export, gives its
// KV-cache usage (mean over series) and running and waiting requests (sum).
func TestParseEngineMetrics(t *testing.T) {
	cases := []struct {
		name, engine, text string
		kv                 float64
		running, waiting   int64
		kvMissing          bool
	}{
		{"vllm v1, two data-parallel engines", kvevents.EngineVLLM, `# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1234.0
`, 0.5, 7, 1, false},
		{"vllm before v0.9 (gpu_cache_usage_perc)", "", `vllm:gpu_cache_usage_perc{model_name="m"} 0.4
vllm:num_requests_running{model_name="m"} 2.0
vllm:num_requests_waiting{model_name="m"} 5.0
`, 0.4, 2, 5, false},
		{"sglang, data-parallel attention", kvevents.EngineSGLang, `# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{dp="0",model_name="m"} 0.5
sglang:token_usage{dp="1",model_name="m"} 0.7
sglang:num_running_reqs{dp="0",model_name="m"} 8.0
sglang:num_running_reqs{dp="1",model_name="m"} 6.0
sglang:num_queue_reqs{dp="0",model_name="m"} 2.0
sglang:num_queue_reqs{dp="1",model_name="m"} 3.0
sglang:cache_hit_rate{dp="0",model_name="m"} 0.9
sglang:full_token_usage{dp="0",model_name="m"} 0.99
`, 0.6, 14, 5, false},
		{"trtllm-serve", kvevents.EngineTRTLLM, `# HELP trtllm_kv_cache_utilization KV cache utilization
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="m"} 0.62
trtllm_num_requests_running{engine_type="trtllm",model_name="m"} 9.0
trtllm_num_requests_waiting{engine_type="trtllm",model_name="m"} 4.0
trtllm_kv_cache_hit_rate{engine_type="trtllm",model_name="m"} 0.3
`, 0.62, 9, 4, false},
		{"Triton's TensorRT-LLM backend", kvevents.EngineTRTLLM, `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m",version="1"} 1000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m",version="1"} 0.35
nv_trt_llm_request_metrics{model="m",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="m",request_type="scheduled",version="1"} 12
`, 0.35, 12, -1, false},
		{"a vLLM pod scraped as SGLang", kvevents.EngineSGLang, "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.9\n", 0, -1, -1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseEngineMetrics(strings.NewReader(c.text), EngineMetricsOf(c.engine))
			if err != nil {
				t.Fatal(err)
			}
			if got.kvOK == c.kvMissing || got.kv != c.kv || got.running != c.running || got.waiting != c.waiting {
				t.Fatalf("got %+v, want kv %v (missing %v), running %d, waiting %d", got, c.kv, c.kvMissing, c.running, c.waiting)
			}
		})
	}
}

// TestScrapeEngineKinds: the scraper reads each pod by its engine kind: an
// SGLang pod's KV pressure and queue come from sglang:* series.
func TestScrapeEngineKinds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "sglang:token_usage{model_name=\"m\"} 0.91\nsglang:num_running_reqs{model_name=\"m\"} 5\nsglang:num_queue_reqs{model_name=\"m\"} 2\n")
	}))
	defer srv.Close()
	idx, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg := route.NewRegistry(idx)
	sg, _, _ := reg.Upsert(route.PodInfo{Name: "sg", Endpoint: srv.URL, Model: "m", Engine: kvevents.EngineSGLang})
	vl, _, _ := reg.Upsert(route.PodInfo{Name: "vl", Endpoint: srv.URL, Model: "m"})
	sc, err := NewScraper(reg, srv.Client(), time.Second, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc.ScrapeOnce(context.Background())
	if l := sg.Load(); l.KVUtil != 0.91 || l.EngineRunning != 5 || l.EngineWaiting != 2 {
		t.Fatalf("sglang pod: %+v", l)
	}
	if l := vl.Load(); l.KVUtil != 0 || l.EngineRunning != -1 || l.EngineWaiting != -1 {
		t.Fatalf("a vllm pod serving sglang metrics: %+v", l)
	}
	if n := testutil.ToFloat64(sc.errors.WithLabelValues(scrapeParse)); n != 1 {
		t.Fatalf("scrape errors of reason parse: %v, want 1 (the vllm pod's)", n)
	}
}

// TestPodsConfigEngine: a static pod's engine kind and capacity are checked.
func TestPodsConfigEngine(t *testing.T) {
	for name, p := range map[string]route.PodInfo{
		`engine "tgi"`:   {Name: "a", Endpoint: "http://10.0.0.1:8000", Engine: "tgi"},
		"kv_blocks = -1": {Name: "a", Endpoint: "http://10.0.0.1:8000", KVBlocks: -1},
	} {
		if err := (PodsConfig{Static: []route.PodInfo{p}}).Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	ok := PodsConfig{Static: []route.PodInfo{{Name: "a", Endpoint: "http://10.0.0.1:8000", Engine: kvevents.EngineSGLang, KVBlocks: 50000}}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}
