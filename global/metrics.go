package global

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics of one node, registered on the injected Registerer.
type metrics struct {
	region            string // the node's own, exported in regionState from the start
	isLeader          prometheus.Gauge
	stale             prometheus.Gauge
	lastContact       prometheus.Gauge
	appliedIndex      prometheus.Gauge
	stateIndex        prometheus.Gauge
	policyVersion     prometheus.Gauge
	regionState       *prometheus.GaugeVec
	commands          *prometheus.CounterVec
	submits           *prometheus.HistogramVec
	forwarded         *prometheus.CounterVec
	leaderChanges     prometheus.Counter
	autoFailovers     *prometheus.CounterVec
	autoSteps         prometheus.Counter
	tlsRejected       prometheus.Counter
	membershipChanges *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, region string) *metrics {
	f := promauto.With(reg) // a nil reg registers nowhere
	m := &metrics{
		region: region,
		isLeader: f.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_global_is_leader",
			Help: "1 when this controller is the Raft leader of the global tier.",
		}),
		stale: f.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_global_stale",
			Help: "1 when this controller has no leader contact for longer than MaxStale: it serves its last committed state.",
		}),
		lastContact: f.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_global_last_contact_seconds",
			Help: "Seconds since this controller last heard from the Raft leader (0 on the leader).",
		}),
		appliedIndex: f.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_global_applied_index",
			Help: "Raft index applied to the local state machine.",
		}),
		stateIndex: f.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_global_state_index",
			Help: "Raft index of the last command that changed the replicated state.",
		}),
		policyVersion: f.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_global_policy_version",
			Help: "Version number of the active residency policy (0: none).",
		}),
		regionState: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_global_region_state",
			Help: "1 for the committed state of each recorded region.",
		}, []string{"region", "state"}),
		commands: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_global_commands_total",
			Help: "Commands applied to the local state machine by operation and outcome (changed, unchanged, duplicate, rejected).",
		}, []string{"op", "outcome"}),
		submits: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meridian_global_submit_duration_seconds",
			Help:    "Time for a write accepted by this controller to commit (including forwarding and leader changes).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"op"}),
		forwarded: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_global_forwarded_total",
			Help: "Requests forwarded to the leader by result (ok, error).",
		}, []string{"result"}),
		leaderChanges: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_global_leader_changes_total",
			Help: "Leader changes observed by this controller.",
		}),
		autoFailovers: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_global_auto_transitions_total",
			Help: "Region state changes committed by the automatic failover, by target state.",
		}, []string{"state"}),
		membershipChanges: f.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_global_membership_changes_total",
			Help: "Changes of the Raft configuration made by this controller while it led, by op (add, promote, demote, remove).",
		}, []string{"op"}),
		autoSteps: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_global_auto_failover_evaluations_total",
			Help: "Evaluations of the automatic failover by this controller while it leads (one per interval).",
		}),
		tlsRejected: f.NewCounter(prometheus.CounterOpts{
			Name: "meridian_global_raft_tls_rejected_total",
			Help: "Incoming Raft connections dropped because their TLS handshake failed (no certificate, another CA, expired, not TLS).",
		}),
	}
	// Series whose labels are known at start are exported at 0 from the
	// first scrape (a first increment is then a rate, not a new series).
	for _, o := range []op{opPolicyApply, opRegionSet, opTargetsSet, opCheckpoint, opMemberUpsert, opMemberRemove} {
		for _, outcome := range []string{"changed", "unchanged", "duplicate", "rejected"} {
			m.commands.WithLabelValues(string(o), outcome)
		}
		m.submits.WithLabelValues(string(o))
	}
	for _, result := range []string{"ok", "error"} {
		m.forwarded.WithLabelValues(result)
	}
	for _, state := range regionStateNames {
		m.autoFailovers.WithLabelValues(state)
	}
	return m
}

func (m *metrics) observeCommand(o op, res *Result, st *State) {
	outcome := "changed"
	switch {
	case res.Duplicate:
		outcome = "duplicate"
	case res.Err != nil:
		outcome = "rejected"
	case !res.Changed:
		outcome = "unchanged"
	}
	name := string(o)
	if name == "" {
		name = "undecodable"
	}
	m.commands.WithLabelValues(name, outcome).Inc()
	if res.Changed && !res.Duplicate {
		m.setState(st)
	}
}

// setState sets the gauges derived from the committed state: its index, the
// active policy version (0: none) and the state of every recorded region, of
// every member's region and of the node's own (active until one is recorded).
func (m *metrics) setState(st *State) {
	m.stateIndex.Set(float64(st.index))
	var version uint64
	if p, ok := st.Policy(); ok {
		version = p.Version
	}
	m.policyVersion.Set(float64(version))
	for region, rs := range st.regions {
		for i, name := range regionStateNames {
			m.regionState.WithLabelValues(region, name).Set(b2f(RegionState(i) == rs.State))
		}
	}
	unrecorded := []string{m.region}
	for _, mb := range st.members {
		unrecorded = append(unrecorded, mb.Region)
	}
	for _, region := range unrecorded {
		if _, ok := st.regions[region]; !ok && region != "" {
			for i, name := range regionStateNames {
				m.regionState.WithLabelValues(region, name).Set(b2f(RegionState(i) == RegionActive))
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
