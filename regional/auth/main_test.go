package auth

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a reload loop (or an HTTP server of a
// test) running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
