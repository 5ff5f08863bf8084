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

	"github.com/meridian-llm/meridian/regional/route"
)

// Errors a scrape wraps, for scrapeReason.
var (
	errScrapeStatus = errors.New("unexpected status")
	errScrapeParse  = errors.New("unreadable metrics")
)

// Scraper reads each pod's vLLM metrics every Interval and records its KV
// cache utilisation (vllm:kv_cache_usage_perc, a 0..1 ratio despite its
// name). It is a secondary signal: the router's own in-flight accounting is
// fresher, and engine metrics can be seconds old.
//
// An https pod is scraped with the client's TLS (the controller's
// pods.tls): a pod whose certificate does not verify is not scraped, and
// the failure is counted (meridian_scrape_errors_total{reason="tls"}).
type Scraper struct {
	reg      *route.Registry
	client   *http.Client
	interval time.Duration
	log      *slog.Logger
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
	s := &Scraper{reg: reg, client: client, interval: interval, log: log,
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
// utilisation (0: no penalty) rather than keeping a value that grows staler
// every interval.
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
			s.scrapes.Inc()
			u, err := s.scrape(sctx, strings.TrimRight(ep, "/")+"/metrics")
			if err != nil {
				reason := scrapeReason(err)
				s.errors.WithLabelValues(reason).Inc()
				s.log.Debug("scrape failed", "pod", p.Name, "reason", reason, "err", err)
				u = 0
			}
			p.SetKVUtil(u)
		}()
	}
	wg.Wait()
}

func (s *Scraper) scrape(ctx context.Context, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s: %w", url, resp.Status, errScrapeStatus)
	}
	u, err := parseKVUsage(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return 0, fmt.Errorf("%s: %w: %w", url, errScrapeParse, err)
	}
	return u, nil
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

// parseKVUsage finds vllm:kv_cache_usage_perc (or the older
// vllm:gpu_cache_usage_perc) in Prometheus text exposition format and returns
// the mean over its series.
func parseKVUsage(r io.Reader) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var sum float64
	var n int
	for sc.Scan() {
		line := sc.Text()
		var rest string
		for _, name := range []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} {
			if r, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(r, "{") || strings.HasPrefix(r, " ")) {
				rest = r
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
		sum += v
		n++
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("no vllm:kv_cache_usage_perc sample")
	}
	return sum / float64(n), nil
}
