package sim

import "time"

// event is one thing that happens at a virtual instant. Events at the same
// instant run in the order they were scheduled (seq), which makes a run
// deterministic.
type event struct {
	at  time.Duration // since the start of the run
	seq uint64
	fn  func()
}

// before orders events by time, then by scheduling order.
func (e *event) before(f *event) bool {
	if e.at != f.at {
		return e.at < f.at
	}
	return e.seq < f.seq
}

// eventQueue is a binary min-heap of events ordered by (at, seq). The naive
// reference in its tests is a sorted slice.
type eventQueue struct {
	h   []event
	seq uint64
}

// push schedules fn at at.
func (q *eventQueue) push(at time.Duration, fn func()) {
	q.seq++
	q.h = append(q.h, event{at: at, seq: q.seq, fn: fn})
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.h[i].before(&q.h[p]) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

// len is the number of scheduled events.
func (q *eventQueue) len() int { return len(q.h) }

// pop removes and returns the earliest event. The queue must not be empty.
func (q *eventQueue) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h[n] = event{}
	q.h = q.h[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && q.h[l].before(&q.h[m]) {
			m = l
		}
		if r < n && q.h[r].before(&q.h[m]) {
			m = r
		}
		if m == i {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return top
}
