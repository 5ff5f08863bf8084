package gossip

import (
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
)

// ReplicaExchange is what a controller shares with the other controllers
// of its region (its replicas) over the pool, every
// Config.ReplicaInterval: an opaque payload, which regional fills with its
// own in-flight accounting per pod and the session pins it made. Its
// methods are called from the node's goroutines and memberlist's receive
// path: they must be quick and must not block.
type ReplicaExchange interface {
	// ReplicaState returns this round's payload (nil: nothing to send) and
	// whether it must arrive: reliable payloads go over TCP
	// (SendReliable); the others best-effort over UDP when they fit one
	// packet (a lost one is replaced by the next round's).
	ReplicaState() (payload []byte, reliable bool)
	// MergeReplicaState takes a replica's payload; payload is valid only
	// during the call.
	MergeReplicaState(from string, payload []byte)
	// ReplicaGone: the replica left the pool or was declared dead.
	ReplicaGone(id string)
}

// maxPacketPayload: a best-effort replica message larger than this goes
// over TCP instead (memberlist's UDP packets are ~1.4 KB with encryption
// and labels; a larger one would never be sent).
const maxPacketPayload = 1200

// replicaLoop sends this controller's replica state every interval.
func (n *Node) replicaLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.ReplicaInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.sendReplicaState()
		}
	}
}

// replicasLocked returns the other controllers of this region that are not
// dead.
func (n *Node) replicasLocked() []memberlist.Node {
	var out []memberlist.Node
	for _, p := range n.peers {
		if !p.dead && p.digestOK && p.digest.Region == n.cfg.Region {
			out = append(out, p.node)
		}
	}
	return out
}

// Replicas returns the names of the other controllers of this region
// that are not dead, sorted.
func (n *Node) Replicas() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, p := range n.replicasLocked() {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func (n *Node) sendReplicaState() {
	payload, reliable := n.cfg.Replicas.ReplicaState()
	if payload == nil {
		return
	}
	msg := encodeReplicaMsg(n.cfg.NodeName, payload)
	n.mu.Lock()
	to := n.replicasLocked()
	n.mu.Unlock()
	for _, node := range to {
		if reliable || len(msg) > maxPacketPayload {
			n.enqueue(sendJob{to: node, msg: msg})
		} else if err := n.ml.SendBestEffort(&node, msg); err != nil {
			n.log.Debug("replica state not sent", "to", node.Name, "err", err)
			continue
		}
		n.m.replicaMsgs.WithLabelValues("sent").Inc()
	}
}

// receiveReplica hands a replica's payload over, if it comes from a known,
// live controller of this region.
func (n *Node) receiveReplica(b []byte) {
	from, payload, err := decodeReplicaMsg(b)
	if err != nil {
		n.m.replicaMsgs.WithLabelValues("malformed").Inc()
		n.warnOnce("replica", "malformed replica message dropped", "err", err)
		return
	}
	n.mu.Lock()
	p := n.peers[from]
	ok := p != nil && !p.dead && p.digestOK && p.digest.Region == n.cfg.Region
	n.mu.Unlock()
	if !ok || n.cfg.Replicas == nil {
		n.m.replicaMsgs.WithLabelValues("unknown_sender").Inc()
		return
	}
	n.m.replicaMsgs.WithLabelValues("received").Inc()
	n.cfg.Replicas.MergeReplicaState(from, payload)
}

func encodeReplicaMsg(from string, payload []byte) []byte {
	b := make([]byte, 0, msgHeaderLen+1+len(from)+len(payload))
	b = append(b, msgReplica, wireVersion)
	b = appendString8(b, from)
	return append(b, payload...)
}

func decodeReplicaMsg(b []byte) (from string, payload []byte, err error) {
	w := &wire{b: b[msgHeaderLen:]}
	from = w.str8("sender", maxNodeNameLen, false)
	return from, w.b, w.err
}

// PublishesForRegion reports whether this controller is the one of its
// region that publishes the region's summary: no other controller of the
// region that is alive and publishing (its summary generation advanced
// within the last within) has a name ordering before this one's. The
// replicas of a region hold the same index, so one publisher is enough,
// and every remote controller then pulls one summary per interval instead
// of one per replica. When the publisher stops publishing (it left, died,
// or its index fell behind), the next replica takes over after within.
func (n *Node) PublishesForRegion(within time.Duration) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	for _, p := range n.peers {
		if p.dead || !p.digestOK || p.digest.Region != n.cfg.Region || p.digest.Generation == 0 {
			continue
		}
		if p.name < n.cfg.NodeName && now.Sub(p.genAt) <= within {
			return false
		}
	}
	return true
}

// RegionGeneration is the highest summary generation the other controllers
// of this region advertise (0: none), those declared dead included (the
// other regions may hold what they published last): a replica that takes
// over publishing continues above it.
func (n *Node) RegionGeneration() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	var g uint64
	for _, p := range n.peers {
		if p.digestOK && p.digest.Region == n.cfg.Region {
			g = max(g, p.digest.Generation)
		}
	}
	return g
}
