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

// streamLayer is the Raft network: TCP, optionally wrapped in mutual TLS. It
// tracks every connection it accepts or dials and closes them all on Close,
// so a closed node leaves no connection (and no goroutine of Raft's
// transport blocked on one) behind.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	srvTLS    *tls.Config // nil: plain TCP
	cliTLS    *tls.Config
	timeout   time.Duration // TLS handshake of an accepted connection
	onReject  func(error)   // a refused handshake

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

var _ raft.StreamLayer = (*streamLayer)(nil)

// newStreamLayer listens on bind. With srvTLS, accepted connections must
// complete a mutual TLS handshake within timeout; cliTLS (default srvTLS)
// dials peers.
func newStreamLayer(bind, advertise string, srvTLS, cliTLS *tls.Config, timeout time.Duration, onReject func(error)) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raft transport: listen on %s: %w", bind, err)
	}
	s := &streamLayer{ln: ln, timeout: timeout, onReject: onReject, conns: map[*trackedConn]struct{}{}}
	if srvTLS != nil {
		s.srvTLS = mutualServerConfig(srvTLS)
		s.cliTLS = cliTLS
		if s.cliTLS == nil {
			s.cliTLS = srvTLS
		}
	}
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

// mutualServerConfig returns base, made to require and verify a client
// certificate, also in the configs its GetConfigForClient returns; a config
// without ClientCAs fails the handshake rather than fall back to the
// system roots.
func mutualServerConfig(base *tls.Config) *tls.Config {
	c := base.Clone()
	c.ClientAuth = tls.RequireAndVerifyClientCert
	if get := base.GetConfigForClient; get != nil {
		fallback := c.Clone()
		fallback.GetConfigForClient = nil
		c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			inner, err := get(h)
			if err != nil {
				return nil, err
			}
			if inner == nil {
				inner = fallback
			}
			inner = inner.Clone()
			inner.ClientAuth = tls.RequireAndVerifyClientCert
			if inner.ClientCAs == nil {
				return nil, errors.New("raft transport: tls config has no ClientCAs to verify the peer with")
			}
			return inner, nil
		}
	}
	return c
}

// Accept implements net.Listener. A TLS connection is returned at once (the
// accept loop must not wait on one peer); its handshake runs on its first
// read or write, bounded by the transport timeout.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	if s.srvTLS != nil {
		c = &handshakeConn{Conn: tls.Server(c, s.srvTLS), timeout: s.timeout, onReject: s.onReject}
	}
	return s.track(c)
}

// handshakeConn completes a server-side TLS handshake, with a deadline,
// before the first byte is read or written.
type handshakeConn struct {
	*tls.Conn
	timeout  time.Duration
	onReject func(error)
	once     sync.Once
	err      error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		_ = c.Conn.SetDeadline(time.Now().Add(c.timeout))
		if c.err = c.Conn.Handshake(); c.err != nil {
			c.err = fmt.Errorf("raft transport: tls handshake with %s: %w", c.RemoteAddr(), c.err)
			if c.onReject != nil {
				c.onReject(c.err)
			}
			return
		}
		c.err = c.Conn.SetDeadline(time.Time{})
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// Dial implements raft.StreamLayer.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", string(address))
	if err != nil {
		return nil, err
	}
	if s.cliTLS != nil {
		cfg := s.cliTLS.Clone()
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
