package residency

import (
	"slices"
	"strings"
)

// FormatVersion is the policy file format this package reads (the file's
// top-level `version`).
const FormatVersion = 1

// Limits on a policy's size; Parse reports a problem past any of them.
const (
	MaxPolicyBytes = 4 << 20 // bytes of one policy file
	MaxZones       = 256
	MaxRules       = 4096
	MaxNameLen     = 63 // region, zone and rule names
	MaxDataClasses = 64 // declared data classes
)

// Reserved target keywords in allow and deny lists; no zone or region may use
// these names.
const (
	TargetOrigin = "origin" // the origin zone of the request
	TargetAll    = "all"    // every declared region
)

// DefaultRuleName names the policy's default in decisions; no rule may use it.
const DefaultRuleName = "default"

// Effect says what a rule does when it matches.
type Effect uint8

const (
	// Allow: the first matching allow rule gives the regions a request may be
	// served in.
	Allow Effect = iota + 1
	// Deny: every matching deny rule removes its regions from that set.
	Deny
)

func (e Effect) String() string {
	switch e {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	}
	return "unknown"
}

// Region is one declared region. Its index in Policy.Regions is its bit in a
// RegionSet.
type Region struct {
	Name        string
	Description string
	Labels      map[string]string // free-form metadata (provider, country, ...)
	Line        int
}

// Zone is a named set of regions.
type Zone struct {
	Name    string
	Regions RegionSet
	Line    int
}

// Rule is one compiled rule (or the default, with Index -1). The exported
// fields are the rule as written; the unexported ones are what Evaluate reads.
type Rule struct {
	Index       int // position among the policy's rules, 0-based; -1 for the default
	Name        string
	Description string
	Line        int
	Column      int
	Effect      Effect
	Tenants     []string // tenant patterns as written; nil: any tenant
	DataClasses []string // data-class patterns as written; nil: any data class
	OriginZones []string // origin zone names; nil: any origin
	Condition   string   // CEL expression; "": none
	Targets     []string // the allow or deny list as written

	tenant    matcher
	class     matcher
	hasOrigin bool
	origin    RegionSet // origins the rule matches (when hasOrigin)
	static    RegionSet // regions named by zone, region or `all` targets
	useOrigin bool      // the targets include `origin`
	cond      *condition
	pos       rulePos
}

// Ref returns the reference decisions carry for r.
func (r *Rule) Ref() RuleRef { return RuleRef{Index: r.Index, Name: r.Name, Line: r.Line} }

// matcher matches one string attribute against a list of patterns.
type matcher struct {
	any  bool     // the rule does not constrain this attribute
	pats []string // exact values or globs (lower-cased for data classes)
	glob []bool
	fold bool
}

func (m *matcher) match(v string) bool {
	for i, p := range m.pats {
		if m.glob[i] {
			if globMatch(p, v, m.fold) {
				return true
			}
		} else if p == v || (m.fold && strings.EqualFold(p, v)) {
			return true
		}
	}
	return false
}

// Policy is a parsed, validated residency policy. It is immutable and safe for
// concurrent use; Evaluate is the request-path call.
type Policy struct {
	file        string
	revision    string
	description string
	digest      string // hex SHA-256 of the source bytes
	id          string
	source      []byte

	regions     []Region
	regionIndex map[string]int
	zones       []Zone
	zoneIndex   map[string]int
	dataClasses []string // declared, lower-case; nil: not declared
	rules       []Rule
	allowRules  []int // indexes into rules, in order
	denyRules   []int
	def         Rule

	originSet       []RegionSet // per region: the regions of its origin zone
	originZoneNames [][]string  // per region: names of the zones holding it
}

// File returns the file name the policy was parsed from.
func (p *Policy) File() string { return p.file }

// Revision returns the policy's `revision` as written ("" when absent).
func (p *Policy) Revision() string { return p.revision }

// Description returns the policy's `description`.
func (p *Policy) Description() string { return p.description }

// Digest returns the hex SHA-256 of the policy's source bytes.
func (p *Policy) Digest() string { return p.digest }

// ID identifies this policy content in decisions and audit records: the
// revision followed by "@sha256:" and the first 12 hex digits of the digest,
// or only the latter when there is no revision.
func (p *Policy) ID() string { return p.id }

// Source returns the bytes the policy was parsed from. Callers must not modify
// them.
func (p *Policy) Source() []byte { return p.source }

// Regions returns the declared regions; index i is bit i of a RegionSet.
// Callers must not modify the slice.
func (p *Policy) Regions() []Region { return p.regions }

// Zones returns the zones in file order. Callers must not modify the slice.
func (p *Policy) Zones() []Zone { return p.zones }

// Rules returns the rules in file order. Callers must not modify the slice.
func (p *Policy) Rules() []Rule { return p.rules }

// Default returns the policy's default (an allow rule with Index -1).
func (p *Policy) Default() *Rule { return &p.def }

// DataClasses returns the declared data classes (nil when the policy declares
// none).
func (p *Policy) DataClasses() []string { return p.dataClasses }

// RegionIndex returns the index of the named region.
func (p *Policy) RegionIndex(name string) (int, bool) {
	i, ok := p.regionIndex[name]
	return i, ok
}

// Zone returns the named zone.
func (p *Policy) Zone(name string) (Zone, bool) {
	i, ok := p.zoneIndex[name]
	if !ok {
		return Zone{}, false
	}
	return p.zones[i], true
}

// RegionNames returns the names of the regions in s, in declaration order.
func (p *Policy) RegionNames(s RegionSet) []string {
	names := make([]string, 0, s.Len())
	for i := range s.Indexes() {
		if i < len(p.regions) {
			names = append(names, p.regions[i].Name)
		}
	}
	return names
}

// RegionSetOf returns the set of the named regions; unknown names are
// reported in the second result.
func (p *Policy) RegionSetOf(names ...string) (RegionSet, []string) {
	var s RegionSet
	var unknown []string
	for _, n := range names {
		if i, ok := p.regionIndex[n]; ok {
			s = s.With(i)
		} else {
			unknown = append(unknown, n)
		}
	}
	return s, unknown
}

// OriginZone returns the regions a request from the named region may stay in
// under `origin`: the regions common to every zone holding it (the region
// alone when no zone holds it).
func (p *Policy) OriginZone(region string) (RegionSet, bool) {
	i, ok := p.regionIndex[region]
	if !ok {
		return RegionSet{}, false
	}
	return p.originSet[i], true
}

// ZonesOf returns the names of the zones holding the named region.
func (p *Policy) ZonesOf(region string) []string {
	i, ok := p.regionIndex[region]
	if !ok {
		return nil
	}
	return slices.Clone(p.originZoneNames[i])
}
