package globaltest

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func tracked(s *connSet) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// TestConnTracking: a connection leaves its owners' sets when it closes, a
// partition closes the dialed connections that cross it, and closing a
// listener or a stream layer closes what it still tracks.
func TestConnTracking(t *testing.T) {
	nw := NewNetwork()
	lnA, err := nw.Listen("a", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lnB, err := nw.Listen("b", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := nw.StreamLayer("b", lnB).(*streamLayer)
	defer sl.Close()
	defer lnA.Close()
	la := lnA.(*listener)
	dialAccept := func() (dialed, accepted net.Conn) {
		t.Helper()
		d, err := sl.Dial(raft.ServerAddress(lnA.Addr().String()), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		a, err := lnA.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return d, a
	}
	counts := func() [3]int { return [3]int{tracked(&nw.conns), tracked(&sl.dialed), tracked(&la.conns)} }

	for range 3 {
		d, a := dialAccept()
		if c := counts(); c != [3]int{1, 1, 1} {
			t.Fatalf("open: tracked %v", c)
		}
		d.Close()
		a.Close()
		if c := counts(); c != [3]int{0, 0, 0} {
			t.Fatalf("closed connections are still tracked: %v", c)
		}
	}

	d, a := dialAccept()
	nw.Partition([]string{"a"}, []string{"b"})
	if _, err := d.Write([]byte("x")); err == nil {
		t.Fatal("a connection across the partition still writes")
	}
	if _, err := a.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the accepted side reads %v, want EOF", err)
	}
	a.Close()
	if c := counts(); c != [3]int{0, 0, 0} {
		t.Fatalf("after the partition: tracked %v", c)
	}
	if _, err := nw.Dial(context.Background(), "b", lnA.Addr().String()); !errors.Is(err, ErrPartitioned) {
		t.Fatalf("dial across the partition: %v", err)
	}
	nw.Heal()

	d, a = dialAccept()
	lnA.Close()
	if _, err := a.Write([]byte("x")); err == nil {
		t.Fatal("an accepted connection survived its listener")
	}
	if c := counts(); c[2] != 0 {
		t.Fatalf("closed listener tracks %d connections", c[2])
	}
	sl.Close()
	if _, err := d.Write([]byte("x")); err == nil {
		t.Fatal("a dialed connection survived its stream layer")
	}
	if c := counts(); c != [3]int{0, 0, 0} {
		t.Fatalf("after closing: tracked %v", c)
	}
	lnC, err := nw.Listen("c", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lnC.Close()
	if _, err := sl.Dial(raft.ServerAddress(lnC.Addr().String()), time.Second); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a closed stream layer dials: %v", err)
	}
	if c := counts(); c != [3]int{0, 0, 0} {
		t.Fatalf("a refused dial is tracked: %v", c)
	}
}
