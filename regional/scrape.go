package regional

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meridian-llm/meridian/regional/route"
)

// Scraper reads each pod's vLLM metrics every Interval and records its KV
// cache utilisation (vllm:kv_cache_usage_perc, a 0..1 ratio despite its
// name) and its own queue (vllm:num_requests_running +
// vllm:num_requests_waiting). They are secondary signals: the router's own
// in-flight accounting is fresher, and engine metrics can be seconds old;
// the engine's queue is a floor under it (with several replicas per
// region, one that has not heard of the others' requests yet still sees
// the pod busy).
type Scraper struct {
	reg      *route.Registry
	client   *http.Client
	interval time.Duration
	log      *slog.Logger
}

// NewScraper builds a scraper over the registry's pods.
func NewScraper(reg *route.Registry, client *http.Client, interval time.Duration, log *slog.Logger) *Scraper {
	return &Scraper{reg: reg, client: client, interval: interval, log: log}
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
// utilisation and queue (0: no penalty, no floor) rather than keeping
// values that grow staler every interval.
func (s *Scraper) ScrapeOnce(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range s.reg.Pods() {
		ep := p.Info().Endpoint
		if ep == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, s.interval)
			defer cancel()
			m, err := s.scrape(sctx, strings.TrimRight(ep, "/")+"/metrics")
			if err != nil {
				s.log.Debug("scrape failed", "pod", p.Name, "err", err)
				m = engineMetrics{}
			}
			p.SetKVUtil(m.kvUsage)
			p.SetEngineQueue(m.queue)
		}()
	}
	wg.Wait()
}

func (s *Scraper) scrape(ctx context.Context, url string) (engineMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return engineMetrics{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return engineMetrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engineMetrics{}, fmt.Errorf("%s: %s", url, resp.Status)
	}
	m, err := parseEngineMetrics(io.LimitReader(resp.Body, 8<<20))
	if err == nil && !m.hasKV {
		err = fmt.Errorf("no vllm:kv_cache_usage_perc sample")
	}
	return m, err
}

// engineMetrics is what the scraper reads of a pod's metrics.
type engineMetrics struct {
	kvUsage float64 // mean of vllm:kv_cache_usage_perc over its series
	hasKV   bool
	queue   int64 // sum of vllm:num_requests_running and _waiting over their series
}

// parseKVUsage finds vllm:kv_cache_usage_perc (or the older
// vllm:gpu_cache_usage_perc) in Prometheus text exposition format and returns
// the mean over its series.
func parseKVUsage(r io.Reader) (float64, error) {
	m, err := parseEngineMetrics(r)
	if err != nil {
		return 0, err
	}
	if !m.hasKV {
		return 0, fmt.Errorf("no vllm:kv_cache_usage_perc sample")
	}
	return m.kvUsage, nil
}

// parseEngineMetrics reads the KV-cache usage (vllm:kv_cache_usage_perc,
// or the older vllm:gpu_cache_usage_perc) and the queue
// (vllm:num_requests_running, vllm:num_requests_waiting) from Prometheus
// text exposition format.
func parseEngineMetrics(r io.Reader) (engineMetrics, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var m engineMetrics
	var sum, queue float64
	var n int
	for sc.Scan() {
		line := sc.Text()
		var rest string
		kv := false
		for _, name := range []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"} {
			if r, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(r, "{") || strings.HasPrefix(r, " ")) {
				rest, kv = r, strings.HasSuffix(name, "_perc")
			}
		}
		if rest == "" {
			continue
		}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		if kv {
			sum += v
			n++
		} else if v > 0 {
			queue += v
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if n > 0 {
		m.kvUsage, m.hasKV = sum/float64(n), true
	}
	m.queue = int64(queue)
	return m, nil
}
