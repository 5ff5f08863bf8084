package console

import (
	"slices"
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// naiveRing is the reference: every value pushed, the last n of them.
type naiveRing struct {
	n    int
	vals []int
}

func (r *naiveRing) push(v int) { r.vals = append(r.vals, v) }
func (r *naiveRing) values() []int {
	if len(r.vals) <= r.n {
		return slices.Clone(r.vals)
	}
	return slices.Clone(r.vals[len(r.vals)-r.n:])
}

// TestRingMatchesNaive: through any number of wraparounds, the ring holds
// exactly the last Cap values, oldest first, as the naive reference does.
func TestRingMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "cap")
		r, ref := NewRing[int](n), &naiveRing{n: n}
		pushes := rapid.IntRange(0, 5*n+3).Draw(t, "pushes")
		for i := range pushes {
			v := rapid.Int().Draw(t, "v")
			r.Push(v)
			ref.push(v)
			if rapid.Bool().Draw(t, "check") || i == pushes-1 {
				want := ref.values()
				if got := r.Values(); !slices.Equal(got, want) {
					t.Fatalf("after %d pushes into %d slots: %v, want %v", i+1, n, got, want)
				}
				if r.Len() != len(want) {
					t.Fatalf("Len %d, want %d", r.Len(), len(want))
				}
				last, ok := r.Last()
				if !ok || last != want[len(want)-1] {
					t.Fatalf("Last %d %v, want %d", last, ok, want[len(want)-1])
				}
			}
		}
		if pushes == 0 {
			if _, ok := r.Last(); ok || r.Len() != 0 || len(r.Values()) != 0 {
				t.Fatal("an empty ring holds something")
			}
		}
	})
}

func TestRingCapacityAtLeastOne(t *testing.T) {
	r := NewRing[string](0)
	r.Push("a")
	r.Push("b")
	if got := r.Values(); !slices.Equal(got, []string{"b"}) || r.Cap() != 1 {
		t.Fatalf("%v (cap %d)", got, r.Cap())
	}
}

// TestRingConcurrent: readers copying the ring while a writer pushes see,
// every time, a run of consecutive values no longer than the capacity
// (never a torn or reordered one); run with -race.
func TestRingConcurrent(t *testing.T) {
	const n, pushes, readers = 16, 5000, 4
	r := NewRing[int](n)
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan string, readers)
	for range readers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				v := r.Values()
				if len(v) > n {
					errs <- "more values than the capacity"
					return
				}
				for i := 1; i < len(v); i++ {
					if v[i] != v[i-1]+1 {
						errs <- "values out of order"
						return
					}
				}
				r.Len()
				r.Last()
			}
		})
	}
	for i := range pushes {
		r.Push(i)
	}
	close(done)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	want := make([]int, n)
	for i := range want {
		want[i] = pushes - n + i
	}
	if got := r.Values(); !slices.Equal(got, want) {
		t.Fatalf("after the writer: %v, want %v", got, want)
	}
}
