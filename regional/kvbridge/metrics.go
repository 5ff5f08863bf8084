package kvbridge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

// metrics are the bridge's series, meridian_kvbridge_*.
type metrics struct {
	received        *prometheus.CounterVec // path: live, replay
	forwarded       prometheus.Counter
	markers         *prometheus.CounterVec // why: restart, join
	duplicates      prometheus.Counter
	dropped         *prometheus.CounterVec // reason
	malformed       *prometheus.CounterVec // decode reason
	malformedEvents *prometheus.CounterVec // decode reason
	gapsDetected    prometheus.Counter
	gapsRecovered   prometheus.Counter
	gapsLost        prometheus.Counter
	batchesLost     prometheus.Counter
	restarts        prometheus.Counter
	joins           *prometheus.CounterVec // history: full, partial
	replays         *prometheus.CounterVec // result: ok, failed
	noReplay        prometheus.Counter
	reconnects      prometheus.Counter
	connectErrors   prometheus.Counter
	produceErrors   *prometheus.CounterVec // kind: write, auth, tls, too_large
	announcements   *prometheus.CounterVec // kind: up, down
	latency         prometheus.Histogram
}

func newMetrics(r prometheus.Registerer, b *Bridge) (*metrics, error) {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_kvbridge_" + name, Help: help})
	}
	cv := func(name, help string, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_kvbridge_" + name, Help: help}, []string{label})
	}
	m := &metrics{
		received:  cv("batches_received_total", "Batches received from engines, by path (live PUB stream or replay socket).", "path"),
		forwarded: c("batches_forwarded_total", "Engine batches written to Kafka (restart markers not included)."),
		markers: cv("markers_forwarded_total",
			"AllBlocksCleared markers written before an engine's new incarnation or a whole-history replay, by why.", "why"),
		duplicates: c("batches_duplicate_total", "Batches a replay answer sent twice (dropped)."),
		dropped: cv("batches_dropped_total",
			"Batches not forwarded, by reason (bad_frames: not [topic, seq, payload]; no_pod: no pod name configured or in the topic; too_many_streams: over max_streams; too_large: over max_message_bytes).", "reason"),
		malformed: cv("batches_malformed_total",
			"Payloads that do not decode as a vLLM KVEventBatch, by decode reason; forwarded all the same.", "reason"),
		malformedEvents: cv("events_malformed_total",
			"Malformed events inside payloads that decode (the ingester skips them and applies the rest), by decode reason; forwarded all the same.", "reason"),
		gapsDetected:  c("gaps_detected_total", "Runs of sequence numbers not received live (per pod, topic and data-parallel rank)."),
		gapsRecovered: c("gaps_recovered_total", "Gaps fully repaired from an engine's replay socket."),
		gapsLost:      c("gaps_lost_total", "Gaps not fully repaired (no replay socket, replay failed, or the engine's buffer no longer held them)."),
		batchesLost:   c("gap_batches_lost_total", "Batches of those gaps that no replay provided."),
		restarts:      c("engine_restarts_total", "Engine restarts detected (sequence number back to 0 or below the last seen, or a different batch at the last seq)."),
		joins: cv("stream_joins_total",
			"Streams seen for the first time, by history (full: replayed from seq 0; partial: forwarding starts mid-stream).", "history"),
		replays: cv("replay_requests_total", "Replay requests to engines' ROUTER sockets, by result.", "result"),
		noReplay: c("replays_unavailable_total",
			"Repairs not attempted because the pod has no replay endpoint: a gap (then lost), a mid-stream join (then partial), or a restarted engine's history."),
		reconnects:    c("reconnects_total", "ZMQ connections re-established after one was lost."),
		connectErrors: c("connect_errors_total", "Failed ZMQ connection attempts (each followed by a backoff)."),
		announcements: cv("announcements_total",
			"The bridge's own pod announcements written to Kafka, by kind (up: PodUp with a TTL, repeated every announce_interval; down: PodDown of a discovered pod that left).", "kind"),
		produceErrors: cv("produce_errors_total", "Kafka write failures (retried with backoff: write; auth: SASL refused; tls: broker certificate not trusted or no TLS) and batches dropped as too large (too_large), by kind.", "kind"),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meridian_kvbridge_forward_latency_seconds",
			Help:    "Time from receiving a batch over ZMQ to Kafka acknowledging it.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	for _, v := range []string{"live", "replay"} {
		m.received.WithLabelValues(v)
	}
	for _, v := range []string{"restart", "join"} {
		m.markers.WithLabelValues(v)
	}
	for _, v := range []string{"bad_frames", "no_pod", "too_many_streams", "too_large"} {
		m.dropped.WithLabelValues(v)
	}
	for _, r := range kvevents.Reasons() {
		m.malformed.WithLabelValues(string(r))
		m.malformedEvents.WithLabelValues(string(r))
	}
	for _, v := range []string{"up", "down"} {
		m.announcements.WithLabelValues(v)
	}
	for _, v := range []string{"full", "partial"} {
		m.joins.WithLabelValues(v)
	}
	for _, v := range []string{"ok", "failed"} {
		m.replays.WithLabelValues(v)
	}
	for _, v := range []string{"write", "auth", "tls", "too_large"} {
		m.produceErrors.WithLabelValues(v)
	}
	gauges := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_kvbridge_lag_batches",
			Help: "Batches received over ZMQ and not yet acknowledged by Kafka (or dropped)."},
			func() float64 { return float64(b.pending.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_kvbridge_connections",
			Help: "Live ZMQ subscriber connections."},
			func() float64 { return float64(b.conns.Load()) }),
	}
	for _, col := range append([]prometheus.Collector{m.received, m.forwarded, m.markers, m.duplicates, m.dropped,
		m.malformed, m.malformedEvents, m.gapsDetected, m.gapsRecovered, m.gapsLost, m.batchesLost, m.restarts, m.joins, m.replays,
		m.noReplay, m.reconnects, m.connectErrors, m.produceErrors, m.announcements, m.latency}, gauges...) {
		if err := r.Register(col); err != nil {
			return nil, fmt.Errorf("register kvbridge metrics: %w", err)
		}
	}
	return m, nil
}

// record adds a tally of the state machines to the counters (Forwarded is
// counted when Kafka acknowledges).
func (m *metrics) record(t tally) {
	m.duplicates.Add(float64(t.Duplicates))
	m.gapsDetected.Add(float64(t.GapsDetected))
	m.gapsRecovered.Add(float64(t.GapsRecovered))
	m.gapsLost.Add(float64(t.GapsLost))
	m.batchesLost.Add(float64(t.BatchesLost))
	m.restarts.Add(float64(t.Restarts))
	m.joins.WithLabelValues("full").Add(float64(t.JoinsFull))
	m.joins.WithLabelValues("partial").Add(float64(t.JoinsPartial))
	m.replays.WithLabelValues("ok").Add(float64(t.ReplayRequests - t.ReplayFailures))
	m.replays.WithLabelValues("failed").Add(float64(t.ReplayFailures))
	m.noReplay.Add(float64(t.NoReplay))
	m.received.WithLabelValues("replay").Add(float64(t.Replayed))
}
