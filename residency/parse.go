package residency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Parse decodes and validates a policy file. file names the source in
// problems. On any problem it returns a *ValidationError listing every problem
// found, in file order, and no policy.
func Parse(file string, data []byte) (*Policy, error) {
	p, problems := parse(file, data, true)
	if len(problems) > 0 {
		return nil, &ValidationError{File: file, Problems: problems}
	}
	return p, nil
}

// Validate returns every problem of a policy file, in file order; nil means
// the file parses into a valid policy.
func Validate(file string, data []byte) []Problem {
	_, problems := parse(file, data, true)
	return problems
}

// rulePos keeps the positions of a rule's parts for the analysis pass.
type rulePos struct {
	targets []pos // one per target, as written
}

type pos struct{ line, col int }

// decoder walks the YAML node tree and collects problems.
type decoder struct {
	file     string
	data     []byte
	problems []Problem
}

func (d *decoder) at(line, col int, value, format string, args ...any) {
	if line < 1 {
		line = 1
	}
	if col < 1 {
		col = 1
	}
	d.problems = append(d.problems, Problem{File: d.file, Line: line, Column: col, Value: value, Message: fmt.Sprintf(format, args...)})
}

func (d *decoder) node(n *yaml.Node, value, format string, args ...any) {
	d.at(n.Line, n.Column, value, format, args...)
}

// parse returns the policy (nil when there are problems) and the problems.
// analyze turns on the whole-policy checks (shadowed and contradicting rules).
func parse(file string, data []byte, analyze bool) (*Policy, []Problem) {
	d := &decoder{file: file, data: data}
	p := d.decode(analyze)
	if len(d.problems) > 0 {
		slices.SortStableFunc(d.problems, func(a, b Problem) int {
			if a.Line != b.Line {
				return a.Line - b.Line
			}
			return a.Column - b.Column
		})
		return nil, d.problems
	}
	return p, nil
}

func (d *decoder) decode(analyze bool) *Policy {
	if len(d.data) > MaxPolicyBytes {
		d.at(1, 1, "", "policy file is %d bytes, more than the limit of %d", len(d.data), MaxPolicyBytes)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(d.data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.at(1, 1, "", "policy file is empty")
		} else {
			d.yamlError(err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.at(extra.Line, extra.Column, "", "more than one YAML document: a policy file holds exactly one")
	} else if !errors.Is(err, io.EOF) {
		d.yamlError(err)
	}
	if len(doc.Content) != 1 {
		d.at(1, 1, "", "policy file is empty")
		return nil
	}
	root := doc.Content[0]
	if !d.expect(root, yaml.MappingNode, "the policy") {
		return nil
	}
	sum := sha256.Sum256(d.data)
	p := &Policy{
		file:        d.file,
		digest:      hex.EncodeToString(sum[:]),
		source:      bytes.Clone(d.data),
		regionIndex: map[string]int{},
		zoneIndex:   map[string]int{},
	}
	f := d.fields(root, "the policy", "version", "revision", "description", "regions", "zones", "data_classes", "default", "rules")
	if v := f["version"]; v == nil {
		d.node(root, "", "missing version: write `version: %d` first", FormatVersion)
	} else if d.expect(v.val, yaml.ScalarNode, "version") {
		if n, err := strconv.Atoi(v.val.Value); err != nil || v.val.Tag != "!!int" {
			d.node(v.val, v.val.Value, "version %q is not an integer: this format is version %d", v.val.Value, FormatVersion)
		} else if n != FormatVersion {
			d.node(v.val, v.val.Value, "unsupported version %d: this format is version %d", n, FormatVersion)
		}
	}
	if v := f["revision"]; v != nil {
		p.revision, _ = d.str(v.val, "revision")
	}
	if v := f["description"]; v != nil {
		p.description, _ = d.str(v.val, "description")
	}
	if v := f["regions"]; v == nil {
		d.node(root, "", "missing regions: declare the regions the policy speaks of")
	} else {
		d.regions(p, v.val)
	}
	if v := f["zones"]; v != nil {
		d.zones(p, v.val)
	}
	p.originSet = make([]RegionSet, len(p.regions))
	p.originZoneNames = make([][]string, len(p.regions))
	for i := range p.regions {
		set := allRegions(len(p.regions))
		found := false
		for _, z := range p.zones {
			if z.Regions.Has(i) {
				set = set.Intersect(z.Regions)
				p.originZoneNames[i] = append(p.originZoneNames[i], z.Name)
				found = true
			}
		}
		if !found {
			set = RegionSet{}.With(i)
		}
		p.originSet[i] = set
	}
	if v := f["data_classes"]; v != nil {
		d.dataClasses(p, v.val)
	}
	var env *celEnv
	if v := f["default"]; v == nil {
		d.node(root, "", "missing default: write `default: {allow: [origin]}` to keep requests in their origin zone")
	} else if d.expect(v.val, yaml.MappingNode, "default") {
		df := d.fields(v.val, "default", "allow", "description")
		p.def = Rule{Index: -1, Name: DefaultRuleName, Line: v.key.Line, Column: v.key.Column, Effect: Allow, tenant: matcher{any: true}, class: matcher{any: true}}
		if dd := df["description"]; dd != nil {
			p.def.Description, _ = d.str(dd.val, "description")
		}
		if a := df["allow"]; a == nil {
			d.node(v.val, "", "default has no allow list: write `allow: [origin]` to keep requests in their origin zone, or `allow: []` to deny")
		} else {
			d.targets(p, &p.def, a.val, "default", true)
		}
	}
	if v := f["rules"]; v != nil && d.expect(v.val, yaml.SequenceNode, "rules") {
		if len(v.val.Content) > MaxRules {
			d.node(v.val, "", "%d rules, more than the limit of %d", len(v.val.Content), MaxRules)
		}
		names := map[string]int{}
		var broken []bool
		for i, rn := range v.val.Content {
			if i >= MaxRules {
				break
			}
			before := len(d.problems)
			r := d.rule(p, rn, len(p.rules), names, &env)
			p.rules = append(p.rules, r)
			broken = append(broken, len(d.problems) > before)
		}
		for i := range p.rules {
			if p.rules[i].Effect == Deny {
				p.denyRules = append(p.denyRules, i)
			} else {
				p.allowRules = append(p.allowRules, i)
			}
		}
		if analyze {
			d.analyze(p, broken)
		}
	}
	if p.revision != "" {
		p.id = p.revision + "@sha256:" + p.digest[:12]
	} else {
		p.id = "sha256:" + p.digest[:12]
	}
	return p
}

// yamlError turns a YAML syntax error ("yaml: line N: msg") into a problem.
func (d *decoder) yamlError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 1
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, after, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				line, msg = n, after
				// The YAML library reports parser errors (unlike scanner
				// errors) with a 0-based line.
				if yamlParserProblems[msg] {
					line++
				}
			}
		}
	}
	d.at(line, 1, "", "invalid YAML: %s", msg)
}

var yamlParserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

var kindNames = map[yaml.Kind]string{
	yaml.DocumentNode: "a document",
	yaml.SequenceNode: "a list",
	yaml.MappingNode:  "a mapping",
	yaml.ScalarNode:   "a single value",
	yaml.AliasNode:    "an alias",
}

// expect reports a problem unless n is of the wanted kind. Aliases are
// refused everywhere: a policy should read the same to a person and to us.
func (d *decoder) expect(n *yaml.Node, kind yaml.Kind, what string) bool {
	if n.Kind == yaml.AliasNode {
		d.node(n, "*"+n.Value, "%s: YAML aliases are not supported in policy files; write the value out", what)
		return false
	}
	if n.Kind == kind && !(kind == yaml.ScalarNode && n.Tag == "!!null") {
		return true
	}
	got := kindNames[n.Kind]
	if n.Kind == yaml.ScalarNode {
		if n.Tag == "!!null" {
			got = "nothing"
		} else {
			got = fmt.Sprintf("%q", n.Value)
		}
	}
	d.node(n, n.Value, "%s must be %s, found %s", what, kindNames[kind], got)
	return false
}

type keyVal struct{ key, val *yaml.Node }

// fields reads a mapping, reporting unknown and duplicate keys.
func (d *decoder) fields(n *yaml.Node, what string, known ...string) map[string]*keyVal {
	out := map[string]*keyVal{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !d.expect(k, yaml.ScalarNode, what+" key") {
			continue
		}
		if k.Value == "<<" {
			d.node(k, k.Value, "%s: YAML merge keys are not supported in policy files", what)
			continue
		}
		if !slices.Contains(known, k.Value) {
			d.node(k, k.Value, "unknown field %q in %s (known: %s)", k.Value, what, strings.Join(known, ", "))
			continue
		}
		if prev, dup := out[k.Value]; dup {
			d.node(k, k.Value, "duplicate field %q in %s (first at line %d)", k.Value, what, prev.key.Line)
			continue
		}
		out[k.Value] = &keyVal{k, v}
	}
	return out
}

// str reads a single non-null scalar as written.
func (d *decoder) str(n *yaml.Node, what string) (string, bool) {
	if !d.expect(n, yaml.ScalarNode, what) {
		return "", false
	}
	return n.Value, true
}

// strList reads a single value or a list of values.
func (d *decoder) strList(n *yaml.Node, what string) ([]string, []*yaml.Node, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
		return []string{n.Value}, []*yaml.Node{n}, true
	}
	if !d.expect(n, yaml.SequenceNode, what) {
		return nil, nil, false
	}
	vals := make([]string, 0, len(n.Content))
	nodes := make([]*yaml.Node, 0, len(n.Content))
	for _, c := range n.Content {
		if v, ok := d.str(c, what+" entry"); ok {
			vals = append(vals, v)
			nodes = append(nodes, c)
		}
	}
	return vals, nodes, true
}

// checkName reports a problem unless s is a valid region, zone or rule name.
func (d *decoder) checkName(n *yaml.Node, s, what string) bool {
	if s == "" {
		d.node(n, s, "%s name is empty", what)
		return false
	}
	if len(s) > MaxNameLen {
		d.node(n, s, "%s name %q is longer than %d characters", what, s, MaxNameLen)
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (i > 0 && (c == '-' || c == '_' || c == '.'))) {
			d.node(n, s, "%s name %q: use lower-case letters, digits, '-', '_' and '.', starting with a letter or digit", what, s)
			return false
		}
	}
	return true
}

func (d *decoder) regions(p *Policy, n *yaml.Node) {
	if !d.expect(n, yaml.SequenceNode, "regions") {
		return
	}
	if len(n.Content) == 0 {
		d.node(n, "", "regions is empty: declare at least one region")
	}
	for _, rn := range n.Content {
		var r Region
		var nameNode *yaml.Node
		switch rn.Kind {
		case yaml.ScalarNode:
			nameNode = rn
			r.Name, _ = d.str(rn, "region")
		case yaml.MappingNode:
			f := d.fields(rn, "region", "name", "description", "labels")
			if v := f["name"]; v == nil {
				d.node(rn, "", "region has no name")
				continue
			} else {
				nameNode = v.val
				r.Name, _ = d.str(v.val, "region name")
			}
			if v := f["description"]; v != nil {
				r.Description, _ = d.str(v.val, "region description")
			}
			if v := f["labels"]; v != nil && d.expect(v.val, yaml.MappingNode, "region labels") {
				r.Labels = map[string]string{}
				for i := 0; i+1 < len(v.val.Content); i += 2 {
					k, ok1 := d.str(v.val.Content[i], "label name")
					val, ok2 := d.str(v.val.Content[i+1], "label value")
					if !ok1 || !ok2 {
						continue
					}
					if _, dup := r.Labels[k]; dup {
						d.node(v.val.Content[i], k, "duplicate label %q in region %q", k, r.Name)
						continue
					}
					if k == "" {
						d.node(v.val.Content[i], k, "empty label name in region %q", r.Name)
						continue
					}
					r.Labels[k] = val
				}
			}
		default:
			d.expect(rn, yaml.MappingNode, "a region")
			continue
		}
		if nameNode == nil || !d.checkName(nameNode, r.Name, "region") {
			continue
		}
		if r.Name == TargetOrigin || r.Name == TargetAll {
			d.node(nameNode, r.Name, "region name %q is reserved (it is a target keyword)", r.Name)
			continue
		}
		if prev, dup := p.regionIndex[r.Name]; dup {
			d.node(nameNode, r.Name, "duplicate region %q (first declared at line %d)", r.Name, p.regions[prev].Line)
			continue
		}
		if len(p.regions) == MaxRegions {
			d.node(nameNode, r.Name, "more than %d regions", MaxRegions)
			continue
		}
		r.Line = nameNode.Line
		p.regionIndex[r.Name] = len(p.regions)
		p.regions = append(p.regions, r)
	}
}

func (d *decoder) zones(p *Policy, n *yaml.Node) {
	if !d.expect(n, yaml.MappingNode, "zones") {
		return
	}
	if len(n.Content)/2 > MaxZones {
		d.node(n, "", "%d zones, more than the limit of %d", len(n.Content)/2, MaxZones)
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := d.str(k, "zone name")
		if !ok || !d.checkName(k, name, "zone") {
			continue
		}
		if name == TargetOrigin || name == TargetAll {
			d.node(k, name, "zone name %q is reserved (it is a target keyword)", name)
			continue
		}
		if _, clash := p.regionIndex[name]; clash {
			d.node(k, name, "zone %q has the name of a region: targets would be ambiguous", name)
			continue
		}
		if prev, dup := p.zoneIndex[name]; dup {
			d.node(k, name, "duplicate zone %q (first declared at line %d)", name, p.zones[prev].Line)
			continue
		}
		z := Zone{Name: name, Line: k.Line}
		members, nodes, ok := d.strList(v, "zone "+name)
		if ok && len(members) == 0 {
			d.node(v, "", "zone %q is empty: a zone needs at least one region", name)
		}
		for j, m := range members {
			idx, known := p.regionIndex[m]
			switch {
			case !known:
				d.node(nodes[j], m, "unknown region %q in zone %q (declared regions: %s)", m, name, p.regionList())
			case z.Regions.Has(idx):
				d.node(nodes[j], m, "region %q listed twice in zone %q", m, name)
			default:
				z.Regions = z.Regions.With(idx)
			}
		}
		p.zoneIndex[name] = len(p.zones)
		p.zones = append(p.zones, z)
	}
}

func (p *Policy) regionList() string {
	names := make([]string, len(p.regions))
	for i, r := range p.regions {
		names[i] = r.Name
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func (p *Policy) zoneList() string {
	names := make([]string, len(p.zones))
	for i, z := range p.zones {
		names[i] = z.Name
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func (d *decoder) dataClasses(p *Policy, n *yaml.Node) {
	vals, nodes, ok := d.strList(n, "data_classes")
	if !ok {
		return
	}
	if len(vals) == 0 {
		d.node(n, "", "data_classes is empty: list the data classes, or leave the field out")
	}
	if len(vals) > MaxDataClasses {
		d.node(n, "", "%d data classes, more than the limit of %d", len(vals), MaxDataClasses)
		vals, nodes = vals[:MaxDataClasses], nodes[:MaxDataClasses]
	}
	p.dataClasses = []string{}
	for i, v := range vals {
		lv := strings.ToLower(v)
		switch {
		case !validValue(v) || isGlob(v):
			d.node(nodes[i], v, "data class %q: use 1 to %d letters, digits or -_.:@/+ (no wildcards)", v, MaxValueLen)
		case slices.Contains(p.dataClasses, lv):
			d.node(nodes[i], v, "data class %q declared twice", v)
		default:
			p.dataClasses = append(p.dataClasses, lv)
		}
	}
}

// rule decodes one rule.
func (d *decoder) rule(p *Policy, n *yaml.Node, index int, names map[string]int, env **celEnv) Rule {
	r := Rule{Index: index, Line: n.Line, Column: n.Column, tenant: matcher{any: true, fold: true}, class: matcher{any: true, fold: true}}
	if !d.expect(n, yaml.MappingNode, "a rule") {
		r.Effect = Allow
		return r
	}
	f := d.fields(n, "rule", "name", "description", "match", "condition", "allow", "deny")
	if v := f["name"]; v == nil {
		d.node(n, "", "rule %d has no name", index+1)
	} else if name, ok := d.str(v.val, "rule name"); ok && d.checkName(v.val, name, "rule") {
		switch prev, dup := names[name]; {
		case name == DefaultRuleName:
			d.node(v.val, name, "rule name %q is reserved for the policy's default", name)
		case dup:
			d.node(v.val, name, "duplicate rule name %q (first at line %d)", name, prev)
		default:
			names[name] = n.Line
		}
		r.Name = name
	}
	if r.Name == "" {
		r.Name = fmt.Sprintf("#%d", index+1)
	}
	if v := f["description"]; v != nil {
		r.Description, _ = d.str(v.val, "rule description")
	}
	if v := f["match"]; v != nil && d.expect(v.val, yaml.MappingNode, "match") {
		mf := d.fields(v.val, "match", "tenant", "data_class", "origin_zone")
		if t := mf["tenant"]; t != nil {
			r.Tenants = d.patterns(p, &r, &r.tenant, t.val, "tenant")
		}
		if c := mf["data_class"]; c != nil {
			r.DataClasses = d.patterns(p, &r, &r.class, c.val, "data_class")
		}
		if o := mf["origin_zone"]; o != nil {
			d.originZones(p, &r, o.val)
		}
	}
	allow, deny := f["allow"], f["deny"]
	switch {
	case allow != nil && deny != nil:
		d.node(deny.key, "deny", "rule %q has both allow and deny: a rule does one or the other", r.Name)
		r.Effect = Allow
		d.targets(p, &r, allow.val, "rule "+strconv.Quote(r.Name), true)
	case allow != nil:
		r.Effect = Allow
		d.targets(p, &r, allow.val, "rule "+strconv.Quote(r.Name), true)
	case deny != nil:
		r.Effect = Deny
		d.targets(p, &r, deny.val, "rule "+strconv.Quote(r.Name), false)
	default:
		r.Effect = Allow
		d.node(n, r.Name, "rule %q has neither allow nor deny", r.Name)
	}
	if v := f["condition"]; v != nil {
		if src, ok := d.str(v.val, "condition"); ok {
			r.Condition = src
			if *env == nil {
				e, err := newCELEnv()
				if err != nil {
					d.node(v.val, src, "condition: cannot build the CEL environment: %v", err)
					return r
				}
				*env = e
			}
			r.cond = d.condition(*env, v.val, src, r.Name)
		}
	}
	return r
}

// patterns reads a tenant or data_class match list into m.
func (d *decoder) patterns(p *Policy, r *Rule, m *matcher, n *yaml.Node, what string) []string {
	vals, nodes, ok := d.strList(n, what)
	if !ok {
		return nil
	}
	m.any = false
	if len(vals) == 0 {
		d.node(n, "", "rule %q can never match: its %s list is empty", r.Name, what)
	}
	for i, v := range vals {
		nv := v
		if m.fold {
			nv = strings.ToLower(v)
		}
		if j := slices.Index(m.pats, nv); j >= 0 {
			d.node(nodes[i], v, "rule %q lists %s %q twice", r.Name, what, v)
			continue
		}
		if !d.possible(p, r, nodes[i], v, what) {
			continue
		}
		m.pats = append(m.pats, nv)
		m.glob = append(m.glob, isGlob(nv))
	}
	return vals
}

// possible reports a problem when pattern v can match no well-formed value.
func (d *decoder) possible(p *Policy, r *Rule, n *yaml.Node, v, what string) bool {
	if v == "" {
		d.node(n, v, "rule %q can never match: empty %s pattern", r.Name, what)
		return false
	}
	fixed := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '*' {
			continue
		}
		fixed++
		if c != '?' && !valueByte(c) {
			d.node(n, v, "rule %q can never match: %s pattern %q holds %q, which no %s can contain (letters, digits and -_.:@/+ only)", r.Name, what, v, string(c), what)
			return false
		}
	}
	if fixed > MaxValueLen {
		d.node(n, v, "rule %q can never match: %s pattern %q needs more than %d characters", r.Name, what, v, MaxValueLen)
		return false
	}
	if what == "data_class" && p.dataClasses != nil {
		lv := strings.ToLower(v)
		if !slices.ContainsFunc(p.dataClasses, func(c string) bool { return globMatch(lv, c, true) }) {
			d.node(n, v, "rule %q can never match: data_class %q matches no declared data class (%s)", r.Name, v, strings.Join(p.dataClasses, ", "))
			return false
		}
	}
	return true
}

func (d *decoder) originZones(p *Policy, r *Rule, n *yaml.Node) {
	vals, nodes, ok := d.strList(n, "origin_zone")
	if !ok {
		return
	}
	r.hasOrigin = true
	if len(vals) == 0 {
		d.node(n, "", "rule %q can never match: its origin_zone list is empty", r.Name)
	}
	for i, v := range vals {
		zi, known := p.zoneIndex[v]
		switch {
		case !known:
			hint := ""
			if _, isRegion := p.regionIndex[v]; isRegion {
				hint = "; it is a region, and origin_zone takes zones"
			}
			d.node(nodes[i], v, "unknown zone %q in rule %q origin_zone (zones: %s)%s", v, r.Name, p.zoneList(), hint)
			continue
		case slices.Contains(r.OriginZones, v):
			d.node(nodes[i], v, "rule %q lists origin_zone %q twice", r.Name, v)
			continue
		}
		r.OriginZones = append(r.OriginZones, v)
		r.origin = r.origin.Union(p.zones[zi].Regions)
	}
}

// targets reads an allow or deny list: zone names, region names, `origin`
// and `all`.
func (d *decoder) targets(p *Policy, r *Rule, n *yaml.Node, what string, allow bool) {
	vals, nodes, ok := d.strList(n, what+" "+map[bool]string{true: "allow", false: "deny"}[allow])
	if !ok {
		return
	}
	if len(vals) == 0 && !allow {
		d.node(n, "", "%s has an empty deny list: it would deny nothing", what)
	}
	for i, v := range vals {
		if slices.Contains(r.Targets, v) {
			d.node(nodes[i], v, "%s lists %q twice", what, v)
			continue
		}
		switch {
		case v == TargetOrigin:
			r.useOrigin = true
		case v == TargetAll:
			r.static = allRegions(len(p.regions))
		default:
			if zi, ok := p.zoneIndex[v]; ok {
				r.static = r.static.Union(p.zones[zi].Regions)
			} else if ri, ok := p.regionIndex[v]; ok {
				r.static = r.static.With(ri)
			} else {
				d.node(nodes[i], v, "unknown zone or region %q in %s (zones: %s; regions: %s; or origin, all)", v, what, p.zoneList(), p.regionList())
				continue
			}
		}
		r.Targets = append(r.Targets, v)
		r.pos.targets = append(r.pos.targets, pos{nodes[i].Line, nodes[i].Column})
	}
}
