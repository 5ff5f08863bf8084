// Package zmtp is the ZMQ plumbing shared by the two ends of vLLM's KV-event
// transport in this repository: the bridge (regional/kvbridge, a SUB and
// DEALER client) and the engine simulator (scenarios/enginesim, a PUB and
// ROUTER server, as vLLM's ZmqEventPublisher). Keeping it in one place keeps
// both ends agreeing on the endpoint syntax and on vLLM's data-parallel
// offsets (rank r publishes at tcp port + r, or ipc path + "_dp<r>").
//
// It holds endpoint parsing, listening and naming, the ZMTP greeting and
// NULL handshake on a buffered connection (go-zeromq/zmq4's connection
// layer; the socket logic above it is each side's own), and the seq frame
// that ends a replay answer. It keeps no state between calls and starts no
// goroutines. It imports nothing of Meridian's, so that both ends can import
// it without importing each other.
package zmtp

import (
	"bufio"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// EndSeq is the seq frame of the replay end marker (vLLM's END_SEQ): -1 as
// 8 bytes big-endian, signed. Do not modify it.
var EndSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Endpoint is a parsed tcp:// or ipc:// endpoint.
type Endpoint struct {
	Network string // "tcp" or "unix"
	Addr    string // host:port ("" host: every interface) or socket path
	// Wildcard is set when the tcp host was "*" (every interface, Addr's
	// host ""): only a bound socket can use it.
	Wildcard bool
}

// String is the endpoint in ZMQ syntax (a wildcard host as "").
func (e Endpoint) String() string {
	if e.Network == "unix" {
		return "ipc://" + e.Addr
	}
	return "tcp://" + e.Addr
}

// Parse parses a tcp://host:port or ipc://path endpoint for data-parallel
// rank rank (0 without data parallelism) and offsets it as vLLM does for
// rank r > 0: tcp port + r (port 0, ephemeral, stays 0) and ipc path +
// "_dp<r>". Whether a host and a port > 0 are needed depends on the
// direction, which is the caller's to check; inproc:// is refused (it
// exists only inside one libzmq context).
func Parse(ep string, rank int) (Endpoint, error) {
	switch {
	case strings.HasPrefix(ep, "ipc://"):
		path := strings.TrimPrefix(ep, "ipc://")
		if path == "" {
			return Endpoint{}, fmt.Errorf("%q: empty ipc path", ep)
		}
		if rank > 0 {
			path += "_dp" + strconv.Itoa(rank)
		}
		return Endpoint{Network: "unix", Addr: path}, nil
	case strings.HasPrefix(ep, "inproc://"):
		return Endpoint{}, fmt.Errorf("%q: inproc endpoints exist only inside one libzmq context; use ipc:// or tcp://", ep)
	case strings.HasPrefix(ep, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			return Endpoint{}, fmt.Errorf("%q: want tcp://host:port: %w", ep, err)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 0 || n+rank > 65535 {
			if rank > 0 {
				return Endpoint{}, fmt.Errorf("%q: bad port %q: want 0..65535 after adding the data-parallel rank %d", ep, port, rank)
			}
			return Endpoint{}, fmt.Errorf("%q: bad port %q: want 0..65535", ep, port)
		}
		if n > 0 {
			n += rank
		}
		wildcard := host == "*"
		if wildcard {
			host = ""
		}
		return Endpoint{Network: "tcp", Addr: net.JoinHostPort(host, strconv.Itoa(n)), Wildcard: wildcard}, nil
	}
	return Endpoint{}, fmt.Errorf("%q: want tcp://host:port or ipc://path", ep)
}

// VLLMBinds reports whether vLLM binds the endpoint rather than connecting
// to it: it binds ipc:// endpoints and tcp:// ones that contain "*" or "::".
func VLLMBinds(ep string) bool {
	return strings.HasPrefix(ep, "ipc://") || strings.Contains(ep, "*") || strings.Contains(ep, "::")
}

// Listen binds the endpoint; a stale ipc socket file is replaced, as libzmq
// does.
func (e Endpoint) Listen() (net.Listener, error) {
	if e.Network == "unix" && !strings.HasPrefix(e.Addr, "@") {
		if fi, err := os.Stat(e.Addr); err == nil && fi.Mode().Type() == fs.ModeSocket {
			_ = os.Remove(e.Addr)
		}
	}
	return net.Listen(e.Network, e.Addr)
}

// EndpointOf names a listener as a dialable endpoint (an unspecified host
// becomes loopback, a port 0 the bound one).
func EndpointOf(ln net.Listener) string {
	switch a := ln.Addr().(type) {
	case *net.TCPAddr:
		host := a.IP.String()
		if a.IP.IsUnspecified() {
			host = "127.0.0.1"
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(a.Port))
	case *net.UnixAddr:
		return "ipc://" + a.Name
	}
	return ln.Addr().String()
}

// Open performs the ZMTP greeting and NULL handshake on nc as a socket of
// type typ (server: the side that accepted nc) within timeout (0: no
// deadline), then clears nc's deadline. zmq4 reads and writes each frame's
// header and body separately, so the connection it runs on buffers reads
// (readBuf bytes) and, when writeBuf > 0, writes after the handshake (which
// must not wait in a buffer) until BufConn.Flush.
func Open(nc net.Conn, typ zmq4.SocketType, server bool, timeout time.Duration, readBuf, writeBuf int) (*zmq4.Conn, *BufConn, error) {
	if timeout > 0 {
		_ = nc.SetDeadline(time.Now().Add(timeout))
	}
	bc := &BufConn{Conn: nc, r: bufio.NewReaderSize(nc, readBuf)}
	conn, err := zmq4.Open(bc, null.Security(), typ, nil, server, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("zmtp handshake: %w", err)
	}
	_ = nc.SetDeadline(time.Time{})
	if writeBuf > 0 {
		bc.w = bufio.NewWriterSize(nc, writeBuf)
	}
	return conn, bc, nil
}

// BufConn is the connection Open runs ZMTP on: reads are buffered, and
// writes too when Open was given a write buffer.
type BufConn struct {
	net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func (c *BufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *BufConn) Write(p []byte) (int, error) {
	if c.w == nil {
		return c.Conn.Write(p)
	}
	return c.w.Write(p)
}

// Flush writes what is buffered (nothing without a write buffer).
func (c *BufConn) Flush() error {
	if c.w == nil {
		return nil
	}
	return c.w.Flush()
}
