package sim

import (
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tracePath is the shared conversation trace (never edited; read by the
// loader): in shared/traces beside the checkout, found by walking up from
// the package (the main checkout and the worktrees sit at different
// depths).
var tracePath = findShared("traces/conversation_trace.jsonl")

func findShared(rel string) string {
	dir, err := filepath.Abs(".")
	if err != nil {
		return filepath.Join("shared", rel)
	}
	for {
		p := filepath.Join(dir, "shared", rel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return filepath.Join("shared", rel)
		}
		dir = parent
	}
}

var (
	traceOnce sync.Once
	traceRecs []TraceRecord
	traceErr  error
)

// conversationTrace loads the shared trace once; tests that need it skip
// when it is not beside the checkout.
func conversationTrace(tb testing.TB) []TraceRecord {
	tb.Helper()
	if _, err := os.Stat(tracePath); err != nil {
		tb.Skipf("shared trace not found: %v", err)
	}
	traceOnce.Do(func() { traceRecs, traceErr = LoadTraceFile(tracePath, TraceBlockSize) })
	if traceErr != nil {
		tb.Fatal(traceErr)
	}
	return traceRecs
}
