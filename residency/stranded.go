package residency

import (
	"fmt"
	"strings"
)

// Stranded is traffic a policy leaves with no region to go to: under one
// allow rule (or the default), the requests entering at Origins whose
// allowed regions are all down.
type Stranded struct {
	Rule        string   // the rule's name; "default" for the default
	Tenants     []string // the rule's tenant patterns; nil: any tenant
	DataClasses []string // its data-class patterns; nil: any data class
	Condition   string   // its CEL condition, if any (the traffic it matches)
	Origins     []string // the origin regions whose traffic loses every allowed region
}

// String describes the stranded traffic for an operator: "rule
// eu-health-phi (tenant eu-health, data class phi) entering at us-east-1,
// eu-west-1".
func (s Stranded) String() string {
	var who []string
	if s.Tenants != nil {
		who = append(who, "tenant "+strings.Join(s.Tenants, "|"))
	}
	if s.DataClasses != nil {
		who = append(who, "data class "+strings.Join(s.DataClasses, "|"))
	}
	if s.Condition != "" {
		who = append(who, "when "+s.Condition)
	}
	if len(who) == 0 {
		who = append(who, "any tenant and data class")
	}
	return fmt.Sprintf("rule %s (%s) entering at %s", s.Rule, strings.Join(who, ", "), strings.Join(s.Origins, ", "))
}

// Stranded lists, for every allow rule and the default, the origin regions
// whose traffic under it would have nowhere to go if the regions down
// reports were down (failed or draining): every region the rule allows for
// that origin is down. Deny rules only take regions away, so they are not
// consulted: what an allow rule strands stays stranded. An operator about
// to fail a region over compares the lists before and after.
func (p *Policy) Stranded(down func(region string) bool) []Stranded {
	var isDown RegionSet
	for i, r := range p.regions {
		if down(r.Name) {
			isDown = isDown.With(i)
		}
	}
	var out []Stranded
	check := func(r *Rule) {
		s := Stranded{Rule: r.Name, Tenants: r.Tenants, DataClasses: r.DataClasses, Condition: r.Condition}
		if r.Index < 0 {
			s.Rule = "default"
		}
		for i, reg := range p.regions {
			if r.hasOrigin && !r.origin.Has(i) {
				continue
			}
			targets := r.static
			if r.useOrigin {
				targets = targets.Union(p.originSet[i])
			}
			if !targets.Empty() && targets.SubsetOf(isDown) {
				s.Origins = append(s.Origins, reg.Name)
			}
		}
		if len(s.Origins) > 0 {
			out = append(out, s)
		}
	}
	for _, i := range p.allowRules {
		check(&p.rules[i])
	}
	check(&p.def)
	return out
}

// Unclassified is the data class a request without one is evaluated with.
// A policy that declares its data classes and not this one treats it as an
// unknown class (rules that constrain data_class skip it); a policy may
// also declare it and write rules for it.
const Unclassified = "unclassified"

// EvaluateUnclassified decides a request that carries no data class and
// whose identity has no default: the strictest treatment, not a refusal
// naming whatever rule needed the class. It is evaluated as a request of
// data class Unclassified (for a policy that does not declare it, an
// unknown data class: rules that constrain data_class do not match it;
// rules that do not still apply, deny rules included), and what that allows
// is confined to the origin region's zone.
func (p *Policy) EvaluateUnclassified(a Attributes) Decision {
	a.DataClass = Unclassified
	d := p.Evaluate(a)
	if i, ok := p.regionIndex[a.OriginRegion]; ok {
		d.Allowed = d.Allowed.Intersect(p.originSet[i])
	} else {
		d.Allowed = RegionSet{}
	}
	return d
}
