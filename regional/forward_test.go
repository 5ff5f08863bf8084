package regional

import (
	"math"
	"testing"
	"time"
)

// TestForwardLimits: a forward's timeouts follow the RTT and the expected
// time to first byte, within the first-byte cap and what is left of the
// request's budget.
func TestForwardLimits(t *testing.T) {
	c := DefaultForwardConfig()
	capFB, budget := 120*time.Second, 60*time.Second
	for _, tc := range []struct {
		name             string
		rttMs, expectMs  float64
		left             time.Duration
		connect, firstBy time.Duration
	}{
		{"near, short queue", 10, 110, budget, 250 * time.Millisecond, 10*time.Millisecond + 300*time.Millisecond + 2*time.Second},
		{"far", 220, 1220, budget, 880 * time.Millisecond, 220*time.Millisecond + 3*time.Second + 2*time.Second},
		{"long prefill, capped by the budget left", 75, 30075, 20 * time.Second, 300 * time.Millisecond, 20 * time.Second},
		{"unknown estimate", 75, math.Inf(1), budget, 300 * time.Millisecond, budget},
		{"no estimate at all", math.NaN(), math.NaN(), budget, 250 * time.Millisecond, budget},
		{"budget nearly spent", 75, 175, 100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		got := c.limits(tc.rttMs, tc.expectMs, capFB, tc.left)
		if got.connect != tc.connect || got.firstByte != tc.firstBy {
			t.Errorf("%s: connect %v first byte %v, want %v and %v", tc.name, got.connect, got.firstByte, tc.connect, tc.firstBy)
		}
	}
}
