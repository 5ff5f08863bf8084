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
// name). It is a secondary signal: the router's own in-flight accounting is
// fresher, and engine metrics can be seconds old.
type Scraper struct {
	reg      *route.Registry
	client   *http.Client
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time
}

// NewScraper builds a scraper over the registry's pods.
func NewScraper(reg *route.Registry, client *http.Client, interval time.Duration, log *slog.Logger) *Scraper {
	return &Scraper{reg: reg, client: client, interval: interval, log: log, now: time.Now}
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
			u, answered, err := s.scrape(sctx, strings.TrimRight(ep, "/")+"/metrics")
			if answered {
				p.Contact(s.now()) // reachable, whatever its metrics say
			}
			if err != nil {
				s.log.Debug("scrape failed", "pod", p.Name, "err", err)
				u = 0
			}
			p.SetKVUtil(u)
		}()
	}
	wg.Wait()
}

// scrape reads one pod's KV-cache utilisation; answered reports whether
// the pod answered at all (any HTTP response).
func (s *Scraper) scrape(ctx context.Context, url string) (u float64, answered bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, true, fmt.Errorf("%s: %s", url, resp.Status)
	}
	u, err = parseKVUsage(io.LimitReader(resp.Body, 8<<20))
	return u, true, err
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
