package meridian_test

import (
	"errors"
	"fmt"
	"go/build"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/meridian-llm/meridian"

// importRule is what one package of ours may import of ours.
type importRule struct {
	// imports are the packages of ours (module-relative) that its non-test
	// files may import: exactly these, its own sub-packages included.
	imports []string
	// anything lets it import every package of ours: the binary only.
	anything bool
	// lean: `go list -deps` of the package holds no net/http, Kafka client
	// or Prometheus (see heavyDeps), so it stays a pure library.
	lean bool
	// planned: the package is being created. Until its directory exists the
	// rule waits for it; any other rule without a package is an error.
	planned bool
}

// importRules holds one rule for every package of the module, keyed by its
// directory ("." is the root); a package without a rule fails
// TestImportRules, so a new package must state its own. Data flows one way
// (DESIGN.md): the pure packages at the bottom import nothing of ours, the
// controller builds on them, the scenarios drive the controller, and only
// the binary imports everything. TestImportRulesFollowDesign keeps the table
// to DESIGN.md's statements. Tests (_test.go files) are not ruled here.
//
// A test-scaffolding package (name ending in "test") may import its parent
// only when the parent's tests that use it are external (package x_test):
// globaltest and routetest do; audittest, gossiptest and checktest serve
// in-package tests, so importing their parent would be a cycle.
var importRules = map[string]importRule{
	".": {},

	// The pure core.
	"index":     {lean: true},
	"residency": {lean: true},
	"gorgo":     {imports: []string{"index"}, lean: true},

	// The Raft tier and its audit log; machine identity (TLS material, peer
	// identity, dev PKI) is a leaf that global, regional and cmd use.
	"global/identity":        {},
	"global/audit":           {},
	"global/audit/audittest": {},
	"global":                 {imports: []string{"global/audit", "global/identity"}},
	"global/globaltest":      {imports: []string{"global"}},

	// One region's controller.
	"regional/tokenize":          {lean: true},
	"regional/reqbody":           {lean: true},
	"regional/kvevents":          {imports: []string{"index"}, lean: true},
	"regional/summary":           {imports: []string{"index", "gorgo"}, lean: true},
	"regional/route":             {imports: []string{"index", "gorgo", "residency"}, lean: true},
	"regional/route/routetest":   {imports: []string{"regional/route", "index", "gorgo"}},
	"regional/gossip":            {imports: []string{"gorgo", "regional/summary"}},
	"regional/gossip/gossiptest": {},
	"regional/auth":              {imports: []string{"global/identity"}}, // reads requests, serves nothing
	// How every Kafka client of ours secures its connections (kafka.tls,
	// kafka.sasl), and secured test brokers.
	"regional/kafkasec":              {imports: []string{"global/identity"}},
	"regional/kafkasec/kafkasectest": {imports: []string{"regional/kafkasec", "global/identity"}},
	"regional/kvbridge/zmtp":         {},
	"regional/kvbridge":              {imports: []string{"regional/kvevents", "regional/kvbridge/zmtp", "regional/kafkasec", "regional/discovery"}},
	// Pod discovery feeds both the controller and the bridge, so it
	// imports nothing of ours: not route, whose decision core the bridge
	// must not pull in.
	"regional/discovery":               {},
	"regional/discovery/discoverytest": {},
	// The operator console: the controller adapts its state to the
	// console's types, so the console imports nothing of ours.
	"regional/console": {},
	"regional": {imports: []string{"index", "gorgo", "residency", "global", "global/audit", "global/identity", "regional/auth",
		"regional/discovery", "regional/route", "regional/tokenize", "regional/kvevents", "regional/summary", "regional/gossip", "regional/kafkasec",
		"regional/console", "regional/reqbody"}},

	// Disaster recovery: the check reads folders and needs nothing of the
	// running system; the drill needs the admin API client and the policy.
	// Neither imports the other; dr itself holds only the package doc.
	"dr":                   {},
	"dr/check/safetensors": {lean: true},
	"dr/check":             {imports: []string{"dr/check/safetensors"}},
	"dr/check/checktest":   {imports: []string{"dr/check/safetensors"}},
	"dr/drill":             {imports: []string{"global", "residency"}},

	// Workloads, simulators and the demo, which drive the controller.
	"scenarios/prefixcache": {lean: true},
	"scenarios/enginesim": {imports: []string{"regional/tokenize", "regional/kvevents", "regional/kvbridge/zmtp",
		"regional/kafkasec", "scenarios/prefixcache"}},
	"scenarios/sim": {imports: []string{"index", "gorgo", "residency", "regional/route",
		"regional/gossip", "regional/summary", "scenarios/enginesim", "scenarios/prefixcache"}},
	"scenarios/fleet": {imports: []string{"residency", "regional", "regional/auth", "global/identity", "scenarios/enginesim", "scenarios/sim"}},
	"scenarios/demo": {imports: []string{"residency", "global", "global/audit", "regional",
		"scenarios/enginesim", "scenarios/sim", "scenarios/fleet"}},

	// The one binary.
	"cmd/meridian": {anything: true},

	// Programs of scripts/ that are packages of their own (the others are
	// //go:build ignore files, run with go run): they import nothing of
	// ours.
	"scripts/proxyload": {},
}

// TestImportRules fails for a package of ours without a rule, for an import
// of ours that a package's rule does not allow, and for a rule left behind
// by a package that is gone.
func TestImportRules(t *testing.T) {
	for _, problem := range checkImports(importRules, ourImports(t)) {
		t.Error(problem)
	}
}

// checkImports compares the import graph of the module (package directory
// -> the packages of ours it imports) with the rules, one line per problem.
func checkImports(rules map[string]importRule, graph map[string][]string) []string {
	var problems []string
	for _, dir := range slices.Sorted(maps.Keys(graph)) {
		rule, ok := rules[dir]
		if !ok {
			problems = append(problems, fmt.Sprintf("package %s has no import rule: add one to importRules in deps_test.go", dir))
			continue
		}
		for _, imp := range graph[dir] {
			if !rule.anything && !slices.Contains(rule.imports, imp) {
				problems = append(problems, fmt.Sprintf("%s imports %s, which its import rule does not allow", dir, imp))
			}
		}
	}
	for _, dir := range slices.Sorted(maps.Keys(rules)) {
		if _, ok := graph[dir]; !ok && !rules[dir].planned {
			problems = append(problems, fmt.Sprintf("importRules has a rule for %s, which is no package (remove the rule, or mark it planned)", dir))
		}
	}
	return problems
}

// ourImports returns, for every package directory of the module ("." for
// the root), the packages of ours that its non-test files import, as
// module-relative paths. It reads the files in process (go/build, honouring
// build constraints), so go test's cache knows every file the answer
// depends on.
func ourImports(t *testing.T) map[string][]string {
	t.Helper()
	graph := map[string][]string{}
	for _, dir := range goPackageDirs(t) {
		p, err := build.ImportDir(dir, 0)
		var noGo *build.NoGoError
		if errors.As(err, &noGo) {
			continue // no buildable file: scripts/ holds //go:build ignore programs
		}
		if err != nil {
			t.Fatalf("read package in %s: %v", dir, err)
		}
		ours := []string{}
		for _, imp := range p.Imports {
			if rel, ok := moduleRel(imp); ok {
				ours = append(ours, rel)
			}
		}
		graph[filepath.ToSlash(dir)] = ours
	}
	return graph
}

// moduleRel turns an import path of ours into its module-relative directory.
func moduleRel(importPath string) (string, bool) {
	if importPath == modulePath {
		return ".", true
	}
	rel, ok := strings.CutPrefix(importPath, modulePath+"/")
	return rel, ok
}

// TestImportRulesFollowDesign keeps the table to what DESIGN.md and STYLE.md
// say, so that loosening a rule against them means editing this test too.
func TestImportRulesFollowDesign(t *testing.T) {
	for _, problem := range checkDesign(importRules) {
		t.Error(problem)
	}
}

// checkDesign returns one line per way the rules break the design.
func checkDesign(rules map[string]importRule) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	under := func(dir, top string) bool { return dir == top || strings.HasPrefix(dir, top+"/") }
	scaffolding := func(dir string) bool { return strings.HasSuffix(filepath.Base(dir), "test") }
	only := func(dir string, allowed ...string) {
		for _, imp := range rules[dir].imports {
			if !slices.Contains(allowed, imp) {
				bad("%s may import only %v of ours, but its rule allows %s", dir, allowed, imp)
			}
		}
	}

	// The pure core: index and residency import nothing of ours; gorgo at
	// most index's types; the decision pipeline only the three of them.
	only("index")
	only("residency")
	only("gorgo", "index")
	only("regional/route", "index", "gorgo", "residency")
	if !rules["regional/route"].lean {
		bad("regional/route must be lean: it pulls no net/http, Kafka or Prometheus")
	}
	// dr's two parts share no code: the check needs nothing of the running
	// system, the drill nothing of the check.
	for _, pair := range [][2]string{{"dr/check", "dr/drill"}, {"dr/drill", "dr/check"}} {
		for _, imp := range rules[pair[0]].imports {
			if under(imp, pair[1]) {
				bad("%s may import %s: dr/check and dr/drill do not import each other", pair[0], imp)
			}
		}
	}

	for _, dir := range slices.Sorted(maps.Keys(rules)) {
		rule := rules[dir]
		if rule.anything && !under(dir, "cmd") {
			bad("%s may import anything, which only cmd may", dir)
		}
		for _, imp := range rule.imports {
			if _, ok := rules[imp]; !ok {
				bad("%s's rule allows %s, which has no rule of its own (a typo?)", dir, imp)
			}
			switch {
			case under(imp, "cmd") && !under(dir, "cmd"):
				bad("%s may import %s: nothing but cmd imports cmd", dir, imp)
			case under(imp, "scenarios") && !under(dir, "cmd") && !under(dir, "scenarios"):
				bad("%s may import %s: only cmd and scenarios import scenarios", dir, imp)
			case under(dir, "global") && !under(imp, "global"):
				bad("%s may import %s: global imports only its own sub-packages", dir, imp)
			case scaffolding(imp):
				bad("%s may import %s: test scaffolding is imported by tests only", dir, imp)
			}
		}
	}

	// Data flows one way: the allowed imports form no cycle.
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var visit func(dir string, path []string)
	visit = func(dir string, path []string) {
		switch state[dir] {
		case onPath:
			bad("import rules form a cycle: %s", strings.Join(append(slices.Clip(path), dir), " -> "))
			return
		case done:
			return
		}
		state[dir] = onPath
		path = append(slices.Clip(path), dir)
		for _, imp := range rules[dir].imports {
			visit(imp, path)
		}
		state[dir] = done
	}
	for _, dir := range slices.Sorted(maps.Keys(rules)) {
		visit(dir, nil)
	}
	return problems
}

// The checkers themselves must catch what they are for.
func TestImportCheckersCatch(t *testing.T) {
	rules := map[string]importRule{
		"index":    {},
		"gorgo":    {imports: []string{"index"}},
		"regional": {imports: []string{"index", "gorgo"}},
		"new":      {planned: true},
		"gone":     {},
	}
	graph := map[string][]string{
		"index":    {"regional"},
		"gorgo":    {"index"},
		"regional": {"gorgo"},
		"unruled":  {},
	}
	got := checkImports(rules, graph)
	want := []string{
		"index imports regional",
		"package unruled has no import rule",
		"rule for gone, which is no package",
	}
	if len(got) != len(want) {
		t.Errorf("checkImports found %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("checkImports did not report %q; got:\n%s", w, strings.Join(got, "\n"))
		}
	}

	design := map[string]importRule{
		"index":             {imports: []string{"gorgo"}},
		"gorgo":             {imports: []string{"index"}},
		"residency":         {},
		"regional/route":    {imports: []string{"global"}},
		"global":            {imports: []string{"regional", "global/globaltest"}},
		"global/globaltest": {imports: []string{"global"}},
		"regional":          {imports: []string{"scenarios/sim", "cmd/meridian"}, anything: true},
		"scenarios/sim":     {imports: []string{"regional", "typo"}},
		"cmd/meridian":      {anything: true},
		"dr/check":          {imports: []string{"dr/drill"}},
		"dr/drill":          {},
	}
	got = checkDesign(design)
	for _, w := range []string{
		"index may import only [] of ours, but its rule allows gorgo",
		"regional/route may import only [index gorgo residency] of ours, but its rule allows global",
		"regional/route must be lean",
		"regional may import anything",
		"regional may import cmd/meridian: nothing but cmd",
		"regional may import scenarios/sim: only cmd and scenarios",
		"global may import regional: global imports only its own",
		"global may import global/globaltest: test scaffolding",
		"scenarios/sim's rule allows typo",
		"import rules form a cycle: global -> global/globaltest -> global",
		"import rules form a cycle: gorgo -> index -> gorgo",
		"dr/check may import dr/drill: dr/check and dr/drill do not import each other",
	} {
		if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("checkDesign did not report %q; got:\n%s", w, strings.Join(got, "\n"))
		}
	}
}

// heavyDeps are what a lean package must not depend on, even indirectly:
// import paths, each with everything under it.
var heavyDeps = []string{
	"net/http",
	"github.com/segmentio/kafka-go",
	"github.com/twmb/franz-go",
	"github.com/prometheus",
}

// heavyRoot returns the entry of heavyDeps that dep is or is under.
func heavyRoot(dep string) (string, bool) {
	for _, h := range heavyDeps {
		if dep == h || strings.HasPrefix(dep, h+"/") {
			return h, true
		}
	}
	return "", false
}

// TestLeanDeps runs `go list -deps` on every lean package and fails when
// one depends on net/http, a Kafka client or Prometheus: the decision core
// must stay a library that a simulator, a benchmark or another server can
// link without dragging the serving stack along.
func TestLeanDeps(t *testing.T) {
	// Read the files go list will read, so that go test's cache (which does
	// not see what a child process reads) reruns this test when they change.
	ourImports(t)
	for _, f := range []string{"go.mod", "go.sum"} {
		if _, err := os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	var lean []string
	for _, dir := range slices.Sorted(maps.Keys(importRules)) {
		if importRules[dir].lean {
			lean = append(lean, dir)
		}
	}
	for _, dir := range lean {
		t.Run(dir, func(t *testing.T) {
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) && importRules[dir].planned {
				// A lean package still to come (as regional/route was before
				// the decision core moved there) is checked once it exists.
				t.Skipf("%s does not exist yet", dir)
			}
			deps := goListDeps(t, "./"+dir)
			// One failure per heavy dependency, naming the packages that
			// bring it in.
			via := map[string][]string{}
			for _, pkg := range slices.Sorted(maps.Keys(deps)) {
				if _, isHeavy := heavyRoot(pkg); isHeavy {
					continue
				}
				for _, imp := range deps[pkg] {
					if root, isHeavy := heavyRoot(imp); isHeavy && !slices.Contains(via[root], pkg) {
						via[root] = append(via[root], pkg)
					}
				}
			}
			for _, root := range slices.Sorted(maps.Keys(via)) {
				t.Errorf("%s depends on %s (imported by %s): a lean package must not pull net/http, Kafka or Prometheus",
					dir, root, strings.Join(via[root], ", "))
			}
		})
	}
}

// goListDeps runs `go list -deps pkg` and returns each package in it with
// its imports. go test puts the GOROOT/bin of the go command that runs it
// first on PATH, so "go" is that same command.
func goListDeps(t *testing.T, pkg string) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pkg)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	deps := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			deps[f[0]] = f[1:]
		}
	}
	return deps
}
