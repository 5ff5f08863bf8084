package gossip

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: memberlist, the
// worker, the senders and the transports must all stop on Close. A probe
// memberlist had in flight at Shutdown ends when its ack handler times out
// (up to ProbeInterval times its awareness multiplier), so leaks get a
// bounded grace period to resolve before they count.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		for goleak.Find() != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
