package kvbridge

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/meridian-llm/meridian/regional/kvbridge/zmtp"
)

// The sockets are built on zmq4's ZMTP connection layer (zmtp.Open, over
// zmq4.Open, does the greeting, the NULL handshake and the socket-type
// check, and zmq4 frames messages) rather than on its Socket types: zmq4's Dial is synchronous and
// sleeps between retries without watching a context, its automatic
// reconnect races, and a closed socket can leave its reader goroutine
// blocked on a full channel. Here a connection is a net.Conn we dial (or
// accept) and close ourselves, read by one goroutine we own, and reconnects
// are our own loop with backoff.

// readBuffer is the read buffer of a connection to an engine (zmtp.Open):
// a batch is a few KiB.
const readBuffer = 64 << 10

// maxReplayBytes bounds the payload bytes one replay answer may bring
// (vLLM's default buffer of 10000 batches of a few KiB each is far below).
const maxReplayBytes = 512 << 20

// errMalformedReply is returned for a replay reply that is neither shape.
var errMalformedReply = errors.New("malformed replay reply")

// dialZMTP connects to ep and performs the ZMTP handshake as typ, within
// timeout; ctx cancels the attempt.
func dialZMTP(ctx context.Context, ep endpoint, typ zmq4.SocketType, timeout time.Duration) (net.Conn, *zmq4.Conn, error) {
	d := net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
	nc, err := d.DialContext(ctx, ep.Network, ep.Addr)
	if err != nil {
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	conn, _, err := zmtp.Open(nc, typ, false, timeout, readBuffer, 0)
	if err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	return nc, conn, nil
}

// subscribe sends a SUB socket's subscription to prefix (ZMTP 3.0 style, a
// message whose first byte is 1, which libzmq and zmq4 publishers accept).
func subscribe(conn *zmq4.Conn, prefix string) error {
	if err := conn.SendMsg(zmq4.NewMsg(append([]byte{1}, prefix...))); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	return nil
}

// replayClient asks one engine's ROUTER socket for buffered batches, as a
// DEALER: it sends [empty, start_seq] and reads replies until the end
// marker, on a fresh connection per request.
type replayClient struct {
	ep      endpoint
	timeout time.Duration // per reply message, and for connecting
}

// replay implements the exchange. Both reply shapes are accepted: vLLM's
// [empty, seq, payload] and [topic, seq, payload] (llm-d's simulator,
// TRT-LLM), with or without the empty delimiter frame a ROUTER puts before
// them, and the end marker [(empty,) 0xFF x 8, empty] or its 3-frame form.
func (c replayClient) replay(ctx context.Context, from, upto uint64) (replayResult, error) {
	var res replayResult
	nc, conn, err := dialZMTP(ctx, c.ep, zmq4.Dealer, c.timeout)
	if err != nil {
		return res, fmt.Errorf("replay from %s: %w", c.ep, err)
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	_ = nc.SetDeadline(time.Now().Add(c.timeout))
	if err := conn.SendMsg(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		return res, fmt.Errorf("replay from %s: send request: %w", c.ep, err)
	}
	var kept int
	for {
		_ = nc.SetDeadline(time.Now().Add(c.timeout))
		msg, err := conn.RecvMsg()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return res, fmt.Errorf("replay from %s: %w", c.ep, err)
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		seq, payload, end, err := parseReply(msg.Frames)
		if err != nil {
			return res, fmt.Errorf("replay from %s: %w", c.ep, err)
		}
		if end {
			return res, nil
		}
		if !res.any {
			res.any, res.first = true, seq
		}
		if seq >= from && seq < upto {
			if kept += len(payload); kept > maxReplayBytes {
				return res, fmt.Errorf("replay from %s: answer exceeds %d bytes", c.ep, maxReplayBytes)
			}
			res.batches = append(res.batches, replayed{seq: seq, payload: payload})
		}
	}
}

// parseReply reads one replay reply: after dropping a leading empty
// delimiter frame when at least three frames remain, [seq, payload] or
// [topic, seq, payload]; the seq frame 0xFF x 8 ends the answer.
func parseReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) >= 3 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	var seqFrame []byte
	switch len(frames) {
	case 2:
		seqFrame, payload = frames[0], frames[1]
	case 3:
		seqFrame, payload = frames[1], frames[2]
	default:
		return 0, nil, false, fmt.Errorf("%w: %d frames", errMalformedReply, len(frames))
	}
	if len(seqFrame) != 8 {
		return 0, nil, false, fmt.Errorf("%w: seq frame of %d bytes", errMalformedReply, len(seqFrame))
	}
	if bytes.Equal(seqFrame, zmtp.EndSeq) {
		return 0, nil, true, nil
	}
	return binary.BigEndian.Uint64(seqFrame), payload, false, nil
}
