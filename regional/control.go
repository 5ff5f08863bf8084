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
	// Policy returns the policy to evaluate and its version. An error means
	// no usable policy: the request path fails closed.
	Policy() (*residency.Policy, string, error)
	// Routable reports whether a region may take traffic (active, or
	// recovering once its hold-down has passed; not failed or draining).
	Routable(region string) bool
	// RegionState names a region's state for explanations.
	RegionState(region string) string
}

// ErrNoPolicy means the control plane has no usable residency policy.
var ErrNoPolicy = errors.New("no usable residency policy")

// StaticControl is the control plane of a controller without a Raft tier: a
// fixed policy (from a file, or the shipped default: stay in the origin
// zone) and every region routable unless marked otherwise.
type StaticControl struct {
	policy  *residency.Policy
	version string
	failed  atomic.Pointer[map[string]string]
}

// NewStaticControl serves policy (nil: the shipped default policy).
func NewStaticControl(policy *residency.Policy) (*StaticControl, error) {
	if policy == nil {
		var err error
		if policy, err = residency.DefaultPolicy(); err != nil {
			return nil, fmt.Errorf("default residency policy: %w", err)
		}
	}
	c := &StaticControl{policy: policy, version: "static/" + policy.ID()}
	empty := map[string]string{}
	c.failed.Store(&empty)
	return c, nil
}

// Policy implements ControlPlane.
func (c *StaticControl) Policy() (*residency.Policy, string, error) { return c.policy, c.version, nil }

// Routable implements ControlPlane.
func (c *StaticControl) Routable(region string) bool {
	_, bad := (*c.failed.Load())[region]
	return !bad
}

// RegionState implements ControlPlane.
func (c *StaticControl) RegionState(region string) string {
	if s, bad := (*c.failed.Load())[region]; bad {
		return s
	}
	return "active"
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
	node     *global.Node
	fallback *residency.Policy
}

// NewGlobalControl reads node's state; fallback nil means the shipped default.
func NewGlobalControl(node *global.Node, fallback *residency.Policy) (*GlobalControl, error) {
	if fallback == nil {
		var err error
		if fallback, err = residency.DefaultPolicy(); err != nil {
			return nil, err
		}
	}
	return &GlobalControl{node: node, fallback: fallback}, nil
}

// Policy implements ControlPlane: the compiled active policy, versioned as
// "v<version>@<raft index>/<policy id>".
func (c *GlobalControl) Policy() (*residency.Policy, string, error) {
	st := c.node.State()
	pv, ok := st.Policy()
	if !ok {
		return c.fallback, "default/" + c.fallback.ID(), nil
	}
	compiled, err := st.CompiledPolicy()
	if err != nil {
		return nil, "", fmt.Errorf("%w: policy %s does not compile: %v", ErrNoPolicy, pv.Ref(), err)
	}
	p, ok := compiled.(*residency.Policy)
	if !ok || p == nil {
		return nil, "", fmt.Errorf("%w: policy %s has no compiled form", ErrNoPolicy, pv.Ref())
	}
	return p, pv.Ref() + "/" + p.ID(), nil
}

// Routable implements ControlPlane.
func (c *GlobalControl) Routable(region string) bool { return c.node.State().Routable(region) }

// RegionState implements ControlPlane.
func (c *GlobalControl) RegionState(region string) string {
	return c.node.State().RegionState(region).String()
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
