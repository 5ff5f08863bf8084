package sim

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// naiveQueue is the event queue's reference: a slice kept sorted by (at,
// insertion order) by linear insertion.
type naiveQueue struct {
	evs []event
	seq uint64
}

func (q *naiveQueue) push(at time.Duration, fn func()) {
	q.seq++
	e := event{at: at, seq: q.seq, fn: fn}
	i := len(q.evs)
	for i > 0 && e.before(&q.evs[i-1]) {
		i--
	}
	q.evs = slices.Insert(q.evs, i, e)
}

func (q *naiveQueue) pop() event {
	e := q.evs[0]
	q.evs = q.evs[1:]
	return e
}

// TestEventQueueMatchesSortedList: any interleaving of pushes (with many
// equal instants) and pops gives the same order as the sorted list.
func TestEventQueueMatchesSortedList(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var q eventQueue
		var ref naiveQueue
		ops := rapid.SliceOfN(rapid.IntRange(-1, 20), 0, 300).Draw(t, "ops")
		for _, op := range ops {
			if op < 0 {
				if q.len() != len(ref.evs) {
					t.Fatalf("len %d, reference %d", q.len(), len(ref.evs))
				}
				if q.len() == 0 {
					continue
				}
				got, want := q.pop(), ref.pop()
				if got.at != want.at || got.seq != want.seq {
					t.Fatalf("popped (%v, %d), reference (%v, %d)", got.at, got.seq, want.at, want.seq)
				}
				continue
			}
			at := time.Duration(op) * time.Millisecond
			q.push(at, nil)
			ref.push(at, nil)
		}
		for q.len() > 0 {
			got, want := q.pop(), ref.pop()
			if got.at != want.at || got.seq != want.seq {
				t.Fatalf("drain: popped (%v, %d), reference (%v, %d)", got.at, got.seq, want.at, want.seq)
			}
		}
		if len(ref.evs) != 0 {
			t.Fatalf("reference still holds %d events", len(ref.evs))
		}
	})
}

func BenchmarkEventQueue(b *testing.B) {
	b.ReportAllocs()
	var q eventQueue
	fn := func() {}
	for i := range 1024 {
		q.push(time.Duration(i*7919%1024), fn)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e := q.pop()
		q.push(e.at+time.Duration(i%977), fn)
	}
}
