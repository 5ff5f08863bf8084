package residency

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Shadow evaluates a candidate policy beside the active one: the active
// decision is enforced, the candidate's only observed. Both policies are
// immutable, so a Shadow is safe for concurrent use.
type Shadow struct {
	Active, Candidate *Policy
}

// Evaluate returns both decisions and whether they allow different regions.
func (s Shadow) Evaluate(a Attributes) (active, candidate Decision, differ bool) {
	active = s.Active.Evaluate(a)
	candidate = s.Candidate.Evaluate(a)
	return active, candidate, !active.SameRegions(candidate)
}

// Difference is one request two policies decide differently.
type Difference struct {
	Index     int        // position in the attributes given to Diff
	Attrs     Attributes // the request
	Active    Decision
	Candidate Decision
}

// String renders the difference on one line.
func (d Difference) String() string {
	return fmt.Sprintf("%s: [%s] by %s -> [%s] by %s", FormatAttributes(d.Attrs),
		strings.Join(d.Active.Regions(), " "), d.Active.Reason(),
		strings.Join(d.Candidate.Regions(), " "), d.Candidate.Reason())
}

// Diff evaluates every request under both policies and returns those whose
// allowed regions (by name) differ, in input order.
func Diff(active, candidate *Policy, attrs []Attributes) []Difference {
	var out []Difference
	s := Shadow{Active: active, Candidate: candidate}
	for i, a := range attrs {
		x, y, differ := s.Evaluate(a)
		if differ {
			out = append(out, Difference{Index: i, Attrs: a, Active: x, Candidate: y})
		}
	}
	return out
}

// FormatAttributes renders attributes as key=value pairs, absent ones left
// out, labels sorted.
func FormatAttributes(a Attributes) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("tenant", a.Tenant)
	add("data_class", a.DataClass)
	add("origin_region", a.OriginRegion)
	add("session", a.Session)
	add("model", a.Model)
	for _, k := range slices.Sorted(maps.Keys(a.Labels)) {
		parts = append(parts, "labels."+k+"="+a.Labels[k])
	}
	if len(parts) == 0 {
		return "(no attributes)"
	}
	return strings.Join(parts, " ")
}

// ChangeKind says how an element differs between two policies.
type ChangeKind string

const (
	Added   ChangeKind = "added"
	Removed ChangeKind = "removed"
	Changed ChangeKind = "changed"
	Moved   ChangeKind = "moved" // a rule whose position among the common rules changed
)

// Change is one structural difference between two policies.
type Change struct {
	Kind    ChangeKind `json:"kind"`
	Object  string     `json:"object"` // version, revision, region, zone, data_classes, rule, default
	Name    string     `json:"name,omitempty"`
	Old     string     `json:"old,omitempty"` // description in the old policy
	New     string     `json:"new,omitempty"` // description in the new policy
	OldLine int        `json:"old_line,omitempty"`
	NewLine int        `json:"new_line,omitempty"`
}

// String renders the change on one line: "+ rule x: ...", "- zone y: ...",
// "~ rule z: OLD -> NEW", "> rule w: moved from 2 to 3".
func (c Change) String() string {
	what := c.Object
	if c.Name != "" {
		what += " " + c.Name
	}
	switch c.Kind {
	case Added:
		return "+ " + what + ": " + c.New
	case Removed:
		return "- " + what + ": " + c.Old
	case Moved:
		return "> " + what + ": moved from position " + c.Old + " to " + c.New
	}
	return "~ " + what + ": " + c.Old + " -> " + c.New
}

// DiffStructure lists what differs between two policies: revision, regions,
// zones (by region names), data classes, rules (by name: added, removed,
// changed, moved) and the default, in that order.
func DiffStructure(old, new *Policy) []Change {
	var out []Change
	if old.revision != new.revision {
		out = append(out, Change{Kind: Changed, Object: "revision", Old: strconv.Quote(old.revision), New: strconv.Quote(new.revision)})
	}
	// Regions.
	for _, r := range old.regions {
		if _, ok := new.regionIndex[r.Name]; !ok {
			out = append(out, Change{Kind: Removed, Object: "region", Name: r.Name, Old: describeRegion(r), OldLine: r.Line})
		}
	}
	for _, r := range new.regions {
		i, ok := old.regionIndex[r.Name]
		switch {
		case !ok:
			out = append(out, Change{Kind: Added, Object: "region", Name: r.Name, New: describeRegion(r), NewLine: r.Line})
		case describeRegion(old.regions[i]) != describeRegion(r):
			out = append(out, Change{Kind: Changed, Object: "region", Name: r.Name, Old: describeRegion(old.regions[i]), New: describeRegion(r), OldLine: old.regions[i].Line, NewLine: r.Line})
		}
	}
	// Zones.
	for _, z := range old.zones {
		if _, ok := new.zoneIndex[z.Name]; !ok {
			out = append(out, Change{Kind: Removed, Object: "zone", Name: z.Name, Old: old.describeSet(z.Regions), OldLine: z.Line})
		}
	}
	for _, z := range new.zones {
		i, ok := old.zoneIndex[z.Name]
		switch {
		case !ok:
			out = append(out, Change{Kind: Added, Object: "zone", Name: z.Name, New: new.describeSet(z.Regions), NewLine: z.Line})
		case old.describeSet(old.zones[i].Regions) != new.describeSet(z.Regions):
			out = append(out, Change{Kind: Changed, Object: "zone", Name: z.Name, Old: old.describeSet(old.zones[i].Regions), New: new.describeSet(z.Regions), OldLine: old.zones[i].Line, NewLine: z.Line})
		}
	}
	// Data classes.
	if oc, nc := describeClasses(old.dataClasses), describeClasses(new.dataClasses); oc != nc {
		out = append(out, Change{Kind: Changed, Object: "data_classes", Old: oc, New: nc})
	}
	// Rules.
	oldByName := map[string]int{}
	for i := range old.rules {
		oldByName[old.rules[i].Name] = i
	}
	newByName := map[string]int{}
	for i := range new.rules {
		newByName[new.rules[i].Name] = i
	}
	var oldCommon, newCommon []string
	for i := range old.rules {
		r := &old.rules[i]
		if _, ok := newByName[r.Name]; !ok {
			out = append(out, Change{Kind: Removed, Object: "rule", Name: r.Name, Old: r.Describe(), OldLine: r.Line})
		} else {
			oldCommon = append(oldCommon, r.Name)
		}
	}
	for i := range new.rules {
		r := &new.rules[i]
		j, ok := oldByName[r.Name]
		if !ok {
			out = append(out, Change{Kind: Added, Object: "rule", Name: r.Name, New: r.Describe(), NewLine: r.Line})
			continue
		}
		newCommon = append(newCommon, r.Name)
		if o := &old.rules[j]; o.Describe() != r.Describe() {
			out = append(out, Change{Kind: Changed, Object: "rule", Name: r.Name, Old: o.Describe(), New: r.Describe(), OldLine: o.Line, NewLine: r.Line})
		}
	}
	// Order matters for allow rules (first match): report rules whose position
	// among the rules both policies have changed.
	for k, name := range newCommon {
		if oldCommon[k] != name {
			ok := slices.Index(oldCommon, name)
			out = append(out, Change{Kind: Moved, Object: "rule", Name: name, Old: strconv.Itoa(ok + 1), New: strconv.Itoa(k + 1),
				OldLine: old.rules[oldByName[name]].Line, NewLine: new.rules[newByName[name]].Line})
		}
	}
	if o, n := old.def.Describe(), new.def.Describe(); o != n {
		out = append(out, Change{Kind: Changed, Object: "default", Old: o, New: n, OldLine: old.def.Line, NewLine: new.def.Line})
	}
	return out
}

func describeRegion(r Region) string {
	if len(r.Labels) == 0 {
		return "no labels"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		parts = append(parts, k+"="+r.Labels[k])
	}
	return "labels " + strings.Join(parts, " ")
}

func describeClasses(c []string) string {
	if c == nil {
		return "not declared"
	}
	s := slices.Clone(c)
	slices.Sort(s)
	return "[" + strings.Join(s, " ") + "]"
}

func (p *Policy) describeSet(s RegionSet) string {
	names := p.RegionNames(s)
	slices.Sort(names)
	return "[" + strings.Join(names, " ") + "]"
}

// Describe renders a rule's meaning in one line (without its name and
// description), e.g. `tenant=[a b*] data_class=[phi] if "..." -> allow [eu]`.
func (r *Rule) Describe() string {
	var parts []string
	if r.Tenants != nil {
		parts = append(parts, "tenant=["+strings.Join(r.Tenants, " ")+"]")
	}
	if r.DataClasses != nil {
		parts = append(parts, "data_class=["+strings.Join(r.DataClasses, " ")+"]")
	}
	if r.OriginZones != nil {
		parts = append(parts, "origin_zone=["+strings.Join(r.OriginZones, " ")+"]")
	}
	if r.Condition != "" {
		parts = append(parts, "if "+strconv.Quote(r.Condition))
	}
	if len(parts) == 0 {
		parts = append(parts, "any request")
	}
	return strings.Join(parts, " ") + " -> " + r.Effect.String() + " [" + strings.Join(r.Targets, " ") + "]"
}
