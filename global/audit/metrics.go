package audit

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	records     prometheus.Counter
	bytes       prometheus.Counter
	writeErrors *prometheus.CounterVec
	fsync       prometheus.Histogram
	batch       prometheus.Histogram
	rotations   prometheus.Counter
	checkpoints *prometheus.CounterVec
	clockBack   prometheus.Counter
	clockBackBy prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, queueDepth func() float64) (*metrics, error) {
	m := &metrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meridian_audit_records_total", Help: "Audit records durably written.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meridian_audit_bytes_total", Help: "Bytes of audit records durably written.",
		}),
		writeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_audit_write_errors_total", Help: "Failed audit writes by operation (rotate, write, sync, index).",
		}, []string{"op"}),
		fsync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "meridian_audit_fsync_seconds", Help: "Duration of one batch fsync.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "meridian_audit_batch_records", Help: "Records written by one fsync (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meridian_audit_segments_rotated_total", Help: "Segments sealed by size or age.",
		}),
		clockBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meridian_audit_clock_regressions_total",
			Help: "Batches whose wall time was behind the chain's last record time (the clock stepped back): their records carry the last time instead.",
		}),
		clockBackBy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_audit_clock_regression_seconds",
			Help: "How far behind the chain's last record time the wall clock was at the last regression.",
		}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_audit_checkpoints_total", Help: "Checkpoints handed to the sink, by result (ok, error).",
		}, []string{"result"}),
	}
	// Every op and result is exported at 0 from the start, so the first
	// failure is a rate Prometheus sees and an alert on it can fire.
	for _, op := range []string{"rotate", "write", "sync", "index"} {
		m.writeErrors.WithLabelValues(op)
	}
	for _, result := range []string{"ok", "error"} {
		m.checkpoints.WithLabelValues(result)
	}
	if reg == nil {
		return m, nil
	}
	queue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meridian_audit_queue_depth", Help: "Appends waiting for the writer.",
	}, queueDepth)
	for _, c := range []prometheus.Collector{m.records, m.bytes, m.writeErrors, m.fsync, m.batch, m.rotations, m.checkpoints, m.clockBack, m.clockBackBy, queue} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register audit metrics: %w", err)
		}
	}
	return m, nil
}
