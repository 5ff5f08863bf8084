package gossip

import (
	"cmp"
	"net"
	"slices"
	"strconv"
	"time"
)

// vivaldiMaxError: a Vivaldi distance is used only once this controller's
// own coordinate error estimate (1.5 when it starts, falling as its
// predictions come true) is below this.
const vivaldiMaxError = 0.5

// suspectAfterLocked is how long a controller may go without answering a
// direct ping before it is suspect: SuspectAfterProbes rounds of probing
// every other controller once, plus a probe timeout.
func (n *Node) suspectAfterLocked() time.Duration {
	others := 0
	for _, p := range n.peers {
		if !p.dead {
			others++
		}
	}
	return time.Duration(n.cfg.SuspectAfterProbes*max(others, 1))*n.cfg.ProbeInterval + n.cfg.ProbeTimeout
}

// rebuildLocked builds and swaps in a new view, and refreshes the metrics.
func (n *Node) rebuildLocked() {
	now := n.now()
	own := n.coord.GetCoordinate()
	ownConverged := own.Error < vivaldiMaxError
	suspectAfter := n.suspectAfterLocked()

	byRegion := map[string]*RegionView{}
	region := func(name string) *RegionView {
		r := byRegion[name]
		if r == nil {
			r = &RegionView{Region: name}
			byRegion[name] = r
		}
		return r
	}
	for name, h := range n.regions {
		r := region(name)
		r.Summary, r.ReceivedAt, r.SentAge, r.Via = h.s, h.receivedAt, h.sentAge, h.via
	}
	states := map[ControllerState]int{StateAlive: 0, StateSuspect: 0, StateDead: 0}
	for _, p := range n.peers {
		if !p.digestOK {
			continue
		}
		c := Controller{
			Name:        p.name,
			ForwardAddr: p.digest.ForwardAddr,
			Digest:      p.digest,
			Samples:     len(p.samples),
			State:       StateAlive,
			ClockSkew:   p.skew,
			SkewKnown:   p.skewOK,
		}
		if p.node.Addr != nil {
			c.Addr = net.JoinHostPort(net.IP(p.node.Addr).String(), strconv.Itoa(int(p.node.Port)))
		}
		switch {
		case p.dead:
			c.State = StateDead
		case now.Sub(p.seen) > suspectAfter:
			c.State = StateSuspect
		}
		states[c.State]++
		if p.digest.Region == n.cfg.Region {
			continue
		}
		if len(p.samples) >= n.cfg.RTTMinSamples {
			c.DirectRTT = median(slices.Clone(p.samples))
		}
		if p.coord != nil && ownConverged {
			c.VivaldiRTT = own.DistanceTo(p.coord)
		}
		r := region(p.digest.Region)
		r.Controllers = append(r.Controllers, c)
		switch c.State {
		case StateAlive:
			r.Alive++
		case StateSuspect:
			r.Suspect++
		case StateDead:
			r.Dead++
		}
	}
	v := &RegionsView{Local: n.cfg.Region, At: now, byName: map[string]int{}}
	for _, r := range byRegion {
		r.Live = r.Alive > 0
		var skews []time.Duration
		for _, c := range r.Controllers {
			if c.SkewKnown && c.State != StateDead {
				skews = append(skews, c.ClockSkew)
			}
		}
		if len(skews) > 0 {
			r.ClockSkew, r.SkewKnown = median(skews), true
		}
		slices.SortFunc(r.Controllers, func(a, b Controller) int { return cmp.Compare(a.Name, b.Name) })
		n.rttLocked(r)
		v.Regions = append(v.Regions, *r)
	}
	slices.SortFunc(v.Regions, func(a, b RegionView) int {
		ua, ub := a.RTTSource == RTTNone, b.RTTSource == RTTNone
		switch {
		case ua != ub:
			if ua {
				return 1
			}
			return -1
		case a.RTT != b.RTT:
			return cmp.Compare(a.RTT, b.RTT)
		}
		return cmp.Compare(a.Region, b.Region)
	})
	for i, r := range v.Regions {
		v.byName[r.Region] = i
	}
	v.Sightings = n.sightingsLocked(v)
	n.view.Store(v)

	for st, k := range states {
		n.m.members.WithLabelValues(string(st)).Set(float64(k))
	}
	iso := 0.0
	if n.isolatedLocked() {
		iso = 1
	}
	n.m.isolated.Set(iso)
	for i := range v.Regions {
		r := &v.Regions[i]
		live := 0.0
		if r.Live {
			live = 1
		}
		n.m.regionLive.WithLabelValues(r.Region).Set(live)
		if r.Summary != nil {
			n.m.summaryAge.WithLabelValues(r.Region).Set(r.Age(now).Seconds())
		}
		if r.RTTSource != RTTNone {
			n.m.rtt.WithLabelValues(r.Region).Set(r.RTT.Seconds())
		}
		if r.SkewKnown {
			n.m.skew.WithLabelValues(r.Region).Set(r.ClockSkew.Seconds())
		}
	}
}

// rttLocked sets a region's RTT fields (see RegionView.RTT).
func (n *Node) rttLocked(r *RegionView) {
	var direct, vivaldi, used []time.Duration
	allDirect := true
	// From the live controllers; a region whose controllers are all
	// suspect (or all dead) keeps their last measurements.
	from := StateAlive
	switch {
	case r.Alive > 0:
	case r.Suspect > 0:
		from = StateSuspect
	default:
		from = StateDead
	}
	for _, c := range r.Controllers {
		if c.State != from {
			continue
		}
		if c.DirectRTT > 0 {
			direct = append(direct, c.DirectRTT)
		}
		if c.VivaldiRTT > 0 {
			vivaldi = append(vivaldi, c.VivaldiRTT)
		}
		switch {
		case c.DirectRTT > 0:
			used = append(used, c.DirectRTT)
		case c.VivaldiRTT > 0:
			used = append(used, c.VivaldiRTT)
			allDirect = false
		}
	}
	r.DirectRTT, r.VivaldiRTT = median(direct), median(vivaldi)
	static, hasStatic := n.static[r.Region]
	switch {
	case hasStatic && (n.cfg.StaticRTTOverride || from == StateDead):
		// The configured entry overrides measurements, and is preferred
		// to what controllers declared dead measured before.
		r.RTT, r.RTTSource = static, RTTStatic
	case len(used) > 0:
		r.RTT, r.RTTSource = median(used), RTTVivaldi
		if allDirect {
			r.RTTSource = RTTDirect
		}
	case hasStatic:
		r.RTT, r.RTTSource = static, RTTStatic
	}
}

// median is the upper median (Consul's choice: index len/2 after sorting);
// 0 for none. It sorts its argument.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
