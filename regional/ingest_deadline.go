package regional

import (
	"context"
	"io"
	"net"
	"time"
)

// fetchRoundTrip is how long the answer to a fetch may take beyond the
// deadline kafka-go gives it. kafka-go's Reader takes its MaxWait as the
// deadline of the whole fetch (the request, the broker holding it, the
// answer) and asks the broker to wait three quarters of it; past the
// deadline it closes the connection, dials again and fetches again from
// the same offset. With the ingester's 100ms that left an answer 25ms, and
// even 1s (kafka-go's own allowance) is not enough on a loaded host: a
// partition with a backlog could go unread for minutes, and a controller
// rebuilding its index never applied the PodUps in it. So the consumer's
// connections move every deadline kafka-go sets this much later
// (lenientConn): the broker still waits what it was asked, and a late
// answer is read instead of cut off. A Close waits for a fetch in flight:
// normally the broker's wait, at most this much more when a connected
// broker stops answering.
const fetchRoundTrip = 5 * time.Second

// lenientDial dials TCP and returns connections whose deadlines are each
// moved slack later (kafka-go's Dialer.DialFunc; TLS and SASL go on top).
func lenientDial(slack time.Duration) func(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return &lenientConn{Conn: c, rw: rawReadWriter(c), slack: slack}, nil
	}
}

// lenientConn is a connection whose deadlines come slack after the ones
// set; a zero deadline (none) stays none.
type lenientConn struct {
	net.Conn
	rw    io.ReadWriter // c's I/O: rawReadWriter
	slack time.Duration
}

func (c *lenientConn) Read(p []byte) (int, error)  { return c.rw.Read(p) }
func (c *lenientConn) Write(p []byte) (int, error) { return c.rw.Write(p) }

func (c *lenientConn) later(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(c.slack)
}

func (c *lenientConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.later(t)) }

func (c *lenientConn) SetReadDeadline(t time.Time) error { return c.Conn.SetReadDeadline(c.later(t)) }

func (c *lenientConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.later(t))
}
