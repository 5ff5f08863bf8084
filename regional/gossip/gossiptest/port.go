package gossiptest

import (
	"net"
	"testing"
)

// FreeAddr returns a loopback address whose port is free for both TCP and
// UDP, for a gossip node that must bind a known address (a restart at an
// address given before it starts). memberlist binds both: a port free for
// UDP alone may be held by a TCP socket (another test's connection), and
// the node's bind then fails.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 50 {
		tl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := tl.Addr().String()
		ul, err := net.ListenPacket("udp", addr)
		tl.Close()
		if err != nil {
			continue // its UDP twin is taken: another port
		}
		ul.Close()
		return addr
	}
	t.Fatal("no loopback port free for both TCP and UDP in 50 tries")
	return ""
}
