package discovery

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// net.Resolver does not return TTLs. To honour them, the DNS source dials
// the resolver's connections itself and reads each response a second time
// as it passes (ttlObserver): the resolver still does all the work of
// asking, retrying, falling back to TCP and checking answers.

// ttlObserver keeps the shortest TTL of the answer records of every DNS
// response read through its connections. It is safe for concurrent use
// (the resolver asks for A and AAAA at once).
type ttlObserver struct {
	mu   sync.Mutex
	ttl  uint32
	seen bool
}

// min returns the shortest TTL seen, or 0 and false.
func (o *ttlObserver) min() (time.Duration, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return time.Duration(o.ttl) * time.Second, o.seen
}

// observe reads the answer records' TTLs of one DNS message; it ignores
// anything that does not parse as a response.
func (o *ttlObserver) observe(msg []byte) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || !h.Response {
		return
	}
	if err := p.SkipAllQuestions(); err != nil {
		return
	}
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			return // dnsmessage.ErrSectionDone, or a malformed record
		}
		o.mu.Lock()
		if !o.seen || rh.TTL < o.ttl {
			o.ttl, o.seen = rh.TTL, true
		}
		o.mu.Unlock()
		if err := p.SkipAnswer(); err != nil {
			return
		}
	}
}

// wrap returns c reading through o: a datagram connection stays a
// net.PacketConn (the resolver reads one response per Read from those), a
// stream one has its two-byte length prefixes followed.
func (o *ttlObserver) wrap(c net.Conn) net.Conn {
	if u, ok := c.(*net.UDPConn); ok {
		return &packetConn{UDPConn: u, o: o}
	}
	return &streamConn{Conn: c, o: o}
}

// packetConn is a UDP connection whose every datagram read is observed.
type packetConn struct {
	*net.UDPConn
	o *ttlObserver
}

func (c *packetConn) Read(b []byte) (int, error) {
	n, err := c.UDPConn.Read(b)
	if n > 0 {
		c.o.observe(b[:n])
	}
	return n, err
}

// streamConn is a TCP connection whose length-prefixed messages are
// observed once each is complete.
type streamConn struct {
	net.Conn
	o   *ttlObserver
	buf []byte
}

func (c *streamConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.buf = append(c.buf, b[:n]...)
		for len(c.buf) >= 2 {
			l := int(binary.BigEndian.Uint16(c.buf))
			if len(c.buf) < 2+l {
				break
			}
			c.o.observe(c.buf[2 : 2+l])
			c.buf = c.buf[2+l:]
		}
	}
	return n, err
}
