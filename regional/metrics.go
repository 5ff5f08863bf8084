package regional

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/residency"
)

// routerMetrics are the request path's metrics, built from an injected
// registerer.
type routerMetrics struct {
	requests       *prometheus.CounterVec   // route, code
	decisions      *prometheus.CounterVec   // policy, reason
	decisionTime   prometheus.Histogram     // seconds
	tokenizeTime   prometheus.Histogram     // seconds
	ttft           *prometheus.HistogramVec // seconds, by pod
	retries        prometheus.Counter
	upstreamErrors *prometheus.CounterVec // kind
	ejections      prometheus.Counter
	promptTokens   prometheus.Counter
	predicted      prometheus.Counter // index-predicted cached tokens
	reported       prometheus.Counter // engine-reported cached tokens
	predictionErr  prometheus.Histogram
	tokensReused   prometheus.Counter
	tokensEncoded  prometheus.Counter

	crossRegion       *prometheus.CounterVec // to
	forwardedIn       *prometheus.CounterVec // from
	residencyDenials  *prometheus.CounterVec // rule
	residencyNoRegion prometheus.Counter
	auditFailures     prometheus.Counter
	fallbacks         prometheus.Counter
	truncated         *prometheus.CounterVec // what: stream, body
	authRefused       *prometheus.CounterVec // code
	rateLimited       prometheus.Counter
	hopsRefused       *prometheus.CounterVec // reason

	// The children the request path counts in on every request, found
	// without the vectors' lookups (each allocates its label values).
	requestsBy  childCache[prometheus.Counter]  // requests, by route and code
	decisionsBy childCache[prometheus.Counter]  // decisions, by policy and reason
	ttftBy      childCache[prometheus.Observer] // ttft, by pod
}

// childCache holds a metric vector's children by their label values.
// Children are never deleted from those vectors, so a cached one stays
// the vector's.
type childCache[M any] struct {
	mu sync.RWMutex
	m  map[childKey]M
}

// childKey is a child's label values: one or two strings, or a string
// and a number (a status code, made a string only for a new child).
type childKey struct {
	a, b string
	n    int
}

// get returns the child for labels, made by with once.
func (c *childCache[M]) get(labels childKey, with func() M) M {
	c.mu.RLock()
	v, ok := c.m[labels]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = with()
	c.mu.Lock()
	if c.m == nil {
		c.m = map[childKey]M{}
	}
	c.m[labels] = v
	c.mu.Unlock()
	return v
}

// request is the count of api's requests answered with code.
func (m *routerMetrics) request(api string, code int) prometheus.Counter {
	return m.requestsBy.get(childKey{a: api, n: code}, func() prometheus.Counter {
		return m.requests.WithLabelValues(api, strconv.Itoa(code))
	})
}

// decision is the count of decisions by policy for reason.
func (m *routerMetrics) decision(policy, reason string) prometheus.Counter {
	return m.decisionsBy.get(childKey{a: policy, b: reason}, func() prometheus.Counter {
		return m.decisions.WithLabelValues(policy, reason)
	})
}

// ttftOf is the time to first byte of pod's answers.
func (m *routerMetrics) ttftOf(pod string) prometheus.Observer {
	return m.ttftBy.get(childKey{a: pod}, func() prometheus.Observer { return m.ttft.WithLabelValues(pod) })
}

func newRouterMetrics(r prometheus.Registerer, reg *route.Registry, now func() time.Time) (*routerMetrics, error) {
	buckets := prometheus.ExponentialBuckets(0.005, 1.6, 20) // 5 ms .. ~30 s
	m := &routerMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_requests_total",
			Help: "Requests answered, by route and HTTP status code."}, []string{"route", "code"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_decisions_total",
			Help: "Routing decisions, by policy and reason."}, []string{"policy", "reason"}),
		decisionTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meridian_router_decision_seconds",
			Help: "Time to decide, excluding tokenization.", Buckets: prometheus.ExponentialBuckets(1e-6, 2, 20)}),
		tokenizeTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meridian_router_tokenize_seconds",
			Help: "Time to tokenize and hash a prompt.", Buckets: prometheus.ExponentialBuckets(1e-6, 2, 22)}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_router_ttft_seconds",
			Help: "Time from the request's arrival to the first byte from the pod.", Buckets: buckets}, []string{"pod"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_retries_total",
			Help: "Requests retried on another pod after a failure before the first byte."}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_upstream_errors_total",
			Help: "Failed attempts at a pod, by kind (connect, status_5xx, first_byte_timeout, mid_stream)."}, []string{"kind"}),
		ejections: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_ejections_total",
			Help: "Pods ejected by outlier detection."}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_prompt_tokens_total",
			Help: "Prompt tokens of answered requests that reported usage."}),
		predicted: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_predicted_cached_tokens_total",
			Help: "Cached tokens the index predicted for those requests."}),
		reported: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_reported_cached_tokens_total",
			Help: "Cached tokens the engines reported (usage.prompt_tokens_details.cached_tokens)."}),
		predictionErr: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meridian_router_prediction_error_tokens",
			Help:    "Absolute difference between predicted and reported cached tokens, per request.",
			Buckets: []float64{0, 16, 64, 256, 1024, 4096, 16384}}),
		tokensReused: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_tokens_reused_total",
			Help: "Prompt tokens taken from the session's previous turn instead of re-tokenized."}),
		tokensEncoded: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_tokens_total",
			Help: "Prompt tokens of routed requests (reused or encoded)."}),
		crossRegion: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_cross_region_total",
			Help: "Requests this controller sent to another region, by destination."}, []string{"to"}),
		forwardedIn: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_forwarded_in_total",
			Help: "Requests forwarded here by another region's controller, by origin."}, []string{"from"}),
		residencyDenials: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_residency_denials_total",
			Help: "Requests refused by a residency rule, by rule."}, []string{"rule"}),
		residencyNoRegion: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_residency_no_healthy_region_total",
			Help: "Requests refused because no region the residency policy allows could serve them."}),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_audit_failures_total",
			Help: "Audit records that could not be written (a cross-region decision that fails to record does not cross)."}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_fallbacks_total",
			Help: "Requests served elsewhere after the chosen remote region failed before answering."}),
		authRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_auth_refused_total",
			Help: "Requests refused by client authentication, by code (missing_credentials, invalid_credentials, tenant_mismatch, data_class_not_allowed)."}, []string{"code"}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_rate_limited_total",
			Help: "Requests refused (429) because their identity was over its rate limit."}),
		hopsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_hops_refused_total",
			Help: "Requests forwarded by another controller and refused, by reason (no_controller_certificate, not_a_member, region_mismatch, bad_token)."}, []string{"reason"}),
		truncated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_truncated_total",
			Help: "Answers whose upstream failed part way: a stream ended with an error event and aborted, or a body refused with 502."}, []string{"what"}),
	}
	for _, what := range []string{"stream", "body"} {
		m.truncated.WithLabelValues(what)
	}
	for _, code := range []string{"missing_credentials", "invalid_credentials", "tenant_mismatch", "data_class_not_allowed"} {
		m.authRefused.WithLabelValues(code)
	}
	for _, reason := range []string{"no_controller_certificate", "not_a_member", "region_mismatch", "bad_token"} {
		m.hopsRefused.WithLabelValues(reason)
	}
	// The answers alerts and panels divide by exist from the first scrape:
	// success, the residency refusal and the controller's own 5xx.
	for _, api := range []string{"chat", "completions", "route"} {
		for _, code := range []string{"200", "451", "500", "502", "503"} {
			m.requests.WithLabelValues(api, code)
		}
	}
	m.requests.WithLabelValues("models", "200")
	for _, kind := range []string{"connect", "refused", "status_5xx", "first_byte_timeout", "mid_stream"} {
		m.upstreamErrors.WithLabelValues(kind)
	}
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_router_inflight_requests",
		Help: "Requests in flight through this controller."}, func() float64 {
		var n int64
		for _, p := range reg.Pods() {
			n += p.Load().InFlight
		}
		return float64(n)
	})
	pods := &podCollector{reg: reg, now: now,
		inflight: prometheus.NewDesc("meridian_router_pod_inflight_requests", "Requests in flight per pod.", []string{"pod"}, nil),
		pending:  prometheus.NewDesc("meridian_router_pod_pending_prefill_tokens", "Prompt tokens routed to a pod and not yet past their first byte.", []string{"pod"}, nil),
		kv:       prometheus.NewDesc("meridian_router_pod_kv_utilization_ratio", "KV-cache utilisation scraped from the pod.", []string{"pod"}, nil),
		ejected:  prometheus.NewDesc("meridian_router_pod_ejected", "1 while the pod is ejected by outlier detection.", []string{"pod"}, nil),
		routed:   prometheus.NewDesc("meridian_router_pod_routed_total", "Requests routed to the pod.", []string{"pod"}, nil),
	}
	for _, c := range []prometheus.Collector{m.requests, m.decisions, m.decisionTime, m.tokenizeTime, m.ttft, m.retries,
		m.upstreamErrors, m.ejections, m.promptTokens, m.predicted, m.reported, m.predictionErr, m.tokensReused,
		m.tokensEncoded, m.crossRegion, m.forwardedIn, m.residencyDenials, m.residencyNoRegion, m.auditFailures,
		m.fallbacks, m.truncated, m.authRefused, m.rateLimited, m.hopsRefused, inflight, pods} {
		if err := r.Register(c); err != nil {
			return nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	return m, nil
}

// knowPolicy exports at 0 the series a residency policy names: a denial by
// each of its rules (and the default), a crossing to and from each of its
// other regions. A policy applied later adds its series at their first use.
func (m *routerMetrics) knowPolicy(p *residency.Policy, region string) {
	if p == nil {
		return
	}
	for _, r := range p.Rules() {
		m.residencyDenials.WithLabelValues(r.Name)
	}
	m.residencyDenials.WithLabelValues("default")
	for _, r := range p.Regions() {
		if r.Name != region {
			m.crossRegion.WithLabelValues(r.Name)
			m.forwardedIn.WithLabelValues(r.Name)
		}
	}
}

type podCollector struct {
	reg                                    *route.Registry
	now                                    func() time.Time
	inflight, pending, kv, ejected, routed *prometheus.Desc
}

func (c *podCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inflight
	ch <- c.pending
	ch <- c.kv
	ch <- c.ejected
	ch <- c.routed
}

func (c *podCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.reg.Pods() {
		l := p.Load()
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(l.InFlight), p.Name)
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(l.PendingPrefill), p.Name)
		ch <- prometheus.MustNewConstMetric(c.kv, prometheus.GaugeValue, l.KVUtil, p.Name)
		ch <- prometheus.MustNewConstMetric(c.ejected, prometheus.GaugeValue, b2f(p.Ejected(c.now())), p.Name)
		ch <- prometheus.MustNewConstMetric(c.routed, prometheus.CounterValue, float64(l.Routed), p.Name)
	}
}
