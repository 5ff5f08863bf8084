package global

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/meridian-llm/meridian/global/audit"
)

// RegionState is the replicated state of one region. The zero value is
// RegionActive: a region with no recorded state is active.
type RegionState uint8

// The region states. Only RegionActive is routable; see State.Routable.
const (
	// RegionActive serves traffic.
	RegionActive RegionState = iota
	// RegionDraining takes no new traffic; requests in flight finish.
	RegionDraining
	// RegionFailed takes no traffic; its own controller (if alive) forwards
	// what it receives to allowed healthy regions.
	RegionFailed
	// RegionRecovering is healthy again and waits out the hold-down of
	// automatic recovery; it takes no traffic yet.
	RegionRecovering
)

var regionStateNames = [...]string{"active", "draining", "failed", "recovering"}

// String returns the lowercase name of the state.
func (s RegionState) String() string {
	if int(s) < len(regionStateNames) {
		return regionStateNames[s]
	}
	return fmt.Sprintf("RegionState(%d)", uint8(s))
}

// Valid reports whether s is one of the four states.
func (s RegionState) Valid() bool { return int(s) < len(regionStateNames) }

// ParseRegionState parses "active", "draining", "failed" or "recovering".
func ParseRegionState(s string) (RegionState, error) {
	for i, n := range regionStateNames {
		if n == s {
			return RegionState(i), nil
		}
	}
	return 0, fmt.Errorf("unknown region state %q (want active, draining, failed or recovering)", s)
}

// MarshalText encodes the state by name.
func (s RegionState) MarshalText() ([]byte, error) {
	if !s.Valid() {
		return nil, fmt.Errorf("invalid region state %d", uint8(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText decodes a state name.
func (s *RegionState) UnmarshalText(b []byte) error {
	v, err := ParseRegionState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// RegionStatus is the committed state of one region with who changed it, when
// and why.
type RegionStatus struct {
	Region string      `json:"region"`
	State  RegionState `json:"state"`
	// Since is the time the change was accepted (stamped by the controller
	// that accepted the request, never by the state machine).
	Since time.Time `json:"since"`
	// Actor is who asked for the change ("operator:alice", "auto:<node id>").
	Actor  string `json:"actor,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Automatic is true when the automatic failover decided the change; only
	// automatic failures are recovered automatically.
	Automatic bool `json:"automatic,omitempty"`
	// Index is the Raft index of the change.
	Index uint64 `json:"index"`
}

// PolicyVersion is one applied residency policy. Version numbers increase by
// one per apply; Index is the Raft index of the apply, so "v<Version>@<Index>"
// (Ref) names a policy across the cluster.
type PolicyVersion struct {
	Version uint64 `json:"version"`
	Index   uint64 `json:"index"`
	// Name is the file name the operator applied (for messages only).
	Name string `json:"name,omitempty"`
	// Declared is the version string the policy validator read from the
	// document itself.
	Declared  string    `json:"declared,omitempty"`
	SHA256    string    `json:"sha256"`
	Size      int       `json:"size"`
	AppliedAt time.Time `json:"applied_at"`
	Actor     string    `json:"actor,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	RequestID string    `json:"request_id,omitempty"`
	// Document is the policy file as applied. History entries older than the
	// latest PolicyDocsKept versions keep their metadata only.
	Document []byte `json:"document,omitempty"`
}

// Ref names the version as "v<Version>@<Index>", the form recorded by every
// routing decision.
func (p PolicyVersion) Ref() string { return fmt.Sprintf("v%d@%d", p.Version, p.Index) }

// Checkpoint is one audit chain head anchored in Raft. The global tier treats
// it as an opaque record apart from the ordering of Sequence per controller.
type Checkpoint struct {
	ControllerID string    `json:"controller_id"`
	Segment      string    `json:"segment"`
	Sequence     uint64    `json:"sequence"`
	HeadHash     string    `json:"head_hash"`
	Count        uint64    `json:"count"`
	Time         time.Time `json:"time"`
	// Index is the Raft index that committed the checkpoint.
	Index uint64 `json:"index"`
}

// AuditCheckpoint returns c in the audit package's form, what audit.Verify
// checks a chain against.
func (c Checkpoint) AuditCheckpoint() audit.Checkpoint {
	return audit.Checkpoint{Controller: c.ControllerID, Segment: c.Segment, LastSeq: c.Sequence,
		Head: c.HeadHash, Count: c.Count, Time: c.Time}
}

// CheckpointFromAudit returns an audit log's checkpoint in the form
// AppendCheckpoint anchors (Index is set when it commits).
func CheckpointFromAudit(cp audit.Checkpoint) Checkpoint {
	return Checkpoint{ControllerID: cp.Controller, Segment: cp.Segment, Sequence: cp.LastSeq,
		HeadHash: cp.Head, Count: cp.Count, Time: cp.Time}
}

// Member is a controller known to the global tier.
type Member struct {
	ID        string    `json:"id"`
	Region    string    `json:"region"`
	RaftAddr  string    `json:"raft_addr"`
	AdminAddr string    `json:"admin_addr"`
	Since     time.Time `json:"since"`
	Index     uint64    `json:"index"`
}

// sameAddrs reports whether m and o have the same region and addresses (an
// upsert of such a record changes nothing).
func (m Member) sameAddrs(o Member) bool {
	return m.Region == o.Region && m.RaftAddr == o.RaftAddr && m.AdminAddr == o.AdminAddr
}

// Retention limits of the state machine. They are constants, not
// configuration: every replica must prune identically or their states diverge.
const (
	// PolicyHistoryKept is the number of policy versions whose metadata is kept.
	PolicyHistoryKept = 256
	// PolicyDocsKept is the number of latest policy versions whose documents
	// are kept.
	PolicyDocsKept = 16
	// CheckpointsKept is the number of latest audit checkpoints kept per
	// controller.
	CheckpointsKept = 64
	// DedupWindow is the number of latest request ids remembered for
	// idempotency; a retry older than that is applied again.
	DedupWindow = 8192
)

// State is an immutable snapshot of the replicated state. A new State is
// built by every state-changing command and swapped in atomically; readers
// keep whatever pointer they loaded. Never modify a State or anything it
// returns by reference.
type State struct {
	index       uint64
	history     []PolicyVersion // oldest first; the last one is active
	regions     map[string]RegionStatus
	targets     map[string][]string
	checkpoints map[string][]Checkpoint
	members     map[string]Member

	// node-local, derived from the active policy document by the injected
	// compiler; not part of the replicated state.
	compiled   any
	compileErr error
	// policyVersion is PolicyVersionString, computed with compiled.
	policyVersion string
}

func emptyState() *State {
	return &State{
		regions:     map[string]RegionStatus{},
		targets:     map[string][]string{},
		checkpoints: map[string][]Checkpoint{},
		members:     map[string]Member{},
	}
}

// Index is the Raft index of the last command that changed the state (0 for
// the empty state).
func (s *State) Index() uint64 { return s.index }

// RegionState returns the state of region; a region with no recorded state
// is RegionActive. It does not allocate.
func (s *State) RegionState(region string) RegionState {
	return s.regions[region].State
}

// Routable reports whether the router may send new traffic to region: only
// active regions (and regions with no recorded state) are routable. It does
// not allocate.
func (s *State) Routable(region string) bool {
	return s.regions[region].State == RegionActive
}

// RegionStatus returns the recorded status of region, if any.
func (s *State) RegionStatus(region string) (RegionStatus, bool) {
	st, ok := s.regions[region]
	return st, ok
}

// Regions returns the recorded region statuses sorted by name.
func (s *State) Regions() []RegionStatus {
	out := make([]RegionStatus, 0, len(s.regions))
	for _, r := range s.regions {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return out
}

// KnownRegions returns every region named by a member, a region status or a
// failover target list, sorted.
func (s *State) KnownRegions() []string {
	set := map[string]bool{}
	for _, m := range s.members {
		set[m.Region] = true
	}
	for r := range s.regions {
		set[r] = true
	}
	for r, ts := range s.targets {
		set[r] = true
		for _, t := range ts {
			set[t] = true
		}
	}
	out := make([]string, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}

func (s *State) knowsRegion(region string) bool {
	if _, ok := s.regions[region]; ok {
		return true
	}
	if _, ok := s.targets[region]; ok {
		return true
	}
	for _, m := range s.members {
		if m.Region == region {
			return true
		}
	}
	for _, ts := range s.targets {
		if slices.Contains(ts, region) {
			return true
		}
	}
	return false
}

// Targets returns the ordered failover targets of region (nil if none). The
// slice is shared: do not modify it.
func (s *State) Targets(region string) []string { return s.targets[region] }

// Policy returns the active policy version with its document.
func (s *State) Policy() (PolicyVersion, bool) {
	if len(s.history) == 0 {
		return PolicyVersion{}, false
	}
	return s.history[len(s.history)-1], true
}

// PolicyHistory returns the kept policy versions, oldest first, without their
// documents.
func (s *State) PolicyHistory() []PolicyVersion {
	out := make([]PolicyVersion, len(s.history))
	for i, p := range s.history {
		p.Document = nil
		out[i] = p
	}
	return out
}

// PolicyVersion returns the kept version v (its document is present if it is
// among the latest PolicyDocsKept versions).
func (s *State) PolicyVersion(v uint64) (PolicyVersion, bool) {
	for _, p := range s.history {
		if p.Version == v {
			return p, true
		}
	}
	return PolicyVersion{}, false
}

// PolicyVersionString names the active policy as routing decisions record
// it: "v<Version>@<Index>/<id>" (PolicyVersion.Ref, a slash, then the ID()
// of the compiled policy, when the PolicyCompiler's result has an ID()
// string method and compiled without error), else "v<Version>@<Index>";
// "" with no policy. It is computed once per applied or restored version, so
// reading it does not allocate.
func (s *State) PolicyVersionString() string { return s.policyVersion }

// CompiledPolicy returns what the injected policy compiler made of the active
// document on this node: (nil, nil) with no policy or no compiler, (nil, err)
// when the compiler rejected it. The router must fail closed on an error.
func (s *State) CompiledPolicy() (any, error) { return s.compiled, s.compileErr }

// Checkpoints returns the kept audit checkpoints of controller, oldest first.
// The slice is shared: do not modify it.
func (s *State) Checkpoints(controller string) []Checkpoint { return s.checkpoints[controller] }

// CheckpointControllers returns the controllers with checkpoints, sorted.
func (s *State) CheckpointControllers() []string {
	out := make([]string, 0, len(s.checkpoints))
	for c := range s.checkpoints {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// Members returns the known controllers sorted by id.
func (s *State) Members() []Member {
	out := make([]Member, 0, len(s.members))
	for _, m := range s.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Member returns the member with the given id.
func (s *State) Member(id string) (Member, bool) {
	m, ok := s.members[id]
	return m, ok
}

// clone returns a shallow copy to be modified by one command: maps are shared
// until the command replaces the one it changes.
func (s *State) clone() *State {
	c := *s
	return &c
}
