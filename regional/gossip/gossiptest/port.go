package gossiptest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreeAddr returns a loopback address whose port is free for both TCP and
// UDP, for a node that must bind a known address later (a child process
// given its addresses in a file, a restart at the address it had).
// memberlist binds both: a port free for UDP alone may be held by a TCP
// socket (another test's connection), and the node's bind then fails.
//
// The port is drawn below the kernel's ephemeral range
// (ip_local_port_range): a port the kernel handed out with ":0" is free
// again once closed, and under load any outgoing connection on the machine
// could take it as its source port before the node binds it ("address
// already in use", seen in stress runs). Below the range only another
// listener can take it.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := PickAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// picked is every port PickAddr returned in this process: two nodes of one
// test, each given a free port before either binds, must not get the same.
var picked = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// PickAddr is FreeAddr returning its error. It never returns the same
// port twice in a process. (scenarios/fleet, which is not a test and may
// not import test scaffolding, picks its controllers' ports the same way.)
func PickAddr() (string, error) {
	lo := ephemeralLow() - 1
	const floor = 10000
	for range 200 {
		port := floor + rand.IntN(lo-floor)
		picked.Lock()
		taken := picked.ports[port]
		picked.ports[port] = true
		picked.Unlock()
		if taken {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		tl, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken: another port
		}
		ul, err := net.ListenPacket("udp", addr)
		tl.Close()
		if err != nil {
			continue // its UDP twin is taken
		}
		ul.Close()
		return addr, nil
	}
	return "", errors.New("no loopback port free for both TCP and UDP in 200 tries")
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default 32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		var lo, hi int
		if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); err == nil && lo > 11000 {
			return lo
		}
	}
	return 32768
}
