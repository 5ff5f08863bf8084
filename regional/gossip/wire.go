package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/coordinate"

	"github.com/meridian-llm/meridian/regional/summary"
)

// What travels between controllers, all versioned and bounded:
//
//   - the digest, in memberlist's node meta (<= 512 bytes, gossiped with
//     every alive message): region, summary generation, body hash and
//     length, region load totals, forwarding address;
//   - user messages over TCP (SendReliable): a pull request naming the
//     requester, a region and the generation it wants; a summary body,
//     preceded by its age message (what it is, how old it was when sent, as
//     a duration, and the sender's wall time then); a keyring operation and
//     its answer (keyring.go). Older controllers drop the age message (an
//     unknown type) and keep reading bodies; between the controllers of
//     one region, their replica state (replicas.go; over UDP when it is
//     best-effort and fits a packet); to every controller, the sender's
//     sightings of the other regions' pods (sightings.go; over UDP when
//     they fit a packet);
//   - the push/pull state (LocalState): the sender's own summary body;
//   - the ping ack payload: the sender's Vivaldi coordinate.

// Digest is what a controller advertises in its node meta.
type Digest struct {
	Region      string
	Generation  uint64 // of the region summary this controller holds (0: none yet)
	BodyHash    uint64 // hash of the encoded summary (bodyHash)
	BodyLen     uint32
	Pods        uint32
	Running     uint32
	Slots       uint32
	Pending     uint64 // pending prefill tokens, region total
	FreeKV      uint64
	ForwardAddr string
}

const (
	digestVersion = 1
	msgWant       = 1
	msgSummary    = 2
	msgKeyOp      = 3
	msgKeyAck     = 4
	msgAge        = 5
	msgReplica    = 6 // replicas.go: a region's controllers' exchange
	msgSightings  = 7 // sightings.go: a controller's view of the other regions' pods
	stateVersion  = 1
	wireVersion   = 1
	pingVersion   = 1
	maxDims       = 16

	// msgHeaderLen frames a user message: its type (msgWant, msgSummary),
	// then wireVersion.
	msgHeaderLen = 2
	// stateHeaderLen frames the push/pull state: stateVersion, then the
	// body's length as a uint32.
	stateHeaderLen = 1 + 4
)

var errWire = errors.New("malformed message")

func appendString8(b []byte, s string) []byte {
	return append(append(b, byte(len(s))), s...)
}

func (d *Digest) encode() ([]byte, error) {
	if len(d.Region) > summary.MaxRegionLen || len(d.ForwardAddr) > maxForwardAddrLen {
		return nil, fmt.Errorf("encode digest: region %d bytes (max %d), forward address %d bytes (max %d)",
			len(d.Region), summary.MaxRegionLen, len(d.ForwardAddr), maxForwardAddrLen)
	}
	b := make([]byte, 0, 64+len(d.Region)+len(d.ForwardAddr))
	b = append(b, digestVersion)
	b = appendString8(b, d.Region)
	b = binary.LittleEndian.AppendUint64(b, d.Generation)
	b = binary.LittleEndian.AppendUint64(b, d.BodyHash)
	b = binary.LittleEndian.AppendUint32(b, d.BodyLen)
	b = binary.LittleEndian.AppendUint32(b, d.Pods)
	b = binary.LittleEndian.AppendUint32(b, d.Running)
	b = binary.LittleEndian.AppendUint32(b, d.Slots)
	b = binary.LittleEndian.AppendUint64(b, d.Pending)
	b = binary.LittleEndian.AppendUint64(b, d.FreeKV)
	b = appendString8(b, d.ForwardAddr)
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("encode digest: %d bytes, memberlist allows %d", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// wire reads a message, failing on any short read.
type wire struct {
	b   []byte
	err error
}

func (w *wire) take(n int) []byte {
	if w.err != nil {
		return nil
	}
	if n > len(w.b) {
		w.err = fmt.Errorf("%w: truncated (%d bytes wanted, %d left)", errWire, n, len(w.b))
		return nil
	}
	v := w.b[:n]
	w.b = w.b[n:]
	return v
}

func (w *wire) u8() uint8 {
	if v := w.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (w *wire) u32() uint32 {
	if v := w.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (w *wire) u64() uint64 {
	if v := w.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (w *wire) f64() float64 { return math.Float64frombits(w.u64()) }

func (w *wire) str8(field string, maxLen int, optional bool) string {
	n := int(w.u8())
	s := string(w.take(n))
	if w.err == nil && (n > maxLen || (!optional && n == 0) || (n > 0 && !printable(s))) {
		w.err = fmt.Errorf("%w: %s %q", errWire, field, s)
	}
	return s
}

func (w *wire) end() error {
	if w.err == nil && len(w.b) != 0 {
		w.err = fmt.Errorf("%w: %d trailing bytes", errWire, len(w.b))
	}
	return w.err
}

func decodeDigest(b []byte) (Digest, error) {
	var d Digest
	if len(b) == 0 {
		return d, fmt.Errorf("%w: empty digest", errWire)
	}
	w := &wire{b: b}
	if v := w.u8(); v != digestVersion {
		return d, fmt.Errorf("%w: digest version %d, want %d", errWire, v, digestVersion)
	}
	d.Region = w.str8("region", summary.MaxRegionLen, false)
	d.Generation = w.u64()
	d.BodyHash = w.u64()
	d.BodyLen = w.u32()
	d.Pods = w.u32()
	d.Running = w.u32()
	d.Slots = w.u32()
	d.Pending = w.u64()
	d.FreeKV = w.u64()
	d.ForwardAddr = w.str8("forward address", maxForwardAddrLen, true)
	return d, w.end()
}

// want asks a controller for its region's summary of at least Generation.
type want struct {
	From       string // requester's node name
	Region     string
	Generation uint64
}

func (m want) encode() []byte {
	b := []byte{msgWant, wireVersion}
	b = appendString8(b, m.From)
	b = appendString8(b, m.Region)
	return binary.LittleEndian.AppendUint64(b, m.Generation)
}

func decodeWant(b []byte) (want, error) {
	w := &wire{b: b[msgHeaderLen:]}
	var m want
	m.From = w.str8("requester", maxNodeNameLen, false)
	m.Region = w.str8("region", summary.MaxRegionLen, false)
	m.Generation = w.u64()
	return m, w.end()
}

// ageMsg says how old a summary body sent with it was: the sender's age of
// it as a duration on the sender's own clock, so the receiver adds its own
// monotonic time since receipt and never compares two machines' wall
// clocks. SentAt, the sender's wall time, measures clock skew.
type ageMsg struct {
	From       string // sender's node name
	Region     string
	Generation uint64
	Hash       uint64 // of the body (bodyHash)
	Age        time.Duration
	SentAt     int64 // unix nanos, the sender's wall clock
}

func (m ageMsg) encode() []byte {
	b := []byte{msgAge, wireVersion}
	b = appendString8(b, m.From)
	b = appendString8(b, m.Region)
	b = binary.LittleEndian.AppendUint64(b, m.Generation)
	b = binary.LittleEndian.AppendUint64(b, m.Hash)
	b = binary.LittleEndian.AppendUint64(b, uint64(max(m.Age, 0)))
	return binary.LittleEndian.AppendUint64(b, uint64(m.SentAt))
}

func decodeAge(b []byte) (ageMsg, error) {
	w := &wire{b: b[msgHeaderLen:]}
	var m ageMsg
	m.From = w.str8("sender", maxNodeNameLen, false)
	m.Region = w.str8("region", summary.MaxRegionLen, false)
	m.Generation = w.u64()
	m.Hash = w.u64()
	age := w.u64()
	m.SentAt = int64(w.u64())
	if w.err == nil && age > uint64(maxReportedAge) {
		return m, fmt.Errorf("%w: summary age %d ns", errWire, age)
	}
	m.Age = time.Duration(age)
	return m, w.end()
}

// maxReportedAge bounds the age a sender may report: a week is nonsense
// already, and a larger value would overflow the receiver's sums.
const maxReportedAge = 7 * 24 * time.Hour

func encodeSummaryMsg(body []byte) []byte {
	return append([]byte{msgSummary, wireVersion}, body...)
}

// localState frames the push/pull payload: version, then the sender's own
// summary body (possibly empty).
func encodeLocalState(body []byte) []byte {
	b := []byte{stateVersion}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

func decodeLocalState(b []byte) ([]byte, error) {
	w := &wire{b: b}
	if v := w.u8(); w.err == nil && v != stateVersion {
		return nil, fmt.Errorf("%w: push/pull state version %d, want %d", errWire, v, stateVersion)
	}
	n := w.u32()
	body := w.take(int(n))
	return body, w.end()
}

// encodeCoordinate is the ping ack payload: version, dimensionality, the
// vector, error, adjustment and height, as float64 bits.
func encodeCoordinate(c *coordinate.Coordinate) []byte {
	b := make([]byte, 0, 2+8*(len(c.Vec)+3))
	b = append(b, pingVersion, byte(len(c.Vec)))
	for _, v := range c.Vec {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	for _, v := range []float64{c.Error, c.Adjustment, c.Height} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// decodeCoordinate validates a peer's coordinate: memberlist hands over raw
// bytes, and coordinate.DistanceTo panics on a dimensionality mismatch.
func decodeCoordinate(b []byte, dims int) (*coordinate.Coordinate, error) {
	w := &wire{b: b}
	if v := w.u8(); w.err == nil && v != pingVersion {
		return nil, fmt.Errorf("%w: coordinate version %d, want %d", errWire, v, pingVersion)
	}
	if d := int(w.u8()); w.err == nil && d != dims {
		return nil, fmt.Errorf("%w: coordinate of %d dimensions, want %d", errWire, d, dims)
	}
	c := &coordinate.Coordinate{Vec: make([]float64, dims)}
	for i := range c.Vec {
		c.Vec[i] = w.f64()
	}
	c.Error, c.Adjustment, c.Height = w.f64(), w.f64(), w.f64()
	if err := w.end(); err != nil {
		return nil, err
	}
	if !c.IsValid() || c.Error < 0 || c.Height < 0 {
		return nil, fmt.Errorf("%w: coordinate with non-finite or negative components", errWire)
	}
	return c, nil
}

// keyOpMsg asks a controller to apply a keyring operation and answer.
type keyOpMsg struct {
	Op   keyOpCode
	ID   uint64 // random; answers carry it, repeats are answered, not re-applied
	From string // requester's node name
	Key  []byte // KeyBytes bytes; empty for a listing
}

type keyOpCode uint8

const (
	keyOpList keyOpCode = iota + 1
	keyOpInstall
	keyOpUse
	keyOpRemove
)

func (m keyOpMsg) encode() []byte {
	b := []byte{msgKeyOp, wireVersion, byte(m.Op)}
	b = binary.LittleEndian.AppendUint64(b, m.ID)
	b = appendString8(b, m.From)
	return append(append(b, byte(len(m.Key))), m.Key...)
}

func decodeKeyOp(b []byte) (keyOpMsg, error) {
	w := &wire{b: b[msgHeaderLen:]}
	var m keyOpMsg
	m.Op = keyOpCode(w.u8())
	m.ID = w.u64()
	m.From = w.str8("requester", maxNodeNameLen, false)
	n := int(w.u8())
	m.Key = append([]byte(nil), w.take(n)...)
	if err := w.end(); err != nil {
		return m, err
	}
	switch {
	case m.Op < keyOpList || m.Op > keyOpRemove:
		return m, fmt.Errorf("%w: keyring operation %d", errWire, m.Op)
	case m.Op == keyOpList && n != 0, m.Op != keyOpList && n != KeyBytes:
		return m, fmt.Errorf("%w: keyring operation %d with a key of %d bytes", errWire, m.Op, n)
	}
	return m, nil
}

// keyAckMsg answers a keyOpMsg: the outcome and the answering controller's
// key fingerprints, primary first.
type keyAckMsg struct {
	ID   uint64
	From string
	Err  string // "" when applied (or nothing to do)
	Keys []string
}

const (
	maxAckErrLen = 1024
	maxAckKeys   = 64
	maxFPLen     = 64
)

func (m keyAckMsg) encode() []byte {
	b := []byte{msgKeyAck, wireVersion}
	b = binary.LittleEndian.AppendUint64(b, m.ID)
	b = appendString8(b, m.From)
	e := m.Err
	if len(e) > maxAckErrLen {
		e = e[:maxAckErrLen]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(e)))
	b = append(b, e...)
	keys := m.Keys
	if len(keys) > maxAckKeys {
		keys = keys[:maxAckKeys]
	}
	b = append(b, byte(len(keys)))
	for _, k := range keys {
		b = appendString8(b, k)
	}
	return b
}

func decodeKeyAck(b []byte) (keyAckMsg, error) {
	w := &wire{b: b[msgHeaderLen:]}
	var m keyAckMsg
	m.ID = w.u64()
	m.From = w.str8("responder", maxNodeNameLen, false)
	var n uint16
	if v := w.take(2); v != nil {
		n = binary.LittleEndian.Uint16(v)
	}
	if int(n) > maxAckErrLen {
		return m, fmt.Errorf("%w: key answer error of %d bytes", errWire, n)
	}
	m.Err = string(w.take(int(n)))
	k := int(w.u8())
	if k > maxAckKeys {
		return m, fmt.Errorf("%w: %d key fingerprints", errWire, k)
	}
	for range k {
		m.Keys = append(m.Keys, w.str8("fingerprint", maxFPLen, false))
	}
	return m, w.end()
}
