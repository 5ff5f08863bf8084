package gossip

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// streamTracker wraps memberlist's NetTransport so Close is prompt: it remembers every
// TCP stream (dialled or accepted) and, on abort, closes them and cancels
// dials in flight. Without it a SendReliable or push/pull to an unreachable
// controller would hold Close for up to TCPTimeout (30s on the WAN preset).
type streamTracker struct {
	memberlist.NodeAwareTransport
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	aborted bool

	in    chan net.Conn
	done  chan struct{}
	relay sync.WaitGroup
	once  sync.Once
}

func newStreamTracker(inner memberlist.NodeAwareTransport) *streamTracker {
	ctx, cancel := context.WithCancel(context.Background())
	t := &streamTracker{
		NodeAwareTransport: inner,
		ctx:                ctx,
		cancel:             cancel,
		conns:              map[net.Conn]struct{}{},
		in:                 make(chan net.Conn),
		done:               make(chan struct{}),
	}
	t.relay.Add(1)
	go t.relayStreams()
	return t
}

// relayStreams hands accepted streams to memberlist, tracking each.
func (t *streamTracker) relayStreams() {
	defer t.relay.Done()
	src := t.NodeAwareTransport.StreamCh()
	for {
		select {
		case c := <-src:
			c = t.track(c)
			if c == nil {
				continue
			}
			select {
			case t.in <- c:
			case <-t.done:
				_ = c.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *streamTracker) StreamCh() <-chan net.Conn { return t.in }

// track registers c, or closes it and returns nil after an abort.
func (t *streamTracker) track(c net.Conn) net.Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.aborted {
		_ = c.Close()
		return nil
	}
	tc := &trackedConn{Conn: c, t: t}
	t.conns[tc] = struct{}{}
	return tc
}

func (t *streamTracker) forget(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

var errTransportClosed = errors.New("gossip transport closed")

// DialAddressTimeout dials like NetTransport does, but gives up at once
// when the node closes.
func (t *streamTracker) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(t.ctx, "tcp", a.Addr)
	if err != nil {
		if t.ctx.Err() != nil {
			return nil, errTransportClosed
		}
		return nil, err
	}
	if c := t.track(c); c != nil {
		return c, nil
	}
	return nil, errTransportClosed
}

func (t *streamTracker) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// abort closes every tracked stream and fails later dials; packets still
// flow (the leave broadcast needs them).
func (t *streamTracker) abort() {
	t.mu.Lock()
	t.aborted = true
	conns := make([]net.Conn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	t.cancel()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Shutdown stops the wrapped transport, then the relay.
func (t *streamTracker) Shutdown() error {
	t.abort()
	err := t.NodeAwareTransport.Shutdown()
	t.once.Do(func() { close(t.done) })
	t.relay.Wait()
	return err
}

type trackedConn struct {
	net.Conn
	t    *streamTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.t.forget(c) })
	return err
}
