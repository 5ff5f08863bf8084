package regional

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

// Errors a scrape wraps, for scrapeReason.
var (
	errScrapeStatus = errors.New("unexpected status")
	errScrapeParse  = errors.New("unreadable metrics")
)

// Scraper reads each pod's engine metrics every Interval and records its KV
// cache utilisation (a 0..1 ratio, whatever its name says) and the engine's
// own running and waiting request counts. It is a secondary signal: the
// router's own in-flight accounting is fresher, and engine metrics can be
// seconds old. The metric names depend on the pod's engine kind (PodInfo
// .Engine, from its PodUp or the static configuration): see EngineMetrics.
//
// An https pod is scraped with the client's TLS (the controller's
// pods.tls): a pod whose certificate does not verify is not scraped, and
// the failure is counted (meridian_scrape_errors_total{reason="tls"}).
type Scraper struct {
	reg      *route.Registry
	client   *http.Client
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time
	scrapes  prometheus.Counter
	errors   *prometheus.CounterVec
}

// Why a scrape failed (meridian_scrape_errors_total).
const (
	scrapeTLS     = "tls"         // handshake: untrusted or misnamed certificate, not a TLS server
	scrapeTimeout = "timeout"     // no answer within the interval
	scrapeConnect = "connect"     // refused, reset, unreachable
	scrapeStatus  = "http_status" // an answer other than 200
	scrapeParse   = "parse"       // no KV-cache usage sample in the body
)

// NewScraper builds a scraper over the registry's pods; metrics receives
// meridian_scrapes_total and meridian_scrape_errors_total (nil: not
// exported).
func NewScraper(reg *route.Registry, client *http.Client, interval time.Duration, log *slog.Logger, metrics prometheus.Registerer) (*Scraper, error) {
	s := &Scraper{reg: reg, client: client, interval: interval, log: log, now: time.Now,
		scrapes: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_scrapes_total",
			Help: "Pod /metrics scrapes attempted (failed ones are meridian_scrape_errors_total)."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_scrape_errors_total",
			Help: "Pod /metrics scrapes that failed, by reason: tls (certificate not trusted or not valid for the pod, or no TLS), timeout, connect, http_status, parse."},
			[]string{"reason"})}
	for _, r := range []string{scrapeTLS, scrapeTimeout, scrapeConnect, scrapeStatus, scrapeParse} {
		s.errors.WithLabelValues(r)
	}
	if metrics != nil {
		for _, c := range []prometheus.Collector{s.scrapes, s.errors} {
			if err := metrics.Register(c); err != nil {
				return nil, fmt.Errorf("register scrape metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Run scrapes until ctx is done.
func (s *Scraper) Run(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.ScrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// ScrapeOnce scrapes every pod with an endpoint, in parallel, each within
// one interval. A pod whose metrics cannot be read loses its KV-cache
// utilisation (0: no penalty) and its engine counts (unknown) rather than
// keeping values that grow staler every interval.
func (s *Scraper) ScrapeOnce(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range s.reg.Pods() {
		info := p.Info()
		if info.Endpoint == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, s.interval)
			defer cancel()
			s.scrapes.Inc()
			m := EngineMetricsOf(info.Engine)
			got, answered, err := s.scrape(sctx, strings.TrimRight(info.Endpoint, "/")+"/metrics", m)
			if answered {
				p.Contact(s.now()) // reachable, whatever its metrics say
			}
			if err == nil && !got.kvOK {
				err = fmt.Errorf("%w: no %s sample", errScrapeParse, strings.Join(m.KVUsage.names(), " or "))
			}
			if err != nil {
				reason := scrapeReason(err)
				s.errors.WithLabelValues(reason).Inc()
				s.log.Debug("scrape failed", "pod", p.Name, "engine", info.Engine, "reason", reason, "err", err)
			}
			p.SetKVUtil(got.kv)
			p.SetEngineQueue(got.running, got.waiting)
		}()
	}
	wg.Wait()
}

// scrape reads one pod's metrics; answered reports whether the pod
// answered at all (any HTTP response: it is reachable).
func (s *Scraper) scrape(ctx context.Context, url string, m EngineMetrics) (got scraped, answered bool, err error) {
	unknown := scraped{running: -1, waiting: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return unknown, false, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return unknown, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return unknown, true, fmt.Errorf("%s: %s: %w", url, resp.Status, errScrapeStatus)
	}
	got, err = parseEngineMetrics(io.LimitReader(resp.Body, 8<<20), m)
	if err != nil {
		return got, true, fmt.Errorf("%s: %w: %w", url, errScrapeParse, err)
	}
	return got, true, nil
}

// scrapeReason classifies a failed scrape.
func scrapeReason(err error) string {
	var (
		verify *tls.CertificateVerificationError
		record tls.RecordHeaderError
		alert  tls.AlertError
		netErr net.Error
	)
	switch {
	case errors.Is(err, errScrapeStatus):
		return scrapeStatus
	case errors.Is(err, errScrapeParse):
		return scrapeParse
	case errors.As(err, &verify), errors.As(err, &record), errors.As(err, &alert):
		return scrapeTLS
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return scrapeTimeout
	}
	return scrapeConnect
}

// Series names one Prometheus series: a metric name and, optionally, one
// label that must have a value.
type Series struct {
	Name, Label, Value string
}

// Names is a list of series for one signal, the current name first and the
// names earlier releases used after it: the first one present is read.
type Names []Series

func (n Names) names() []string {
	out := make([]string, len(n))
	for i, s := range n {
		out[i] = s.Name
	}
	return out
}

// EngineMetrics are the series one engine kind exports for what the scraper
// reads: KV-cache usage as a 0..1 ratio (the mean over its series, e.g. one
// per data-parallel engine), and running and waiting requests (summed).
type EngineMetrics struct {
	KVUsage, Running, Waiting Names
}

// EngineMetricsOf returns the metric names of an engine kind; an empty or
// unknown kind reads vLLM's.
//
//	vllm:   vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before v0.9,
//	        removed later), vllm:num_requests_running, vllm:num_requests_waiting
//	        (vllm/v1/metrics/loggers.py)
//	sglang: sglang:token_usage, sglang:num_running_reqs, sglang:num_queue_reqs
//	        (python/sglang/srt/metrics/collector.py; unchanged since 2024)
//	trtllm: trtllm-serve's trtllm_kv_cache_utilization,
//	        trtllm_num_requests_running, trtllm_num_requests_waiting; before
//	        trtllm-serve, Triton's TensorRT-LLM backend exported
//	        nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}
//	        and nv_trt_llm_request_metrics{request_type="scheduled"}
//
// (the same table llm-d-router's core metrics extractor uses for these
// engines, with the previous names added).
func EngineMetricsOf(kind string) EngineMetrics {
	switch kind {
	case kvevents.EngineSGLang:
		return EngineMetrics{
			KVUsage: Names{{Name: "sglang:token_usage"}},
			Running: Names{{Name: "sglang:num_running_reqs"}},
			Waiting: Names{{Name: "sglang:num_queue_reqs"}},
		}
	case kvevents.EngineTRTLLM:
		return EngineMetrics{
			KVUsage: Names{{Name: "trtllm_kv_cache_utilization"},
				{Name: "nv_trt_llm_kv_cache_block_metrics", Label: "kv_cache_block_type", Value: "fraction"}},
			Running: Names{{Name: "trtllm_num_requests_running"},
				{Name: "nv_trt_llm_request_metrics", Label: "request_type", Value: "scheduled"}},
			Waiting: Names{{Name: "trtllm_num_requests_waiting"}},
		}
	}
	return EngineMetrics{
		KVUsage: Names{{Name: "vllm:kv_cache_usage_perc"}, {Name: "vllm:gpu_cache_usage_perc"}},
		Running: Names{{Name: "vllm:num_requests_running"}},
		Waiting: Names{{Name: "vllm:num_requests_waiting"}},
	}
}

// scraped is what one scrape found: the KV usage (kvOK: a sample was
// there) and the engine's counts (-1: none).
type scraped struct {
	kv               float64
	kvOK             bool
	running, waiting int64
}

// parseEngineMetrics reads Prometheus text exposition format and returns
// the signals m names.
func parseEngineMetrics(r io.Reader, m EngineMetrics) (scraped, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	kv, run, wait := newAccum(m.KVUsage), newAccum(m.Running), newAccum(m.Waiting)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		kv.add(line)
		run.add(line)
		wait.add(line)
	}
	out := scraped{running: -1, waiting: -1}
	if err := sc.Err(); err != nil {
		return out, err
	}
	if sum, n := kv.first(); n > 0 {
		out.kv, out.kvOK = sum/float64(n), true
	}
	if sum, n := run.first(); n > 0 {
		out.running = int64(sum)
	}
	if sum, n := wait.first(); n > 0 {
		out.waiting = int64(sum)
	}
	return out, nil
}

// accum sums the samples of each series of a Names.
type accum struct {
	names Names
	sum   []float64
	n     []int
}

func newAccum(names Names) *accum {
	return &accum{names: names, sum: make([]float64, len(names)), n: make([]int, len(names))}
}

func (a *accum) add(line string) {
	for i, s := range a.names {
		rest, ok := strings.CutPrefix(line, s.Name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			if s.Label != "" && !strings.Contains(rest[:end], s.Label+`="`+s.Value+`"`) {
				continue
			}
			rest = rest[end+1:]
		} else if s.Label != "" {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		a.sum[i] += v
		a.n[i]++
	}
}

// first returns the sum and count of the first series that had samples.
func (a *accum) first() (float64, int) {
	for i := range a.names {
		if a.n[i] > 0 {
			return a.sum[i], a.n[i]
		}
	}
	return 0, 0
}

// parseKVUsage finds vLLM's KV-cache usage (vllm:kv_cache_usage_perc, or
// the older vllm:gpu_cache_usage_perc) and returns the mean over its series.
func parseKVUsage(r io.Reader) (float64, error) {
	got, err := parseEngineMetrics(r, EngineMetricsOf(kvevents.EngineVLLM))
	if err == nil && !got.kvOK {
		err = fmt.Errorf("no vllm:kv_cache_usage_perc sample")
	}
	return got.kv, err
}
