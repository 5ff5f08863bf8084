package kvbridge

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The package imports regional/kvevents of ours and nothing else of
// Meridian's (not the ingester, the index, global or cmd).
func TestImportsOnlyKVEventsOfOurs(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	const ours = "github.com/meridian-llm/meridian/"
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, ours) && path != ours+"regional/kvevents" {
				t.Errorf("%s imports %s", name, path)
			}
		}
	}
}
