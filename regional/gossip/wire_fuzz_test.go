package gossip

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
)

// FuzzWire feeds arbitrary bytes to every decoder of what other
// controllers send (node meta, user messages, push/pull state, ping
// payloads), as a peer with the cluster's key but a broken or hostile
// build could. No decoder may panic; each failure must be an errWire; and
// whatever one accepts must re-encode to the very bytes it read (every
// field is fixed-width or length-prefixed, so there is one encoding of
// each message): a decoder that accepted more than the encoder can say
// would be reading something nobody sends.
func FuzzWire(f *testing.F) {
	seed := func(b []byte, err error) {
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed((&Digest{Region: "us-east-1", Generation: 7, BodyHash: 9, BodyLen: 100, Pods: 3, Running: 2, Slots: 8,
		Pending: 4096, FreeKV: 1 << 20, ForwardAddr: "10.0.0.1:8443"}).encode())
	seed((&Digest{Region: "eu-west-1"}).encode())
	f.Add(want{From: "ctl-a", Region: "us-west-2", Generation: 3}.encode())
	f.Add(ageMsg{From: "ctl-a", Region: "us-west-2", Generation: 3, Hash: 5, Age: 1500 * time.Millisecond, SentAt: 1e18}.encode())
	f.Add(encodeLocalState([]byte("summary body")))
	f.Add(encodeLocalState(nil))
	f.Add(encodeCoordinate(coordinate.NewCoordinate(coordinate.DefaultConfig())))
	f.Add(keyOpMsg{Op: keyOpList, ID: 1, From: "ctl-a"}.encode())
	f.Add(keyOpMsg{Op: keyOpInstall, ID: 2, From: "ctl-a", Key: bytes.Repeat([]byte{7}, KeyBytes)}.encode())
	f.Add(keyAckMsg{ID: 2, From: "ctl-b", Err: "no such key", Keys: []string{"ab12", "cd34"}}.encode())
	f.Add(sightingsMsg{From: "ctl-a", Region: "us-east-1", Seen: []Sighting{
		{Region: "eu-west-1", Generation: 4, Pods: 12, Age: time.Second, Live: true},
		{Region: "us-west-2", Pods: -1},
	}}.encode())
	f.Add(encodeReplicaMsg("ctl-a", []byte{3, 1, 2, 3}))

	f.Fuzz(func(t *testing.T, b []byte) {
		// same checks what a decoder accepted against its re-encoding;
		// body is the part of b the decoder read (after a message header
		// the dispatcher checked).
		same := func(what string, body, enc []byte, err error) {
			t.Helper()
			if err != nil {
				if !errors.Is(err, errWire) {
					t.Fatalf("%s: error %v is not errWire", what, err)
				}
				return
			}
			if !bytes.Equal(body, enc) {
				t.Fatalf("%s: accepted % x, which re-encodes as % x", what, body, enc)
			}
		}
		if d, err := decodeDigest(b); err == nil {
			enc, eerr := d.encode()
			if eerr != nil {
				t.Fatalf("digest %+v decoded but does not encode: %v", d, eerr)
			}
			same("digest", b, enc, nil)
		} else {
			same("digest", nil, nil, err)
		}
		body, err := decodeLocalState(b)
		same("push/pull state", b, encodeLocalState(body), err)
		dims := 8
		if len(b) > 1 && b[1] >= 1 && b[1] <= maxDims {
			dims = int(b[1])
		}
		if c, err := decodeCoordinate(b, dims); err == nil {
			same("coordinate", b, encodeCoordinate(c), nil)
		} else {
			same("coordinate", nil, nil, err)
		}

		// User messages: NotifyMsg hands each decoder a message of at
		// least msgHeaderLen bytes; every decoder is tried whatever the
		// type byte says, and its re-encoding compared past the header.
		if len(b) < msgHeaderLen {
			return
		}
		tail := func(enc []byte) []byte { return enc[msgHeaderLen:] }
		m, err := decodeWant(b)
		same("pull request", b[msgHeaderLen:], tail(m.encode()), err)
		a, err := decodeAge(b)
		same("summary age", b[msgHeaderLen:], tail(a.encode()), err)
		k, err := decodeKeyOp(b)
		same("keyring operation", b[msgHeaderLen:], tail(k.encode()), err)
		ack, err := decodeKeyAck(b)
		same("keyring answer", b[msgHeaderLen:], tail(ack.encode()), err)
		s, err := decodeSightings(b)
		same("sightings", b[msgHeaderLen:], tail(s.encode()), err)
		from, payload, err := decodeReplicaMsg(b)
		if err == nil {
			same("replica message", b[msgHeaderLen:], tail(encodeReplicaMsg(from, payload)), nil)
		} else {
			same("replica message", nil, nil, err)
		}
	})
}
