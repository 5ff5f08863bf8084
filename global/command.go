package global

import (
	"encoding/json"
	"fmt"
	"time"
)

// commandVersion is the version of the command encoding written to the Raft
// log (see doc.go). A replica rejects (deterministically, without changing
// state) a command of a version it does not know.
const commandVersion = 1

// Limits on command fields, checked before proposing and again when applying.
const (
	// MaxPolicySize is the largest policy document accepted (Raft entries
	// should stay well under 512 KiB).
	MaxPolicySize   = 256 << 10
	maxReasonLen    = 1024
	maxNameLen      = 256
	maxRequestIDLen = 128
	maxTargets      = 32
)

type op string

const (
	opPolicyApply  op = "policy.apply"
	opRegionSet    op = "region.set"
	opTargetsSet   op = "region.targets"
	opCheckpoint   op = "audit.checkpoint"
	opMemberUpsert op = "member.upsert"
	opMemberRemove op = "member.remove"
)

// command is one entry of the Raft log. Everything the state machine needs is
// in it, including the time (stamped by the controller that accepted the
// request), so applying it is deterministic.
type command struct {
	V          int         `json:"v"`
	Op         op          `json:"op"`
	RequestID  string      `json:"rid"`
	At         int64       `json:"at"` // unix nanoseconds
	Actor      string      `json:"actor,omitempty"`
	Policy     *policyCmd  `json:"policy,omitempty"`
	Region     *regionCmd  `json:"region,omitempty"`
	Targets    *targetsCmd `json:"targets,omitempty"`
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	Member     *Member     `json:"member,omitempty"`
}

type policyCmd struct {
	Name     string `json:"name,omitempty"`
	Declared string `json:"declared,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Document []byte `json:"document"`
	// UnlessActive: a document identical to the active policy adds no
	// version. Every apply sets it; entries written before it existed
	// replay as they were applied (each one a version).
	UnlessActive bool `json:"unless_active,omitempty"`
}

type regionCmd struct {
	Region    string       `json:"region"`
	State     RegionState  `json:"state"`
	Reason    string       `json:"reason,omitempty"`
	Automatic bool         `json:"automatic,omitempty"`
	Expect    *RegionState `json:"expect,omitempty"`
	// Force allows a region the cluster does not know yet.
	Force bool `json:"force,omitempty"`
}

type targetsCmd struct {
	Region  string   `json:"region"`
	Targets []string `json:"targets"`
}

func (c *command) at() time.Time { return time.Unix(0, c.At).UTC() }

func encodeCommand(c *command) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode command: %w", err)
	}
	return b, nil
}

func decodeCommand(b []byte) (*command, error) {
	var c command
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("decode command: %w", err)
	}
	return &c, nil
}

// validate checks a command's shape. It is pure (no clock, no node-local
// configuration), so the state machine may call it on apply and every replica
// reaches the same verdict.
func (c *command) validate() *RejectedError {
	if c.V != commandVersion {
		return rejectf(CodeInvalid, "command version %d is not supported (this controller knows version %d)", c.V, commandVersion)
	}
	if c.RequestID == "" || len(c.RequestID) > maxRequestIDLen || !printable(c.RequestID) {
		return rejectf(CodeInvalid, "request id %q must be 1-%d printable characters", c.RequestID, maxRequestIDLen)
	}
	if c.At <= 0 {
		return rejectf(CodeInvalid, "command time must be set")
	}
	if len(c.Actor) > maxNameLen || !printable(c.Actor) {
		return rejectf(CodeInvalid, "actor %q must be at most %d printable characters", c.Actor, maxNameLen)
	}
	bodies := 0
	for _, set := range []bool{c.Policy != nil, c.Region != nil, c.Targets != nil, c.Checkpoint != nil, c.Member != nil} {
		if set {
			bodies++
		}
	}
	if bodies != 1 {
		return rejectf(CodeInvalid, "command %q must carry exactly one body, has %d", c.Op, bodies)
	}
	switch c.Op {
	case opPolicyApply:
		if c.Policy == nil {
			return rejectf(CodeInvalid, "policy.apply without a policy")
		}
		return c.Policy.validate()
	case opRegionSet:
		if c.Region == nil {
			return rejectf(CodeInvalid, "region.set without a region")
		}
		return c.Region.validate()
	case opTargetsSet:
		if c.Targets == nil {
			return rejectf(CodeInvalid, "region.targets without targets")
		}
		return c.Targets.validate()
	case opCheckpoint:
		if c.Checkpoint == nil {
			return rejectf(CodeInvalid, "audit.checkpoint without a checkpoint")
		}
		return validateCheckpoint(c.Checkpoint)
	case opMemberUpsert, opMemberRemove:
		if c.Member == nil {
			return rejectf(CodeInvalid, "%s without a member", c.Op)
		}
		return validateMember(c.Member, c.Op == opMemberUpsert)
	}
	return rejectf(CodeInvalid, "unknown command %q", c.Op)
}

func (p *policyCmd) validate() *RejectedError {
	if len(p.Document) == 0 {
		return rejectf(CodeInvalid, "policy document %q is empty", p.Name)
	}
	if len(p.Document) > MaxPolicySize {
		return rejectf(CodeInvalid, "policy document %q is %d bytes, more than the limit of %d", p.Name, len(p.Document), MaxPolicySize)
	}
	if len(p.Name) > maxNameLen || !printable(p.Name) {
		return rejectf(CodeInvalid, "policy name %q must be at most %d printable characters", p.Name, maxNameLen)
	}
	if len(p.Declared) > maxNameLen || !printable(p.Declared) {
		return rejectf(CodeInvalid, "declared policy version %q must be at most %d printable characters", p.Declared, maxNameLen)
	}
	if len(p.Reason) > maxReasonLen {
		return rejectf(CodeInvalid, "reason is %d bytes, more than %d", len(p.Reason), maxReasonLen)
	}
	return nil
}

func (r *regionCmd) validate() *RejectedError {
	if err := validRegion(r.Region); err != nil {
		return err
	}
	if !r.State.Valid() {
		return rejectf(CodeInvalid, "invalid region state %d", r.State)
	}
	if r.Expect != nil && !r.Expect.Valid() {
		return rejectf(CodeInvalid, "invalid expected region state %d", *r.Expect)
	}
	if len(r.Reason) > maxReasonLen {
		return rejectf(CodeInvalid, "reason is %d bytes, more than %d", len(r.Reason), maxReasonLen)
	}
	return nil
}

func (t *targetsCmd) validate() *RejectedError {
	if err := validRegion(t.Region); err != nil {
		return err
	}
	if len(t.Targets) > maxTargets {
		return rejectf(CodeInvalid, "region %q has %d failover targets, more than %d", t.Region, len(t.Targets), maxTargets)
	}
	seen := map[string]bool{}
	for _, x := range t.Targets {
		if err := validRegion(x); err != nil {
			return err
		}
		if x == t.Region {
			return rejectf(CodeInvalid, "region %q cannot be its own failover target", t.Region)
		}
		if seen[x] {
			return rejectf(CodeInvalid, "failover target %q is listed twice for region %q", x, t.Region)
		}
		seen[x] = true
	}
	return nil
}

func validateCheckpoint(cp *Checkpoint) *RejectedError {
	if err := validID("controller id", cp.ControllerID); err != nil {
		return err
	}
	if len(cp.Segment) == 0 || len(cp.Segment) > maxNameLen || !printable(cp.Segment) {
		return rejectf(CodeInvalid, "checkpoint segment %q must be 1-%d printable characters", cp.Segment, maxNameLen)
	}
	if len(cp.HeadHash) == 0 || len(cp.HeadHash) > maxNameLen || !printable(cp.HeadHash) {
		return rejectf(CodeInvalid, "checkpoint head hash %q must be 1-%d printable characters", cp.HeadHash, maxNameLen)
	}
	if cp.Time.IsZero() {
		return rejectf(CodeInvalid, "checkpoint of %q has no time", cp.ControllerID)
	}
	if cp.Index != 0 {
		return rejectf(CodeInvalid, "checkpoint index is assigned by the cluster, got %d", cp.Index)
	}
	return nil
}

func validateMember(m *Member, full bool) *RejectedError {
	if err := validID("member id", m.ID); err != nil {
		return err
	}
	if !full {
		return nil
	}
	if err := validRegion(m.Region); err != nil {
		return err
	}
	if m.RaftAddr == "" || len(m.RaftAddr) > maxNameLen || !printable(m.RaftAddr) {
		return rejectf(CodeInvalid, "member %q raft address %q is invalid", m.ID, m.RaftAddr)
	}
	if m.AdminAddr == "" || len(m.AdminAddr) > maxNameLen || !printable(m.AdminAddr) {
		return rejectf(CodeInvalid, "member %q admin address %q is invalid", m.ID, m.AdminAddr)
	}
	return nil
}

// validRegion accepts lowercase DNS-label-like names: a-z, 0-9 and '-', 1-63
// characters, not starting or ending with '-'.
func validRegion(r string) *RejectedError {
	if len(r) == 0 || len(r) > 63 || r[0] == '-' || r[len(r)-1] == '-' {
		return rejectf(CodeInvalid, "region name %q must be 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'", r)
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return rejectf(CodeInvalid, "region name %q must be 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'", r)
		}
	}
	return nil
}

func validID(what, id string) *RejectedError {
	if len(id) == 0 || len(id) > maxNameLen {
		return rejectf(CodeInvalid, "%s %q must be 1-%d characters", what, id, maxNameLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return rejectf(CodeInvalid, "%s %q may only hold letters, digits and - _ . :", what, id)
		}
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}
