package sim

import (
	"os"
	"testing"

	"github.com/meridian-llm/meridian/residency"
)

// TestResidencyPolicyMatchesExample: for the default regions the
// simulator's policy decides exactly as deploy/policies/example.yaml on
// every combination of tenant, data class, origin, session and labels.
func TestResidencyPolicyMatchesExample(t *testing.T) {
	src, err := os.ReadFile("../../deploy/policies/example.yaml")
	if err != nil {
		t.Skipf("example policy not found: %v", err)
	}
	example, err := residency.Parse("example.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := residency.Parse("sim.yaml", ResidencyPolicy(DefaultRegions()))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tenant := range []string{"acme", "eu-health", "embargoed-x", ""} {
		for _, class := range []string{"phi", "pii", "public", "internal", "secret", ""} {
			for _, origin := range append(DefaultRegions(), "") {
				for _, session := range []string{"eval-1", "s1", ""} {
					for _, labels := range []map[string]string{nil, {"priority": "batch"}, {"priority": "high"}} {
						a := residency.Attributes{Tenant: tenant, DataClass: class, OriginRegion: origin, Session: session, Labels: labels}
						e, o := example.Evaluate(a), ours.Evaluate(a)
						if !e.SameRegions(o) || e.Outcome != o.Outcome {
							t.Errorf("%+v: example allows %v (%v), ours %v (%v)", a, e.Regions(), e.Outcome, o.Regions(), o.Outcome)
						}
						n++
					}
				}
			}
		}
	}
	t.Logf("%d attribute combinations compared", n)
}

// TestResidencyPolicyRegions: the policy parses for other region sets and
// keeps the EU PHI rule wherever an EU region exists.
func TestResidencyPolicyRegions(t *testing.T) {
	for n := 1; n <= 6; n++ {
		regions := RegionNames(n)
		p, err := residency.Parse("sim.yaml", ResidencyPolicy(regions))
		if err != nil {
			t.Fatalf("%d regions: %v\n%s", n, err, ResidencyPolicy(regions))
		}
		for _, origin := range regions {
			d := p.Evaluate(residency.Attributes{Tenant: "eu-health", DataClass: "phi", OriginRegion: origin, Session: "s"})
			for _, r := range regions {
				if d.Allows(r) && n >= 3 && r != "eu-west-1" {
					t.Errorf("%d regions: EU PHI from %s allowed in %s", n, origin, r)
				}
			}
			if !p.Evaluate(residency.Attributes{Tenant: "acme", DataClass: "public", OriginRegion: origin, Session: "s"}).Allows(origin) {
				t.Errorf("%d regions: public data from %s not allowed at home", n, origin)
			}
		}
	}
}
