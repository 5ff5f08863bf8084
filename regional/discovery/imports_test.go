package discovery

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The package imports, beyond the standard library, only the Prometheus
// client (to build its metrics on the Registerer it is given), YAML and
// the DNS message parser: no Kafka client, nothing of ours (the root's
// deps_test.go checks that too). Its test server may add miekg/dns.
func TestImports(t *testing.T) {
	allowed := map[string][]string{
		".": {"github.com/prometheus/client_golang/prometheus", "go.yaml.in/yaml/v3",
			"golang.org/x/net/dns/dnsmessage"},
		"discoverytest": {"github.com/miekg/dns"},
	}
	for dir, ok := range allowed {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(p, "/")
				if strings.Contains(first, ".") && !slices.Contains(ok, p) {
					t.Errorf("%s imports %s", path, p)
				}
			}
		}
	}
}
