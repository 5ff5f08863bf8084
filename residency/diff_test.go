package residency

import (
	"strings"
	"testing"
)

func TestDiffStructure(t *testing.T) {
	old := mustParse(t, `version: 1
revision: a
regions: [x, y, gone]
zones: {zx: [x], zy: [y], old: [gone]}
data_classes: [phi]
rules:
  - name: one
    match: {tenant: t1}
    allow: [zx]
  - name: two
    match: {tenant: t2}
    allow: [zy]
  - name: three
    match: {tenant: t3}
    allow: [zx]
  - name: dropped
    match: {tenant: t4}
    deny: [zy]
default: {allow: [origin]}
`)
	cand := mustParse(t, `version: 1
revision: b
regions: [x, y, new]
zones: {zx: [x, y], zy: [y], fresh: [new]}
data_classes: [phi, pii]
rules:
  - name: three
    match: {tenant: t3}
    allow: [zx]
  - name: one
    match: {tenant: t1}
    condition: 'model == "m"'
    allow: [zx]
  - name: two
    match: {tenant: t2}
    allow: [zy]
  - name: added
    match: {tenant: t5}
    allow: []
default: {allow: []}
`)
	var got []string
	for _, c := range DiffStructure(old, cand) {
		got = append(got, c.String())
	}
	want := []string{
		`~ revision: "a" -> "b"`,
		`- region gone: no labels`,
		`+ region new: no labels`,
		`- zone old: [gone]`,
		`~ zone zx: [x] -> [x y]`,
		`+ zone fresh: [new]`,
		`~ data_classes: [phi] -> [phi pii]`,
		`- rule dropped: tenant=[t4] -> deny [zy]`,
		`~ rule one: tenant=[t1] -> allow [zx] -> tenant=[t1] if "model == \"m\"" -> allow [zx]`,
		`+ rule added: tenant=[t5] -> allow []`,
		`> rule three: moved from position 3 to 1`,
		`> rule one: moved from position 1 to 2`,
		`> rule two: moved from position 2 to 3`,
		`~ default: any request -> allow [origin] -> any request -> allow []`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(DiffStructure(old, old)) != 0 {
		t.Fatal("a policy differs from itself")
	}
}

func TestShadowComparesByRegionName(t *testing.T) {
	// Same regions declared in a different order: equal decisions compare
	// equal even though the bitmasks differ.
	a := mustParse(t, "version: 1\nregions: [x, y]\nzones: {z: [x]}\ndefault: {allow: [origin]}\n")
	b := mustParse(t, "version: 1\nregions: [y, x]\nzones: {z: [x]}\ndefault: {allow: [origin]}\n")
	c := mustParse(t, "version: 1\nregions: [y, x]\nzones: {z: [x, y]}\ndefault: {allow: [origin]}\n")
	s := Shadow{Active: a, Candidate: b}
	x, y, differ := s.Evaluate(Attributes{OriginRegion: "x"})
	if differ || x.Allowed == y.Allowed {
		t.Fatalf("same names must compare equal across region orders: %s / %s", x, y)
	}
	if _, _, differ := (Shadow{Active: a, Candidate: c}).Evaluate(Attributes{OriginRegion: "x"}); !differ {
		t.Fatal("[x] and [x y] must differ")
	}
	attrs := []Attributes{{OriginRegion: "x"}, {OriginRegion: "y"}, {}}
	diffs := Diff(a, c, attrs)
	if len(diffs) != 2 || diffs[0].Index != 0 || diffs[1].Index != 1 {
		t.Fatalf("Diff = %v", diffs)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _, _ = s.Evaluate(attrs[0]) }); allocs != 0 {
		t.Fatalf("shadow evaluation allocates %.1f times", allocs)
	}
}
