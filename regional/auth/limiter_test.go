package auth_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/regional/auth"
)

func newLimiter(t testing.TB, cfg auth.LimiterConfig) *auth.Limiter {
	t.Helper()
	l, err := auth.NewLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLimiterBasics(t *testing.T) {
	l := newLimiter(t, auth.DefaultLimiterConfig())
	now := time.Unix(1_000_000, 0)
	rl := auth.RateLimit{RequestsPerSecond: 2, Burst: 3}
	for i := range 3 {
		if ok, _ := l.Allow("a", rl, now); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, wait := l.Allow("a", rl, now)
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("4th request: %v, retry after %v; want refused, 500ms", ok, wait)
	}
	if ok, _ := l.Allow("b", rl, now); !ok {
		t.Fatal("another name shares the bucket")
	}
	if ok, _ := l.Allow("a", rl, now.Add(499*time.Millisecond)); ok {
		t.Fatal("allowed before the retry time")
	}
	if ok, _ := l.Allow("a", rl, now.Add(500*time.Millisecond)); !ok {
		t.Fatal("refused at the retry time")
	}
	for range 100 {
		if ok, _ := l.Allow("free", auth.RateLimit{}, now); !ok {
			t.Fatal("an unlimited limit refused")
		}
	}
	if l.Len() != 2 {
		t.Fatalf("tracking %d names, want 2 (unlimited names are not tracked)", l.Len())
	}
}

// TestLimiterMatchesNaive: on any sequence of requests (names with their
// own limits, non-decreasing times) the limiter answers exactly as the
// naive token bucket, including the wait.
func TestLimiterMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c", "d"}
		limits := map[string]auth.RateLimit{}
		for _, n := range names {
			limits[n] = auth.RateLimit{
				RequestsPerSecond: rapid.SampledFrom([]float64{0, 0.5, 1, 3, 7.5, 100, 1e6}).Draw(t, "rps_"+n),
				Burst:             rapid.IntRange(0, 6).Draw(t, "burst_"+n),
			}
		}
		l, err := auth.NewLimiter(auth.LimiterConfig{MaxKeys: 64, Shards: 4})
		if err != nil {
			t.Fatal(err)
		}
		ref := newNaiveLimiter()
		now := time.Unix(1_700_000_000, 0)
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for i := range steps {
			now = now.Add(time.Duration(rapid.OneOf(rapid.Just(int64(0)), rapid.Int64Range(0, int64(3*time.Second))).Draw(t, "dt")))
			n := rapid.SampledFrom(names).Draw(t, "name")
			ok, wait := l.Allow(n, limits[n], now)
			wantOK, wantWait := ref.allow(n, limits[n], now)
			if ok != wantOK || wait != wantWait {
				t.Fatalf("step %d, %s %+v at %v: limiter (%v, %v), naive (%v, %v)", i, n, limits[n], now, ok, wait, wantOK, wantWait)
			}
		}
	})
}

// TestLimiterBoundedMemory: however many names, at most MaxKeys are kept;
// an evicted name starts again with a full bucket.
func TestLimiterBoundedMemory(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		shards := rapid.IntRange(1, 8).Draw(t, "shards")
		maxKeys := rapid.IntRange(shards, 40).Draw(t, "maxKeys")
		l, err := auth.NewLimiter(auth.LimiterConfig{MaxKeys: maxKeys, Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_700_000_000, 0)
		rl := auth.RateLimit{RequestsPerSecond: 1, Burst: 1}
		for i := range rapid.IntRange(1, 500).Draw(t, "n") {
			name := fmt.Sprintf("n%d", rapid.IntRange(0, 200).Draw(t, "name"))
			l.Allow(name, rl, now.Add(time.Duration(i)*time.Millisecond))
			if got := l.Len(); got > maxKeys {
				t.Fatalf("tracking %d names, more than MaxKeys %d", got, maxKeys)
			}
		}
	})
	l := newLimiter(t, auth.LimiterConfig{MaxKeys: 2, Shards: 1})
	now := time.Unix(1_700_000_000, 0)
	rl := auth.RateLimit{RequestsPerSecond: 1, Burst: 1}
	l.Allow("a", rl, now)
	if ok, _ := l.Allow("a", rl, now); ok {
		t.Fatal("a's bucket is not empty")
	}
	l.Allow("b", rl, now)
	l.Allow("c", rl, now) // evicts a, the least recently seen
	if ok, _ := l.Allow("a", rl, now); !ok {
		t.Fatal("an evicted name did not start with a full bucket")
	}
}

// TestLimiterConcurrent: with the clock standing still, concurrent callers
// of one name get exactly the burst.
func TestLimiterConcurrent(t *testing.T) {
	l := newLimiter(t, auth.DefaultLimiterConfig())
	now := time.Unix(1_700_000_000, 0)
	rl := auth.RateLimit{RequestsPerSecond: 10, Burst: 50}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if ok, _ := l.Allow("shared", rl, now); ok {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 50 {
		t.Fatalf("%d allowed, want the burst of 50", allowed.Load())
	}
}

func TestLimiterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	l := newLimiter(t, auth.DefaultLimiterConfig())
	rl := auth.RateLimit{RequestsPerSecond: 1e6, Burst: 1 << 20}
	now := time.Unix(1_700_000_000, 0)
	l.Allow("tenant-a", rl, now)
	if n := testing.AllocsPerRun(1000, func() { l.Allow("tenant-a", rl, now) }); n != 0 {
		t.Fatalf("Allow of a known name allocates %v times, want 0", n)
	}
}

func BenchmarkLimiterAllow(b *testing.B) {
	l, _ := auth.NewLimiter(auth.DefaultLimiterConfig())
	rl := auth.RateLimit{RequestsPerSecond: 1e6, Burst: 1 << 20}
	names := make([]string, 1024)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%d", i)
	}
	now := time.Unix(1_700_000_000, 0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.Allow(names[i&1023], rl, now.Add(time.Duration(i)))
	}
}
