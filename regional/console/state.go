package console

import "time"

// Point is one sample of the time series: what happened in the interval
// that ended at At. A figure with nothing to measure in the interval (no
// answer reported usage, no first byte) is null, drawn as a gap.
type Point struct {
	At         time.Time `json:"t"`
	ReqPerS    float64   `json:"req_per_s"`    // answers of the traffic routes
	ErrPerS    float64   `json:"err_per_s"`    // of which 5xx or truncated
	CrossPerS  float64   `json:"cross_per_s"`  // requests sent to another region
	DeniedPerS float64   `json:"denied_per_s"` // residency denials (451)
	HitRate    *float64  `json:"hit_rate"`     // cached / prompt tokens the engines reported, 0..1
	TTFTP50Ms  *float64  `json:"ttft_p50_ms"`  // from the TTFT histogram's buckets
	TTFTP95Ms  *float64  `json:"ttft_p95_ms"`
}

// Pod is one pod of this region as this controller sees it. The
// controller fills what it knows now; the console adds the last minute's
// rate and TTFT.
type Pod struct {
	Name           string  `json:"name"`
	Hardware       string  `json:"hardware"`
	Model          string  `json:"model"`
	State          string  `json:"state"` // serving, ejected, lapsed, no endpoint
	InFlight       int64   `json:"in_flight"`
	PendingPrefill int64   `json:"pending_prefill_tokens"`
	KVUtil         float64 `json:"kv_util"`
	Routed         int64   `json:"routed"`
	EngineWaiting  int64   `json:"engine_waiting"` // -1: unknown
	// Over the last minute, from the TTFT histogram of the pod.
	ReqPerS   float64  `json:"req_per_s"`
	TTFTP50Ms *float64 `json:"ttft_p50_ms"`
	TTFTP95Ms *float64 `json:"ttft_p95_ms"`
}

// Region is one region: this controller's own, and each one gossip or
// the Raft state knows.
type Region struct {
	Name  string `json:"name"`
	Local bool   `json:"local"`
	// State is the region's committed state (active, failed, draining,
	// recovering); "" without the Raft tier.
	State    string `json:"state"`
	Routable bool   `json:"routable"`
	// From gossip (remote regions): liveness of its controllers, the RTT
	// decisions use and the age of its summary.
	Live        bool     `json:"live"`
	Alive       int      `json:"alive"`
	Suspect     int      `json:"suspect"`
	Dead        int      `json:"dead"`
	RTTMs       float64  `json:"rtt_ms"`
	RTTSource   string   `json:"rtt_source,omitempty"`
	SummaryAgeS *float64 `json:"summary_age_s"`
	Pods        int      `json:"pods"`
	Controllers []string `json:"controllers,omitempty"`
	// Filled by the console from the counters since start.
	CrossedTo     float64 `json:"crossed_to"`     // requests this controller sent there
	ForwardedFrom float64 `json:"forwarded_from"` // requests it forwarded here
}

// Member is one controller of the Raft group.
type Member struct {
	ID       string `json:"id"`
	Region   string `json:"region"`
	Voter    bool   `json:"voter"`
	Liveness string `json:"liveness,omitempty"` // alive, suspect, dead, unknown
}

// Raft is this controller's view of the Raft group.
type Raft struct {
	State         string   `json:"state"` // Leader, Follower, Candidate, Shutdown
	Leader        string   `json:"leader"`
	Term          uint64   `json:"term"`
	AppliedIndex  uint64   `json:"applied_index"`
	CommitIndex   uint64   `json:"commit_index"`
	LastContactMs float64  `json:"last_contact_ms"` // 0 on the leader, -1 never
	Stale         bool     `json:"stale"`           // no leader heard within the limit: writes fail, routing keeps the last state
	Members       []Member `json:"members"`
}

// Gossip is this controller's view of the gossip pool.
type Gossip struct {
	Isolated bool `json:"isolated"` // no other region reachable
	Alive    int  `json:"alive"`    // controllers of other regions
	Suspect  int  `json:"suspect"`
	Dead     int  `json:"dead"`
	// Replicas are this region's other controllers whose load reports
	// this one counts, with the age of their last report.
	Replicas []Replica `json:"replicas,omitempty"`
}

// Replica is another controller of this region.
type Replica struct {
	ID         string  `json:"id"`
	ReportAgeS float64 `json:"report_age_s"`
	InFlight   int64   `json:"in_flight"`
}

// Live is what the controller knows now, read at each request for the
// state (cheap: snapshots the request path reads too).
type Live struct {
	Ready         bool     `json:"ready"`
	PolicyVersion string   `json:"policy_version"`
	Pods          []Pod    `json:"pods"`
	Regions       []Region `json:"regions"`
	Raft          *Raft    `json:"raft"`   // nil without the Raft tier
	Gossip        *Gossip  `json:"gossip"` // nil without gossip
}

// Decision is a cross-region decision or a residency denial this
// controller recorded in its audit log.
type Decision struct {
	Time          time.Time `json:"time"`
	Kind          string    `json:"kind"` // cross_region, fallback, forwarded_in, residency_denied
	Origin        string    `json:"origin"`
	Region        string    `json:"region,omitempty"`
	Pod           string    `json:"pod,omitempty"`
	DataClass     string    `json:"data_class,omitempty"`
	Rule          string    `json:"rule,omitempty"`
	PolicyVersion string    `json:"policy_version"`
	DecisionID    string    `json:"decision_id"`
	Reason        string    `json:"reason,omitempty"`    // the placement's reason, for crossings
	MarginMs      float64   `json:"margin_ms,omitempty"` // how much the chosen region beat the next
}

// Failover is a change of a region's committed state.
type Failover struct {
	Time      time.Time `json:"time"` // when the change was accepted
	Region    string    `json:"region"`
	From      string    `json:"from,omitempty"` // "" for a change older than this controller's start
	To        string    `json:"to"`
	Actor     string    `json:"actor,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Automatic bool      `json:"automatic,omitempty"`
	Index     uint64    `json:"index"` // Raft index
}

// Residency is the compliance picture since this controller started.
type Residency struct {
	PolicyVersion string `json:"policy_version"`
	// CrossingsByRule counts the requests this controller sent to another
	// region (cross_region and fallback records), by the rule that allowed
	// them; ForwardedInByRule those it accepted from another region.
	CrossingsByRule   map[string]int64 `json:"crossings_by_rule"`
	ForwardedInByRule map[string]int64 `json:"forwarded_in_by_rule"`
	// DenialsByRule counts 451 residency_denied answers, by rule.
	DenialsByRule map[string]float64 `json:"denials_by_rule"`
	// NoHealthyRegion counts 503s: no region the policy allows could serve.
	NoHealthyRegion float64 `json:"no_healthy_region"`
	// A violation (a request served in a region its rule forbids) is
	// what the controller refuses rather than serves: each request is
	// evaluated here, and one forwarded in is evaluated again. What it can
	// count are the attempts it caught: RefusedAtRecheck, requests another
	// region's controller sent here that this region's evaluation forbids
	// (a policy version skew, or a bug), and HopsRefused, forwarded
	// requests refused before evaluation (not a member, bad certificate).
	RefusedAtRecheck int64   `json:"refused_at_recheck"`
	HopsRefused      float64 `json:"hops_refused"`
	// AuditFailures counts records that could not be written (a decision
	// not on record does not cross).
	AuditFailures float64 `json:"audit_failures"`
}

// Totals are since the controller started.
type Totals struct {
	Requests    float64  `json:"requests"`
	Errors      float64  `json:"errors"`
	CrossRegion float64  `json:"cross_region"`
	ForwardedIn float64  `json:"forwarded_in"`
	Denied      float64  `json:"denied"`
	HitRate     *float64 `json:"hit_rate"`
}

// State is everything the console shows: GET /ui/api/state.
type State struct {
	Controller string     `json:"controller"`
	Region     string     `json:"region"`
	Now        time.Time  `json:"now"`
	IntervalS  float64    `json:"interval_s"`
	WindowS    float64    `json:"window_s"`
	Series     []Point    `json:"series"` // oldest first
	Totals     Totals     `json:"totals"`
	Residency  Residency  `json:"residency"`
	Decisions  []Decision `json:"decisions"` // newest first
	Failovers  []Failover `json:"failovers"` // newest first
	Live
}
