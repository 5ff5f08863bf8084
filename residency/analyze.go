package residency

import (
	"fmt"
	"slices"
	"strings"
)

// The whole-policy checks. They are sound but not complete: what they report
// is always true of every request, and some redundancies (for instance a glob
// covered only by the union of two others) go unreported.

// analyze reports shadowed rules, overlapping allow rules where the earlier
// allows more than the later, and allow targets that deny rules always take
// away. Rules with
// their own problems (broken[i]) are left out.
func (d *decoder) analyze(p *Policy, broken []bool) {
	a := analyzer{p: p}
	if p.dataClasses != nil {
		a.classMasks = make([]uint64, len(p.rules))
		for i := range p.rules {
			a.classMasks[i] = a.classMask(&p.rules[i].class)
		}
	}
	ok := func(i int) bool { return !broken[i] }
	// Shadowing and overlap between allow rules.
	for jj, j := range p.allowRules {
		if !ok(j) {
			continue
		}
		b := &p.rules[j]
		shadowed := false
		for _, i := range p.allowRules[:jj] {
			if ok(i) && p.rules[i].cond == nil && a.covers(i, j) {
				r := &p.rules[i]
				d.at(b.Line, b.Column, b.Name, "rule %q can never match: rule %q (line %d) comes first and matches every request it matches", b.Name, r.Name, r.Line)
				shadowed = true
				break
			}
		}
		if shadowed || b.cond != nil {
			continue
		}
		for ii, i := range p.allowRules[:jj] {
			r := &p.rules[i]
			if !ok(i) || r.cond != nil || a.covers(j, i) {
				continue // a later, broader rule is the usual first-match idiom
			}
			w, overlap := a.overlap(i, j)
			if !overlap {
				continue
			}
			o, wider := a.wider(r, b, w.originSet)
			if !wider || a.coveredEarlier(p.allowRules[:ii], ok, i, j) {
				continue
			}
			w.origin = o
			d.at(b.Line, b.Column, b.Name, "rules %q (line %d) and %q overlap and contradict: for a request such as %s, %q comes first and allows %s, beyond the %s that %q allows; make them disjoint or add an earlier rule for the overlap",
				r.Name, r.Line, b.Name, w.describe(p), r.Name, a.show(r, o), a.show(b, o), b.Name)
			break
		}
	}
	// Allow targets that covering deny rules always remove.
	check := func(r *Rule) {
		for t, target := range r.Targets {
			var names []string
			var line int
			always := true
			domain := allRegions(len(p.regions))
			if r.hasOrigin {
				domain = r.origin
			}
			for o := range domain.Indexes() {
				var deny RegionSet
				for _, k := range p.denyRules {
					if !ok(k) || p.rules[k].cond != nil || !a.coversRule(&p.rules[k], r, k) {
						continue
					}
					st := evalState{origin: present, originIdx: o}
					set, _ := p.resolve(&p.rules[k], &st)
					if set.Overlaps(a.target(target, o)) && !slices.Contains(names, p.rules[k].Name) {
						names = append(names, p.rules[k].Name)
						if line == 0 {
							line = p.rules[k].Line
						}
					}
					deny = deny.Union(set)
				}
				if !a.target(target, o).SubsetOf(deny) {
					always = false
					break
				}
			}
			if always && len(names) > 0 && t < len(r.pos.targets) {
				tp := r.pos.targets[t]
				who := fmt.Sprintf("rule %q (line %d) denies", names[0], line)
				if len(names) > 1 {
					who = fmt.Sprintf("rules %s deny", quoteAll(names))
				}
				d.at(tp.line, tp.col, target, "%s allows %q, but %s all of it for every request %s matches",
					ruleWord(r), target, who, map[bool]string{true: "it", false: "the default"}[r.Index >= 0])
			}
		}
	}
	for _, i := range p.allowRules {
		if ok(i) {
			check(&p.rules[i])
		}
	}
	check(&p.def)
}

func ruleWord(r *Rule) string {
	if r.Index < 0 {
		return "the default"
	}
	return fmt.Sprintf("rule %q", r.Name)
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

type analyzer struct {
	p          *Policy
	classMasks []uint64 // per rule, over declared data classes (when declared)
}

func (a *analyzer) classMask(m *matcher) uint64 {
	var mask uint64
	for i, c := range a.p.dataClasses {
		if i < 64 && (m.any || m.match(c)) {
			mask |= 1 << uint(i)
		}
	}
	return mask
}

// target returns the regions one written target names for origin o.
func (a *analyzer) target(t string, o int) RegionSet {
	p := a.p
	switch t {
	case TargetOrigin:
		return p.originSet[o]
	case TargetAll:
		return allRegions(len(p.regions))
	}
	if zi, ok := p.zoneIndex[t]; ok {
		return p.zones[zi].Regions
	}
	if ri, ok := p.regionIndex[t]; ok {
		return RegionSet{}.With(ri)
	}
	return RegionSet{}
}

// covers reports whether rule i matches (or fails closed on) every request
// rule j matches, ignoring conditions.
func (a *analyzer) covers(i, j int) bool {
	return a.coversRule(&a.p.rules[i], &a.p.rules[j], i)
}

// coversRule is covers for any two rules; ki is r's index (for class masks).
func (a *analyzer) coversRule(r, s *Rule, ki int) bool {
	if !patternsCover(&r.tenant, &s.tenant) {
		return false
	}
	if a.classMasks != nil && !r.class.any {
		if s.class.any {
			return false // s also matches undeclared data classes, r never does
		}
		sm := a.classMask(&s.class)
		if a.classMasks[ki]&sm != sm {
			return false
		}
	} else if !patternsCover(&r.class, &s.class) {
		return false
	}
	if r.hasOrigin {
		if s.hasOrigin {
			return s.origin.SubsetOf(r.origin)
		}
		return allRegions(len(a.p.regions)).SubsetOf(r.origin)
	}
	return true
}

// patternsCover: every value s matches, r matches or (when s is unconstrained
// and r needs a value) fails closed on.
func patternsCover(r, s *matcher) bool {
	if r.any {
		return true
	}
	if s.any {
		for _, p := range r.pats {
			if strings.Trim(p, "*") == "" {
				return true
			}
		}
		return false
	}
	for _, sp := range s.pats {
		found := false
		for _, rp := range r.pats {
			if globCovers(rp, sp) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// witness is an example request two rules both match.
type witness struct {
	tenant, class string
	originSet     RegionSet
	origin        int
	constrained   [3]bool
}

func (w witness) describe(p *Policy) string {
	var parts []string
	if w.constrained[0] {
		parts = append(parts, "tenant="+w.tenant)
	}
	if w.constrained[1] {
		parts = append(parts, "data_class="+w.class)
	}
	if w.constrained[2] && w.origin >= 0 {
		parts = append(parts, "origin_region="+p.regions[w.origin].Name)
	}
	if len(parts) == 0 {
		return "any request"
	}
	return strings.Join(parts, " ")
}

// overlap reports whether some request matches both rules, with an example.
func (a *analyzer) overlap(i, j int) (witness, bool) {
	r, s := &a.p.rules[i], &a.p.rules[j]
	var w witness
	var ok bool
	if w.tenant, ok = patternsOverlap(&r.tenant, &s.tenant); !ok {
		return w, false
	}
	w.constrained[0] = !r.tenant.any || !s.tenant.any
	if a.classMasks != nil && !(r.class.any && s.class.any) {
		m := a.classMasks[i] & a.classMasks[j]
		if m == 0 {
			return w, false
		}
		for k := range a.p.dataClasses {
			if m&(1<<uint(k)) != 0 {
				w.class = a.p.dataClasses[k]
				break
			}
		}
	} else if w.class, ok = patternsOverlap(&r.class, &s.class); !ok {
		return w, false
	}
	w.constrained[1] = !r.class.any || !s.class.any
	w.originSet = allRegions(len(a.p.regions))
	if r.hasOrigin {
		w.originSet = w.originSet.Intersect(r.origin)
	}
	if s.hasOrigin {
		w.originSet = w.originSet.Intersect(s.origin)
	}
	if w.originSet.Empty() {
		return w, false
	}
	w.constrained[2] = r.hasOrigin || s.hasOrigin || r.useOrigin || s.useOrigin
	w.origin = -1
	return w, true
}

func patternsOverlap(r, s *matcher) (string, bool) {
	switch {
	case r.any && s.any:
		return "", true
	case r.any && len(s.pats) > 0:
		w, _ := globIntersect(s.pats[0], s.pats[0])
		return w, true
	case s.any && len(r.pats) > 0:
		w, _ := globIntersect(r.pats[0], r.pats[0])
		return w, true
	}
	for _, rp := range r.pats {
		for _, sp := range s.pats {
			if w, ok := globIntersect(rp, sp); ok {
				return w, true
			}
		}
	}
	return "", false
}

// wider reports an origin in set for which the earlier allow rule r allows a
// region the later rule s does not: for those requests r silently bypasses
// the narrower residency s states.
func (a *analyzer) wider(r, s *Rule, set RegionSet) (int, bool) {
	for o := range set.Indexes() {
		st := evalState{origin: present, originIdx: o}
		x, _ := a.p.resolve(r, &st)
		y, _ := a.p.resolve(s, &st)
		if !x.SubsetOf(y) {
			return o, true
		}
	}
	return -1, false
}

// coveredEarlier reports whether an unconditional allow rule among earlier
// covers the overlap of rules i and j (dimension by dimension, it covers one
// of the two).
func (a *analyzer) coveredEarlier(earlier []int, ok func(int) bool, i, j int) bool {
	ri, rj := &a.p.rules[i], &a.p.rules[j]
	for _, k := range earlier {
		rk := &a.p.rules[k]
		if !ok(k) || rk.cond != nil {
			continue
		}
		t := patternsCover(&rk.tenant, &ri.tenant) || patternsCover(&rk.tenant, &rj.tenant)
		var c bool
		if a.classMasks != nil && !rk.class.any {
			m := a.classMasks[i] & a.classMasks[j]
			c = !(ri.class.any && rj.class.any) && a.classMasks[k]&m == m
		} else {
			c = patternsCover(&rk.class, &ri.class) || patternsCover(&rk.class, &rj.class)
		}
		o := !rk.hasOrigin || allRegions(len(a.p.regions)).SubsetOf(rk.origin) || (ri.hasOrigin && ri.origin.SubsetOf(rk.origin)) || (rj.hasOrigin && rj.origin.SubsetOf(rk.origin))
		if t && c && o {
			return true
		}
	}
	return false
}

// show renders what rule r allows for origin o.
func (a *analyzer) show(r *Rule, o int) string {
	st := evalState{origin: present, originIdx: o}
	set, _ := a.p.resolve(r, &st)
	return "[" + strings.Join(a.p.RegionNames(set), " ") + "]"
}
