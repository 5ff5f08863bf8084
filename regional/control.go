package regional

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/residency"
)

// ControlPlane is what the request path reads of the global tier: the
// residency policy in force (with the version decisions record) and the
// state of every region. Implementations answer from local immutable
// snapshots and never wait on the network: when the Raft tier has lost its
// quorum they keep answering with the last committed state.
type ControlPlane interface {
	// View is the state one request is decided on: read once per request,
	// so its policy and its region states come from the same commit.
	View() ControlView
}

// ControlView is one immutable reading of a ControlPlane. Taking and using
// it does not allocate.
type ControlView struct {
	// Policy is the policy to evaluate and Version the version decisions
	// record. Err set means no usable policy: the request path fails closed.
	Policy  *residency.Policy
	Version string
	Err     error
	state   *global.State     // committed region states (GlobalControl)
	failed  map[string]string // regions marked unroutable (StaticControl)
}

// Routable reports whether a region may take traffic (active, or
// recovering once its hold-down has passed; not failed or draining).
func (v ControlView) Routable(region string) bool {
	if v.state != nil {
		return v.state.Routable(region)
	}
	_, bad := v.failed[region]
	return !bad
}

// LastResort reports whether a region that is not routable may still serve
// traffic that no routable region may serve: a region recovering from an
// automatic failover (its pods are healthy again; the hold-down only keeps
// traffic that has a choice away from it). A failed or draining region may
// not.
func (v ControlView) LastResort(region string) bool {
	return v.state != nil && v.state.RegionState(region) == global.RegionRecovering
}

// RegionState names a region's state for explanations.
func (v ControlView) RegionState(region string) string {
	if v.state != nil {
		return v.state.RegionState(region).String()
	}
	if s, bad := v.failed[region]; bad {
		return s
	}
	return "active"
}

// ErrNoPolicy means the control plane has no usable residency policy.
var ErrNoPolicy = errors.New("no usable residency policy")

// StaticControl is the control plane of a controller without a Raft tier: a
// fixed policy (from a file, or the shipped default: stay in the origin
// zone) and every region routable unless marked otherwise.
type StaticControl struct {
	policy atomic.Pointer[staticPolicy]
	failed atomic.Pointer[map[string]string]
}

// staticPolicy is the policy a StaticControl serves, with its version.
type staticPolicy struct {
	policy  *residency.Policy
	version string
}

// NewStaticControl serves policy (nil: the shipped default policy).
func NewStaticControl(policy *residency.Policy) (*StaticControl, error) {
	c := &StaticControl{}
	if err := c.SetPolicy(policy); err != nil {
		return nil, err
	}
	empty := map[string]string{}
	c.failed.Store(&empty)
	return c, nil
}

// SetPolicy replaces the policy served (nil: the shipped default). The
// requests decided from then on record its version, "static/<policy id>".
func (c *StaticControl) SetPolicy(policy *residency.Policy) error {
	if policy == nil {
		var err error
		if policy, err = residency.DefaultPolicy(); err != nil {
			return fmt.Errorf("default residency policy: %w", err)
		}
	}
	c.policy.Store(&staticPolicy{policy: policy, version: "static/" + policy.ID()})
	return nil
}

// View implements ControlPlane.
func (c *StaticControl) View() ControlView {
	p := c.policy.Load()
	return ControlView{Policy: p.policy, Version: p.version, failed: *c.failed.Load()}
}

// SetState marks a region failed or draining ("" or "active" clears it);
// for tests and single-region tooling.
func (c *StaticControl) SetState(region, state string) {
	m := map[string]string{}
	for k, v := range *c.failed.Load() {
		m[k] = v
	}
	if state == "" || state == "active" {
		delete(m, region)
	} else {
		m[region] = state
	}
	c.failed.Store(&m)
}

// GlobalControl reads the Raft tier's committed state. Until a policy has
// been applied through Raft it uses a fallback (the shipped default, or the
// controller's bootstrap policy file).
type GlobalControl struct {
	node            *global.Node
	fallback        *residency.Policy
	fallbackVersion string // "default/<id>"
}

// NewGlobalControl reads node's state; fallback nil means the shipped default.
func NewGlobalControl(node *global.Node, fallback *residency.Policy) (*GlobalControl, error) {
	if fallback == nil {
		var err error
		if fallback, err = residency.DefaultPolicy(); err != nil {
			return nil, err
		}
	}
	return &GlobalControl{node: node, fallback: fallback, fallbackVersion: "default/" + fallback.ID()}, nil
}

// View implements ControlPlane: the compiled active policy, versioned as
// "v<version>@<raft index>/<policy id>" (global.State.PolicyVersionString),
// and the region states of the same committed state.
func (c *GlobalControl) View() ControlView {
	st := c.node.State()
	v := ControlView{state: st}
	pv, ok := st.Policy()
	if !ok {
		v.Policy, v.Version = c.fallback, c.fallbackVersion
		return v
	}
	compiled, err := st.CompiledPolicy()
	if err != nil {
		v.Err = fmt.Errorf("%w: policy %s does not compile: %v", ErrNoPolicy, pv.Ref(), err)
		return v
	}
	p, ok := compiled.(*residency.Policy)
	if !ok || p == nil {
		v.Err = fmt.Errorf("%w: policy %s has no compiled form", ErrNoPolicy, pv.Ref())
		return v
	}
	v.Policy, v.Version = p, st.PolicyVersionString()
	return v
}

// PolicyValidator and PolicyCompiler wire the residency package into the
// Raft tier (global.Config): a policy is validated before it is proposed and
// compiled once per committed version.
func PolicyValidator(name string, doc []byte) (string, error) {
	p, err := residency.Parse(name, doc)
	if err != nil {
		return "", err
	}
	return p.ID(), nil
}

// PolicyCompiler compiles a committed policy document.
func PolicyCompiler(doc []byte) (any, error) { return residency.Parse("policy.yaml", doc) }

// PolicyStranded wires residency.Policy.Stranded into the Raft tier
// (global.Config.Stranded): the traffic a compiled policy would leave with
// no region to go to, as text for the operator.
func PolicyStranded(compiled any, down func(region string) bool) []string {
	p, ok := compiled.(*residency.Policy)
	if !ok || p == nil {
		return nil
	}
	var out []string
	for _, s := range p.Stranded(down) {
		out = append(out, s.String())
	}
	return out
}
