package summary

import (
	"math"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
)

// VerifyBefore is how many sampled positions before the last one found
// present must also be present for a binary-search answer to stand.
const VerifyBefore = 2

// Depth is the estimate of how many leading blocks of a query chain a region
// holds. Under prefix closure, and unless the filter answered a false
// positive, Lower <= true depth <= Upper.
type Depth struct {
	// Lower is one past the last sampled position found present (0 if none):
	// the region holds at least the blocks before it. The estimate used for
	// decisions (see the package comment for why).
	Lower int
	// Upper is the first sampled position found absent (the chain length if
	// none): the region holds none of the blocks from it on.
	Upper int
	// Probes counts filter lookups.
	Probes int
	// Fallback is set when the check of the binary search's answer failed
	// (a false positive was caught) and a consecutive scan gave the answer.
	Fallback bool
}

// Mid is the midpoint of [Lower, Upper]: an unbiased guess when the true
// depth is equally likely anywhere in the bracket.
func (d Depth) Mid() int { return (d.Lower + d.Upper) / 2 }

// Depth estimates the region's matched depth (in blocks) for a chain of
// block hashes (index.ChainHashes with this summary's BlockSize). It does
// not allocate.
//
// Membership of the sampled positions is monotone along a chain the region
// holds a prefix of (present up to some position, absent after), so a
// binary search over positions finds the drop: for a probe position it looks
// back to the nearest sampled position and asks the filter. Each probe only
// narrows the bracket, so false positives can only raise the answer. The
// answer is then checked: the VerifyBefore sampled positions before it must
// be present too; a false positive far beyond the true depth fails this
// check with probability 1 - 2^-16, and the estimate is then the consecutive
// scan (the first absent sampled position from the start), which a false
// positive can only extend by one sampling gap. A false positive at the very
// first absent sampled position cannot be told from a true match: it raises
// the estimate by one gap.
func (s *Summary) Depth(chain []uint64) Depth {
	n := len(chain)
	d := Depth{Upper: n}
	if n == 0 {
		return d
	}
	keep := s.sampler
	last := -1      // last sampled position found present
	lo, hi := -1, n // every sampled position <= lo is present; hi is n or an absent sampled position
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		q := mid
		for q > lo && !keep.Keep(chain[q]) {
			q--
		}
		if q == lo {
			lo = mid // no sampled position in (lo, mid]
			continue
		}
		d.Probes++
		if s.filter.contains(chain[q]) {
			last, lo = q, mid
		} else {
			hi = q
		}
	}
	d.Lower, d.Upper = last+1, hi
	// Check the answer: the sampled positions just before it must be present.
	q := last - 1
	for k := 0; k < VerifyBefore && q >= 0; k++ {
		for q >= 0 && !keep.Keep(chain[q]) {
			q--
		}
		if q < 0 {
			break
		}
		d.Probes++
		if !s.filter.contains(chain[q]) {
			return s.scan(chain, d)
		}
		q--
	}
	return d
}

// scan is the consecutive scan: present up to the first absent sampled
// position.
func (s *Summary) scan(chain []uint64, d Depth) Depth {
	d.Fallback = true
	d.Lower, d.Upper = 0, len(chain)
	for i, h := range chain {
		if !s.sampler.Keep(h) {
			continue
		}
		d.Probes++
		if !s.filter.contains(h) {
			d.Upper = i
			break
		}
		d.Lower = i + 1
	}
	return d
}

// Candidate fills the gorgo candidate of this (remote) region for a request
// of promptTokens tokens whose chain of block hashes is chain:
//
//   - CachedTokens: Depth(chain).Lower blocks of BlockSize tokens, capped at
//     the prompt;
//   - Profile: the profile with the most pods; PendingPrefillTokens and
//     Running: the region's totals per pod, rounded up (the remote
//     controller picks a pod of its own; its queue is estimated as the
//     region's mean). A reader with a cost model prices it at the pool
//     that would serve it soonest instead (Price).
//
// SummaryAge, RTTMs and EgressBytes are left for the caller: the gossip view
// knows the RTT, and when the summary arrived, which bounds its age when
// the remote clock runs ahead. The time argument is not used; it goes when
// its last caller (regional's benchmark) stops passing it.
func (s *Summary) Candidate(_ time.Time, chain []uint64, promptTokens int) gorgo.Candidate {
	t := s.Totals()
	c := gorgo.Candidate{
		Region:       s.Region,
		Remote:       true,
		Profile:      t.Profile,
		PromptTokens: promptTokens,
		CachedTokens: min(s.Depth(chain).Lower*s.BlockSize, max(promptTokens, 0)),
	}
	if t.Pods > 0 {
		c.PendingPrefillTokens = int(ceilDiv(t.PendingPrefillTokens, int64(t.Pods)))
		c.Running = int(ceilDiv(int64(t.Running), int64(t.Pods)))
	}
	return c
}

// Price sets c (a candidate of this region, as Candidate fills it, with
// whatever the caller adds: age, RTT, egress) to the pool of the region's
// pods that would serve it soonest by m: for each profile with live pods,
// that profile, with its pods' mean backlog and requests in flight
// (rounded up); the pool whose m.Estimate is least wins (ties to the
// earlier in Load). With no load it leaves c as it is.
//
// A summary's PendingPrefillTokens are each pool's backlog in tokens at
// its own profile's rate: a b200 pool's 1,000 tokens are 158 ms, an h100
// pool's 360 ms. Summed over pools and priced at the profile with the
// most pods, as Candidate does for a reader without rates, a fast pool's
// backlog counts at the slow profile's rate and the request's prefill is
// priced on hardware the remote controller would not pick for it: the
// region looks up to 2.3x as far off as it is. The remote controller
// picks the pod with the least expected TTFT; the pool whose mean pod
// does is the estimate a summary allows (a pool's least loaded pod may do
// better still). In the simulator's long-RTT scenario, where
// ap-southeast-1 must shed its excess over 220 ms, pricing remote regions
// at the profile with the most pods kept large cold prompts at home: its
// p95 TTFT was 2.25x the idealised GORGO's at load 0.5, and 0.75x priced
// at the soonest pool.
func (s *Summary) Price(c *gorgo.Candidate, m *gorgo.Model) {
	best, bestMs := *c, math.Inf(1)
	for _, l := range s.Load {
		if l.Pods <= 0 {
			continue
		}
		try := *c
		try.Profile = l.Profile
		try.PendingPrefillTokens = int(ceilDiv(l.PendingPrefillTokens, int64(l.Pods)))
		try.Running = int(ceilDiv(int64(l.Running), int64(l.Pods)))
		if e := m.Estimate(&try); e.TotalMs < bestMs {
			best, bestMs = try, e.TotalMs
		}
	}
	*c = best
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
