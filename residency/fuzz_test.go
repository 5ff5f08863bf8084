package residency

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// FuzzPolicy feeds arbitrary bytes to Parse, Validate and Evaluate. It must
// never panic; Parse and Validate must agree; every problem has a position;
// a decision stays within the declared regions and allows nothing when it
// failed closed. The committed seed corpus is testdata/fuzz/FuzzPolicy.
func FuzzPolicy(f *testing.F) {
	for _, name := range []string{"../deploy/policies/example.yaml", "../deploy/policies/default.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, "eu-health", "phi", "us-east-1", "llama")
	}
	f.Add([]byte(precedence), "t-deny", "y", "c1", "")
	f.Fuzz(func(t *testing.T, data []byte, tenant, class, origin, model string) {
		p, err := Parse("fuzz.yaml", data)
		problems := Validate("fuzz.yaml", data)
		if (err == nil) != (problems == nil) {
			t.Fatalf("Parse error %v but Validate %d problems", err, len(problems))
		}
		for _, pr := range problems {
			if pr.Line < 1 || pr.Column < 1 || pr.File != "fuzz.yaml" || pr.Message == "" {
				t.Fatalf("problem without a position or message: %+v", pr)
			}
			if !strings.HasPrefix(pr.String(), "fuzz.yaml:") {
				t.Fatalf("problem string %q", pr)
			}
		}
		if !slices.IsSortedFunc(problems, func(a, b Problem) int {
			if a.Line != b.Line {
				return a.Line - b.Line
			}
			return a.Column - b.Column
		}) {
			t.Fatalf("problems not in file order: %v", problems)
		}
		// Evaluate on the unanalyzed policy too, which accepts more inputs.
		q, _ := parse("fuzz.yaml", data, false)
		for _, pol := range []*Policy{p, q} {
			if pol == nil {
				continue
			}
			a := Attributes{Tenant: tenant, DataClass: class, OriginRegion: origin, Model: model, Session: model}
			d := pol.Evaluate(a)
			if !d.Allowed.SubsetOf(allRegions(len(pol.Regions()))) {
				t.Fatalf("decision allows undeclared regions: %v", d.Allowed)
			}
			if d.Outcome.FailedClosed() && !d.Allowed.Empty() {
				t.Fatalf("failed closed but allows %v", d.Regions())
			}
			if e := pol.Evaluate(a); e.Allowed != d.Allowed || e.Outcome != d.Outcome || e.Rule != d.Rule {
				t.Fatalf("Evaluate is not deterministic: %s vs %s", d, e)
			}
			_ = d.String()
		}
		if p != nil && q != nil {
			_ = DiffStructure(p, q)
		}
	})
}
