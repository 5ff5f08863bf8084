package route

import (
	"sync"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
)

// Forwarded is the prefill work this controller has sent to each remote
// region whose prefill has not finished yet. A remote candidate's load comes
// from the region's summary, which is seconds old: without this, every
// request placed between two summaries sees the remote region as idle as it
// was, and a burst goes all to one place (in the simulator's coding workload
// the origins sent their first sessions to regions whose summaries still
// said "no load"). GORGO's lesson applies across regions too: the router's
// own count of what it sent is the load signal that is never stale.
//
// Safe for concurrent use. The zero value is ready.
type Forwarded struct {
	mu     sync.Mutex
	next   uint64
	region map[string][]forward
}

type forward struct {
	id     uint64
	at     time.Time
	tokens int
}

// Add records uncached prefill tokens sent to region at the given time and
// returns the id that Landed takes.
func (f *Forwarded) Add(region string, at time.Time, tokens int) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.region == nil {
		f.region = map[string][]forward{}
	}
	f.next++
	f.region[region] = append(f.region[region], forward{id: f.next, at: at, tokens: max(tokens, 0)})
	return f.next
}

// Landed removes a forward whose prefill is over (its first byte came back,
// or it failed); an unknown id is ignored.
func (f *Forwarded) Landed(region string, id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.region[region]
	for i := range l {
		if l[i].id == id {
			f.region[region] = append(l[:i], l[i+1:]...)
			return
		}
	}
}

// Since is the tokens sent to region at or after t and not landed.
func (f *Forwarded) Since(region string, t time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, fw := range f.region[region] {
		if !fw.at.Before(t) {
			n += fw.tokens
		}
	}
	return n
}

// Unseen is what a remote region's summary cannot show yet: a summary
// received at receivedAt was built about half an RTT earlier and counts
// the requests that reached the region before that, so the forwards sent
// from receivedAt - rtt on are not in it.
type Unseen struct {
	ReceivedAt time.Time
	RTT        time.Duration
	Pods       int
}

// Adjust adds to each remote candidate's pending prefill, per pod of its
// region (rounded up, as the summary's own figure is), the forwards its
// summary cannot show yet. unseen says when each region's summary arrived,
// the RTT and the region's pod count (ok false: leave the candidate as it is).
func (f *Forwarded) Adjust(cands []gorgo.Candidate, unseen func(region string) (Unseen, bool)) {
	for i := range cands {
		c := &cands[i]
		if !c.Remote {
			continue
		}
		u, ok := unseen(c.Region)
		if !ok || u.Pods <= 0 {
			continue
		}
		if n := f.Since(c.Region, u.ReceivedAt.Add(-u.RTT)); n > 0 {
			c.PendingPrefillTokens += (n + u.Pods - 1) / u.Pods
		}
	}
}
