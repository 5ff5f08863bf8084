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
// module-internal import prefixes it may use. A directory not listed may import
// any package of ours except cmd. The rules follow DESIGN.md: data flows one
// way, and the pure packages import nothing of ours.
var importRules = map[string][]string{
	"index":     {},
	"residency": {},
	"gorgo":     {"index"},
	"dr":        {"residency", "global", "index"},
}

func rulesFor(dir string) ([]string, bool) {
	best, found := "", false
	var allowed []string
	for prefix, a := range importRules {
		if dir == prefix || strings.HasPrefix(dir, prefix+"/") {
			if len(prefix) > len(best) {
				best, allowed, found = prefix, a, true
			}
		}
	}
	return allowed, found
}

// TestImportDirection fails when a package imports one of ours that its rule
// does not allow (its own sub-packages are always allowed), or when anything
// but cmd imports cmd.
func TestImportDirection(t *testing.T) {
	for _, dir := range goPackageDirs(t) {
		dir = filepath.ToSlash(dir)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		allowed, ruled := rulesFor(dir)
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
				if !checkImport(dir, rel, allowed, ruled) {
					t.Errorf("%s/%s imports %q, which its import rule does not allow", dir, name, p)
				}
			}
		}
	}
}

func checkImport(dir, rel string, allowed []string, ruled bool) bool {
	if rel == "cmd" || strings.HasPrefix(rel, "cmd/") {
		return strings.HasPrefix(dir, "cmd")
	}
	if !ruled {
		return true
	}
	top := strings.SplitN(dir, "/", 2)[0]
	if rel == top || strings.HasPrefix(rel, top+"/") {
		return true // a package's own sub-packages
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
	}
	for _, c := range cases {
		allowed, ruled := rulesFor(c.dir)
		if got := checkImport(c.dir, c.rel, allowed, ruled); got != c.want {
			t.Errorf("checkImport(%q, %q) = %v, want %v", c.dir, c.rel, got, c.want)
		}
	}
}
