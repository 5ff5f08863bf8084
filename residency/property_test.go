package residency

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// This file holds a deliberately naive reference evaluator — maps of region
// names, regular expressions for globs, the documented precedence written out
// step by step — and rapid properties comparing Evaluate with it on random
// policies and requests.

type refZone struct {
	name    string
	regions []string
}

type refRule struct {
	name                          string
	tenants, classes, originZones []string // nil: not constrained
	cond                          int      // index into refConds, -1: none
	deny                          bool
	targets                       []string
}

type refPolicy struct {
	regions []string
	zones   []refZone
	classes []string // declared data classes, nil: none
	rules   []refRule
	def     []string
}

// refCond is a condition with its meaning in Go.
type refCond struct {
	src   string
	needs []string // attributes whose absence fails closed
	eval  func(a Attributes, originZones []string) (bool, error)
}

var refConds = []refCond{
	{`model.startsWith("llama")`, nil, func(a Attributes, _ []string) (bool, error) { return strings.HasPrefix(a.Model, "llama"), nil }},
	{`tenant.endsWith("eu")`, []string{"tenant"}, func(a Attributes, _ []string) (bool, error) { return strings.HasSuffix(a.Tenant, "eu"), nil }},
	{`"k" in labels`, nil, func(a Attributes, _ []string) (bool, error) { _, ok := a.Labels["k"]; return ok, nil }},
	{`labels["k"] == "v"`, nil, func(a Attributes, _ []string) (bool, error) {
		v, ok := a.Labels["k"]
		if !ok {
			return false, fmt.Errorf("no such key: k")
		}
		return v == "v", nil
	}},
	{`origin_zones.exists(z, z == "z0")`, []string{"origin"}, func(_ Attributes, zones []string) (bool, error) { return slices.Contains(zones, "z0"), nil }},
	{`data_class == "phi" || session != ""`, []string{"data_class"}, func(a Attributes, _ []string) (bool, error) { return a.DataClass == "phi" || a.Session != "", nil }},
}

func (rp refPolicy) yaml() string {
	var b strings.Builder
	list := func(s []string) string {
		q := make([]string, len(s))
		for i, v := range s {
			q[i] = fmt.Sprintf("%q", v)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	fmt.Fprintf(&b, "version: 1\nregions: %s\n", list(rp.regions))
	if len(rp.zones) > 0 {
		b.WriteString("zones:\n")
		for _, z := range rp.zones {
			fmt.Fprintf(&b, "  %s: %s\n", z.name, list(z.regions))
		}
	}
	if rp.classes != nil {
		fmt.Fprintf(&b, "data_classes: %s\n", list(rp.classes))
	}
	if len(rp.rules) > 0 {
		b.WriteString("rules:\n")
	}
	for _, r := range rp.rules {
		fmt.Fprintf(&b, "  - name: %s\n", r.name)
		var m []string
		if r.tenants != nil {
			m = append(m, "tenant: "+list(r.tenants))
		}
		if r.classes != nil {
			m = append(m, "data_class: "+list(r.classes))
		}
		if r.originZones != nil {
			m = append(m, "origin_zone: "+list(r.originZones))
		}
		if m != nil {
			fmt.Fprintf(&b, "    match: {%s}\n", strings.Join(m, ", "))
		}
		if r.cond >= 0 {
			fmt.Fprintf(&b, "    condition: %q\n", refConds[r.cond].src)
		}
		effect := "allow"
		if r.deny {
			effect = "deny"
		}
		fmt.Fprintf(&b, "    %s: %s\n", effect, list(r.targets))
	}
	fmt.Fprintf(&b, "default: {allow: %s}\n", list(rp.def))
	return b.String()
}

var (
	regionPool  = []string{"r0", "r1", "r2", "r3", "r4", "r5"}
	tenantPats  = []string{"acme", "acme*", "*", "a?me", "b*", "*-eu", "beta", "acme-eu"}
	classPats   = []string{"phi", "p*", "pii", "public", "*", "PHI"}
	tenantVals  = []string{"acme", "acme-eu", "beta", "b", "", "bad tenant", "x-eu", "abme"}
	classVals   = []string{"phi", "pii", "public", "PHI", "x", "", "p h"}
	labelValues = []map[string]string{nil, {"k": "v"}, {"k": "w"}, {"j": "v"}}
)

func genSubset(t *rapid.T, pool []string, min int, label string) []string {
	var out []string
	for _, v := range pool {
		if rapid.Bool().Draw(t, label+"-"+v) {
			out = append(out, v)
		}
	}
	for len(out) < min {
		out = append(out, rapid.SampledFrom(pool).Draw(t, label+"-pick"))
		slices.Sort(out)
		out = slices.Compact(out)
	}
	return out
}

func genPolicy(t *rapid.T) refPolicy {
	var rp refPolicy
	rp.regions = regionPool[:rapid.IntRange(1, len(regionPool)).Draw(t, "regions")]
	for i := range rapid.IntRange(0, 4).Draw(t, "zones") {
		rp.zones = append(rp.zones, refZone{name: fmt.Sprintf("z%d", i), regions: genSubset(t, rp.regions, 1, fmt.Sprintf("zone%d", i))})
	}
	if rapid.Bool().Draw(t, "declare-classes") {
		rp.classes = []string{"phi", "pii", "public"}
	}
	targets := []string{TargetOrigin, TargetAll}
	targets = append(targets, rp.regions...)
	for _, z := range rp.zones {
		targets = append(targets, z.name)
	}
	var zoneNames []string
	for _, z := range rp.zones {
		zoneNames = append(zoneNames, z.name)
	}
	for i := range rapid.IntRange(0, 8).Draw(t, "rules") {
		r := refRule{name: fmt.Sprintf("rule%d", i), cond: -1}
		if rapid.Bool().Draw(t, "has-tenant") {
			r.tenants = genSubset(t, tenantPats, 1, "tenants")
		}
		if rapid.Bool().Draw(t, "has-class") {
			r.classes = genSubset(t, classPats[:5], 1, "classes") // PHI would duplicate phi
		}
		if len(zoneNames) > 0 && rapid.IntRange(0, 2).Draw(t, "has-origin") == 0 {
			r.originZones = genSubset(t, zoneNames, 1, "origin-zones")
		}
		if rapid.IntRange(0, 3).Draw(t, "has-cond") == 0 {
			r.cond = rapid.IntRange(0, len(refConds)-1).Draw(t, "cond")
		}
		r.deny = rapid.IntRange(0, 3).Draw(t, "deny") == 0
		r.targets = genSubset(t, targets, 0, "targets")
		if r.deny && len(r.targets) == 0 {
			r.targets = []string{TargetOrigin}
		}
		rp.rules = append(rp.rules, r)
	}
	rp.def = genSubset(t, targets, 0, "default")
	return rp
}

func genAttrs(t *rapid.T, rp refPolicy) Attributes {
	origins := append(slices.Clone(rp.regions), "", "elsewhere")
	return Attributes{
		Tenant:       rapid.SampledFrom(tenantVals).Draw(t, "tenant"),
		DataClass:    rapid.SampledFrom(classVals).Draw(t, "class"),
		OriginRegion: rapid.SampledFrom(origins).Draw(t, "origin"),
		Session:      rapid.SampledFrom([]string{"", "s1"}).Draw(t, "session"),
		Model:        rapid.SampledFrom([]string{"", "llama-3", "mistral"}).Draw(t, "model"),
		Labels:       rapid.SampledFrom(labelValues).Draw(t, "labels"),
	}
}

// refDecision is the reference's answer.
type refDecision struct {
	regions []string
	outcome Outcome
	rule    string
	denied  string
	attr    Attr
}

var validValueRE = regexp.MustCompile(`^[A-Za-z0-9._:@/+-]{1,256}$`)

func refGlob(pattern, v string, fold bool) bool {
	re := "^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$"
	if fold {
		re = "(?i)" + re
	}
	return regexp.MustCompile("(?s)" + re).MatchString(v)
}

func refEvaluate(rp refPolicy, a Attributes) refDecision {
	zone := func(name string) []string {
		for _, z := range rp.zones {
			if z.name == name {
				return z.regions
			}
		}
		return nil
	}
	state := func(v string) string {
		switch {
		case v == "":
			return "missing"
		case !validValueRE.MatchString(v):
			return "malformed"
		}
		return "present"
	}
	tenant, class := state(a.Tenant), state(a.DataClass)
	if class == "present" && rp.classes != nil && !slices.ContainsFunc(rp.classes, func(c string) bool { return strings.EqualFold(c, a.DataClass) }) {
		class = "unknown"
	}
	origin := "present"
	if a.OriginRegion == "" {
		origin = "missing"
	} else if !slices.Contains(rp.regions, a.OriginRegion) {
		origin = "unknown"
	}
	var originZones []string
	for _, z := range rp.zones {
		if slices.Contains(z.regions, a.OriginRegion) {
			originZones = append(originZones, z.name)
		}
	}
	// originZone: regions in every zone holding the origin, or the origin alone.
	originZone := func() map[string]bool {
		set := map[string]bool{}
		if len(originZones) == 0 {
			set[a.OriginRegion] = true
			return set
		}
		for _, r := range rp.regions {
			in := true
			for _, zn := range originZones {
				if !slices.Contains(zone(zn), r) {
					in = false
				}
			}
			if in {
				set[r] = true
			}
		}
		return set
	}
	resolve := func(targets []string) (map[string]bool, bool) {
		set := map[string]bool{}
		for _, t := range targets {
			switch {
			case t == TargetOrigin:
				if origin != "present" {
					return nil, false
				}
				for r := range originZone() {
					set[r] = true
				}
			case t == TargetAll:
				for _, r := range rp.regions {
					set[r] = true
				}
			case slices.Contains(rp.regions, t):
				set[t] = true
			default:
				for _, r := range zone(t) {
					set[r] = true
				}
			}
		}
		return set, true
	}
	// match returns "no", "yes", or the attribute and state that is needed.
	type result struct {
		m     string
		attr  Attr
		state string
	}
	match := func(r refRule) result {
		var needed []result
		if r.tenants != nil {
			if tenant == "present" {
				if !slices.ContainsFunc(r.tenants, func(p string) bool { return refGlob(p, a.Tenant, false) }) {
					return result{m: "no"}
				}
			} else {
				needed = append(needed, result{"needs", AttrTenant, tenant})
			}
		}
		if r.classes != nil {
			switch class {
			case "present":
				if !slices.ContainsFunc(r.classes, func(p string) bool { return refGlob(p, a.DataClass, true) }) {
					return result{m: "no"}
				}
			case "unknown":
				return result{m: "no"}
			default:
				needed = append(needed, result{"needs", AttrDataClass, class})
			}
		}
		if r.originZones != nil {
			if origin == "present" {
				if !slices.ContainsFunc(r.originZones, func(z string) bool { return slices.Contains(zone(z), a.OriginRegion) }) {
					return result{m: "no"}
				}
			} else {
				needed = append(needed, result{"needs", AttrOriginRegion, origin})
			}
		}
		if r.cond >= 0 {
			for _, n := range refConds[r.cond].needs {
				switch {
				case n == "tenant" && tenant != "present":
					needed = append(needed, result{"needs", AttrTenant, tenant})
				case n == "data_class" && class != "present" && class != "unknown":
					needed = append(needed, result{"needs", AttrDataClass, class})
				case n == "origin" && origin != "present":
					needed = append(needed, result{"needs", AttrOriginRegion, origin})
				}
			}
		}
		if len(needed) > 0 {
			return needed[0]
		}
		return result{m: "yes"}
	}
	closed := func(r string, res result) refDecision {
		d := refDecision{rule: r, attr: res.attr}
		switch {
		case res.attr == AttrOriginRegion && res.state == "unknown":
			d.outcome = OutcomeUnknownOrigin
		case res.state == "malformed":
			d.outcome = OutcomeMalformedAttribute
		default:
			d.outcome = OutcomeMissingAttribute
		}
		return d
	}
	// Pass 1: the first allow rule that matches.
	decider, targets, outcome := DefaultRuleName, rp.def, OutcomeDefault
	for _, r := range rp.rules {
		if r.deny {
			continue
		}
		res := match(r)
		if res.m == "no" {
			continue
		}
		if res.m == "needs" {
			return closed(r.name, res)
		}
		if r.cond >= 0 {
			ok, err := refConds[r.cond].eval(a, originZones)
			if err != nil {
				return refDecision{outcome: OutcomeConditionError, rule: r.name}
			}
			if !ok {
				continue
			}
		}
		decider, targets, outcome = r.name, r.targets, OutcomeRule
		break
	}
	allowed, ok := resolve(targets)
	if !ok {
		return closed(decider, result{"needs", AttrOriginRegion, origin})
	}
	// Pass 2: every matching deny rule.
	denied := ""
	for _, r := range rp.rules {
		if !r.deny {
			continue
		}
		res := match(r)
		if res.m == "no" {
			continue
		}
		if res.m == "needs" {
			return closed(r.name, res)
		}
		if r.cond >= 0 {
			ok, err := refConds[r.cond].eval(a, originZones)
			if err != nil {
				return refDecision{outcome: OutcomeConditionError, rule: r.name}
			}
			if !ok {
				continue
			}
		}
		set, ok := resolve(r.targets)
		if !ok {
			return closed(r.name, result{"needs", AttrOriginRegion, origin})
		}
		for reg := range set {
			if allowed[reg] {
				if denied == "" {
					denied = r.name
				}
				delete(allowed, reg)
			}
		}
	}
	d := refDecision{outcome: outcome, rule: decider, denied: denied}
	for _, r := range rp.regions { // declaration order
		if allowed[r] {
			d.regions = append(d.regions, r)
		}
	}
	return d
}

// TestEvaluateMatchesReference: on random policies and requests, Evaluate
// gives exactly the reference's regions, outcome, deciding rule, first deny
// rule and missing attribute.
func TestEvaluateMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rp := genPolicy(t)
		src := rp.yaml()
		p, problems := parse("gen.yaml", []byte(src), false)
		if problems != nil {
			t.Fatalf("generated policy has problems:\n%s\n%v", src, problems)
		}
		for i := range 20 {
			a := genAttrs(t, rp)
			got, want := p.Evaluate(a), refEvaluate(rp, a)
			if !slices.Equal(got.Regions(), want.regions) || got.Outcome != want.outcome || got.Rule.Name != want.rule ||
				got.DeniedBy.Name != want.denied || got.Attr != want.attr {
				t.Fatalf("request %d %s\npolicy:\n%s\nEvaluate:  %v outcome=%s rule=%s denied=%s attr=%s\nreference: %v outcome=%s rule=%s denied=%s attr=%s",
					i, FormatAttributes(a), src, got.Regions(), got.Outcome, got.Rule.Name, got.DeniedBy.Name, got.Attr,
					want.regions, want.outcome, want.rule, want.denied, want.attr)
			}
		}
	})
}

// TestEvaluateStaysWithinDecidingRule: the allowed regions are always within
// the targets of the rule that decided (resolved through the public API), and
// never include a region a matching deny rule names. Checked for every
// decision, failed-closed ones included (which must allow nothing).
func TestEvaluateStaysWithinDecidingRule(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rp := genPolicy(t)
		p, problems := parse("gen.yaml", []byte(rp.yaml()), false)
		if problems != nil {
			t.Fatal(problems)
		}
		for range 20 {
			a := genAttrs(t, rp)
			d := p.Evaluate(a)
			if d.Outcome.FailedClosed() {
				if !d.Allowed.Empty() {
					t.Fatalf("failed closed (%s) but allows %v", d.Reason(), d.Regions())
				}
				continue
			}
			rule := p.Default()
			if d.Rule.Index >= 0 {
				rule = &p.Rules()[d.Rule.Index]
			}
			limit := targetsOf(t, p, rule.Targets, a.OriginRegion)
			for _, r := range d.Regions() {
				if !limit[r] {
					t.Fatalf("%s allows %s, outside the targets %v of rule %q", FormatAttributes(a), r, rule.Targets, rule.Name)
				}
			}
		}
	})
}

// targetsOf resolves written targets with only the public API.
func targetsOf(t *rapid.T, p *Policy, targets []string, origin string) map[string]bool {
	set := map[string]bool{}
	for _, tg := range targets {
		switch tg {
		case TargetAll:
			for _, r := range p.Regions() {
				set[r.Name] = true
			}
		case TargetOrigin:
			s, ok := p.OriginZone(origin)
			if !ok {
				t.Fatalf("origin target resolved without a known origin %q", origin)
			}
			for _, r := range p.RegionNames(s) {
				set[r] = true
			}
		default:
			if z, ok := p.Zone(tg); ok {
				for _, r := range p.RegionNames(z.Regions) {
					set[r] = true
				}
			} else {
				set[tg] = true
			}
		}
	}
	return set
}

// TestAnalysisIsSound: when the whole-policy checks call a rule shadowed, no
// request is ever decided by it; when they say deny rules always remove an
// allow target of a rule, that rule never allows a region only that target
// names.
func TestAnalysisIsSound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rp := genPolicy(t)
		src := rp.yaml()
		p, _ := parse("gen.yaml", []byte(src), false)
		shadowed := map[string]bool{}
		for _, pr := range Validate("gen.yaml", []byte(src)) {
			if strings.Contains(pr.Message, "can never match: rule") {
				shadowed[pr.Value] = true
			}
		}
		for range 30 {
			a := genAttrs(t, rp)
			if d := p.Evaluate(a); shadowed[d.Rule.Name] && !d.Outcome.FailedClosed() {
				t.Fatalf("rule %q reported shadowed but decided %s\n%s", d.Rule.Name, FormatAttributes(a), src)
			}
		}
	})
}
