package console

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The controller's metrics the console reads (regional/metrics.go): the
// same series /metrics exports, so the console and a Grafana panel built
// on them agree.
const (
	metricRequests    = "meridian_router_requests_total"
	metricPrompt      = "meridian_router_prompt_tokens_total"
	metricCached      = "meridian_router_reported_cached_tokens_total"
	metricTTFT        = "meridian_router_ttft_seconds"
	metricCross       = "meridian_router_cross_region_total"
	metricForwardedIn = "meridian_router_forwarded_in_total"
	metricDenials     = "meridian_router_residency_denials_total"
	metricNoRegion    = "meridian_router_residency_no_healthy_region_total"
	metricHopsRefused = "meridian_router_hops_refused_total"
	metricAuditFail   = "meridian_router_audit_failures_total"
)

// trafficRoutes are the routes whose answers count as requests: the two
// proxied APIs and the decision-only API.
var trafficRoutes = []string{"chat", "completions", "route"}

// Histogram is a cumulative histogram: Counts[i] observations were <=
// Bounds[i]; Count is every observation (those above the last bound too).
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
}

// add adds h to g; g takes h's bounds when it has none. Histograms with
// other bounds are not added (the controller's all share one layout).
func (g *Histogram) add(h Histogram) {
	if len(g.Bounds) == 0 {
		g.Bounds, g.Counts = slices.Clone(h.Bounds), make([]uint64, len(h.Bounds))
	}
	if !slices.Equal(g.Bounds, h.Bounds) {
		return
	}
	for i, c := range h.Counts {
		g.Counts[i] += c
	}
	g.Count += h.Count
}

// since is h minus an earlier reading of the same histogram. A reading
// that went down (a pod re-registered under the same name) counts from 0.
func (h Histogram) since(prev Histogram) Histogram {
	if prev.Count > h.Count || !slices.Equal(h.Bounds, prev.Bounds) {
		return h
	}
	d := Histogram{Bounds: h.Bounds, Counts: make([]uint64, len(h.Counts)), Count: h.Count - prev.Count}
	for i := range h.Counts {
		if prev.Counts[i] > h.Counts[i] {
			return h
		}
		d.Counts[i] = h.Counts[i] - prev.Counts[i]
	}
	return d
}

// Quantile estimates the q-quantile (0..1) of the observations as
// Prometheus' histogram_quantile does: linear within the bucket that holds
// it, the last finite bound for the observations above it. ok is false
// without observations.
func (h Histogram) Quantile(q float64) (v float64, ok bool) {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0, false
	}
	rank := q * float64(h.Count)
	for i, c := range h.Counts {
		if float64(c) < rank {
			continue
		}
		lo, below := 0.0, uint64(0)
		if i > 0 {
			lo, below = h.Bounds[i-1], h.Counts[i-1]
		}
		if c == below {
			return h.Bounds[i], true
		}
		return lo + (h.Bounds[i]-lo)*(rank-float64(below))/float64(c-below), true
	}
	return h.Bounds[len(h.Bounds)-1], true
}

// Counters is one reading of the controller's cumulative counters.
type Counters struct {
	Requests     float64 // answers of the traffic routes, any status
	Errors       float64 // of which 5xx or truncated
	Denied       float64 // of which 451
	PromptTokens float64 // of answers that reported usage
	CachedTokens float64 // engine-reported cached tokens of those
	TTFT         Histogram
	PodTTFT      map[string]Histogram
	CrossTo      map[string]float64 // requests sent to another region, by region
	ForwardedIn  map[string]float64 // requests forwarded here, by origin region
	DenialsBy    map[string]float64 // residency denials, by rule
	NoRegion     float64
	HopsRefused  float64
	AuditFails   float64
}

// crossings is every request sent to another region.
func (c Counters) crossings() float64 {
	var n float64
	for _, v := range c.CrossTo {
		n += v
	}
	return n
}

// ReadCounters gathers g (the controller's registry) and reads the series
// the console shows. Series it does not find read as 0.
func ReadCounters(g prometheus.Gatherer) (Counters, error) {
	mfs, err := g.Gather()
	if err != nil {
		return Counters{}, fmt.Errorf("console: gather metrics: %w", err)
	}
	c := Counters{PodTTFT: map[string]Histogram{}, CrossTo: map[string]float64{}, ForwardedIn: map[string]float64{}, DenialsBy: map[string]float64{}}
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricRequests:
			for _, m := range mf.GetMetric() {
				route, code := label(m, "route"), label(m, "code")
				if !slices.Contains(trafficRoutes, route) {
					continue
				}
				v := m.GetCounter().GetValue()
				c.Requests += v
				switch {
				case strings.HasPrefix(code, "5") || code == "truncated":
					c.Errors += v
				case code == "451":
					c.Denied += v
				}
			}
		case metricPrompt:
			c.PromptTokens = sum(mf)
		case metricCached:
			c.CachedTokens = sum(mf)
		case metricTTFT:
			for _, m := range mf.GetMetric() {
				h := histogram(m.GetHistogram())
				c.PodTTFT[label(m, "pod")] = h
				c.TTFT.add(h)
			}
		case metricCross:
			byLabel(mf, "to", c.CrossTo)
		case metricForwardedIn:
			byLabel(mf, "from", c.ForwardedIn)
		case metricDenials:
			byLabel(mf, "rule", c.DenialsBy)
		case metricNoRegion:
			c.NoRegion = sum(mf)
		case metricHopsRefused:
			c.HopsRefused = sum(mf)
		case metricAuditFail:
			c.AuditFails = sum(mf)
		}
	}
	return c, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func sum(mf *dto.MetricFamily) float64 {
	var v float64
	for _, m := range mf.GetMetric() {
		v += m.GetCounter().GetValue()
	}
	return v
}

func byLabel(mf *dto.MetricFamily, name string, into map[string]float64) {
	for _, m := range mf.GetMetric() {
		into[label(m, name)] += m.GetCounter().GetValue()
	}
}

func histogram(h *dto.Histogram) Histogram {
	out := Histogram{Count: h.GetSampleCount()}
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue
		}
		out.Bounds = append(out.Bounds, b.GetUpperBound())
		out.Counts = append(out.Counts, b.GetCumulativeCount())
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
