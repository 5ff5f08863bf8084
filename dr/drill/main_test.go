package drill

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: the probes, the
// coordinator and the fleets of fleet_test.go must all stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
