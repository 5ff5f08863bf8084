package fleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// pickedPorts is every port pickAddr returned in this process.
var pickedPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// pickAddr returns a loopback address for a controller that may be
// started again on it: its port free now for TCP and UDP (gossip binds
// both), below the kernel's ephemeral range (ip_local_port_range) and
// never returned before in this process. A port the kernel handed out
// with ":0" is free again once closed, and any outgoing connection on the
// machine may take it as its source port before the replica binds it
// again ("address already in use", seen in stress runs); below the range
// only another listener can take it.
func pickAddr() (string, error) {
	const floor = 10000
	hi := ephemeralLow()
	for range 200 {
		port := floor + rand.IntN(hi-floor)
		pickedPorts.Lock()
		taken := pickedPorts.m[port]
		pickedPorts.m[port] = true
		pickedPorts.Unlock()
		if taken {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		tl, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ul, err := net.ListenPacket("udp", addr)
		tl.Close()
		if err != nil {
			continue
		}
		ul.Close()
		return addr, nil
	}
	return "", errors.New("no loopback port below the ephemeral range free for TCP and UDP in 200 tries")
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default, 32768, when it cannot be read or leaves too little below it).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); err == nil && lo > 11000 {
			return lo
		}
	}
	return 32768
}
