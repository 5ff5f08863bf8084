package gossip

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/meridian-llm/meridian/regional/summary"
)

// Sighting is what one controller saw of another region's pods: the
// serving pods counted by the latest summary of that region it held (the
// region's own report), how old that summary was, and whether the region
// had a live controller for it. Every controller sends its sightings of
// every other region to every other controller each SyncInterval, so the
// Raft leader's automatic failover can count, region by region, who still
// hears a region it cannot, and what they hear (global.PeerView).
type Sighting struct {
	Observer       string // the controller that saw it
	ObserverRegion string
	Region         string // the region seen
	// Generation of the summary it is from (0 with none).
	Generation uint64
	// Pods is the serving pods that summary counts; -1: the observer held
	// no summary of the region.
	Pods int
	// Age is the summary's age when the observer sent the sighting, on
	// the observer's clock (a duration: no two wall clocks compared).
	Age time.Duration
	// Live: the region had a live controller for the observer.
	Live bool
	// ReceivedAt is when this controller received it (its own sightings:
	// when the view was built), on this controller's clock.
	ReceivedAt time.Time
}

// SummaryAge is how old the summary the sighting is from is at now: its
// age when sent plus the time since the sighting arrived.
func (s Sighting) SummaryAge(now time.Time) time.Duration {
	return s.Age + max(now.Sub(s.ReceivedAt), 0)
}

// maxSightings bounds the regions one sightings message may name.
const maxSightings = 64

// heard is the last sightings message of one controller.
type heard struct {
	region string
	at     time.Time
	seen   []Sighting // ReceivedAt, Observer and ObserverRegion filled in
}

// sightingsMsg is a controller's sightings of the other regions.
type sightingsMsg struct {
	From   string // sender's node name
	Region string // sender's region
	Seen   []Sighting
}

const noPods = ^uint32(0)

func (m sightingsMsg) encode() []byte {
	b := make([]byte, 0, 8+len(m.From)+len(m.Region)+len(m.Seen)*40)
	b = append(b, msgSightings, wireVersion)
	b = appendString8(b, m.From)
	b = appendString8(b, m.Region)
	b = append(b, byte(len(m.Seen)))
	for _, s := range m.Seen {
		b = appendString8(b, s.Region)
		b = binary.LittleEndian.AppendUint64(b, s.Generation)
		pods := noPods
		if s.Pods >= 0 {
			pods = uint32(min(s.Pods, int(noPods-1)))
		}
		b = binary.LittleEndian.AppendUint32(b, pods)
		b = binary.LittleEndian.AppendUint64(b, uint64(min(max(s.Age, 0), maxReportedAge)))
		var flags byte
		if s.Live {
			flags |= 1
		}
		b = append(b, flags)
	}
	return b
}

func decodeSightings(b []byte) (sightingsMsg, error) {
	w := &wire{b: b[msgHeaderLen:]}
	var m sightingsMsg
	m.From = w.str8("sender", maxNodeNameLen, false)
	m.Region = w.str8("region", summary.MaxRegionLen, false)
	n := int(w.u8())
	if w.err == nil && n > maxSightings {
		return m, fmt.Errorf("%w: %d sightings, at most %d", errWire, n, maxSightings)
	}
	for range n {
		var s Sighting
		s.Region = w.str8("seen region", summary.MaxRegionLen, false)
		s.Generation = w.u64()
		pods := w.u32()
		age := w.u64()
		flags := w.u8()
		if w.err != nil {
			break
		}
		if age > uint64(maxReportedAge) {
			return m, fmt.Errorf("%w: sighting age %d ns", errWire, age)
		}
		if flags&^1 != 0 {
			return m, fmt.Errorf("%w: sighting flags %#x", errWire, flags)
		}
		s.Pods = int(pods)
		if pods == noPods {
			s.Pods = -1
		}
		s.Age, s.Live = time.Duration(age), flags&1 != 0
		m.Seen = append(m.Seen, s)
	}
	return m, w.end()
}

// ownSightings are this controller's sightings of the regions of view
// (built at view.At).
func (n *Node) ownSightings(v *RegionsView) []Sighting {
	out := make([]Sighting, 0, len(v.Regions))
	for i := range v.Regions {
		r := &v.Regions[i]
		s := Sighting{Observer: n.cfg.NodeName, ObserverRegion: n.cfg.Region, Region: r.Region, Pods: -1,
			Live: r.Live, ReceivedAt: v.At}
		if r.Summary != nil {
			s.Generation, s.Pods, s.Age = r.Summary.Generation, r.Summary.Totals().Pods, r.Age(v.At)
		}
		out = append(out, s)
	}
	return out
}

// sightingsLocked are every controller's sightings this one holds, its
// own (from v) included, ordered by region seen, then observer.
func (n *Node) sightingsLocked(v *RegionsView) []Sighting {
	out := n.ownSightings(v)
	for _, h := range n.heard {
		out = append(out, h.seen...)
	}
	slices.SortFunc(out, func(a, b Sighting) int {
		if c := cmp.Compare(a.Region, b.Region); c != 0 {
			return c
		}
		return cmp.Compare(a.Observer, b.Observer)
	})
	return out
}

// sendSightings sends this controller's sightings of the other regions to
// every controller it does not hold dead, at most once per SyncInterval,
// best-effort over UDP when they fit a packet (a lost one is replaced next
// round), over TCP otherwise.
func (n *Node) sendSightings() {
	v := n.View()
	if len(v.Regions) == 0 {
		return
	}
	n.mu.Lock()
	if now := n.now(); now.Sub(n.lastSeen) >= n.cfg.SyncInterval || now.Before(n.lastSeen) {
		n.lastSeen = now
	} else {
		n.mu.Unlock()
		return // the worker also syncs on events: once per interval is enough
	}
	n.mu.Unlock()
	own := n.ownSightings(v)
	if len(own) > maxSightings {
		own = own[:maxSightings] // nearest first
	}
	msg := sightingsMsg{From: n.cfg.NodeName, Region: n.cfg.Region, Seen: own}.encode()
	n.mu.Lock()
	var to []memberlist.Node
	for _, p := range n.peers {
		if !p.dead && p.digestOK {
			to = append(to, p.node)
		}
	}
	n.mu.Unlock()
	for _, node := range to {
		if len(msg) > maxPacketPayload {
			n.enqueue(sendJob{to: node, msg: msg})
		} else if err := n.ml.SendBestEffort(&node, msg); err != nil {
			n.log.Debug("sightings not sent", "to", node.Name, "err", err)
			continue
		}
		n.m.sightingMsgs.WithLabelValues("sent").Inc()
	}
}

// receiveSightings keeps a controller's sightings, if it comes from a
// known, live controller of the region it names. The next rebuild
// publishes them.
func (n *Node) receiveSightings(b []byte) {
	m, err := decodeSightings(b)
	if err != nil {
		n.m.sightingMsgs.WithLabelValues("malformed").Inc()
		n.warnOnce("sightings", "malformed sightings message dropped", "err", err)
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.peers[m.From]
	if p == nil || p.dead || !p.digestOK || p.digest.Region != m.Region || m.From == n.cfg.NodeName {
		n.m.sightingMsgs.WithLabelValues("unknown_sender").Inc()
		return
	}
	now := n.now()
	seen := make([]Sighting, 0, len(m.Seen))
	for _, s := range m.Seen {
		if s.Region == m.Region {
			continue // nobody reports on its own region here: its summary does
		}
		s.Observer, s.ObserverRegion, s.ReceivedAt = m.From, m.Region, now
		seen = append(seen, s)
	}
	n.heard[m.From] = &heard{region: m.Region, at: now, seen: seen}
	n.m.sightingMsgs.WithLabelValues("received").Inc()
}
