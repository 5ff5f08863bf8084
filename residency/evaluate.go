package residency

import (
	"fmt"
	"strings"
)

// Attributes are what Evaluate knows of a request. Empty means absent.
type Attributes struct {
	Tenant       string            `json:"tenant,omitempty"`        // X-Tenant-Id
	DataClass    string            `json:"data_class,omitempty"`    // X-Data-Class (compared case-insensitively)
	OriginRegion string            `json:"origin_region,omitempty"` // the region that received the request
	Session      string            `json:"session,omitempty"`       // X-Session-Id (conditions only)
	Model        string            `json:"model,omitempty"`         // requested model (conditions only)
	Labels       map[string]string `json:"labels,omitempty"`        // other metadata (conditions only)
}

// Attr names a request attribute in fail-closed decisions.
type Attr uint8

const (
	AttrTenant Attr = iota + 1
	AttrDataClass
	AttrOriginRegion
)

func (a Attr) String() string {
	switch a {
	case AttrTenant:
		return "tenant"
	case AttrDataClass:
		return "data_class"
	case AttrOriginRegion:
		return "origin_region"
	}
	return "none"
}

type attrMask uint8

// Outcome says how a decision was reached. The fail-closed outcomes allow no
// region.
type Outcome uint8

const (
	// OutcomeNone is the zero Decision: nothing was evaluated, nothing allowed.
	OutcomeNone Outcome = iota
	// OutcomeRule: an allow rule matched (deny rules may have removed regions).
	OutcomeRule
	// OutcomeDefault: no allow rule matched; the policy's default applied.
	OutcomeDefault
	// OutcomeMissingAttribute: a rule that might apply needs an attribute the
	// request does not carry. Fails closed.
	OutcomeMissingAttribute
	// OutcomeMalformedAttribute: a rule that might apply needs a tenant or data
	// class, and the request's value is not well formed. Fails closed.
	OutcomeMalformedAttribute
	// OutcomeUnknownOrigin: a rule that might apply needs the origin zone, and
	// the origin region is not declared in the policy. Fails closed.
	OutcomeUnknownOrigin
	// OutcomeConditionError: a condition failed to evaluate (including running
	// over its cost budget). Fails closed.
	OutcomeConditionError
)

func (o Outcome) String() string {
	switch o {
	case OutcomeRule:
		return "rule"
	case OutcomeDefault:
		return "default"
	case OutcomeMissingAttribute:
		return "missing_attribute"
	case OutcomeMalformedAttribute:
		return "malformed_attribute"
	case OutcomeUnknownOrigin:
		return "unknown_origin"
	case OutcomeConditionError:
		return "condition_error"
	}
	return "none"
}

// FailedClosed reports whether the outcome is one that allows nothing because
// the policy could not be applied.
func (o Outcome) FailedClosed() bool { return o >= OutcomeMissingAttribute || o == OutcomeNone }

// RuleRef names a rule in a decision. Index is the rule's position (0-based),
// -1 for the policy's default. The zero RuleRef (empty Name) means no rule.
type RuleRef struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	Line  int    `json:"line"`
}

// Valid reports whether r names a rule.
func (r RuleRef) Valid() bool { return r.Name != "" }

// Decision is the result of Evaluate. Its zero value allows nothing.
type Decision struct {
	// Allowed is the set of regions the request may be served in.
	Allowed RegionSet
	Outcome Outcome
	// Rule is the allow rule that decided, the default, or (when the
	// decision failed closed) the rule that could not be applied.
	Rule RuleRef
	// DeniedBy is the first deny rule, in file order, that removed a region
	// from the allowed set; zero when none did.
	DeniedBy RuleRef
	// Attr is the attribute that was missing or malformed, for those outcomes.
	Attr Attr
	// UnknownDataClass is set when the policy declares data classes and the
	// request's is not one of them (rules keyed on data class then skip it).
	UnknownDataClass bool
	// Err is the condition error, for OutcomeConditionError.
	Err error
	// PolicyID identifies the policy that decided (Policy.ID).
	PolicyID string

	policy *Policy
}

// Policy returns the policy that made the decision (nil for the zero value).
func (d Decision) Policy() *Policy { return d.policy }

// Regions returns the names of the allowed regions in declaration order.
func (d Decision) Regions() []string {
	if d.policy == nil {
		return nil
	}
	return d.policy.RegionNames(d.Allowed)
}

// Allows reports whether the decision allows the named region.
func (d Decision) Allows(region string) bool {
	if d.policy == nil {
		return false
	}
	i, ok := d.policy.regionIndex[region]
	return ok && d.Allowed.Has(i)
}

// SameRegions reports whether d and e allow the same region names, even when
// they come from policies with different region lists. It does not allocate.
func (d Decision) SameRegions(e Decision) bool {
	if d.Allowed.Len() != e.Allowed.Len() {
		return false
	}
	if d.Allowed.Empty() {
		return true
	}
	if d.policy == e.policy || sameRegionList(d.policy, e.policy) {
		return d.Allowed == e.Allowed
	}
	for i := range d.Allowed.Indexes() {
		if !e.Allows(d.policy.regions[i].Name) {
			return false
		}
	}
	return true
}

func sameRegionList(a, b *Policy) bool {
	if a == nil || b == nil || len(a.regions) != len(b.regions) {
		return false
	}
	for i := range a.regions {
		if a.regions[i].Name != b.regions[i].Name {
			return false
		}
	}
	return true
}

// Reason explains the decision in one line, naming the rule.
func (d Decision) Reason() string {
	switch d.Outcome {
	case OutcomeRule, OutcomeDefault:
		var b strings.Builder
		if d.Outcome == OutcomeRule {
			fmt.Fprintf(&b, "rule %q", d.Rule.Name)
		} else {
			b.WriteString("the default")
		}
		if d.UnknownDataClass {
			b.WriteString(" (unknown data class)")
		}
		if d.DeniedBy.Valid() {
			fmt.Fprintf(&b, ", less what rule %q denies", d.DeniedBy.Name)
		}
		if d.Allowed.Empty() {
			b.WriteString(": no region allowed")
		}
		return b.String()
	case OutcomeMissingAttribute:
		return fmt.Sprintf("rule %q needs %s, which the request does not carry", d.Rule.Name, d.Attr)
	case OutcomeMalformedAttribute:
		return fmt.Sprintf("rule %q needs %s, and the request's value is malformed", d.Rule.Name, d.Attr)
	case OutcomeUnknownOrigin:
		return fmt.Sprintf("rule %q needs the origin zone, and the origin region is not in the policy", d.Rule.Name)
	case OutcomeConditionError:
		return fmt.Sprintf("rule %q condition failed: %v", d.Rule.Name, d.Err)
	}
	return "not evaluated"
}

// String is a one-line summary: allowed regions, reason, policy.
func (d Decision) String() string {
	return fmt.Sprintf("allow [%s] by %s (policy %s)", strings.Join(d.Regions(), " "), d.Reason(), d.PolicyID)
}

// presence of one attribute for matching.
type presence uint8

const (
	present presence = iota
	missing
	malformed
	unknown // data class not declared; origin region not declared
)

// evalState is what Evaluate works out once per request.
type evalState struct {
	tenant, class, origin presence
	originIdx             int
}

// tri is a rule's match result.
type tri uint8

const (
	no tri = iota
	yes
	needs
)

// Evaluate decides where a request with the given attributes may be served.
// The precedence is documented in the package comment; it fails closed (allows
// nothing, says why) rather than guess. Without conditions it does not
// allocate.
func (p *Policy) Evaluate(a Attributes) Decision {
	d := Decision{PolicyID: p.id, policy: p}
	st := p.state(&a)
	d.UnknownDataClass = st.class == unknown

	decider := &p.def
	for _, i := range p.allowRules {
		r := &p.rules[i]
		applies, stop := p.applies(&d, r, &st, &a)
		if stop {
			return d
		}
		if applies {
			decider = r
			break
		}
	}
	allowed, ok := p.resolve(decider, &st)
	if !ok {
		return failClosed(d, decider, AttrOriginRegion, st.origin)
	}
	for _, i := range p.denyRules {
		r := &p.rules[i]
		applies, stop := p.applies(&d, r, &st, &a)
		if stop {
			return d
		}
		if !applies {
			continue
		}
		denied, ok := p.resolve(r, &st)
		if !ok {
			return failClosed(d, r, AttrOriginRegion, st.origin)
		}
		if !d.DeniedBy.Valid() && allowed.Overlaps(denied) {
			d.DeniedBy = r.Ref()
		}
		allowed = allowed.Minus(denied)
	}
	d.Allowed = allowed
	d.Rule = decider.Ref()
	d.Outcome = OutcomeRule
	if decider == &p.def {
		d.Outcome = OutcomeDefault
	}
	return d
}

// applies reports whether rule r applies to the request: its attributes
// match and its condition, if any, holds. When that cannot be told (an
// attribute r keys on is missing or malformed, or its condition fails) it
// sets d to the fail-closed decision and returns stop.
func (p *Policy) applies(d *Decision, r *Rule, st *evalState, a *Attributes) (applies, stop bool) {
	m, attr, pr := r.match(st, a)
	switch m {
	case no:
		return false, false
	case needs:
		*d = failClosed(*d, r, attr, pr)
		return false, true
	}
	if r.cond == nil {
		return true, false
	}
	ok, err := r.cond.eval(a, p.zoneNames(st))
	if err != nil {
		d.Outcome, d.Rule, d.DeniedBy, d.Err = OutcomeConditionError, r.Ref(), RuleRef{}, fmt.Errorf("rule %q: %w", r.Name, err)
		return false, true
	}
	return ok, false
}

func failClosed(d Decision, r *Rule, attr Attr, pr presence) Decision {
	d.Rule, d.Attr, d.DeniedBy = r.Ref(), attr, RuleRef{}
	switch {
	case attr == AttrOriginRegion && pr == unknown:
		d.Outcome = OutcomeUnknownOrigin
	case pr == malformed:
		d.Outcome = OutcomeMalformedAttribute
	default:
		d.Outcome = OutcomeMissingAttribute
	}
	return d
}

func (p *Policy) state(a *Attributes) evalState {
	st := evalState{originIdx: -1}
	st.tenant = valuePresence(a.Tenant)
	st.class = valuePresence(a.DataClass)
	if st.class == present && p.dataClasses != nil {
		st.class = unknown
		for _, c := range p.dataClasses {
			if strings.EqualFold(c, a.DataClass) {
				st.class = present
				break
			}
		}
	}
	switch i, ok := p.regionIndex[a.OriginRegion]; {
	case a.OriginRegion == "":
		st.origin = missing
	case !ok:
		st.origin = unknown
	default:
		st.originIdx = i
	}
	return st
}

func valuePresence(v string) presence {
	switch {
	case v == "":
		return missing
	case !validValue(v):
		return malformed
	}
	return present
}

func (p *Policy) zoneNames(st *evalState) []string {
	if st.originIdx < 0 {
		return nil
	}
	return p.originZoneNames[st.originIdx]
}

// match tells whether r matches: no when some attribute rules it out, needs
// when none does but one it depends on is absent or unusable, yes otherwise.
func (r *Rule) match(st *evalState, a *Attributes) (tri, Attr, presence) {
	result, attr, pr := yes, Attr(0), present
	need := func(x Attr, p presence) {
		if result == yes {
			result, attr, pr = needs, x, p
		}
	}
	if !r.tenant.any {
		if st.tenant == present {
			if !r.tenant.match(a.Tenant) {
				return no, 0, present
			}
		} else {
			need(AttrTenant, st.tenant)
		}
	}
	if !r.class.any {
		switch st.class {
		case present:
			if !r.class.match(a.DataClass) {
				return no, 0, present
			}
		case unknown:
			return no, 0, present
		default:
			need(AttrDataClass, st.class)
		}
	}
	if r.hasOrigin {
		if st.origin == present {
			if !r.origin.Has(st.originIdx) {
				return no, 0, present
			}
		} else {
			need(AttrOriginRegion, st.origin)
		}
	}
	if r.cond != nil && r.cond.needs != 0 {
		n := r.cond.needs
		if n&(1<<AttrTenant) != 0 && st.tenant != present {
			need(AttrTenant, st.tenant)
		}
		if n&(1<<AttrDataClass) != 0 && st.class != present && st.class != unknown {
			need(AttrDataClass, st.class)
		}
		if n&(1<<AttrOriginRegion) != 0 && st.origin != present {
			need(AttrOriginRegion, st.origin)
		}
	}
	return result, attr, pr
}

// resolve returns the regions r's targets name for this request; false when
// they include `origin` and the origin region is absent or unknown.
func (p *Policy) resolve(r *Rule, st *evalState) (RegionSet, bool) {
	if !r.useOrigin {
		return r.static, true
	}
	if st.origin != present {
		return RegionSet{}, false
	}
	return r.static.Union(p.originSet[st.originIdx]), true
}
