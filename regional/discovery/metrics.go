package discovery

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a lookup (meridian_discovery_lookups_total{result}).
const (
	resultOK       = "ok"        // an answer with pods
	resultNotFound = "not_found" // an answer of none: NXDOMAIN or no records (Kubernetes: no ready pod)
	resultError    = "error"     // no answer: timeout, SERVFAIL, refused, unreadable or invalid file
)

// metrics are a source's series, meridian_discovery_*.
type metrics struct {
	pods    prometheus.Gauge
	missing prometheus.Gauge
	lookups *prometheus.CounterVec
	changes prometheus.Counter
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	if r == nil {
		r = prometheus.NewRegistry()
	}
	m := &metrics{
		pods: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_discovery_pods",
			Help: "Pods the discovery source publishes now (those kept through their grace included)."}),
		missing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_discovery_pods_missing",
			Help: "Published pods that the last DNS answer lacked, kept until their grace runs out."}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_discovery_lookups_total",
			Help: "Lookups (DNS queries, file reads), by result: ok; not_found (an answer of no pods); error (no answer: the last set is kept)."},
			[]string{"result"}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_discovery_changes_total",
			Help: "Times the published set of pods changed (a pod joined, left or changed)."}),
	}
	for _, v := range []string{resultOK, resultNotFound, resultError} {
		m.lookups.WithLabelValues(v)
	}
	for _, c := range []prometheus.Collector{m.pods, m.missing, m.lookups, m.changes} {
		if err := r.Register(c); err != nil {
			return nil, fmt.Errorf("register discovery metrics: %w", err)
		}
	}
	return m, nil
}
