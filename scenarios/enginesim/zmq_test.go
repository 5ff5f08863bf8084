package enginesim

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/meridian-llm/meridian/regional/kvbridge/zmtp"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// zmqPeer is a test client at the ZMTP connection level (SUB or DEALER).
type zmqPeer struct {
	t    *testing.T
	nc   net.Conn
	conn *zmq4.Conn
}

func dialZMQ(t *testing.T, endpoint string, typ zmq4.SocketType) *zmqPeer {
	t.Helper()
	network, addr := "tcp", strings.TrimPrefix(endpoint, "tcp://")
	if strings.HasPrefix(endpoint, "ipc://") {
		network, addr = "unix", strings.TrimPrefix(endpoint, "ipc://")
	}
	nc, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := zmq4.Open(nc, null.Security(), typ, nil, false, nil)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	p := &zmqPeer{t: t, nc: nc, conn: conn}
	t.Cleanup(func() { nc.Close() })
	return p
}

func (p *zmqPeer) send(frames ...[]byte) {
	p.t.Helper()
	if err := p.conn.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
		p.t.Fatal(err)
	}
}

// recv returns the next message's frames, failing after 10s.
func (p *zmqPeer) recv() [][]byte {
	p.t.Helper()
	_ = p.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		msg, err := p.conn.RecvMsg()
		if err != nil {
			p.t.Fatalf("receive: %v", err)
		}
		if msg.Type != zmq4.CmdMsg {
			return msg.Frames
		}
	}
}

func u64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

func newZMQPub(t *testing.T, zc ZMQConfig) *ZMQPublisher {
	t.Helper()
	pub, err := NewZMQPublisher(zc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the engine's (cleanups run last-in first-out)
		if err := pub.Close(); err != nil {
			t.Error(err)
		}
	})
	return pub
}

func waitZMQ(t *testing.T, pub *ZMQPublisher, cond func(ZMQStats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pub.WaitFor(ctx, cond); err != nil {
		t.Fatal(err)
	}
}

// An engine publishing over ZMQ: a subscriber sees [topic, seq, payload]
// with the kv@<pod>@<model> topic, seq from 0 without holes (PodUp first,
// PodDown last), payloads that decode as vLLM batches, and replaying the
// block events gives exactly the cache. The replay socket then serves the
// same bytes in vLLM's reply shape.
func TestZMQPublishing(t *testing.T) {
	pub := newZMQPub(t, ZMQConfig{Endpoint: "tcp://127.0.0.1:0", Mode: "bind", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if !strings.HasPrefix(pub.Addr(), "tcp://127.0.0.1:") || !strings.HasPrefix(pub.ReplayAddr(), "tcp://127.0.0.1:") {
		t.Fatalf("addresses %q %q", pub.Addr(), pub.ReplayAddr())
	}
	sub := dialZMQ(t, pub.Addr(), zmq4.Sub)
	sub.send([]byte("\x01kv@"))
	waitZMQ(t, pub, func(s ZMQStats) bool { return s.Subscribers == 1 })

	cfg := fastConfig()
	cfg.Name = "pod-z"
	cfg.CacheBlocks = 24 // small enough to evict
	cfg.Publisher = pub
	te := openTestEngine(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 10 {
		body := fmt.Sprintf(`{"model": "meridian/sim-70b", "max_tokens": 2, "prompt": %q}`, strings.Repeat(fmt.Sprintf("zmq words %d ", i%4), 8)+fmt.Sprint(i))
		if status, b := te.post(ctx, "/v1/completions", body); status != 200 {
			t.Fatalf("request %d: %d %s", i, status, b)
		}
	}
	want := map[uint64]bool{}
	for _, b := range te.CachedBlocks() {
		want[b.Hash] = true
	}
	if err := te.Close(ctx); err != nil { // flushes the events, PodDown last
		t.Fatal(err)
	}
	dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]bool{}
	payloads := map[uint64][]byte{}
	var kinds []kvevents.Kind
	var seq uint64
	for down := false; !down; seq++ {
		f := sub.recv()
		if len(f) != 3 || string(f[0]) != "kv@pod-z@meridian/sim-70b" || len(f[1]) != 8 {
			t.Fatalf("message %d: frames %q", seq, f)
		}
		if s := u64(f[1]); s != seq {
			t.Fatalf("got seq %d, want %d", s, seq)
		}
		payloads[seq] = f[2]
		b, err := dec.Decode(f[2])
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		for _, ev := range b.Events {
			kinds = append(kinds, ev.Kind())
			switch ev := ev.(type) {
			case *kvevents.PodUp:
				if ev.Pod != "pod-z" || ev.Epoch != te.Epoch() {
					t.Fatalf("PodUp %+v", ev)
				}
			case *kvevents.PodDown:
				down = true
			case *kvevents.BlockStored:
				for _, h := range ev.BlockHashes {
					got[h] = true
				}
			case *kvevents.BlockRemoved:
				for _, h := range ev.BlockHashes {
					delete(got, h)
				}
			}
		}
	}
	if kinds[0] != kvevents.KindPodUp || !slices.Contains(kinds, kvevents.KindBlockRemoved) {
		t.Fatalf("event kinds %v: want PodUp first and an eviction", kinds)
	}
	if len(want) == 0 || !maps.Equal(got, want) {
		t.Fatalf("replayed %d blocks from the PUB stream, the cache holds %d", len(got), len(want))
	}

	// Replay from 1: every batch from seq 1 on, byte for byte, as
	// [empty, seq, payload], then [empty, 0xFF x 8, empty].
	last := pub.Stats().LastSeq
	if last != seq-1 {
		t.Fatalf("last published seq %d, received up to %d", last, seq-1)
	}
	rep := dialZMQ(t, pub.ReplayAddr(), zmq4.Dealer)
	rep.send([]byte{}, binary.BigEndian.AppendUint64(nil, 1))
	for s := uint64(1); ; s++ {
		f := rep.recv()
		if len(f) != 3 || len(f[0]) != 0 {
			t.Fatalf("reply frames %q", f)
		}
		if string(f[1]) == string(zmtp.EndSeq) {
			if len(f[2]) != 0 || s != last+1 {
				t.Fatalf("end marker after seq %d (last published %d), payload %q", s-1, last, f[2])
			}
			break
		}
		if u64(f[1]) != s || string(payloads[s]) != string(f[2]) {
			t.Fatalf("replayed seq %d (want %d) differs from the published batch", u64(f[1]), s)
		}
	}
	// The publisher counts the request once its answer is flushed, which
	// can be after the end marker arrived here.
	waitZMQ(t, pub, func(st ZMQStats) bool { return st.ReplayRequests > 0 })
	if st := pub.Stats(); st.ReplayRequests != 1 || st.ReplayBatches != last {
		t.Fatalf("stats %+v", st)
	}
}

// The replay ring keeps the last BufferSteps batches; a malformed request is
// ignored and the connection still answers the next one; a request beyond
// the newest gets only the end marker.
func TestZMQReplayBuffer(t *testing.T) {
	pub, err := NewZMQPublisher(ZMQConfig{Endpoint: "tcp://127.0.0.1:0", Mode: "bind", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 4, Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for s := range uint64(10) {
		if err := pub.Publish(context.Background(), Batch{Pod: "p", Seq: s, TS: time.Unix(1, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	rep := dialZMQ(t, pub.ReplayAddr(), zmq4.Dealer)
	rep.send([]byte("junk"))
	rep.send([]byte{}, binary.BigEndian.AppendUint64(nil, 2))
	var seqs []uint64
	for {
		f := rep.recv()
		if string(f[1]) == string(zmtp.EndSeq) {
			break
		}
		seqs = append(seqs, u64(f[1]))
	}
	if fmt.Sprint(seqs) != "[6 7 8 9]" {
		t.Fatalf("replayed %v, want the last 4", seqs)
	}
	rep.send([]byte{}, binary.BigEndian.AppendUint64(nil, 10))
	if f := rep.recv(); string(f[1]) != string(zmtp.EndSeq) {
		t.Fatalf("want only the end marker, got %q", f)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), Batch{Seq: 11}); err == nil {
		t.Fatal("publish after close succeeded")
	}
	if err := pub.Close(); err != nil {
		t.Fatal("second close:", err)
	}
}

// DropEvery withholds every Nth batch from subscribers (a gap), not from the
// replay buffer; only subscriptions that match the topic receive anything.
func TestZMQDropEveryAndTopics(t *testing.T) {
	pub, err := NewZMQPublisher(ZMQConfig{Endpoint: "tcp://127.0.0.1:0", Mode: "bind", ReplayEndpoint: "tcp://127.0.0.1:0", DropEvery: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	match := dialZMQ(t, pub.Addr(), zmq4.Sub)
	match.send([]byte("\x01kv@p@"))
	other := dialZMQ(t, pub.Addr(), zmq4.Sub)
	other.send([]byte("\x01kv@q@"))
	waitZMQ(t, pub, func(s ZMQStats) bool { return s.Subscribers == 2 })
	for s := range uint64(9) {
		if err := pub.Publish(context.Background(), Batch{Pod: "p", Seq: s, TS: time.Unix(1, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	for range 6 {
		f := match.recv()
		if string(f[0]) != "kv@p@meridian/sim-70b" {
			t.Fatalf("topic %q", f[0])
		}
		got = append(got, u64(f[1]))
	}
	if fmt.Sprint(got) != "[0 1 3 4 6 7]" {
		t.Fatalf("received %v: want every third batch (seq 2, 5, 8) withheld", got)
	}
	if st := pub.Stats(); st.FaultDropped != 3 || st.Published != 9 || st.HWMDropped != 0 {
		t.Fatalf("stats %+v", st)
	}
	// The replay buffer holds the withheld batches.
	rep := dialZMQ(t, pub.ReplayAddr(), zmq4.Dealer)
	rep.send([]byte{}, binary.BigEndian.AppendUint64(nil, 2))
	if f := rep.recv(); u64(f[1]) != 2 {
		t.Fatalf("replay starts at %d, want the withheld seq 2", u64(f[1]))
	}
	// The other subscriber received nothing: once it subscribes to the
	// topic, the first message it gets is the next one published.
	other.send([]byte("\x01kv@p@"))
	waitZMQ(t, pub, func(s ZMQStats) bool { return s.Subscriptions == 3 })
	pub.SetDropEvery(0)
	if err := pub.Publish(context.Background(), Batch{Pod: "p", Seq: 9, TS: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	if f := other.recv(); u64(f[1]) != 9 {
		t.Fatalf("non-matching subscriber had received seq %d", u64(f[1]))
	}
}

// Connect mode (vLLM's heuristic: an endpoint naming a host connects): the
// publisher dials a subscriber that binds, and dials again after the
// subscriber goes away and comes back.
func TestZMQConnectMode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	pub, err := NewZMQPublisher(ZMQConfig{Endpoint: "tcp://" + addr, Topic: "kv@c@m", ReconnectMin: 5 * time.Millisecond, ReconnectMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	accept := func() *zmqPeer {
		nc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := zmq4.Open(nc, null.Security(), zmq4.Sub, nil, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := &zmqPeer{t: t, nc: nc, conn: conn}
		p.send([]byte("\x01"))
		waitZMQ(t, pub, func(s ZMQStats) bool { return s.Subscribers == 1 })
		return p
	}
	for round := range 2 {
		sub := accept()
		seq := uint64(round)
		if err := pub.Publish(context.Background(), Batch{Pod: "c", Seq: seq, TS: time.Unix(1, 0)}); err != nil {
			t.Fatal(err)
		}
		if f := sub.recv(); string(f[0]) != "kv@c@m" || u64(f[1]) != seq {
			t.Fatalf("round %d: %q", round, f)
		}
		sub.nc.Close() // the subscriber goes away; the publisher redials
		waitZMQ(t, pub, func(s ZMQStats) bool { return s.Subscribers == 0 })
	}
	ln.Close()
}

// ipc endpoints bind, with vLLM's data-parallel suffix.
func TestZMQIPC(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv")
	pub, err := NewZMQPublisher(ZMQConfig{Endpoint: "ipc://" + path, ReplayEndpoint: "ipc://" + path + "-replay", DataParallelRank: 2, Topic: "kv@i@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if pub.Addr() != "ipc://"+path+"_dp2" || pub.ReplayAddr() != "ipc://"+path+"-replay_dp2" {
		t.Fatalf("addresses %q %q", pub.Addr(), pub.ReplayAddr())
	}
	sub := dialZMQ(t, pub.Addr(), zmq4.Sub)
	sub.send([]byte("\x01"))
	waitZMQ(t, pub, func(s ZMQStats) bool { return s.Subscribers == 1 })
	if err := pub.Publish(context.Background(), Batch{Pod: "i", Seq: 0, DPRank: 2, TS: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	f := sub.recv()
	dec, _ := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
	b, err := dec.Decode(f[2])
	if err != nil || b.Rank() != 2 {
		t.Fatalf("payload rank %v, err %v", b, err)
	}
}

func TestZMQEndpointHeuristic(t *testing.T) {
	for _, c := range []struct {
		ep   string
		rank int
		want string
		bind bool
		err  string
	}{
		{ep: "tcp://*:5557", want: "tcp://:5557", bind: true},
		{ep: "tcp://*:5557", rank: 3, want: "tcp://:5560", bind: true},
		{ep: "tcp://[::]:5557", want: "tcp://[::]:5557", bind: true},
		{ep: "tcp://10.0.0.7:5557", want: "tcp://10.0.0.7:5557"},
		{ep: "tcp://bridge.local:5557", rank: 1, want: "tcp://bridge.local:5558"},
		{ep: "ipc:///run/kv", want: "ipc:///run/kv", bind: true},
		{ep: "ipc:///run/kv", rank: 1, want: "ipc:///run/kv_dp1", bind: true},
		{ep: "inproc://kv", err: "inproc"},
		{ep: "tcp://host", err: "missing port"},
		{ep: "udp://x:1", err: "want tcp"},
		{ep: "tcp://*:65535", rank: 1, err: "bad port"},
	} {
		e, err := zmtp.Parse(c.ep, c.rank)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.ep, err, c.err)
			}
			continue
		}
		if bind := zmtp.VLLMBinds(c.ep); err != nil || e.String() != c.want || bind != c.bind {
			t.Errorf("%s rank %d: %v bind %v err %v; want %s bind %v", c.ep, c.rank, e, bind, err, c.want, c.bind)
		}
	}
	for name, zc := range map[string]ZMQConfig{
		"BufferSteps":      {BufferSteps: -1},
		"HWM":              {HWM: -2},
		"Mode":             {Mode: "sideways"},
		"DropEvery":        {DropEvery: -1},
		"Endpoint":         {Endpoint: "inproc://x"},
		"ReplayEndpoint":   {ReplayEndpoint: "udp://x:1"},
		"DataParallelRank": {DataParallelRank: -1},
	} {
		if err := zc.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
