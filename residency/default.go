package residency

import _ "embed"

// defaultPolicy is the shipped policy, a copy of deploy/policies/default.yaml
// (a test keeps the two equal).
//
//go:embed default.yaml
var defaultPolicy []byte

// DefaultPolicyFile is the name DefaultPolicy's problems and decisions use.
const DefaultPolicyFile = "default.yaml"

// DefaultPolicyBytes returns a copy of the shipped policy file: regions
// us-east-1, us-west-2 (zone us) and eu-west-1 (zone eu), no rules, and the
// default "stay in the origin zone".
func DefaultPolicyBytes() []byte { return append([]byte(nil), defaultPolicy...) }

// DefaultPolicy parses the shipped policy.
func DefaultPolicy() (*Policy, error) { return Parse(DefaultPolicyFile, defaultPolicy) }
