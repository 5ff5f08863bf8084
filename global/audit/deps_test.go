package audit

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNothingOfOurs keeps the package free of the Raft tier (package
// global) and every other package of ours: it runs beside global, not on it.
func TestImportsNothingOfOurs(t *testing.T) {
	const module = "github.com/meridian-llm/meridian/"
	for _, dir := range []string{".", "audittest"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(p, module) {
					t.Errorf("%s imports %s", f, p)
				}
			}
		}
	}
}
