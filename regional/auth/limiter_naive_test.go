package auth_test

import (
	"math"
	"math/big"
	"time"

	"github.com/meridian-llm/meridian/regional/auth"
)

// naiveLimiter is the reference for auth.Limiter: a literal token bucket
// per name, refilled continuously at the limit's rate up to its burst, in
// exact rational arithmetic, never forgetting a name.
type naiveLimiter struct {
	buckets map[string]*naiveBucket
}

type naiveBucket struct {
	tokens *big.Rat
	last   int64 // ns
}

func newNaiveLimiter() *naiveLimiter { return &naiveLimiter{buckets: map[string]*naiveBucket{}} }

// naiveParams is the documented meaning of a RateLimit: one token every
// 1/rate seconds (rounded to a nanosecond, at least one), a bucket of Burst
// tokens (default: the rate rounded up, at least 1).
func naiveParams(rl auth.RateLimit) (interval int64, burst int64) {
	interval = int64(math.Round(1e9 / rl.RequestsPerSecond))
	if interval < 1 {
		interval = 1
	}
	burst = int64(rl.Burst)
	if burst <= 0 {
		burst = max(1, int64(math.Ceil(rl.RequestsPerSecond)))
	}
	return interval, burst
}

func (n *naiveLimiter) allow(name string, rl auth.RateLimit, now time.Time) (bool, time.Duration) {
	if rl.RequestsPerSecond == 0 {
		return true, 0
	}
	interval, burst := naiveParams(rl)
	t := now.UnixNano()
	full := new(big.Rat).SetInt64(burst)
	b := n.buckets[name]
	if b == nil {
		b = &naiveBucket{tokens: new(big.Rat).Set(full), last: t}
		n.buckets[name] = b
	}
	refill := big.NewRat(t-b.last, interval)
	b.tokens.Add(b.tokens, refill)
	if b.tokens.Cmp(full) > 0 {
		b.tokens.Set(full)
	}
	b.last = t
	one := big.NewRat(1, 1)
	if b.tokens.Cmp(one) >= 0 {
		b.tokens.Sub(b.tokens, one)
		return true, 0
	}
	wait := new(big.Rat).Sub(one, b.tokens)
	wait.Mul(wait, new(big.Rat).SetInt64(interval))
	if !wait.IsInt() {
		panic("fractional wait: " + wait.String())
	}
	return false, time.Duration(wait.Num().Int64())
}
