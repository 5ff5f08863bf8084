package identity_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meridian-llm/meridian/global/identity"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// devPKI writes a dev PKI for regions a and b to a temporary directory.
func devPKI(t testing.TB, opts identity.PKIOptions) identity.PKIResult {
	t.Helper()
	res, err := identity.InitDevPKI(filepath.Join(t.TempDir(), "pki"), []string{"a", "b"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// tlsFiles returns the TLSConfig of an issued certificate under res's CA.
func tlsFiles(res identity.PKIResult, c identity.IssuedCert) identity.TLSConfig {
	cfg := identity.DefaultTLSConfig()
	cfg.Cert, cfg.Key, cfg.ClientCA = c.Cert, c.Key, res.CACert
	return cfg
}

func openSource(t testing.TB, cfg identity.TLSConfig, deps identity.Deps) *identity.Source {
	t.Helper()
	s, err := identity.Open(ctxT(t, 5*time.Second), cfg, deps)
	if err != nil {
		t.Fatalf("open source: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(ctxT(t, 5*time.Second)); err != nil {
			t.Error(err)
		}
	})
	return s
}

// echoServer is a TLS listener on loopback that answers each connection
// that completes a handshake with the peer's identity (or "-") and the
// serial of the certificate it served, and records failed handshakes.
type echoServer struct {
	ln      net.Listener
	wg      sync.WaitGroup
	mu      sync.Mutex
	failed  []error
	changed chan struct{} // closed and replaced at each failure recorded
}

func newEchoServer(t testing.TB, cfg *tls.Config) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, changed: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				tc := tls.Server(c, cfg)
				if err := tc.Handshake(); err != nil {
					s.mu.Lock()
					s.failed = append(s.failed, err)
					close(s.changed)
					s.changed = make(chan struct{})
					s.mu.Unlock()
					return
				}
				cs := tc.ConnectionState()
				name := "-"
				if id, ok := identity.PeerIdentity(&cs); ok {
					name = id.String()
				}
				_, _ = io.WriteString(tc, name+"\n")
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

func (s *echoServer) failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.failed)
}

// failuresAtLeast returns the failures recorded once there are at least n,
// or after 10 s. With TLS 1.3 the client's handshake can end (and the
// client see the server's alert) before the server's Handshake returns and
// the failure is recorded.
func (s *echoServer) failuresAtLeast(n int) int {
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		got, ch := len(s.failed), s.changed
		s.mu.Unlock()
		if got >= n {
			return got
		}
		select {
		case <-ch:
		case <-deadline.C:
			return got
		}
	}
}

// result of one client connection.
type result struct {
	peer      string // identity the server saw
	serverSN  string // serial of the server's certificate
	serverCfg tls.ConnectionState
	err       error
}

// dial connects with cfg and reads the server's answer: a refused
// handshake (on either side) is an error.
func dial(t testing.TB, addr string, cfg *tls.Config) result {
	t.Helper()
	d := tls.Dialer{Config: cfg, NetDialer: &net.Dialer{Timeout: 5 * time.Second}}
	c, err := d.DialContext(ctxT(t, 10*time.Second), "tcp", addr)
	if err != nil {
		return result{err: err}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		// TLS 1.3: the server checks the client's certificate after the
		// client's handshake finished; its refusal arrives on the first read.
		return result{err: err}
	}
	cs := c.(*tls.Conn).ConnectionState()
	return result{peer: line[:len(line)-1], serverSN: cs.PeerCertificates[0].SerialNumber.String(), serverCfg: cs}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, b)
}

// writeFile replaces a file the way an operator's rotation does: a new file
// renamed into place.
func writeFile(t testing.TB, name string, b []byte) {
	t.Helper()
	tmp := name + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

func mustErr(t testing.TB, r result, what string) {
	t.Helper()
	if r.err == nil {
		t.Fatalf("%s: connection accepted (server saw %q)", what, r.peer)
	}
	var ne net.Error
	if errors.As(r.err, &ne) && ne.Timeout() {
		t.Fatalf("%s: timed out instead of being refused: %v", what, r.err)
	}
}
