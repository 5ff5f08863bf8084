package kvbridge

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The package and its sub-packages (zmtp) import regional/kvevents,
// regional/discovery, regional/kafkasec and each other of ours and nothing else of Meridian's (not the ingester, the index,
// global, scenarios or cmd); zmtp, shared with the engine simulator, imports
// nothing of ours at all.
func TestImportsOnlyKVEventsOfOurs(t *testing.T) {
	const ours = "github.com/meridian-llm/meridian/"
	const self = ours + "regional/kvbridge"
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		leaf := filepath.Dir(path) == "zmtp"
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, ours) {
				continue
			}
			allowed := !leaf && (p == ours+"regional/kvevents" || p == ours+"regional/discovery" || p == ours+"regional/kafkasec" || strings.HasPrefix(p, self+"/"))
			if !allowed {
				t.Errorf("%s imports %s", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
