package gossip

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// The memberlist delegates are views of the Node under other names, so the
// memberlist callbacks are not part of Node's API.
type (
	delegate Node // memberlist.Delegate
	events   Node // memberlist.EventDelegate
	pings    Node // memberlist.PingDelegate
)

var (
	_ memberlist.Delegate      = (*delegate)(nil)
	_ memberlist.EventDelegate = (*events)(nil)
	_ memberlist.PingDelegate  = (*pings)(nil)
)

// NodeMeta serves the digest prepared by Publish. Its size was checked
// when it was encoded; should a smaller limit ever be asked, it sends
// nothing rather than let memberlist panic.
func (d *delegate) NodeMeta(limit int) []byte {
	b := *d.meta.Load()
	if len(b) > limit {
		(*Node)(d).warnOnce("meta", "digest larger than the node meta limit; not advertised", "bytes", len(b), "limit", limit)
		return nil
	}
	return b
}

// NotifyMsg handles the user messages: pull requests, summary bodies,
// keyring operations and their answers, replica state, sightings. It must not block: a
// pull is answered by the senders, a keyring operation applied by the key
// worker; a body is decoded here (tens of microseconds for 64 KiB).
func (d *delegate) NotifyMsg(b []byte) {
	n := (*Node)(d)
	if len(b) < msgHeaderLen || b[1] != wireVersion {
		n.m.rejected.WithLabelValues("malformed").Inc()
		n.warnOnce("malformed", "malformed gossip message dropped", "bytes", len(b))
		return
	}
	switch b[0] {
	case msgWant:
		w, err := decodeWant(b)
		if err != nil {
			n.warnOnce("want", "malformed pull request dropped", "err", err)
			return
		}
		n.answer(w)
	case msgSummary:
		_ = n.receive(b[msgHeaderLen:], "pull")
	case msgAge:
		m, err := decodeAge(b)
		if err != nil {
			n.m.rejected.WithLabelValues("malformed").Inc()
			n.warnOnce("age", "malformed summary age dropped", "err", err)
			return
		}
		n.noteAge(m)
	case msgKeyOp:
		m, err := decodeKeyOp(b)
		if err != nil {
			n.m.rejected.WithLabelValues("malformed").Inc()
			n.warnOnce("keyop", "malformed keyring operation dropped", "err", err)
			return
		}
		select {
		case n.keyOps <- m:
		default:
			n.warnOnce("keyops-full", "keyring operations arrive faster than they are applied; dropped (the sender sees no answer)")
		}
	case msgReplica:
		n.receiveReplica(b)
	case msgSightings:
		n.receiveSightings(b)
	case msgKeyAck:
		a, err := decodeKeyAck(b)
		if err != nil {
			n.m.rejected.WithLabelValues("malformed").Inc()
			n.warnOnce("keyack", "malformed keyring answer dropped", "err", err)
			return
		}
		n.deliverKeyAck(a)
	default:
		n.m.rejected.WithLabelValues("malformed").Inc()
		n.warnOnce("msgtype", "gossip message of unknown type dropped", "type", b[0])
	}
}

// GetBroadcasts: nothing goes through memberlist's broadcast queue (packets
// of ~1.4 KB; a larger message would never be sent).
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState is the push/pull payload: this controller's own summary.
func (d *delegate) LocalState(join bool) []byte {
	b := *d.localState.Load()
	if len(b) > stateHeaderLen {
		d.m.sentBytes.Add(float64(len(b) - stateHeaderLen))
	}
	return b
}

// MergeRemoteState takes a peer's summary from push/pull (the backstop for
// lost or refused pulls).
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	n := (*Node)(d)
	body, err := decodeLocalState(buf)
	if err != nil {
		n.m.rejected.WithLabelValues("malformed").Inc()
		n.warnOnce("state", "malformed push/pull state dropped", "err", err)
		return
	}
	if len(body) > 0 {
		_ = n.receive(body, "push/pull")
	}
}

// NotifyJoin, NotifyUpdate and NotifyLeave run under memberlist's node lock:
// they only record, and never call back into memberlist.
func (e *events) NotifyJoin(node *memberlist.Node)   { (*Node)(e).notePeer(node, false) }
func (e *events) NotifyUpdate(node *memberlist.Node) { (*Node)(e).notePeer(node, false) }
func (e *events) NotifyLeave(node *memberlist.Node)  { (*Node)(e).notePeer(node, true) }

func (n *Node) notePeer(node *memberlist.Node, dead bool) {
	if node.Name == n.cfg.NodeName {
		return
	}
	d, err := decodeDigest(node.Meta)
	if err != nil && !dead {
		n.m.digestRejected.Inc()
		n.warnOnce("digest:"+node.Name, "controller's digest rejected", "peer", node.Name, "err", err)
	}
	n.mu.Lock()
	p := n.peerLocked(node.Name)
	if err == nil {
		if d.Generation != p.digest.Generation {
			p.genAt = n.now()
		}
		p.digest, p.digestOK = d, true
	} else if !dead {
		p.digestOK = false
	}
	wasDead := p.dead
	p.dead = dead
	p.node = memberlist.Node{Name: node.Name, Addr: append([]byte(nil), node.Addr...), Port: node.Port}
	if !dead && (wasDead || p.seen.IsZero()) {
		p.seen = n.now() // a (re)joining controller gets a fresh probe allowance
		p.samples, p.next, p.coord = p.samples[:0], 0, nil
	}
	replica := p.digestOK && p.digest.Region == n.cfg.Region
	n.rebuildLocked()
	n.mu.Unlock()
	if dead {
		n.coord.ForgetNode(node.Name)
		if replica && n.cfg.Replicas != nil && !wasDead {
			n.cfg.Replicas.ReplicaGone(node.Name)
		}
	}
	n.poke()
}

// AckPayload carries this controller's Vivaldi coordinate in ping acks.
func (p *pings) AckPayload() []byte { return encodeCoordinate(p.coord.GetCoordinate()) }

// NotifyPingComplete records a direct ping's RTT and feeds the peer's
// coordinate, once validated, to the Vivaldi client.
func (p *pings) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	n := (*Node)(p)
	if other == nil || other.Name == n.cfg.NodeName {
		return
	}
	c, err := decodeCoordinate(payload, n.dims)
	if err == nil {
		if _, err = n.coord.Update(other.Name, c, rtt); err != nil {
			c = nil
		}
	}
	if err != nil {
		n.m.coordsRejected.Inc()
		n.warnOnce("coord:"+other.Name, "peer coordinate rejected", "peer", other.Name, "err", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	pe := n.peerLocked(other.Name)
	pe.seen = n.now()
	if len(pe.samples) < n.cfg.RTTWindow {
		pe.samples = append(pe.samples, rtt)
	} else {
		pe.samples[pe.next] = rtt
		pe.next = (pe.next + 1) % len(pe.samples)
	}
	if c != nil {
		pe.coord = c
	}
}
