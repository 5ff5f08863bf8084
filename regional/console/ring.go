package console

import "sync"

// Ring keeps the last Cap values pushed, in order: a fixed array written
// round, so its memory is bounded from the start whatever runs through it.
// Safe for concurrent use.
type Ring[T any] struct {
	mu   sync.Mutex
	buf  []T
	next int  // where the next value goes
	full bool // every slot holds a value
}

// NewRing returns a ring of capacity n (at least 1).
func NewRing[T any](n int) *Ring[T] {
	return &Ring[T]{buf: make([]T, max(n, 1))}
}

// Cap is the ring's capacity.
func (r *Ring[T]) Cap() int { return len(r.buf) }

// Push adds v, dropping the oldest value when the ring is full.
func (r *Ring[T]) Push(v T) {
	r.mu.Lock()
	r.buf[r.next] = v
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
	r.mu.Unlock()
}

// Len is how many values the ring holds.
func (r *Ring[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.full {
		return len(r.buf)
	}
	return r.next
}

// Values returns a copy of the values held, oldest first.
func (r *Ring[T]) Values() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]T(nil), r.buf[:r.next]...)
	}
	out := make([]T, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// Last returns the newest value, and false when the ring is empty.
func (r *Ring[T]) Last() (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var zero T
	if !r.full && r.next == 0 {
		return zero, false
	}
	i := r.next - 1
	if i < 0 {
		i = len(r.buf) - 1
	}
	return r.buf[i], true
}
