package regional

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
)

func TestReadBudget(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	b := newReadBudget(10)
	for _, n := range []int64{5, 5} {
		if err := b.acquire(context.Background(), n); err != nil {
			t.Fatalf("acquire(%d) with room: %v", n, err)
		}
	}
	// Full: acquiring waits, so with ctx done it fails, and takes nothing.
	if err := b.acquire(done, 1); err == nil {
		t.Fatal("acquire(1) on a full budget did not wait")
	}
	b.release(5)
	if err := b.acquire(done, 3); err != nil {
		t.Fatalf("acquire(3) after release(5): %v", err)
	}
	if err := b.acquire(done, 3); err == nil {
		t.Fatal("acquire(3) with 2 free did not wait")
	}
	b.release(3)
	b.release(5)
	// A message larger than the whole budget passes, alone.
	if err := b.acquire(done, 100); err != nil {
		t.Fatalf("acquire(100) of an empty budget of 10: %v", err)
	}
	if err := b.acquire(done, 1); err == nil {
		t.Fatal("acquire(1) beside an oversized message did not wait")
	}
	b.release(100)
	if b.free != b.max {
		t.Fatalf("free %d after every release, want %d", b.free, b.max)
	}

	// A waiting acquire returns once enough is released.
	if err := b.acquire(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	got := make(chan error)
	go func() { got <- b.acquire(context.Background(), 4) }()
	b.release(2)
	b.release(2)
	if err := <-got; err != nil {
		t.Fatalf("acquire(4) woken by releases: %v", err)
	}
}

// One acquirer and concurrent releasers, against a plain count of the
// bytes held: what acquire lets through never exceeds the budget (but for
// one oversized message alone), and everything acquired comes back.
func TestReadBudgetBounds(t *testing.T) {
	const max = 1000
	b := newReadBudget(max)
	var mu sync.Mutex
	held := int64(0)
	rel := make(chan int64, 64)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range rel {
				mu.Lock()
				held -= min(n, max)
				mu.Unlock()
				b.release(n)
			}
		}()
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 20000 {
		n := int64(rng.IntN(300))
		if i%997 == 0 {
			n = 5000 // oversized
		}
		if err := b.acquire(context.Background(), n); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		held += min(n, max)
		if held > max {
			mu.Unlock()
			t.Fatalf("%d bytes held after acquire(%d), budget %d", held, n, max)
		}
		mu.Unlock()
		rel <- n
	}
	close(rel)
	wg.Wait()
	if b.free != max {
		t.Fatalf("free %d after every release, want %d", b.free, max)
	}
}
