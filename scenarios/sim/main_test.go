package sim

import (
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tracePath is the shared conversation trace (never edited; read by the loader).
const tracePath = "../../../shared/traces/conversation_trace.jsonl"

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
