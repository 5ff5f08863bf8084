package enginesim

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

// metrics are the engine's Prometheus series: its engine's names for what a
// router scrapes (metricNames), meridian_enginesim_* for the simulator's
// own plumbing.
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

// metricNames are the names one engine kind exports for what the simulator
// measures ("" where the engine has no such series: it is then counted
// but not exported). The names a router scrapes (running, waiting, KV
// usage) are the engines' own: vLLM's vllm/v1/metrics/loggers.py, SGLang's
// python/sglang/srt/metrics/collector.py, trtllm-serve's
// tensorrt_llm/metrics/collector.py with the trtllm_ prefix its server adds.
type metricNames struct {
	running, waiting, kvUsage, hits, queries, ttft, e2e, prompt, gen, success string
	labels                                                                    func(model string) prometheus.Labels
}

func namesOf(engine string) metricNames {
	switch engine {
	case kvevents.EngineSGLang:
		return metricNames{running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs", kvUsage: "sglang:token_usage",
			hits: "sglang:cached_tokens_total", ttft: "sglang:time_to_first_token_seconds", e2e: "sglang:e2e_request_latency_seconds",
			prompt: "sglang:prompt_tokens_total", gen: "sglang:generation_tokens_total", success: "sglang:num_requests_total",
			labels: func(m string) prometheus.Labels { return prometheus.Labels{"model_name": m} }}
	case kvevents.EngineTRTLLM:
		return metricNames{running: "trtllm_num_requests_running", waiting: "trtllm_num_requests_waiting", kvUsage: "trtllm_kv_cache_utilization",
			ttft: "trtllm_time_to_first_token_seconds", e2e: "trtllm_e2e_request_latency_seconds", success: "trtllm_request_success_total",
			labels: func(m string) prometheus.Labels { return prometheus.Labels{"model_name": m, "engine_type": "trtllm"} }}
	}
	return metricNames{running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting", kvUsage: "vllm:kv_cache_usage_perc",
		hits: "vllm:prefix_cache_hits_total", queries: "vllm:prefix_cache_queries_total", ttft: "vllm:time_to_first_token_seconds",
		e2e: "vllm:e2e_request_latency_seconds", prompt: "vllm:prompt_tokens_total", gen: "vllm:generation_tokens_total",
		success: "vllm:request_success_total",
		labels:  func(m string) prometheus.Labels { return prometheus.Labels{"model_name": m, "engine": "0"} }}
}

func newMetrics(reg prometheus.Registerer, model, engine string) (*metrics, error) {
	n := namesOf(engine)
	l := n.labels(model)
	var named []prometheus.Collector
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: orUnexported(name), ConstLabels: l, Help: help})
		if name != "" {
			named = append(named, g)
		}
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: orUnexported(name), ConstLabels: l, Help: help})
		if name != "" {
			named = append(named, c)
		}
		return c
	}
	hist := func(name, help string) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: orUnexported(name), ConstLabels: l, Help: help, Buckets: ttftBuckets})
		if name != "" {
			named = append(named, h)
		}
		return h
	}
	m := &metrics{
		running:      gauge(n.running, "Number of requests in model execution batches."),
		waiting:      gauge(n.waiting, "Number of requests waiting to be processed."),
		kvUsage:      gauge(n.kvUsage, "KV-cache usage. 1 means 100 percent usage."),
		cacheHits:    counter(n.hits, "Prefix cache hits, in terms of number of cached tokens."),
		cacheQueries: counter(n.queries, "Prefix cache queries, in terms of number of queried tokens."),
		ttft:         hist(n.ttft, "Histogram of time to first token in seconds."),
		e2e:          hist(n.e2e, "Histogram of end to end request latency in seconds."),
		promptToks:   counter(n.prompt, "Number of prefill tokens processed."),
		genToks:      counter(n.gen, "Number of generation tokens processed."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: n.success, ConstLabels: l,
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
	for _, c := range append(named, m.success, m.events, m.batches, m.publishErrors, m.dropped, m.faults) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register enginesim metrics: %w", err)
		}
	}
	return m, nil
}

// orUnexported names a series the engine does not export (it is counted,
// never registered).
func orUnexported(name string) string {
	if name == "" {
		return "unexported"
	}
	return name
}
