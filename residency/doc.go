// Package residency reads data-residency policy files and decides, for one
// request, the regions it may be served in.
//
// Its one job: turn a policy file (YAML bytes) into an immutable Policy with
// every problem reported at its file, line and column, and evaluate that
// policy on request attributes without I/O, locks or (for rules without
// conditions) allocations. It is pure: no files, network, clock or globals;
// callers read files and hand over bytes. It imports nothing of Meridian's,
// nor anything that pulls in net/http, Kafka or Prometheus (the root's
// deps_test.go checks both); the regional router, the DR drill, the
// scenarios and the CLI import it.
//
// Invariants:
//   - Evaluate never allows a region outside the targets of the allow rule (or
//     default) that decided, and never one a matching deny rule names.
//   - It fails closed: when a rule that might apply needs an attribute the
//     request lacks or carries malformed, or a condition cannot be evaluated,
//     the decision allows nothing and says which rule and attribute.
//   - A policy that Parse returns has no problems; Validate and Parse agree.
//   - Every decision carries the policy's ID (revision and content digest).
//
// # Policy file format, version 1
//
// A policy file is one YAML document, a mapping with these fields (unknown
// fields, duplicate keys, YAML aliases and merge keys are problems):
//
//	version: 1                  # required: the format version, the integer 1
//	revision: "2026-01-15.1"    # optional: names this policy in decisions and audit records
//	description: "..."          # optional
//	regions: [...]              # required: the regions the policy speaks of
//	zones: {...}                # optional: named sets of regions
//	data_classes: [...]         # optional: the known X-Data-Class values
//	rules: [...]                # optional: allow and deny rules, in order
//	default: {allow: [...]}     # required: what applies when no allow rule matches
//
// regions is a list; each entry is a region name, or a mapping with name,
// description and labels (a mapping of strings, free-form metadata):
//
//	regions:
//	  - us-east-1
//	  - name: eu-west-1
//	    labels: {provider: aws, country: IE}
//
// Names of regions, zones and rules are 1 to 63 characters of lower-case
// letters, digits, '-', '_' and '.', starting with a letter or digit. At most
// 128 regions (a RegionSet is a 128-bit mask over the region list, in
// declaration order), 256 zones, 64 declared data classes and 4096 rules.
//
// zones maps a zone name to a non-empty list of declared regions. A zone may
// not share a name with a region, and "origin" and "all" are reserved. A
// region may belong to several zones, or to none.
//
//	zones:
//	  us: [us-east-1, us-west-2]
//	  eu: [eu-west-1]
//
// data_classes, when present, lists the data classes the policy knows (values
// of the X-Data-Class header; compared case-insensitively). Validate then
// reports data_class patterns that match none of them (typos), and a request
// whose data class is not in the list has an unknown data class: rules that
// constrain data_class do not match it (so it ends at a rule that does not
// look at the data class, or at the default), while rules that do not look at
// the data class still apply. Without data_classes every value is matched
// against the patterns as is.
//
// Each rule is a mapping:
//
//	rules:
//	  - name: eu-health-phi       # required, unique; "default" is reserved
//	    description: "..."        # optional
//	    match:                    # optional; each field a value or a list
//	      tenant: [eu-health, "acme-*"]   # X-Tenant-Id: exact values or globs
//	      data_class: phi                 # X-Data-Class: exact values or globs
//	      origin_zone: eu                 # zones the origin region belongs to
//	    condition: 'model.startsWith("llama")'   # optional CEL, see below
//	    allow: [eu]               # or deny: [...]; exactly one of the two
//
// A rule matches a request when every field it gives matches: tenant and
// data_class when the request's value matches any listed pattern, origin_zone
// when the origin region belongs to any listed zone, and the condition when
// it evaluates to true. A field left out matches anything, including an
// absent value; a rule without match matches every request. A glob uses '*'
// (any run of characters, none included) and '?' (one character); nothing
// else is special. Tenant and data-class values are 1 to 256 characters of
// letters, digits and -_.:@/+; tenants compare case-sensitively, data classes
// case-insensitively.
//
// The targets of allow and deny are zone names, region names, "origin" (the
// origin zone: the regions common to every zone that holds the origin region,
// or the origin region alone when no zone holds it) and "all" (every declared
// region). An allow list may be empty (allow: [] allows nothing); a deny list
// may not.
//
// # Precedence
//
// Evaluate computes the decision in two passes:
//
//  1. Allow: the allow rules are tried in file order and the first that
//     matches decides the allowed set (first match wins; specificity plays no
//     part, so put narrow rules before broad ones). When none matches, the
//     default decides. The shipped default is allow: [origin], "stay in the
//     origin zone"; unknown tenants and data classes therefore stay home.
//  2. Deny overrides allow: every deny rule that matches, wherever it stands
//     in the file, removes its targets from that set.
//
// The decision names the allow rule or default that decided (Rule), the first
// deny rule in file order that removed a region (DeniedBy), and the policy ID.
//
// Fail closed. A rule that constrains an attribute the request lacks (or
// carries malformed: not 1-256 characters of the value alphabet) cannot be
// decided. If no other field of the rule already rules the request out, the
// evaluation stops there and allows nothing (OutcomeMissingAttribute,
// OutcomeMalformedAttribute, naming the rule and the attribute). This holds
// for allow rules tried before the deciding one and for every deny rule: a
// deny rule keyed on tenant fails closed a request without a tenant, since it
// might have been meant for it. An origin region that the policy does not
// declare fails closed wherever the origin zone is needed (origin_zone, the
// "origin" target, conditions reading the origin) as OutcomeUnknownOrigin.
//
// # Conditions
//
// A condition is a CEL expression (cel.dev/cel-go) that must type-check to
// bool, over these variables:
//
//	tenant, data_class, origin_region  string   residency keys: a condition reading
//	                                             an absent one fails closed
//	origin_zones                        list(string)  zones holding the origin region
//	session, model                      string   "" when absent
//	labels                              map(string, string)  other request metadata
//
// Its estimated worst-case cost (strings up to 256 characters, up to 64
// labels) must stay within MaxConditionCost, and evaluation stops at that
// budget. A condition that errs at run time (a missing map key, the budget)
// fails the decision closed (OutcomeConditionError): test keys with
// `"k" in labels` first. Conditions are for what globs cannot say; rules with
// conditions cost allocations, rules without do not.
//
// # Validation
//
// Parse and Validate report every problem, each as FILE:LINE:COL: message
// with the offending value: YAML syntax, unknown or duplicate fields, wrong
// types, bad or unsupported version, bad or reserved names, duplicate
// regions, zones, rules, labels and list entries, empty zones, unknown
// regions and zones, rules with neither or both of allow and deny, empty
// match or deny lists, patterns that can never match (a character no value
// can hold, or no declared data class), CEL that does not compile, is not
// boolean or costs too much, and these whole-policy checks:
//
//   - shadowed: an allow rule after an unconditional allow rule that matches
//     every request it matches can never decide;
//   - overlapping and contradicting: two unconditional allow rules, neither
//     covering the other, that some request matches both of (an example is
//     given), where the earlier one allows a region the later one does not,
//     unless an earlier rule already decides their overlap. For those requests
//     the order silently bypasses the narrower residency the later rule
//     states: make the rules disjoint or add an earlier rule for the overlap.
//     (A later rule that covers an earlier one is the usual "narrow first,
//     broad later" idiom, and an earlier rule that allows less is safe; neither
//     is reported.);
//   - contradicted by deny: an allow target (or a target of the default) that
//     unconditional deny rules matching every request of the rule always
//     remove entirely.
//
// The checks are sound but not complete: what they report holds for every
// request, and some redundancies go unreported.
//
// # Shadow mode and diffs
//
// Shadow evaluates a candidate policy beside the active one on each request
// (without allocating, for rules without conditions), and Diff runs it over a
// list of requests, reporting those the two decide differently (by region names, so the two may
// declare different regions); DiffStructure lists regions, zones, data
// classes, rules and default added, removed, changed or moved between two
// policies.
package residency
