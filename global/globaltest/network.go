package globaltest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// ErrPartitioned is the dial error across a partition.
var ErrPartitioned = errors.New("globaltest: partitioned")

// Network is a loopback network whose links between named nodes can be cut.
// Every listener is owned by a node; every dial names the dialing node.
type Network struct {
	mu    sync.Mutex
	owner map[string]string // listen address -> node
	cut   map[[2]string]bool
	conns connSet // dialed connections, for Partition
}

// NewNetwork returns a network with every link up.
func NewNetwork() *Network {
	return &Network{owner: map[string]string{}, cut: map[[2]string]bool{}}
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Listen opens a listener owned by node at addr ("127.0.0.1:0" for a fresh
// port). Connections it accepts are closed when the listener closes.
func (nw *Network) Listen(node, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	nw.mu.Lock()
	nw.owner[ln.Addr().String()] = node
	nw.mu.Unlock()
	return &listener{Listener: ln, node: node}, nil
}

// Dial connects from node to addr, unless the link is cut.
func (nw *Network) Dial(ctx context.Context, from, addr string) (net.Conn, error) {
	c, err := nw.dial(ctx, from, addr)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (nw *Network) dial(ctx context.Context, from, addr string) (*netConn, error) {
	nw.mu.Lock()
	to := nw.owner[addr]
	blocked := nw.cut[pair(from, to)]
	nw.mu.Unlock()
	if blocked {
		return nil, fmt.Errorf("dial %s (%s) from %s: %w", addr, to, from, ErrPartitioned)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	nc := &netConn{Conn: c, from: from, to: to}
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.cut[pair(from, to)] || !nw.conns.add(nc) { // the set never closes
		c.Close()
		return nil, fmt.Errorf("dial %s (%s) from %s: %w", addr, to, from, ErrPartitioned)
	}
	return nc, nil
}

// Partition cuts every link between nodes of different groups and closes
// the connections that cross a cut. Nodes in no group keep their links.
func (nw *Network) Partition(groups ...[]string) {
	nw.mu.Lock()
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					nw.cut[pair(a, b)] = true
				}
			}
		}
	}
	var drop []*netConn
	for _, c := range nw.conns.list() {
		if nw.cut[pair(c.from, c.to)] {
			drop = append(drop, c)
		}
	}
	nw.mu.Unlock()
	for _, c := range drop {
		c.Close()
	}
}

// Isolate cuts every link of node (as if it crashed or lost its network)
// and closes its connections.
func (nw *Network) Isolate(node string) {
	nw.mu.Lock()
	nodes := map[string]bool{}
	for _, o := range nw.owner {
		nodes[o] = true
	}
	nw.mu.Unlock()
	var others []string
	for o := range nodes {
		if o != node {
			others = append(others, o)
		}
	}
	nw.Partition([]string{node}, others)
}

// Reconnect restores every link of node.
func (nw *Network) Reconnect(node string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for p := range nw.cut {
		if p[0] == node || p[1] == node {
			delete(nw.cut, p)
		}
	}
}

// Heal restores every link.
func (nw *Network) Heal() {
	nw.mu.Lock()
	nw.cut = map[[2]string]bool{}
	nw.mu.Unlock()
}

// HTTPClient returns an HTTP client whose connections are dialed from node
// over the network (so partitions apply to forwarding and joins).
func (nw *Network) HTTPClient(node string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return nw.Dial(ctx, node, addr)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// StreamLayer returns a Raft stream layer for node: it accepts on ln and
// dials over the network. Closing it closes ln and every connection it made
// or accepted.
func (nw *Network) StreamLayer(node string, ln net.Listener) raft.StreamLayer {
	return &streamLayer{ln: ln, nw: nw, node: node}
}

// netConn is a connection of the network; closing it removes it from every
// connSet that tracks it.
type netConn struct {
	net.Conn
	from, to string // from is "" for an accepted connection

	mu     sync.Mutex
	closed bool
	sets   []*connSet
}

func (c *netConn) Close() error {
	c.mu.Lock()
	sets := c.sets
	c.sets, c.closed = nil, true
	c.mu.Unlock()
	for _, s := range sets {
		s.remove(c)
	}
	return c.Conn.Close()
}

// connSet tracks the open connections of an owner (the network, a listener,
// a stream layer) so that it can close them all.
type connSet struct {
	mu     sync.Mutex
	conns  map[*netConn]struct{}
	closed bool
}

// add tracks c until it closes. It fails, and the caller must close c, when
// the set is closed (or c already is).
func (s *connSet) add(c *netConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || c.closed {
		return false
	}
	if s.conns == nil {
		s.conns = map[*netConn]struct{}{}
	}
	s.conns[c] = struct{}{}
	c.sets = append(c.sets, s)
	return true
}

func (s *connSet) remove(c *netConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *connSet) list() []*netConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*netConn, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c)
	}
	return out
}

// close closes every tracked connection and makes add fail from now on. It
// reports false when the set was closed already.
func (s *connSet) close() bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	return true
}

type listener struct {
	net.Listener
	node  string
	conns connSet // accepted
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	nc := &netConn{Conn: c, to: l.node}
	if !l.conns.add(nc) {
		c.Close()
		return nil, net.ErrClosed
	}
	return nc, nil
}

func (l *listener) Close() error {
	if !l.conns.close() {
		return nil
	}
	return l.Listener.Close()
}

type streamLayer struct {
	ln     net.Listener
	nw     *Network
	node   string
	dialed connSet
}

func (s *streamLayer) Accept() (net.Conn, error) { return s.ln.Accept() }
func (s *streamLayer) Addr() net.Addr            { return s.ln.Addr() }

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := s.nw.dial(ctx, s.node, string(address))
	if err != nil {
		return nil, err
	}
	if !s.dialed.add(c) {
		c.Close()
		return nil, net.ErrClosed
	}
	return c, nil
}

func (s *streamLayer) Close() error {
	if !s.dialed.close() {
		return nil
	}
	return s.ln.Close()
}
