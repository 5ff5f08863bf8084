package route

import (
	"math"
	"time"
)

// OutlierConfig is passive health checking in the style of Envoy's outlier
// detection: a pod that fails ConsecutiveFailures requests in a row (5xx or
// no response) is ejected for BaseEjection x (number of times it has been
// ejected in a row), at most MaxEjectionPercent of the pods at once (but at
// least one pod may always be ejected, as Envoy does). It comes back on its
// own when the time is up; a clean spell of BaseEjection brings the multiplier
// down again.
type OutlierConfig struct {
	ConsecutiveFailures int           `yaml:"consecutive_failures"` // default 5
	BaseEjection        time.Duration `yaml:"base_ejection"`        // default 30s
	MaxEjectionPercent  float64       `yaml:"max_ejection_percent"` // default 10
	MaxEjection         time.Duration `yaml:"max_ejection"`         // cap on one ejection; default 300s
}

// DefaultOutlierConfig returns Envoy's defaults.
func DefaultOutlierConfig() OutlierConfig {
	return OutlierConfig{ConsecutiveFailures: 5, BaseEjection: 30 * time.Second, MaxEjectionPercent: 10, MaxEjection: 300 * time.Second}
}

// Report records the outcome of one request to pod p at now: ok is false for
// a 5xx or a failure to get a response. It reports whether this outcome
// ejected the pod.
func (r *Registry) Report(p *Pod, ok bool, now time.Time, cfg OutlierConfig) (ejected bool) {
	p.mu.Lock()
	if ok {
		p.fails = 0
		if p.ejections > 0 && now.UnixNano() >= p.ejectedTo.Load()+int64(cfg.BaseEjection) {
			p.ejections--
		}
		p.mu.Unlock()
		return false
	}
	p.fails++
	trip := p.fails >= cfg.ConsecutiveFailures && !p.Ejected(now)
	p.mu.Unlock()
	if !trip {
		return false
	}
	pods := r.Pods()
	out := 0
	for _, q := range pods {
		if q != p && q.Ejected(now) {
			out++
		}
	}
	limit := int(math.Floor(float64(len(pods)) * cfg.MaxEjectionPercent / 100))
	if out >= max(limit, 1) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ejections++
	d := min(time.Duration(p.ejections)*cfg.BaseEjection, cfg.MaxEjection)
	p.ejectedTo.Store(now.Add(d).UnixNano())
	r.changes.Add(1)
	p.fails = 0
	return true
}

// Eject ejects pod p at once, whatever its count of failures and the cap on
// ejected pods: for a pod that refused a connection, which is gone, not
// slow (the cap guards against ejecting pods that are only overloaded). It
// reports whether the pod was not ejected already.
func (r *Registry) Eject(p *Pod, now time.Time, cfg OutlierConfig) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Ejected(now) {
		return false
	}
	p.ejections++
	d := min(time.Duration(p.ejections)*cfg.BaseEjection, cfg.MaxEjection)
	p.ejectedTo.Store(now.Add(d).UnixNano())
	r.changes.Add(1)
	p.fails = 0
	return true
}
