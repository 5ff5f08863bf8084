package kvbridge

import (
	"fmt"
	"testing"
)

// The per-batch cost of the state machine on the common path: the next
// batch in order on the same connection (one digest of the payload).
func BenchmarkStreamInOrder(b *testing.B) {
	for _, size := range []int{256, 4096} {
		b.Run(fmt.Sprintf("payload=%dB", size), func(b *testing.B) {
			payload := make([]byte, size)
			var st stream
			var t tally
			acts := make([]action, 0, 4)
			acts = st.handle(acts[:0], &t, 1, 0, payload, nil)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				acts = st.handle(acts[:0], &t, 1, uint64(i+1), payload, nil)
			}
			if len(acts) != 1 {
				b.Fatalf("actions %d", len(acts))
			}
		})
	}
}
