package residency

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

func mustParse(t testing.TB, src string) *Policy {
	t.Helper()
	p, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func examplePolicy(t testing.TB) *Policy {
	t.Helper()
	data, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse("example.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type evalCase struct {
	name    string
	attrs   Attributes
	regions string // space-separated allowed regions
	outcome Outcome
	rule    string // deciding (or failing) rule
	denied  string // DeniedBy rule, "" for none
	attr    Attr
}

func checkEval(t *testing.T, p *Policy, cases []evalCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := p.Evaluate(c.attrs)
			if got := strings.Join(d.Regions(), " "); got != c.regions {
				t.Errorf("regions = [%s], want [%s] (%s)", got, c.regions, d)
			}
			if d.Outcome != c.outcome || d.Rule.Name != c.rule || d.DeniedBy.Name != c.denied || d.Attr != c.attr {
				t.Errorf("got outcome=%s rule=%q denied=%q attr=%s, want %s %q %q %s (%s)",
					d.Outcome, d.Rule.Name, d.DeniedBy.Name, d.Attr, c.outcome, c.rule, c.denied, c.attr, d)
			}
			if d.PolicyID != p.ID() || d.Policy() != p {
				t.Errorf("decision policy %q, want %q", d.PolicyID, p.ID())
			}
			if c.outcome.FailedClosed() && !d.Allowed.Empty() {
				t.Errorf("failed closed but allows %v", d.Regions())
			}
		})
	}
}

func TestEvaluateExamplePolicy(t *testing.T) {
	p := examplePolicy(t)
	batch := map[string]string{"priority": "batch"}
	checkEval(t, p, []evalCase{
		{"eu phi tenant stays in eu from eu", Attributes{Tenant: "eu-health", DataClass: "phi", OriginRegion: "eu-west-1"}, "eu-west-1", OutcomeRule, "eu-health-phi", "", 0},
		{"eu phi tenant stays in eu from us", Attributes{Tenant: "eu-health", DataClass: "phi", OriginRegion: "us-east-1"}, "eu-west-1", OutcomeRule, "eu-health-phi", "", 0},
		{"eu tenant data class is case-insensitive", Attributes{Tenant: "eu-health", DataClass: "PHI", OriginRegion: "us-east-1"}, "eu-west-1", OutcomeRule, "eu-health-phi", "", 0},
		{"eu tenant public data", Attributes{Tenant: "eu-health", DataClass: "public", OriginRegion: "eu-west-1"}, "us-east-1 us-west-2 eu-west-1", OutcomeRule, "public-from-eu", "", 0},
		{"other phi stays home", Attributes{Tenant: "acme", DataClass: "phi", OriginRegion: "us-west-2"}, "us-east-1 us-west-2", OutcomeRule, "phi-and-pii-stay-home", "", 0},
		{"pii stays home in eu", Attributes{Tenant: "acme", DataClass: "pii", OriginRegion: "eu-west-1"}, "eu-west-1", OutcomeRule, "phi-and-pii-stay-home", "", 0},
		{"public from us stays in us", Attributes{Tenant: "acme", DataClass: "public", OriginRegion: "us-east-1"}, "us-east-1 us-west-2", OutcomeRule, "public-anywhere-in-origin", "", 0},
		{"condition true", Attributes{Tenant: "acme", DataClass: "public", OriginRegion: "us-east-1", Session: "eval-7", Labels: batch}, "us-east-1 us-west-2 eu-west-1", OutcomeRule, "us-batch-eval", "", 0},
		{"condition false", Attributes{Tenant: "acme", DataClass: "public", OriginRegion: "us-east-1", Session: "chat-7", Labels: batch}, "us-east-1 us-west-2", OutcomeRule, "public-anywhere-in-origin", "", 0},
		{"condition without the label", Attributes{Tenant: "acme", DataClass: "public", OriginRegion: "us-east-1", Session: "eval-7"}, "us-east-1 us-west-2", OutcomeRule, "public-anywhere-in-origin", "", 0},
		{"embargoed tenant denied everywhere", Attributes{Tenant: "embargoed-co", DataClass: "public", OriginRegion: "eu-west-1"}, "", OutcomeRule, "public-from-eu", "embargoed-tenants", 0},
		{"unknown data class takes the default", Attributes{Tenant: "acme", DataClass: "secret", OriginRegion: "eu-west-1"}, "eu-west-1", OutcomeDefault, "default", "", 0},
		{"missing data class fails closed", Attributes{Tenant: "acme", OriginRegion: "eu-west-1"}, "", OutcomeMissingAttribute, "phi-and-pii-stay-home", "", AttrDataClass},
		{"missing tenant fails closed on a tenant rule that might apply", Attributes{DataClass: "phi", OriginRegion: "eu-west-1"}, "", OutcomeMissingAttribute, "eu-health-phi", "", AttrTenant},
		{"malformed tenant fails closed", Attributes{Tenant: "eu health", DataClass: "phi", OriginRegion: "eu-west-1"}, "", OutcomeMalformedAttribute, "eu-health-phi", "", AttrTenant},
		{"missing origin fails closed", Attributes{Tenant: "acme", DataClass: "pii"}, "", OutcomeMissingAttribute, "phi-and-pii-stay-home", "", AttrOriginRegion},
		{"unknown origin fails closed", Attributes{Tenant: "acme", DataClass: "pii", OriginRegion: "ap-southeast-1"}, "", OutcomeUnknownOrigin, "phi-and-pii-stay-home", "", AttrOriginRegion},
		{"unknown origin is fine where not needed", Attributes{Tenant: "eu-health", DataClass: "phi", OriginRegion: "ap-southeast-1"}, "eu-west-1", OutcomeRule, "eu-health-phi", "", 0},
	})
}

const precedence = `version: 1
regions: [a1, a2, b1, c1]
zones:
  a: [a1, a2]
  b: [b1]
  ab: [a1, a2, b1]
rules:
  - name: deny-early
    match: {tenant: t-deny}
    deny: [a2]
  - name: first
    match: {tenant: "t-*"}
    allow: [ab]
  - name: second
    match: {tenant: "t-*", data_class: x}
    allow: [b]
  - name: deny-late
    match: {tenant: "t-*", data_class: y}
    deny: [b1, a2]
  - name: deny-origin
    match: {tenant: t-home}
    deny: [origin]
  - name: all-for-u
    match: {tenant: u}
    allow: [all]
default: {allow: [origin]}
`

// TestEvaluatePrecedence pins the documented precedence: first matching allow
// rule, then every matching deny rule removes its regions wherever it stands;
// DeniedBy is the first deny rule that removed something.
func TestEvaluatePrecedence(t *testing.T) {
	p, problems := parse("t.yaml", []byte(precedence), false) // "second" is shadowed on purpose
	if problems != nil {
		t.Fatal(problems)
	}
	checkEval(t, p, []evalCase{
		{"first match wins over a more specific later rule", Attributes{Tenant: "t-1", DataClass: "x", OriginRegion: "c1"}, "a1 a2 b1", OutcomeRule, "first", "", 0},
		{"deny before the allow rule still applies", Attributes{Tenant: "t-deny", DataClass: "z", OriginRegion: "c1"}, "a1 b1", OutcomeRule, "first", "deny-early", 0},
		{"deny after the allow rule applies", Attributes{Tenant: "t-1", DataClass: "y", OriginRegion: "c1"}, "a1", OutcomeRule, "first", "deny-late", 0},
		{"first deny that removed something is named", Attributes{Tenant: "t-deny", DataClass: "y", OriginRegion: "c1"}, "a1", OutcomeRule, "first", "deny-early", 0},
		{"deny origin", Attributes{Tenant: "t-home", DataClass: "z", OriginRegion: "a1"}, "b1", OutcomeRule, "first", "deny-origin", 0},
		{"all", Attributes{Tenant: "u", DataClass: "z", OriginRegion: "a1"}, "a1 a2 b1 c1", OutcomeRule, "all-for-u", "", 0},
		{"unknown tenant takes the default", Attributes{Tenant: "v", DataClass: "z", OriginRegion: "a1"}, "a1 a2", OutcomeDefault, "default", "", 0},
		{"origin is the intersection of the zones holding it", Attributes{Tenant: "v", DataClass: "z", OriginRegion: "b1"}, "b1", OutcomeDefault, "default", "", 0},
		{"origin in no zone is the region alone", Attributes{Tenant: "v", OriginRegion: "c1"}, "c1", OutcomeDefault, "default", "", 0},
		{"a rule ruled out by another attribute does not need the missing one", Attributes{Tenant: "v", OriginRegion: "a2"}, "a1 a2", OutcomeDefault, "default", "", 0},
		{"missing data class under a rule that might match", Attributes{Tenant: "t-1", OriginRegion: "a2"}, "", OutcomeMissingAttribute, "deny-late", "", AttrDataClass},
	})
}

func TestEvaluateConditions(t *testing.T) {
	p := mustParse(t, `version: 1
regions: [a, b]
zones: {za: [a], zb: [b]}
rules:
  - name: by-model
    condition: 'model.startsWith("llama") && origin_zones.exists(z, z == "za")'
    allow: [zb]
  - name: by-tenant
    match: {data_class: x}
    condition: 'tenant.endsWith("-eu")'
    allow: [za]
  - name: label
    match: {data_class: l}
    condition: 'labels["k"] == "v"'
    allow: [all]
  - name: costly
    match: {data_class: c}
    condition: 'labels.exists(k, k.matches("^(a+)+$"))'
    deny: [a]
default: {allow: [origin]}
`)
	checkEval(t, p, []evalCase{
		{"condition over model and origin zones", Attributes{Tenant: "t", DataClass: "z", Model: "llama-3", OriginRegion: "a"}, "b", OutcomeRule, "by-model", "", 0},
		{"condition false falls through", Attributes{Tenant: "t", DataClass: "z", Model: "llama-3", OriginRegion: "b"}, "b", OutcomeDefault, "default", "", 0},
		{"absent model reads as empty", Attributes{Tenant: "t", DataClass: "z", OriginRegion: "a"}, "a", OutcomeDefault, "default", "", 0},
		{"condition reads tenant", Attributes{Tenant: "acme-eu", DataClass: "x", OriginRegion: "b"}, "a", OutcomeRule, "by-tenant", "", 0},
		{"condition needs the absent tenant", Attributes{DataClass: "x", OriginRegion: "b"}, "", OutcomeMissingAttribute, "by-tenant", "", AttrTenant},
		{"condition error fails closed", Attributes{Tenant: "t", DataClass: "l", OriginRegion: "b"}, "", OutcomeConditionError, "label", "", 0},
		{"label present", Attributes{Tenant: "t", DataClass: "l", OriginRegion: "b", Labels: map[string]string{"k": "v"}}, "a b", OutcomeRule, "label", "", 0},
	})
	d := p.Evaluate(Attributes{Tenant: "t", DataClass: "l", OriginRegion: "b"})
	if d.Err == nil || !strings.Contains(d.Reason(), "no such key") {
		t.Fatalf("condition error reason %q", d.Reason())
	}
	// A condition that runs over its budget at run time fails closed.
	labels := map[string]string{}
	for i := range 1000 {
		labels[fmt.Sprintf("%0200d", i)] = "v"
	}
	d = p.Evaluate(Attributes{Tenant: "t", DataClass: "c", OriginRegion: "b", Labels: labels})
	if d.Outcome != OutcomeConditionError || !d.Allowed.Empty() {
		t.Fatalf("over-budget condition: %s", d)
	}
}

func TestZeroDecisionAllowsNothing(t *testing.T) {
	var d Decision
	if !d.Allowed.Empty() || d.Allows("a") || !d.Outcome.FailedClosed() || d.Regions() != nil {
		t.Fatal("zero decision must allow nothing")
	}
}

func TestDecisionAccessors(t *testing.T) {
	p := examplePolicy(t)
	d := p.Evaluate(Attributes{Tenant: "eu-health", DataClass: "phi", OriginRegion: "us-east-1"})
	if !d.Allows("eu-west-1") || d.Allows("us-east-1") || d.Allows("nowhere") {
		t.Fatalf("Allows: %s", d)
	}
	want := `allow [eu-west-1] by rule "eu-health-phi" (policy ` + p.ID() + ")"
	if d.String() != want {
		t.Fatalf("String() = %q, want %q", d.String(), want)
	}
	if !strings.HasPrefix(p.ID(), "example-2026-01@sha256:") || len(p.Digest()) != 64 {
		t.Fatalf("policy id %q digest %q", p.ID(), p.Digest())
	}
	if d.Rule.Line == 0 || d.Rule.Index != 1 {
		t.Fatalf("rule ref %+v", d.Rule)
	}
}

// nonCELAttrs are requests that reach only rules without conditions.
var nonCELAttrs = []Attributes{
	{Tenant: "eu-health", DataClass: "phi", OriginRegion: "us-east-1"},      // first allow rule
	{Tenant: "acme", DataClass: "pii", OriginRegion: "eu-west-1"},           // origin target
	{Tenant: "acme", DataClass: "secret", OriginRegion: "eu-west-1"},        // unknown class: default
	{Tenant: "embargoed-x", DataClass: "public", OriginRegion: "eu-west-1"}, // deny
	{Tenant: "acme", OriginRegion: "eu-west-1"},                             // fails closed
}

// TestEvaluateAllocs is the request path's allocation budget: zero for rules
// without conditions.
func TestEvaluateAllocs(t *testing.T) {
	p := examplePolicy(t)
	for _, a := range nonCELAttrs {
		var d Decision
		allocs := testing.AllocsPerRun(200, func() { d = p.Evaluate(a) })
		if allocs != 0 {
			t.Errorf("Evaluate(%s) allocates %.1f times per call, want 0", FormatAttributes(a), allocs)
		}
		_ = d
	}
	big := manyRules(t, 100)
	a := Attributes{Tenant: "tenant-99", DataClass: "phi", OriginRegion: "r1"}
	if allocs := testing.AllocsPerRun(200, func() { _ = big.Evaluate(a) }); allocs != 0 {
		t.Errorf("Evaluate on 100 rules allocates %.1f times per call, want 0", allocs)
	}
}

// manyRules builds a policy of n tenant rules (half exact, half globs) over
// 8 regions in 4 zones.
func manyRules(t testing.TB, n int) *Policy {
	var b strings.Builder
	b.WriteString("version: 1\nregions: [r0, r1, r2, r3, r4, r5, r6, r7]\nzones: {z0: [r0, r1], z1: [r2, r3], z2: [r4, r5], z3: [r6, r7]}\ndata_classes: [phi, pii, public]\nrules:\n")
	for i := range n {
		pat := fmt.Sprintf("tenant-%d", i)
		if i%2 == 1 {
			pat = fmt.Sprintf("tenant-%d*", i)
		}
		fmt.Fprintf(&b, "  - name: r%d\n    match: {tenant: %q, data_class: [phi, pii], origin_zone: [z%d, z%d]}\n    allow: [z%d]\n", i, pat, i%4, (i+1)%4, i%4)
	}
	b.WriteString("  - name: no-phi-z3\n    match: {data_class: phi}\n    deny: [z3]\ndefault: {allow: [origin]}\n")
	p, problems := parse("many.yaml", []byte(b.String()), false)
	if problems != nil {
		t.Fatal(problems)
	}
	return p
}

func BenchmarkEvaluate(b *testing.B) {
	p := examplePolicy(b)
	run := func(name string, p *Policy, a Attributes) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = p.Evaluate(a)
			}
		})
	}
	run("example/first-rule", p, nonCELAttrs[0])
	run("example/origin-target", p, nonCELAttrs[1])
	run("example/default", p, nonCELAttrs[2])
	run("example/deny", p, nonCELAttrs[3])
	run("example/fail-closed", p, nonCELAttrs[4])
	run("example/cel-condition", p, Attributes{Tenant: "acme", DataClass: "public", OriginRegion: "us-east-1", Session: "eval-1", Labels: map[string]string{"priority": "batch"}})
	big := manyRules(b, 100)
	run("rules-100/last", big, Attributes{Tenant: "tenant-99x", DataClass: "phi", OriginRegion: "r0"})
	run("rules-100/none", big, Attributes{Tenant: "other", DataClass: "phi", OriginRegion: "r0"})
}

func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("example.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEvaluateConcurrently: a Policy is shared by every request goroutine;
// run under -race.
func TestEvaluateConcurrently(t *testing.T) {
	p := examplePolicy(t)
	reqs := append(slices.Clone(nonCELAttrs), Attributes{Tenant: "acme", DataClass: "public", OriginRegion: "us-east-1", Session: "eval-1", Labels: map[string]string{"priority": "batch"}})
	want := make([]Decision, len(reqs))
	for i, a := range reqs {
		want[i] = p.Evaluate(a)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for range 4 {
		wg.Go(func() {
			for range 200 {
				for i, a := range reqs {
					if d := p.Evaluate(a); d.Allowed != want[i].Allowed || d.Rule != want[i].Rule {
						errs <- fmt.Sprintf("%s: got %s, want %s", FormatAttributes(a), d, want[i])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
