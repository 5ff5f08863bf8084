package gossip

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	members        *prometheus.GaugeVec
	sentBytes      prometheus.Counter
	receivedBytes  prometheus.Counter
	accepted       prometheus.Counter
	rejected       *prometheus.CounterVec
	pulls          prometheus.Counter
	coordsRejected prometheus.Counter
	replicaMsgs    *prometheus.CounterVec
	sightingMsgs   *prometheus.CounterVec
	digestRejected prometheus.Counter
	summaryAge     *prometheus.GaugeVec
	rtt            *prometheus.GaugeVec
	regionLive     *prometheus.GaugeVec
	skew           *prometheus.GaugeVec
	isolated       prometheus.Gauge
	rejoins        prometheus.Counter
	keyOps         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg) // a nil reg registers nowhere
	m := &metrics{
		members: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_gossip_members",
			Help: "Controllers of the WAN pool known to this one, by state (alive, suspect, dead), itself excluded.",
		}, []string{"state"}),
		sentBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_gossip_summary_sent_bytes_total",
			Help: "Bytes of this region's summary sent to other controllers (pull answers and push/pull state).",
		}),
		receivedBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_gossip_summary_received_bytes_total",
			Help: "Bytes of summary bodies received, accepted or not.",
		}),
		accepted: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_gossip_summaries_accepted_total",
			Help: "Remote region summaries accepted (newer than the one held).",
		}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_gossip_summaries_rejected_total",
			Help: "Summary bodies rejected, by reason (oversize, truncated, magic, version, checksum, field, malformed, stale, older_generation).",
		}, []string{"reason"}),
		pulls: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_gossip_summary_pulls_total",
			Help: "Requests sent for a newer remote summary.",
		}),
		replicaMsgs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_gossip_replica_messages_total",
			Help: "Replica state messages between the controllers of this region, by outcome (sent, received, malformed, unknown_sender).",
		}, []string{"outcome"}),
		sightingMsgs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_gossip_sighting_messages_total",
			Help: "Messages of the controllers' sightings of the other regions' pods (the automatic failover's evidence from a quorum of regions), by outcome (sent, received, malformed, unknown_sender).",
		}, []string{"outcome"}),
		coordsRejected: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_gossip_coordinates_rejected_total",
			Help: "Peer Vivaldi coordinates rejected (malformed, wrong dimensionality, non-finite).",
		}),
		digestRejected: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_gossip_digests_rejected_total",
			Help: "Node-meta digests that could not be decoded.",
		}),
		summaryAge: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_gossip_summary_age_seconds",
			Help: "Age of the summary held for each remote region: the sender's reported age when it sent it plus the time since it arrived (no remote wall clock is read).",
		}, []string{"region"}),
		isolated: f.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_gossip_isolated",
			Help: "1 while no controller of another region is alive for this one: no cross-region work can be done, and it rejoins through every address it knows.",
		}),
		rejoins: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_gossip_rejoins_total",
			Help: "Attempts to rejoin the pool while isolated from every other region.",
		}),
		skew: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_gossip_clock_skew_seconds",
			Help: "How far each remote region's controllers' wall clocks are ahead of this controller's (median; negative: behind), measured from their summaries' age messages.",
		}, []string{"region"}),
		rtt: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_gossip_rtt_seconds",
			Help: "RTT to each remote region as used for decisions (median over its live controllers, or static).",
		}, []string{"region"}),
		regionLive: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_gossip_region_live",
			Help: "1 when a remote region has at least one alive, reachable controller.",
		}, []string{"region"}),
		keyOps: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_gossip_key_operations_total",
			Help: "Keyring operations applied on this controller (started here or sent by another), by op (list, install, use, remove) and result (ok, error).",
		}, []string{"op", "result"}),
	}
	// The rejection reasons are exported at 0 from the start, so the first
	// rejected summary is a rate an alert sees.
	for _, reason := range []string{"oversize", "truncated", "magic", "version", "checksum", "field", "malformed"} {
		m.rejected.WithLabelValues(reason)
	}
	for _, outcome := range []string{"sent", "received", "malformed", "unknown_sender"} {
		m.sightingMsgs.WithLabelValues(outcome)
	}
	return m
}
