package zmtp

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Both ends of the transport parse endpoints here, so the data-parallel
// offsets (tcp port + rank, ipc path + "_dp<rank>") are one rule.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		ep       string
		rank     int
		want     string
		wildcard bool
		err      string
	}{
		{ep: "tcp://10.0.0.7:5557", want: "tcp://10.0.0.7:5557"},
		{ep: "tcp://10.0.0.7:5557", rank: 2, want: "tcp://10.0.0.7:5559"},
		{ep: "tcp://[fd00::1]:5557", rank: 1, want: "tcp://[fd00::1]:5558"},
		{ep: "tcp://bridge.local:5557", rank: 1, want: "tcp://bridge.local:5558"},
		{ep: "tcp://*:5557", want: "tcp://:5557", wildcard: true},
		{ep: "tcp://*:5557", rank: 3, want: "tcp://:5560", wildcard: true},
		{ep: "tcp://[::]:5557", want: "tcp://[::]:5557"},
		{ep: "tcp://:5557", want: "tcp://:5557"},
		{ep: "tcp://127.0.0.1:0", rank: 3, want: "tcp://127.0.0.1:0"},
		{ep: "tcp://*:65534", rank: 1, want: "tcp://:65535", wildcard: true},
		{ep: "ipc:///run/kv", want: "ipc:///run/kv"},
		{ep: "ipc:///run/kv", rank: 2, want: "ipc:///run/kv_dp2"},
		{ep: "ipc://", err: "empty ipc path"},
		{ep: "inproc://kv", err: "inproc"},
		{ep: "tcp://host", err: "missing port"},
		{ep: "tcp://host:http", err: "bad port"},
		{ep: "tcp://host:-1", err: "bad port"},
		{ep: "tcp://host:65536", err: "bad port"},
		{ep: "tcp://*:65535", rank: 1, err: "bad port"},
		{ep: "udp://x:1", err: "want tcp"},
		{ep: "10.0.0.7:5557", err: "want tcp"},
	} {
		e, err := Parse(c.ep, c.rank)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s rank %d: %v, %v; want an error containing %q", c.ep, c.rank, e, err, c.err)
			}
			continue
		}
		if err != nil || e.String() != c.want || e.Wildcard != c.wildcard {
			t.Errorf("%s rank %d: %v (wildcard %v) %v; want %s (wildcard %v)", c.ep, c.rank, e, e.Wildcard, err, c.want, c.wildcard)
		}
	}
}

func TestVLLMBinds(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557":            true,
		"tcp://[::]:5557":         true,
		"tcp://[::1]:5557":        true, // vLLM's heuristic looks for "::" only
		"ipc:///run/kv":           true,
		"tcp://10.0.0.7:5557":     false,
		"tcp://bridge.local:5557": false,
	} {
		if got := VLLMBinds(ep); got != want {
			t.Errorf("VLLMBinds(%q) = %v, want %v", ep, got, want)
		}
	}
}

// Listen replaces a stale ipc socket file, and EndpointOf names what it
// bound in a form Parse reads back.
func TestListenAndEndpointOf(t *testing.T) {
	e, _ := Parse("tcp://*:0", 0)
	ln, err := e.Listen()
	if err != nil {
		t.Fatal(err)
	}
	name := EndpointOf(ln)
	ln.Close()
	if !strings.HasPrefix(name, "tcp://127.0.0.1:") || strings.HasSuffix(name, ":0") {
		t.Fatalf("tcp listener named %q", name)
	}
	if _, err := Parse(name, 0); err != nil {
		t.Fatalf("%s does not parse: %v", name, err)
	}

	path := filepath.Join(t.TempDir(), "kv")
	for i := range 2 { // the second bind finds the first's socket file
		e, _ := Parse("ipc://"+path, 0)
		ln, err := e.Listen()
		if err != nil {
			t.Fatalf("bind %d: %v", i, err)
		}
		if got := EndpointOf(ln); got != "ipc://"+path {
			t.Fatalf("ipc listener named %q", got)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("socket file: %v", err)
		}
	}
}

// A publisher with a write buffer and a subscriber without one exchange a
// subscription and a message over Open's connections.
func TestOpen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		msg zmq4.Msg
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer nc.Close()
		conn, bc, err := Open(nc, zmq4.Pub, true, 5*time.Second, 16<<10, 64<<10)
		if err != nil {
			done <- result{err: err}
			return
		}
		sub, err := conn.RecvMsg()
		if err == nil {
			err = conn.SendMsg(zmq4.NewMsgFrom([]byte("topic"), EndSeq))
		}
		if err == nil {
			err = bc.Flush()
		}
		done <- result{msg: sub, err: err}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	conn, bc, err := Open(nc, zmq4.Sub, false, 5*time.Second, 64<<10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.SendMsg(zmq4.NewMsg([]byte("\x01kv@"))); err != nil {
		t.Fatal(err)
	}
	if err := bc.Flush(); err != nil {
		t.Fatalf("flush without a write buffer: %v", err)
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	msg, err := conn.RecvMsg()
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Frames) != 2 || string(msg.Frames[0]) != "topic" || string(msg.Frames[1]) != string(EndSeq) {
		t.Fatalf("subscriber read %q", msg.Frames)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.msg.Frames) != 1 || string(r.msg.Frames[0]) != "\x01kv@" {
		t.Fatalf("publisher read %q", r.msg.Frames)
	}
}
