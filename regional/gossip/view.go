package gossip

import (
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/summary"
)

// RegionsView is an immutable snapshot of what this controller knows about
// the other regions. The request path reads it without locks (Node.View);
// the node swaps in a new one when anything changes. Nothing in it may be
// modified.
type RegionsView struct {
	Local string    // this controller's region
	At    time.Time // when the snapshot was taken
	// Regions are the remote regions, nearest first (unknown RTT last, then
	// by name), like Consul's GetDatacentersByDistance.
	Regions []RegionView
	// Sightings are every controller's view of the regions other than its
	// own, as last heard (this controller's included), ordered by region
	// seen, then observer: the evidence a quorum of regions gives the
	// automatic failover. A controller's sightings stop changing when it
	// stops being heard; their SummaryAge then keeps growing.
	Sightings []Sighting
	byName    map[string]int
}

// Region returns the view of one remote region.
func (v *RegionsView) Region(name string) (*RegionView, bool) {
	i, ok := v.byName[name]
	if !ok {
		return nil, false
	}
	return &v.Regions[i], true
}

// RTTSource says where a region's RTT comes from.
type RTTSource string

const (
	RTTNone    RTTSource = ""        // unknown: the region is not a candidate
	RTTDirect  RTTSource = "direct"  // median of direct ping samples
	RTTVivaldi RTTSource = "vivaldi" // Vivaldi coordinates (some controller lacks direct samples)
	RTTStatic  RTTSource = "static"  // the configured matrix (fallback or override)
)

// RegionView is one remote region.
type RegionView struct {
	Region string
	// Summary is the latest summary of the region (highest generation, from
	// any of its controllers); nil until one arrived.
	Summary    *summary.Summary
	ReceivedAt time.Time // on this controller's clock
	// SentAge is how old the summary was when its sender sent it, as the
	// sender reported it (a duration on its clock; 0 when not reported).
	SentAge time.Duration
	Via     string // how it arrived: "pull" or "push/pull"
	// ClockSkew is the median over the region's controllers of how far
	// their wall clocks are ahead of this controller's (negative: behind),
	// from their last age messages; SkewKnown false without one.
	ClockSkew time.Duration
	SkewKnown bool

	Controllers []Controller
	Alive       int  // controllers alive and answering pings
	Suspect     int  // controllers alive for memberlist but not answering pings
	Dead        int  // controllers memberlist declared dead (they may refute it and come back)
	Live        bool // Alive > 0; a region whose controllers are all dead or suspect is not Live

	// RTT is the round trip used for decisions: with StaticRTTOverride and a
	// configured entry, the entry; otherwise the median over the region's
	// live controllers of each one's measured RTT (direct samples when there
	// are RTTMinSamples, else its Vivaldi distance); otherwise the configured
	// entry; otherwise unknown.
	RTT        time.Duration
	RTTSource  RTTSource
	DirectRTT  time.Duration // median over live controllers of direct samples (0: none)
	VivaldiRTT time.Duration // median over live controllers of Vivaldi distances (0: none)
}

// ControllerState is a controller's liveness as this node sees it.
type ControllerState string

const (
	StateAlive   ControllerState = "alive"
	StateSuspect ControllerState = "suspect" // alive for memberlist, but no ping answer for SuspectAfterProbes rounds
	StateDead    ControllerState = "dead"    // memberlist declared it dead or it left
)

// Controller is one controller of a remote region.
type Controller struct {
	Name        string
	Addr        string // gossip address
	ForwardAddr string // where to forward requests (from its digest)
	State       ControllerState
	Digest      Digest
	DirectRTT   time.Duration // median of its direct samples (0: fewer than RTTMinSamples)
	VivaldiRTT  time.Duration // Vivaldi distance (0: no coordinate)
	Samples     int           // direct samples held
	ClockSkew   time.Duration // its wall clock minus ours (see RegionView.ClockSkew)
	SkewKnown   bool
}

// Age is the summary's age at now: the sender's age of it when it sent it
// plus the time since it arrived here, both durations, so that no two
// machines' wall clocks are compared (a controller 90 s ahead would
// otherwise find every summary 90 s stale). 0 without a summary.
func (r *RegionView) Age(now time.Time) time.Duration {
	if r.Summary == nil {
		return 0
	}
	return max(now.Sub(r.ReceivedAt), 0) + r.SentAge
}

// Serves reports whether any remote region's summary says it serves model
// (a region whose summary lists no models makes no claim and serves every
// model), and whether any summary is known at all.
func (v *RegionsView) Serves(model string) (serves, known bool) {
	for i := range v.Regions {
		if s := v.Regions[i].Summary; s != nil {
			known = true
			if s.Serves(model) {
				return true, true
			}
		}
	}
	return false, known
}

// Candidate turns the region into a gorgo candidate for a request whose
// chain of block hashes is chain (see summary.Summary.Candidate), with the
// region's RTT and the summary's age, priced by the cost model cost at
// the pool of the region's pods that would serve it soonest
// (summary.Summary.Price; nil cost: the region's mean load at the profile
// with the most pods). A region that is not Live (its
// controllers suspect, or declared dead by this node's failure detector)
// is a Suspect candidate: what one controller's gossip saw is not a
// failure (the Raft tier's region state says that), so traffic that only
// that region may serve still goes there, and fails fast if nobody is
// there. ok is false when the region cannot be a candidate: no summary
// yet, no controller known, or RTT unknown.
func (r *RegionView) Candidate(now time.Time, chain []uint64, promptTokens int, cost *gorgo.Model) (c gorgo.Candidate, ok bool) {
	if r.Summary == nil || (!r.Live && r.Suspect == 0 && r.Dead == 0) || r.RTTSource == RTTNone {
		return gorgo.Candidate{}, false
	}
	c = r.Summary.Candidate(now, chain, promptTokens)
	c.SummaryAge = r.Age(now)
	c.RTTMs = float64(r.RTT) / float64(time.Millisecond)
	c.Suspect = !r.Live
	if cost != nil {
		r.Summary.Price(&c, cost)
	}
	return c, true
}

// Candidates appends the candidates of every usable remote region that
// serves model ("": any) and that allowed accepts (nil: all), each priced
// by the cost model cost at its soonest pool (see Candidate; nil: at its
// mean). Residency filtering is the caller's: pass its verdict as allowed.
func (v *RegionsView) Candidates(now time.Time, model string, chain []uint64, promptTokens int, allowed func(region string) bool, cost *gorgo.Model, dst []gorgo.Candidate) []gorgo.Candidate {
	for i := range v.Regions {
		r := &v.Regions[i]
		if allowed != nil && !allowed(r.Region) {
			continue
		}
		if model != "" && r.Summary != nil && !r.Summary.Serves(model) {
			continue
		}
		if c, ok := r.Candidate(now, chain, promptTokens, cost); ok {
			dst = append(dst, c)
		}
	}
	return dst
}
