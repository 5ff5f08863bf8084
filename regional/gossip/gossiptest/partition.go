package gossiptest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrPartitioned is what a stream dial across a cut link returns.
var ErrPartitioned = errors.New("gossiptest: partitioned")

// Partition cuts links of a gossip pool between named nodes, both ways:
// packets (probes, acks, gossip) across a cut link are dropped and stream
// dials (push/pull, pulls, answers) fail, as across a network partition.
// Each node's transport is wrapped with Wrap(name); a node's address is
// learnt when its transport is asked for it (FinalAdvertiseAddr). Safe for
// concurrent use.
type Partition struct {
	mu    sync.Mutex
	addrs map[string]string // advertised host:port -> node name
	cut   map[[2]string]bool
}

// NewPartition returns a partition with every link up.
func NewPartition() *Partition {
	return &Partition{addrs: map[string]string{}, cut: map[[2]string]bool{}}
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Cut cuts every link between a node of a and a node of b.
func (p *Partition) Cut(a, b []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			p.cut[pair(x, y)] = true
		}
	}
}

// Heal restores every link.
func (p *Partition) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.cut)
}

// blocked reports whether the link from node to the node at addr is cut.
func (p *Partition) blocked(node, addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	to, ok := p.addrs[addr]
	return ok && p.cut[pair(node, to)]
}

// Wrap returns the transport wrapper of node name (for gossip's
// Config.WrapTransport).
func (p *Partition) Wrap(name string) func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
	return func(inner memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		return &partTransport{NodeAwareTransport: inner, p: p, name: name}
	}
}

type partTransport struct {
	memberlist.NodeAwareTransport
	p    *Partition
	name string
}

func (t *partTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	a, pt, err := t.NodeAwareTransport.FinalAdvertiseAddr(ip, port)
	if err == nil {
		t.p.mu.Lock()
		t.p.addrs[net.JoinHostPort(a.String(), strconv.Itoa(pt))] = t.name
		t.p.mu.Unlock()
	}
	return a, pt, err
}

func (t *partTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.p.blocked(t.name, a.Addr) {
		return time.Now(), nil // sent, never to arrive
	}
	return t.NodeAwareTransport.WriteToAddress(b, a)
}

func (t *partTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.p.blocked(t.name, addr) {
		return time.Now(), nil
	}
	return t.NodeAwareTransport.WriteTo(b, addr)
}

func (t *partTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.p.blocked(t.name, a.Addr) {
		return nil, fmt.Errorf("dial %s from %s: %w", a.Addr, t.name, ErrPartitioned)
	}
	return t.NodeAwareTransport.DialAddressTimeout(a, timeout)
}

func (t *partTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.p.blocked(t.name, addr) {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, t.name, ErrPartitioned)
	}
	return t.NodeAwareTransport.DialTimeout(addr, timeout)
}
