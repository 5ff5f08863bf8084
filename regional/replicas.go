package regional

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/route"
)

// replicaShare is this controller's side of the exchange between the
// replicas of its region, carried by the gossip pool (gossip.ReplicaExchange)
// every gossip.replica_interval:
//
//   - out: its own in-flight accounting per pod (requests and their
//     uncached prompt tokens before the first byte), the pods with none
//     left out; and the session pins it made since the last round
//     (reliable: over TCP; a round without pins goes best-effort over UDP,
//     the next round replacing a lost one);
//   - in: a replica's accounting replaces its previous report in the
//     registry (route.Registry.SetPeerLoads; Pod.InFlight adds it), its
//     pins go into the session table (route.Sessions.NotePeer); a replica
//     that leaves or is declared dead is forgotten.
//
// Payload (version 3, little-endian): u8 version, u64 epoch (the sender's
// start, unix ns), uvarint seq, uvarint pods, per pod {uvarint name length,
// name, uvarint in flight, uvarint pending prefill tokens}, uvarint pins,
// per pin {u64 session key, u64 stamp, uvarint pod length, pod}, then
// uvarint serving: the pods the sender sees able to take a request, which
// a replica that sees none compares with before it calls itself ready
// (Server.serveReady). The stamp (route.Pin.Stamp) lets two replicas that
// pinned a session at once to different pods settle on the same one.
// Versions 1 (no serving count) and 2 (no stamps: their pins are taken as
// the latest, as before) are still read, from replicas not yet upgraded;
// a replica of an older version drops newer reports as malformed until it
// is upgraded too (its load sharing pauses for the rollout).
type replicaShare struct {
	reg      *route.Registry
	sessions *route.Sessions
	now      func() time.Time
	log      *slog.Logger
	epoch    uint64
	// serving counts the pods this replica sees able to take a request.
	serving func() int

	mu   sync.Mutex // ReplicaState's scratch and sequence
	seq  uint64
	pins []route.Pin
	buf  []byte

	received *prometheus.CounterVec
	pinsSent prometheus.Counter
	pinsIn   prometheus.Counter
	dropped  prometheus.CounterFunc
}

// maxSharedPins bounds the pins queued between two rounds.
const maxSharedPins = 1 << 16

func newReplicaShare(reg *route.Registry, sessions *route.Sessions, serving func() int, now func() time.Time, log *slog.Logger, m prometheus.Registerer) (*replicaShare, error) {
	r := &replicaShare{reg: reg, sessions: sessions, serving: serving, now: now, log: log, epoch: uint64(now().UnixNano())}
	sessions.ShareWithPeers(maxSharedPins)
	r.received = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_replica_reports_total",
		Help: "Reports of the region's other replicas' load and pins, by outcome (applied, late, malformed)."}, []string{"outcome"})
	r.pinsSent = prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_replica_pins_sent_total",
		Help: "Session pins sent to the region's other replicas."})
	r.pinsIn = prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_router_replica_pins_received_total",
		Help: "Session pins received from the region's other replicas."})
	r.dropped = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "meridian_router_replica_pins_dropped_total",
		Help: "Session pins dropped before they were sent (more than 65536 begun between two exchanges)."}, func() float64 {
		return float64(sessions.DroppedPins())
	})
	for _, c := range []prometheus.Collector{r.received, r.pinsSent, r.pinsIn, r.dropped} {
		if err := m.Register(c); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// ReplicaState encodes this round's report.
func (r *replicaShare) ReplicaState() ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.pins, _ = r.sessions.TakePins(r.pins[:0])
	b := append(r.buf[:0], replicaVersion)
	b = binary.LittleEndian.AppendUint64(b, r.epoch)
	b = binary.AppendUvarint(b, r.seq)
	pods := r.reg.Pods()
	n := 0
	for _, p := range pods {
		if in, pend := p.OwnLoad(); in > 0 || pend > 0 {
			n++
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	for _, p := range pods {
		in, pend := p.OwnLoad()
		if in <= 0 && pend <= 0 {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(p.Name)))
		b = append(b, p.Name...)
		b = binary.AppendUvarint(b, uint64(max(in, 0)))
		b = binary.AppendUvarint(b, uint64(max(pend, 0)))
	}
	b = binary.AppendUvarint(b, uint64(len(r.pins)))
	for _, p := range r.pins {
		b = binary.LittleEndian.AppendUint64(b, p.Key)
		b = binary.LittleEndian.AppendUint64(b, uint64(max(p.Stamp, 0)))
		b = binary.AppendUvarint(b, uint64(len(p.Pod)))
		b = append(b, p.Pod...)
	}
	b = binary.AppendUvarint(b, uint64(max(r.serving(), 0)))
	r.buf = b
	r.pinsSent.Add(float64(len(r.pins)))
	// The node sends (copies) the payload before the next round reuses it.
	return append([]byte(nil), b...), len(r.pins) > 0
}

// MergeReplicaState applies a replica's report.
func (r *replicaShare) MergeReplicaState(from string, payload []byte) {
	rep, err := decodeReplicaReport(payload)
	if err != nil {
		r.received.WithLabelValues("malformed").Inc()
		r.log.Debug("malformed replica report dropped", "from", from, "err", err)
		return
	}
	now := r.now()
	if !r.reg.SetPeerLoads(from, rep.epoch, rep.seq, rep.loads, rep.serving, now) {
		r.received.WithLabelValues("late").Inc()
	} else {
		r.received.WithLabelValues("applied").Inc()
	}
	// Pins apply even from a late report: each is a session placed then.
	for _, p := range rep.pins {
		r.sessions.NotePeer(p, now)
	}
	r.pinsIn.Add(float64(len(rep.pins)))
}

// ReplicaGone forgets a replica's report.
func (r *replicaShare) ReplicaGone(id string) {
	r.reg.ForgetPeer(id)
	r.log.Info("replica of the region gone: its load report dropped", "replica", id)
}

type replicaReport struct {
	epoch, seq uint64
	loads      []route.PeerLoad
	pins       []route.Pin
	serving    int // -1: a version 1 report, which does not say
}

// replicaVersion is the payload version sent.
const replicaVersion = 3

var errReplicaReport = errors.New("malformed replica report")

// decodeReplicaReport reads a payload, bounded by its length: every count
// is checked against the bytes left before anything is allocated.
func decodeReplicaReport(b []byte) (replicaReport, error) {
	rep := replicaReport{serving: -1}
	if len(b) < 9 || b[0] < 1 || b[0] > 3 {
		return rep, fmt.Errorf("%w: version or length", errReplicaReport)
	}
	version := b[0]
	rep.epoch = binary.LittleEndian.Uint64(b[1:9])
	b = b[9:]
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	str := func() (string, bool) {
		n, ok := uv()
		if !ok || n == 0 || n > 256 || n > uint64(len(b)) {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	var ok bool
	if rep.seq, ok = uv(); !ok {
		return rep, fmt.Errorf("%w: seq", errReplicaReport)
	}
	n, ok := uv()
	if !ok || n > uint64(len(b))/3 {
		return rep, fmt.Errorf("%w: pod count", errReplicaReport)
	}
	rep.loads = make([]route.PeerLoad, 0, n)
	for range n {
		var l route.PeerLoad
		var in, pend uint64
		var ok1, ok2, ok3 bool
		l.Pod, ok1 = str()
		in, ok2 = uv()
		pend, ok3 = uv()
		if !ok1 || !ok2 || !ok3 || in > 1<<31 || pend > 1<<40 {
			return rep, fmt.Errorf("%w: pod load", errReplicaReport)
		}
		l.InFlight, l.PendingPrefill = int64(in), int64(pend)
		rep.loads = append(rep.loads, l)
	}
	pinSize := uint64(10) // key, pod length, a pod name of one byte
	if version >= 3 {
		pinSize += 8 // stamp
	}
	n, ok = uv()
	if !ok || n > uint64(len(b))/pinSize {
		return rep, fmt.Errorf("%w: pin count", errReplicaReport)
	}
	rep.pins = make([]route.Pin, 0, n)
	for range n {
		if len(b) < 8 {
			return rep, fmt.Errorf("%w: pin", errReplicaReport)
		}
		p := route.Pin{Key: binary.LittleEndian.Uint64(b[:8])}
		b = b[8:]
		if version >= 3 {
			if len(b) < 8 {
				return rep, fmt.Errorf("%w: pin stamp", errReplicaReport)
			}
			stamp := binary.LittleEndian.Uint64(b[:8])
			if stamp > math.MaxInt64 {
				return rep, fmt.Errorf("%w: pin stamp", errReplicaReport)
			}
			p.Stamp = int64(stamp)
			b = b[8:]
		}
		if p.Pod, ok = str(); !ok {
			return rep, fmt.Errorf("%w: pin pod", errReplicaReport)
		}
		rep.pins = append(rep.pins, p)
	}
	if version >= 2 {
		n, ok := uv()
		if !ok || n > 1<<20 {
			return rep, fmt.Errorf("%w: serving pods", errReplicaReport)
		}
		rep.serving = int(n)
	}
	if len(b) != 0 {
		return rep, fmt.Errorf("%w: %d trailing bytes", errReplicaReport, len(b))
	}
	return rep, nil
}
