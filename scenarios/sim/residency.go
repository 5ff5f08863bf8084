package sim

import (
	"fmt"
	"slices"
	"strings"
)

// zoneOf names the residency zone of a region: us, eu or ap by prefix,
// otherwise a zone of its own ("z-" + name).
func zoneOf(region string) string {
	for _, z := range []string{"us", "eu", "ap"} {
		if strings.HasPrefix(region, z+"-") {
			return z
		}
	}
	return "z-" + region
}

// ResidencyPolicy returns the simulator's residency policy for the given
// regions (YAML, residency format). For the default three regions it decides
// exactly as deploy/policies/example.yaml (a test compares them): zones us
// and eu, the tenant eu-health's PHI only in the EU, other PHI and PII in
// the origin zone, public data from the EU in the EU or the US, public data
// of US evaluation batches also in the EU, the rest in the origin zone. For
// other region sets the same rules apply to the zones that exist (us, eu,
// ap by name prefix; any other region is a zone of its own), and rules
// whose zones are missing are left out; with an ap zone and a us zone,
// public data from ap may also be served in the us (as the EU's may).
func ResidencyPolicy(regions []string) []byte {
	zones := map[string][]string{}
	var order []string
	for _, r := range regions {
		z := zoneOf(r)
		if _, ok := zones[z]; !ok {
			order = append(order, z)
		}
		zones[z] = append(zones[z], r)
	}
	has := func(z string) bool { _, ok := zones[z]; return ok }
	var b strings.Builder
	fmt.Fprintf(&b, "version: 1\nrevision: sim-%d-regions\n", len(regions))
	b.WriteString("description: The multi-region simulator's policy (deploy/policies/example.yaml generalised to any regions).\n")
	b.WriteString("regions:\n")
	for _, r := range regions {
		fmt.Fprintf(&b, "  - %s\n", r)
	}
	b.WriteString("zones:\n")
	slices.Sort(order)
	for _, z := range order {
		fmt.Fprintf(&b, "  %s: [%s]\n", z, strings.Join(zones[z], ", "))
	}
	b.WriteString("data_classes: [phi, pii, public, internal]\n")
	b.WriteString("rules:\n")
	b.WriteString("  - name: embargoed-tenants\n    match: {tenant: \"embargoed-*\"}\n    deny: [all]\n")
	if has("eu") {
		b.WriteString("  - name: eu-health-phi\n    match: {tenant: eu-health, data_class: phi}\n    allow: [eu]\n")
	}
	b.WriteString("  - name: phi-and-pii-stay-home\n    match: {data_class: [phi, pii]}\n    allow: [origin]\n")
	if has("ap") && has("us") {
		// Not in the example policy (it has no ap zone): public data from
		// Asia-Pacific may be served in the US, as the EU's may.
		b.WriteString("  - name: public-from-ap\n    match: {data_class: public, origin_zone: ap}\n    allow: [ap, us]\n")
	}
	if has("eu") && has("us") {
		b.WriteString("  - name: public-from-eu\n    match: {data_class: public, origin_zone: eu}\n    allow: [eu, us]\n")
		b.WriteString("  - name: us-batch-eval\n    match: {data_class: public, origin_zone: us}\n" +
			"    condition: 'session.startsWith(\"eval-\") && \"priority\" in labels && labels[\"priority\"] == \"batch\"'\n" +
			"    allow: [us, eu]\n")
	}
	b.WriteString("  - name: public-anywhere-in-origin\n    match: {data_class: [public, internal]}\n    allow: [origin]\n")
	b.WriteString("default:\n  allow: [origin]\n")
	return []byte(b.String())
}
