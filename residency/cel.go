package residency

import (
	"bytes"
	"fmt"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/interpreter"
	yaml "go.yaml.in/yaml/v3"
)

// MaxConditionCost is the CEL cost budget of one condition: Parse rejects a
// condition whose estimated worst case exceeds it (with attribute sizes
// bounded as below), and Evaluate stops a condition that spends more and
// fails closed.
const MaxConditionCost = 10000

// Sizes the parse-time cost estimate assumes for condition variables.
const (
	maxLabels      = 64 // entries of Attributes.Labels
	maxCELExprSize = 4096
)

// celEnv is the CEL environment conditions compile in: one per Parse, built
// only when a rule has a condition.
type celEnv struct{ env *cel.Env }

func newCELEnv() (*celEnv, error) {
	env, err := cel.NewEnv(
		cel.Variable("tenant", cel.StringType),
		cel.Variable("data_class", cel.StringType),
		cel.Variable("origin_region", cel.StringType),
		cel.Variable("origin_zones", cel.ListType(cel.StringType)),
		cel.Variable("session", cel.StringType),
		cel.Variable("model", cel.StringType),
		cel.Variable("labels", cel.MapType(cel.StringType, cel.StringType)),
		cel.ParserExpressionSizeLimit(maxCELExprSize),
		cel.ParserRecursionLimit(64),
	)
	if err != nil {
		return nil, fmt.Errorf("new cel env: %w", err)
	}
	return &celEnv{env: env}, nil
}

// condVars maps condition variable names to the attribute each needs present:
// tenant, data class and origin are residency keys, and a condition reading
// an absent one fails closed like a match key would. Session, model and
// labels are optional hints: absent, they read as "" and an empty map.
var condVars = map[string]Attr{
	"tenant":        AttrTenant,
	"data_class":    AttrDataClass,
	"origin_region": AttrOriginRegion,
	"origin_zones":  AttrOriginRegion,
	"session":       0,
	"model":         0,
	"labels":        0,
}

// condition is one compiled CEL condition.
type condition struct {
	prog  cel.Program
	needs attrMask // attributes the expression reads (other than labels)
}

// condition compiles a rule's condition, reporting every problem at its
// position in the file.
func (d *decoder) condition(e *celEnv, n *yaml.Node, src, rule string) *condition {
	if len(src) > maxCELExprSize {
		d.node(n, src, "rule %q condition is %d bytes, more than the limit of %d", rule, len(src), maxCELExprSize)
		return nil
	}
	ast, iss := e.env.Compile(src)
	if iss != nil && iss.Err() != nil {
		for _, ce := range iss.Errors() {
			line, col := d.celPos(n, ce.Location.Line(), ce.Location.Column())
			d.at(line, col, src, "rule %q condition does not compile: %s", rule, ce.Message)
		}
		return nil
	}
	if !ast.OutputType().IsExactType(types.BoolType) {
		d.node(n, src, "rule %q condition must be a boolean expression; it has type %s", rule, ast.OutputType())
		return nil
	}
	est, err := e.env.EstimateCost(ast, costEstimator{})
	if err != nil {
		d.node(n, src, "rule %q condition: cannot estimate its cost: %v", rule, err)
		return nil
	}
	if est.Max > MaxConditionCost {
		d.node(n, src, "rule %q condition may cost up to %d, more than the budget of %d", rule, est.Max, MaxConditionCost)
		return nil
	}
	prog, err := e.env.Program(ast, cel.CostLimit(MaxConditionCost))
	if err != nil {
		d.node(n, src, "rule %q condition: %v", rule, err)
		return nil
	}
	c := &condition{prog: prog}
	for _, ref := range ast.NativeRep().ReferenceMap() {
		if a, ok := condVars[ref.Name]; ok && a != 0 {
			c.needs |= 1 << a
		}
	}
	return c
}

// celPos maps a CEL location (1-based line, 0-based column within the
// expression) to a file position, given the YAML scalar holding the
// expression.
func (d *decoder) celPos(n *yaml.Node, line, col int) (int, int) {
	if line < 1 {
		line = 1
	}
	if col < 0 {
		col = 0
	}
	switch n.Style {
	case yaml.LiteralStyle, yaml.FoldedStyle:
		// The block's indentation is that of its first non-blank line.
		lines := bytes.Split(d.data, []byte("\n"))
		indent := 0
		for l := n.Line; l < len(lines); l++ {
			if t := bytes.TrimLeft(lines[l], " "); len(bytes.TrimSpace(t)) > 0 {
				indent = len(lines[l]) - len(t)
				break
			}
		}
		return n.Line + line, indent + col + 1
	case yaml.DoubleQuotedStyle, yaml.SingleQuotedStyle:
		if line == 1 {
			return n.Line, n.Column + 1 + col
		}
	default:
		if line == 1 {
			return n.Line, n.Column + col
		}
	}
	return n.Line + line - 1, col + 1
}

// costEstimator bounds the sizes of condition variables for the parse-time
// cost estimate.
type costEstimator struct{}

func (costEstimator) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	path := n.Path()
	if len(path) == 0 {
		return nil
	}
	size := func(max uint64) *cost.SizeEstimate { return &cost.SizeEstimate{Min: 0, Max: max} }
	switch path[0] {
	case "tenant", "data_class", "session", "model":
		return size(MaxValueLen)
	case "origin_region":
		return size(MaxNameLen)
	case "origin_zones":
		if len(path) == 1 {
			return size(MaxZones)
		}
		return size(MaxNameLen)
	case "labels":
		if len(path) == 1 {
			return size(maxLabels)
		}
		return size(MaxValueLen)
	}
	return nil
}

func (costEstimator) EstimateCallCost(function, overloadID string, target *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
	return nil
}

// eval runs the condition. The attributes are copied into the activation so
// that the caller's value does not escape on the paths without a condition.
func (c *condition) eval(a *Attributes, zones []string) (bool, error) {
	act := &activation{attrs: *a, zones: zones}
	out, _, err := c.prog.Eval(act)
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("condition returned %s, not a bool", out.Type().TypeName())
	}
	return bool(b), nil
}

// activation resolves condition variables from request attributes. An empty
// tenant, data class or origin is unbound (Evaluate fails closed before
// evaluating a condition that reads one, so this is a second line of
// defence); session and model read as "".
type activation struct {
	attrs Attributes
	zones []string
}

func (a *activation) ResolveName(name string) (any, bool) {
	var v string
	switch name {
	case "tenant":
		v = a.attrs.Tenant
	case "data_class":
		v = a.attrs.DataClass
	case "origin_region":
		v = a.attrs.OriginRegion
	case "session":
		return a.attrs.Session, true
	case "model":
		return a.attrs.Model, true
	case "origin_zones":
		if a.zones == nil {
			return []string{}, true
		}
		return a.zones, true
	case "labels":
		if a.attrs.Labels == nil {
			return map[string]string{}, true
		}
		return a.attrs.Labels, true
	default:
		return nil, false
	}
	return v, v != ""
}

func (a *activation) Parent() interpreter.Activation { return nil }
