package residency

import (
	"os"
	"slices"
	"testing"
)

func TestStranded(t *testing.T) {
	src, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse("example.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	downSet := func(regions ...string) func(string) bool {
		return func(r string) bool { return slices.Contains(regions, r) }
	}
	if got := p.Stranded(downSet()); len(got) != 0 {
		t.Fatalf("nothing down: %v", got)
	}
	// us-west-2 down: the US zone still has us-east-1: nothing stranded.
	if got := p.Stranded(downSet("us-west-2")); len(got) != 0 {
		t.Fatalf("us-west-2 down: %v", got)
	}
	// eu-west-1 down: the EU zone is empty. EU health PHI from anywhere,
	// and whatever stays in its origin zone when it enters in the EU.
	got := p.Stranded(downSet("eu-west-1"))
	byRule := map[string][]string{}
	for _, s := range got {
		byRule[s.Rule] = s.Origins
	}
	want := map[string][]string{
		"eu-health-phi":             {"us-east-1", "us-west-2", "eu-west-1"},
		"phi-and-pii-stay-home":     {"eu-west-1"},
		"public-anywhere-in-origin": {"eu-west-1"},
		"default":                   {"eu-west-1"},
	}
	for rule, origins := range want {
		if !slices.Equal(byRule[rule], origins) {
			t.Errorf("eu-west-1 down, rule %s: origins %v, want %v (all: %v)", rule, byRule[rule], origins, got)
		}
	}
	if _, ok := byRule["public-from-eu"]; ok {
		t.Error("public data entering in the EU may go to the US: not stranded")
	}
	for _, s := range got {
		if s.Rule == "eu-health-phi" && s.String() != "rule eu-health-phi (tenant eu-health, data class phi) entering at us-east-1, us-west-2, eu-west-1" {
			t.Errorf("description %q", s)
		}
	}
	// Against a naive check: evaluate every tenant/class/origin the
	// example names and compare with what Stranded says.
	down := downSet("eu-west-1")
	for _, a := range []Attributes{
		{Tenant: "eu-health", DataClass: "phi", OriginRegion: "us-east-1"},
		{Tenant: "acme", DataClass: "pii", OriginRegion: "eu-west-1"},
		{Tenant: "acme", DataClass: "pii", OriginRegion: "us-east-1"},
		{Tenant: "acme", DataClass: "public", OriginRegion: "eu-west-1"},
		{Tenant: "acme", DataClass: "secret", OriginRegion: "eu-west-1"},
	} {
		d := p.Evaluate(a)
		left := false
		for _, r := range d.Regions() {
			left = left || !down(r)
		}
		stranded := false
		for _, s := range got {
			if (d.Rule.Name == s.Rule || (d.Rule.Name == "" && s.Rule == "default")) && slices.Contains(s.Origins, a.OriginRegion) {
				stranded = true
			}
		}
		if stranded == left {
			t.Errorf("%+v: allowed %v, Stranded says stranded=%v", a, d.Regions(), stranded)
		}
	}
}

// Tenants compare case-insensitively, like data classes: "EU-HEALTH" does
// not escape a rule written for "eu-health".
func TestTenantCaseInsensitive(t *testing.T) {
	src, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse("example.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"eu-health", "EU-HEALTH", "Eu-Health"} {
		d := p.Evaluate(Attributes{Tenant: tenant, DataClass: "PHI", OriginRegion: "us-east-1"})
		if d.Rule.Name != "eu-health-phi" || !slices.Equal(d.Regions(), []string{"eu-west-1"}) {
			t.Errorf("tenant %q: rule %q, regions %v", tenant, d.Rule.Name, d.Regions())
		}
	}
	if d := p.Evaluate(Attributes{Tenant: "EMBARGOED-9", DataClass: "public", OriginRegion: "us-east-1"}); !d.Allowed.Empty() {
		t.Errorf("EMBARGOED-9 allowed %v", d.Regions())
	}
}

// A request without a data class is served in its origin zone only, under
// the rules that do not look at the data class (deny rules too), instead of
// failing closed on the first rule that needs a data class.
func TestEvaluateUnclassified(t *testing.T) {
	src, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse("example.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Evaluate(Attributes{Tenant: "acme", OriginRegion: "eu-west-1"}); d.Outcome != OutcomeMissingAttribute {
		t.Fatalf("plain Evaluate without a class: %v", d.Reason())
	}
	for origin, want := range map[string][]string{"eu-west-1": {"eu-west-1"}, "us-east-1": {"us-east-1", "us-west-2"}} {
		d := p.EvaluateUnclassified(Attributes{Tenant: "acme", OriginRegion: origin})
		if !slices.Equal(d.Regions(), want) || !d.UnknownDataClass || d.Rule.Name != "default" && d.Rule.Name != "" {
			t.Errorf("acme from %s: %v (%s), want %v", origin, d.Regions(), d.Reason(), want)
		}
	}
	if d := p.EvaluateUnclassified(Attributes{Tenant: "embargoed-3", OriginRegion: "us-east-1"}); !d.Allowed.Empty() {
		t.Errorf("an embargoed tenant without a class: %v", d.Regions())
	}
	if d := p.EvaluateUnclassified(Attributes{Tenant: "acme", OriginRegion: "mars-1"}); !d.Allowed.Empty() {
		t.Errorf("an unknown origin: %v", d.Regions())
	}
}
