package residency

import (
	"errors"
	"strings"
	"testing"
)

// base is a valid policy the cases below vary; line numbers in the cases
// refer to the case's own text.
const base = `version: 1
regions: [us-east-1, us-west-2, eu-west-1]
zones:
  us: [us-east-1, us-west-2]
  eu: [eu-west-1]
default: {allow: [origin]}
`

// TestValidationProblems has one case per kind of problem, each asserting the
// FILE:LINE:COL the problem is reported at and a part of its message.
func TestValidationProblems(t *testing.T) {
	cases := []struct {
		name, src string
		want      string // "LINE:COL: message part"
	}{
		{"yaml syntax", "version: 1\nregions: [a\n", "2:1: invalid YAML: did not find expected ',' or ']'"},
		{"yaml tab", "version: 1\nregions:\n\t- a\n", "3:1: invalid YAML: found character that cannot start any token"},
		{"empty file", "", "1:1: policy file is empty"},
		{"comment only", "# nothing\n", "1:1: policy file is empty"},
		{"two documents", base + "---\nversion: 1\n", "7:1: more than one YAML document"},
		{"root not a mapping", "- a\n", "1:1: the policy must be a mapping, found a list"},
		{"missing version", "regions: [a]\ndefault: {allow: []}\n", "1:1: missing version"},
		{"version not an integer", "version: '1'\nregions: [a]\ndefault: {allow: []}\n", `1:10: version "1" is not an integer`},
		{"version float", "version: 1.0\nregions: [a]\ndefault: {allow: []}\n", `1:10: version "1.0" is not an integer`},
		{"unsupported version", "version: 2\nregions: [a]\ndefault: {allow: []}\n", "1:10: unsupported version 2"},
		{"unknown field", base + "regoins: []\n", `7:1: unknown field "regoins" in the policy`},
		{"unknown rule field", base + "rules:\n  - name: r\n    alow: [eu]\n", `9:5: unknown field "alow" in rule`},
		{"unknown match field", base + "rules:\n  - name: r\n    match: {tenants: a}\n    allow: [eu]\n", `9:13: unknown field "tenants" in match`},
		{"duplicate field", base + "version: 1\n", `7:1: duplicate field "version" in the policy (first at line 1)`},
		{"alias", "version: 1\nregions: &r [a]\nzones: {z: *r}\ndefault: {allow: []}\n", "3:12: zone z: YAML aliases are not supported"},
		{"merge key", base + "rules:\n  - <<: {name: x}\n    allow: [eu]\n", "8:5: rule: YAML merge keys are not supported"},
		{"wrong type", "version: 1\nregions: {a: b}\ndefault: {allow: []}\n", "2:10: regions must be a list, found a mapping"},
		{"null value", base + "rules:\n  - name:\n    allow: [eu]\n", "8:10: rule name must be a single value, found nothing"},
		{"missing regions", "version: 1\ndefault: {allow: []}\n", "1:1: missing regions"},
		{"empty regions", "version: 1\nregions: []\ndefault: {allow: []}\n", "2:10: regions is empty"},
		{"bad region name", "version: 1\nregions: [US_East]\ndefault: {allow: []}\n", `2:11: region name "US_East": use lower-case letters`},
		{"long region name", "version: 1\nregions: [" + strings.Repeat("a", 64) + "]\ndefault: {allow: []}\n", "2:11: region name \"aaaa"},
		{"reserved region name", "version: 1\nregions: [origin]\ndefault: {allow: []}\n", `2:11: region name "origin" is reserved`},
		{"duplicate region", "version: 1\nregions: [a, b, a]\ndefault: {allow: []}\n", `2:17: duplicate region "a" (first declared at line 2)`},
		{"region without name", "version: 1\nregions:\n  - labels: {x: y}\ndefault: {allow: []}\n", "3:5: region has no name"},
		{"duplicate label", "version: 1\nregions:\n  - name: a\n    labels: {x: y, x: z}\ndefault: {allow: []}\n", `4:20: duplicate label "x" in region "a"`},
		{"unknown region in zone", "version: 1\nregions: [a]\nzones:\n  z: [a, b]\ndefault: {allow: []}\n", `4:10: unknown region "b" in zone "z" (declared regions: a)`},
		{"empty zone", "version: 1\nregions: [a]\nzones:\n  z: []\ndefault: {allow: []}\n", `4:6: zone "z" is empty`},
		{"duplicate zone", "version: 1\nregions: [a]\nzones:\n  z: [a]\n  z: [a]\ndefault: {allow: []}\n", `5:3: duplicate zone "z" (first declared at line 4)`},
		{"zone named like a region", "version: 1\nregions: [a]\nzones:\n  a: [a]\ndefault: {allow: []}\n", `4:3: zone "a" has the name of a region`},
		{"reserved zone name", "version: 1\nregions: [a]\nzones:\n  all: [a]\ndefault: {allow: []}\n", `4:3: zone name "all" is reserved`},
		{"region twice in zone", "version: 1\nregions: [a]\nzones:\n  z: [a, a]\ndefault: {allow: []}\n", `4:10: region "a" listed twice in zone "z"`},
		{"bad data class", base + "data_classes: [phi, 'p h']\n", `7:21: data class "p h"`},
		{"glob data class", base + "data_classes: ['p*']\n", `7:16: data class "p*"`},
		{"duplicate data class", base + "data_classes: [phi, PHI]\n", `7:21: data class "PHI" declared twice`},
		{"too many data classes", base + "data_classes: [" + strings.Repeat("c,", 64) + "d]\n", "7:15: 65 data classes, more than the limit of 64"},
		{"missing default", "version: 1\nregions: [a]\n", "1:1: missing default"},
		{"default without allow", "version: 1\nregions: [a]\ndefault: {}\n", "3:10: default has no allow list"},
		{"default with deny", "version: 1\nregions: [a]\ndefault: {allow: [], deny: [a]}\n", `3:22: unknown field "deny" in default`},
		{"unknown target", base + "rules:\n  - name: r\n    allow: [eu, mars]\n", `9:17: unknown zone or region "mars" in rule "r"`},
		{"unknown target in default", "version: 1\nregions: [a]\ndefault: {allow: [b]}\n", `3:19: unknown zone or region "b" in default`},
		{"duplicate target", base + "rules:\n  - name: r\n    allow: [eu, eu]\n", `9:17: rule "r" lists "eu" twice`},
		{"unknown origin zone", base + "rules:\n  - name: r\n    match: {origin_zone: eu-west-1}\n    allow: [eu]\n", `9:26: unknown zone "eu-west-1" in rule "r" origin_zone (zones: us, eu); it is a region`},
		{"rule without name", base + "rules:\n  - allow: [eu]\n", "8:5: rule 1 has no name"},
		{"duplicate rule name", base + "rules:\n  - name: r\n    match: {tenant: a}\n    allow: [eu]\n  - name: r\n    match: {tenant: b}\n    allow: [eu]\n", `11:11: duplicate rule name "r" (first at line 8)`},
		{"reserved rule name", base + "rules:\n  - name: default\n    allow: [eu]\n", `8:11: rule name "default" is reserved`},
		{"neither allow nor deny", base + "rules:\n  - name: r\n    match: {tenant: a}\n", `8:5: rule "r" has neither allow nor deny`},
		{"both allow and deny", base + "rules:\n  - name: r\n    allow: [eu]\n    deny: [us]\n", `10:5: rule "r" has both allow and deny`},
		{"empty deny", base + "rules:\n  - name: r\n    deny: []\n", `9:11: rule "r" has an empty deny list`},
		{"empty match list", base + "rules:\n  - name: r\n    match: {tenant: []}\n    allow: [eu]\n", `9:21: rule "r" can never match: its tenant list is empty`},
		{"empty pattern", base + "rules:\n  - name: r\n    match: {tenant: ''}\n    allow: [eu]\n", `9:21: rule "r" can never match: empty tenant pattern`},
		{"impossible character", base + "rules:\n  - name: r\n    match: {tenant: 'acme corp*'}\n    allow: [eu]\n", `9:21: rule "r" can never match: tenant pattern "acme corp*" holds " "`},
		{"impossible length", base + "rules:\n  - name: r\n    match: {tenant: '" + strings.Repeat("a", 257) + "*'}\n    allow: [eu]\n", `9:21: rule "r" can never match: tenant pattern "aaa`},
		{"no declared data class", base + "data_classes: [phi, public]\nrules:\n  - name: r\n    match: {data_class: 'pii*'}\n    allow: [eu]\n", `10:25: rule "r" can never match: data_class "pii*" matches no declared data class (phi, public)`},
		{"duplicate pattern", base + "rules:\n  - name: r\n    match: {tenant: [a, a]}\n    allow: [eu]\n", `9:25: rule "r" lists tenant "a" twice`},
		{"shadowed", base + "rules:\n  - name: broad\n    match: {tenant: 'acme-*'}\n    allow: [eu]\n  - name: narrow\n    match: {tenant: acme-eu, data_class: phi}\n    allow: [us]\n",
			`11:5: rule "narrow" can never match: rule "broad" (line 8) comes first`},
		{"shadowed by catch-all", base + "rules:\n  - name: all\n    allow: [eu]\n  - name: later\n    match: {tenant: x}\n    condition: 'model == \"m\"'\n    allow: [us]\n",
			`10:5: rule "later" can never match: rule "all" (line 8) comes first`},
		{"overlapping rules contradict", base + "rules:\n  - name: acme\n    match: {tenant: 'acme-*'}\n    allow: [eu]\n  - name: public\n    match: {data_class: public}\n    allow: [us]\n",
			`11:5: rules "acme" (line 8) and "public" overlap and contradict: for a request such as tenant=acme- data_class=public, "acme" comes first and allows [eu-west-1], beyond the [us-east-1 us-west-2] that "public" allows`},
		{"allow contradicted by deny", base + "rules:\n  - name: no-us-phi\n    match: {data_class: phi}\n    deny: [us]\n  - name: acme-phi\n    match: {tenant: acme, data_class: phi}\n    allow: [eu, us]\n",
			`13:17: rule "acme-phi" allows "us", but rule "no-us-phi" (line 8) denies all of it for every request it matches`},
		{"default contradicted by deny", base + "rules:\n  - name: nothing\n    deny: [all]\n",
			`6:19: the default allows "origin", but rule "nothing" (line 8) denies all of it for every request the default matches`},
		{"cel does not compile", base + "rules:\n  - name: r\n    condition: 'tenant.startsWith('\n    allow: [eu]\n", `9:35: rule "r" condition does not compile: Syntax error`},
		{"cel undeclared", base + "rules:\n  - name: r\n    condition: \"tennant == 'a'\"\n    allow: [eu]\n", `9:17: rule "r" condition does not compile: undeclared reference to 'tennant'`},
		{"cel not boolean", base + "rules:\n  - name: r\n    condition: 'tenant + \"x\"'\n    allow: [eu]\n", `9:16: rule "r" condition must be a boolean expression; it has type string`},
		{"cel too costly", base + "rules:\n  - name: r\n    condition: 'labels.all(k, labels.all(j, labels.all(i, labels[k] + labels[j] + labels[i] != tenant)))'\n    allow: [eu]\n", `9:16: rule "r" condition may cost up to`},
		{"cel block scalar", base + "rules:\n  - name: r\n    condition: |\n      tenant == 'a' &&\n        model\n    allow: [eu]\n", `11:9: rule "r" condition does not compile: expected type 'bool' but found 'string'`},
		{"cel block scalar position", base + "rules:\n  - name: r\n    condition: |\n      tenant == 'a' &&\n        modle\n    allow: [eu]\n", `11:9: rule "r" condition does not compile: undeclared reference to 'modle'`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			problems := Validate("f.yaml", []byte(c.src))
			want := "f.yaml:" + c.want
			for _, p := range problems {
				if strings.HasPrefix(p.String(), want) {
					return
				}
			}
			var got []string
			for _, p := range problems {
				got = append(got, p.String())
			}
			t.Fatalf("want a problem starting %q, got:\n%s", want, strings.Join(got, "\n"))
		})
	}
}

// TestValidateReportsEveryProblem: problems in different parts of a file are
// all reported, in file order, and Parse agrees with Validate.
func TestValidateReportsEveryProblem(t *testing.T) {
	src := `version: 3
regions: [a, a]
zones:
  z: [a, b]
  e: []
default: {allow: [mars]}
rules:
  - name: r
    match: {tenant: "x y", origin_zone: nowhere}
    condition: 'tenant + 1'
    allow: [z]
`
	want := []string{
		"f.yaml:1:10: unsupported version 3",
		`f.yaml:2:14: duplicate region "a"`,
		`f.yaml:4:10: unknown region "b" in zone "z"`,
		`f.yaml:5:6: zone "e" is empty`,
		`f.yaml:6:19: unknown zone or region "mars" in default`,
		`f.yaml:9:21: rule "r" can never match: tenant pattern "x y"`,
		`f.yaml:9:41: unknown zone "nowhere"`,
		`f.yaml:10:24: rule "r" condition does not compile`,
	}
	problems := Validate("f.yaml", []byte(src))
	if len(problems) != len(want) {
		t.Fatalf("got %d problems, want %d: %v", len(problems), len(want), problems)
	}
	for i, p := range problems {
		if !strings.HasPrefix(p.String(), want[i]) {
			t.Errorf("problem %d = %q, want prefix %q", i, p, want[i])
		}
	}
	_, err := Parse("f.yaml", []byte(src))
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != len(problems) {
		t.Fatalf("Parse error = %v, want a ValidationError with %d problems", err, len(problems))
	}
	if !strings.Contains(err.Error(), "8 problems") || !strings.Contains(err.Error(), want[0]) {
		t.Fatalf("error text %q", err)
	}
	if problems[1].Value != "a" || problems[4].Value != "mars" {
		t.Fatalf("offending values: %q, %q", problems[1].Value, problems[4].Value)
	}
}

func TestValidPoliciesHaveNoProblems(t *testing.T) {
	for _, src := range []string{
		base,
		"version: 1\nregions: [a]\ndefault: {allow: []}\n",
		string(defaultPolicy),
		base + `data_classes: [phi, public]
rules:
  - name: narrow-first
    match: {tenant: acme, data_class: phi}
    allow: [eu]
  - name: beta-public-eu
    match: {tenant: "beta-*", data_class: public}
    allow: [eu]
  - name: conditional
    match: {tenant: "beta-*"}
    condition: 'model.startsWith("llama") && "tier" in labels'
    allow: [us]
  - name: beta-nothing-else
    match: {tenant: "beta-*"}
    allow: []
  - name: broad-later
    match: {data_class: [phi, public]}
    allow: [origin]
  - name: no-phi-in-us-west
    match: {data_class: phi}
    deny: [us-west-2]
`,
	} {
		if problems := Validate("f.yaml", []byte(src)); problems != nil {
			t.Errorf("unexpected problems in\n%s\n%v", src, problems)
		}
	}
}
