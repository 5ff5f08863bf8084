package summary

// The naive reference: an exact set and consecutive scans.

// naiveTrueDepth is the number of leading blocks of chain in held.
func naiveTrueDepth(held map[uint64]bool, chain []uint64) int {
	for i, h := range chain {
		if !held[h] {
			return i
		}
	}
	return len(chain)
}

// naiveSampledDepth is what a perfect (false-positive-free) summary at
// sampling rule s can say: one past the last sampled position before the
// first absent sampled position (lower), and that position (upper).
func naiveSampledDepth(held map[uint64]bool, s Sampler, chain []uint64) (lower, upper int) {
	upper = len(chain)
	for i, h := range chain {
		if !s.Keep(h) {
			continue
		}
		if !held[h] {
			return lower, i
		}
		lower = i + 1
	}
	return lower, upper
}

// falsePositiveIn reports whether the summary answers present for a sampled
// position of chain that held lacks.
func falsePositiveIn(s *Summary, held map[uint64]bool, chain []uint64) bool {
	for _, h := range chain {
		if s.sampler.Keep(h) && !held[h] && s.filter.contains(h) {
			return true
		}
	}
	return false
}
