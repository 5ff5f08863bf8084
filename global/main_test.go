package global

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test of the package (internal or external) leaves
// a goroutine behind: nodes, raft, transports and HTTP servers must all stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
