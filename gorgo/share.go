package gorgo

import (
	"sync"
	"time"
)

// shareBuckets is the resolution of the sliding window.
const shareBuckets = 60

// ShareTracker counts this region's decisions over a sliding window (in
// shareBuckets buckets) and how many went to each remote region. It is the
// state behind the MaxRemoteShare guardrail. Safe for concurrent use; time
// is given, never read.
type ShareTracker struct {
	mu      sync.Mutex
	bucket  time.Duration
	head    int64 // index of the newest bucket (unix time / bucket)
	total   [shareBuckets]int
	remote  map[string]*[shareBuckets]int
	sumAll  int
	sumByRg map[string]int
}

// NewShareTracker tracks shares over window.
func NewShareTracker(window time.Duration) *ShareTracker {
	b := window / shareBuckets
	if b <= 0 {
		b = time.Millisecond
	}
	return &ShareTracker{bucket: b, remote: map[string]*[shareBuckets]int{}, sumByRg: map[string]int{}}
}

// advance drops buckets that fell out of the window by now.
func (s *ShareTracker) advance(now time.Time) int {
	idx := now.UnixNano() / int64(s.bucket)
	if idx <= s.head {
		return int(s.head % shareBuckets)
	}
	steps := idx - s.head
	if steps > shareBuckets {
		steps = shareBuckets
	}
	for i := int64(1); i <= steps; i++ {
		b := int((s.head + i) % shareBuckets)
		s.sumAll -= s.total[b]
		s.total[b] = 0
		for r, arr := range s.remote {
			s.sumByRg[r] -= arr[b]
			arr[b] = 0
		}
	}
	s.head = idx
	return int(idx % shareBuckets)
}

// Record counts one decision: served at home (remoteRegion == "") or
// forwarded to remoteRegion.
func (s *ShareTracker) Record(remoteRegion string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.advance(now)
	s.total[b]++
	s.sumAll++
	if remoteRegion == "" {
		return
	}
	arr := s.remote[remoteRegion]
	if arr == nil {
		arr = new([shareBuckets]int)
		s.remote[remoteRegion] = arr
	}
	arr[b]++
	s.sumByRg[remoteRegion]++
}

// Share is the fraction of the window's decisions forwarded to region.
func (s *ShareTracker) Share(region string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(now)
	if s.sumAll == 0 {
		return 0
	}
	return float64(s.sumByRg[region]) / float64(s.sumAll)
}
