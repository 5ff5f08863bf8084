package meridian_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/meridian-llm/meridian"

// importRules lists, for a package directory (and everything under it), the
// module-internal import prefixes it may use besides the packages under that
// directory; the longest listed prefix of a directory is its rule. A directory
// not listed may import any package of ours except cmd. The rules follow
// DESIGN.md: data flows one way, and the pure packages import nothing of ours.
// dr's two parts do not import each other: the check reads folders and needs
// nothing of ours, the drill needs the admin API client and the policy.
var importRules = map[string][]string{
	"index":     {},
	"residency": {},
	"gorgo":     {"index"},
	"dr":        {"residency", "global", "index"},
	"dr/check":  {},
	"dr/drill":  {"residency", "global"},
}

// rulesFor returns the rule of dir: its longest prefix in importRules and
// what that prefix may import; rule is "" when dir has none.
func rulesFor(dir string) (rule string, allowed []string) {
	for prefix, a := range importRules {
		if dir == prefix || strings.HasPrefix(dir, prefix+"/") {
			if len(prefix) > len(rule) {
				rule, allowed = prefix, a
			}
		}
	}
	return rule, allowed
}

// TestImportDirection fails when a package imports one of ours that its rule
// does not allow (the packages under the rule's directory are always
// allowed), or when anything but cmd imports cmd.
func TestImportDirection(t *testing.T) {
	for _, dir := range goPackageDirs(t) {
		dir = filepath.ToSlash(dir)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		rule, allowed := rulesFor(dir)
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.ImportsOnly)
			if err != nil {
				t.Fatalf("parse %s/%s: %v", dir, name, err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if p != modulePath && !strings.HasPrefix(p, modulePath+"/") {
					continue
				}
				rel := strings.TrimPrefix(strings.TrimPrefix(p, modulePath), "/")
				if !checkImport(dir, rel, rule, allowed) {
					t.Errorf("%s/%s imports %q, which its import rule does not allow", dir, name, p)
				}
			}
		}
	}
}

func checkImport(dir, rel, rule string, allowed []string) bool {
	if rel == "cmd" || strings.HasPrefix(rel, "cmd/") {
		return strings.HasPrefix(dir, "cmd")
	}
	if rule == "" {
		return true
	}
	if rel == rule || strings.HasPrefix(rel, rule+"/") {
		return true // a package under the rule's directory (its own sub-packages)
	}
	for _, a := range allowed {
		if rel == a || strings.HasPrefix(rel, a+"/") {
			return true
		}
	}
	return false
}

func TestCheckImportRules(t *testing.T) {
	cases := []struct {
		dir, rel string
		want     bool
	}{
		{"index", "regional", false},
		{"index", "index/internal", true},
		{"residency", "index", false},
		{"gorgo", "index", true},
		{"gorgo", "regional", false},
		{"regional", "index", true},
		{"regional", "cmd/meridian", false},
		{"cmd/meridian", "regional", true},
		{"dr/check", "dr/check/safetensors", true},
		{"dr/check/checktest", "dr/check/safetensors", true},
		{"dr/check", "global", false},
		{"dr/check", "dr/drill", false},
		{"dr/drill", "global", true},
		{"dr/drill", "residency", true},
		{"dr/drill", "index", false},
		{"dr/drill", "dr/check", false},
		{"dr/drill", "regional", false},
	}
	for _, c := range cases {
		rule, allowed := rulesFor(c.dir)
		if got := checkImport(c.dir, c.rel, rule, allowed); got != c.want {
			t.Errorf("checkImport(%q, %q) = %v, want %v", c.dir, c.rel, got, c.want)
		}
	}
}
