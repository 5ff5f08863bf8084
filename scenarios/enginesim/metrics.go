package enginesim

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine's Prometheus series: vLLM's names for what a router
// scrapes, meridian_enginesim_* for the simulator's own plumbing.
type metrics struct {
	running      prometheus.Gauge
	waiting      prometheus.Gauge
	kvUsage      prometheus.Gauge
	cacheHits    prometheus.Counter
	cacheQueries prometheus.Counter
	ttft         prometheus.Histogram
	e2e          prometheus.Histogram
	promptToks   prometheus.Counter
	genToks      prometheus.Counter
	success      *prometheus.CounterVec

	events        *prometheus.CounterVec
	batches       prometheus.Counter
	publishErrors prometheus.Counter
	dropped       prometheus.Counter
	faults        *prometheus.CounterVec
}

// vLLM's TTFT buckets (vllm/v1/metrics/loggers.py).
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

func newMetrics(reg prometheus.Registerer, model string) (*metrics, error) {
	l := prometheus.Labels{"model_name": model, "engine": "0"}
	m := &metrics{
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_running", ConstLabels: l,
			Help: "Number of requests in model execution batches."}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting", ConstLabels: l,
			Help: "Number of requests waiting to be processed."}),
		kvUsage: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc", ConstLabels: l,
			Help: "KV-cache usage. 1 means 100 percent usage."}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total", ConstLabels: l,
			Help: "Prefix cache hits, in terms of number of cached tokens."}),
		cacheQueries: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total", ConstLabels: l,
			Help: "Prefix cache queries, in terms of number of queried tokens."}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds", ConstLabels: l,
			Help: "Histogram of time to first token in seconds.", Buckets: ttftBuckets}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds", ConstLabels: l,
			Help: "Histogram of end to end request latency in seconds.", Buckets: ttftBuckets}),
		promptToks: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total", ConstLabels: l,
			Help: "Number of prefill tokens processed."}),
		genToks: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:generation_tokens_total", ConstLabels: l,
			Help: "Number of generation tokens processed."}),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total", ConstLabels: l,
			Help: "Count of successfully processed requests."}, []string{"finished_reason"}),

		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_enginesim_kv_events_total",
			Help: "KV events emitted, by type."}, []string{"type"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_enginesim_kv_batches_published_total",
			Help: "KV event batches the publisher accepted."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_enginesim_kv_publish_errors_total",
			Help: "Failed attempts to publish a KV event batch (each is retried)."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_enginesim_kv_events_dropped_total",
			Help: "KV events dropped because too many were pending while publishing failed."}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_enginesim_faults_injected_total",
			Help: "Injected failures, by kind."}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.running, m.waiting, m.kvUsage, m.cacheHits, m.cacheQueries, m.ttft, m.e2e,
		m.promptToks, m.genToks, m.success, m.events, m.batches, m.publishErrors, m.dropped, m.faults} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register enginesim metrics: %w", err)
		}
	}
	return m, nil
}
