package global

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is the Raft network: TCP, optionally wrapped in TLS. It tracks
// every connection it accepts or dials and closes them all on Close, so a
// closed node leaves no connection (and no goroutine of Raft's transport
// blocked on one) behind.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	tls       *tls.Config // nil: plain TCP

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(bind, advertise string, tlsCfg *tls.Config) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raft transport: listen on %s: %w", bind, err)
	}
	s := &streamLayer{ln: ln, tls: tlsCfg, conns: map[*trackedConn]struct{}{}}
	if advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", advertise)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("raft transport: advertise address %q: %w", advertise, err)
		}
		s.advertise = a
	}
	if a, ok := s.Addr().(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("raft transport: address %s cannot be advertised; set RaftAdvertise", s.Addr())
	}
	return s, nil
}

// Accept implements net.Listener.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	if s.tls != nil {
		c = tls.Server(c, s.tls)
	}
	return s.track(c)
}

// Dial implements raft.StreamLayer.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", string(address))
	if err != nil {
		return nil, err
	}
	if s.tls != nil {
		cfg := s.tls.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(string(address))
			cfg.ServerName = host
		}
		tc := tls.Client(c, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("raft transport: tls handshake with %s: %w", address, err)
		}
		c = tc
	}
	return s.track(c)
}

func (s *streamLayer) track(c net.Conn) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return nil, errors.New("raft transport: closed")
	}
	t := &trackedConn{Conn: c, s: s}
	s.conns[t] = struct{}{}
	return t, nil
}

// Close implements net.Listener: it stops accepting and closes every
// connection.
func (s *streamLayer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	err := s.ln.Close()
	for c := range conns {
		c.Conn.Close()
	}
	return err
}

// Addr implements net.Listener: the advertised address.
func (s *streamLayer) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.ln.Addr()
}

type trackedConn struct {
	net.Conn
	s    *streamLayer
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}
