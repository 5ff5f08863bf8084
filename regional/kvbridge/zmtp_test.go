package kvbridge

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/meridian-llm/meridian/regional/kvbridge/zmtp"
)

func seqFrame(s uint64) []byte { return binary.BigEndian.AppendUint64(nil, s) }

// Both reply shapes, with and without the ROUTER's empty delimiter, and both
// end markers.
func TestParseReplyShapes(t *testing.T) {
	p := []byte("payload")
	for _, c := range []struct {
		name   string
		frames [][]byte
		seq    uint64
		end    bool
		err    bool
	}{
		{name: "vLLM via DEALER", frames: [][]byte{{}, seqFrame(7), p}, seq: 7},
		{name: "vLLM via REQ", frames: [][]byte{seqFrame(7), p}, seq: 7},
		{name: "3-frame", frames: [][]byte{[]byte("kv@a@m"), seqFrame(8), p}, seq: 8},
		{name: "3-frame with delimiter", frames: [][]byte{{}, []byte("kv@a@m"), seqFrame(8), p}, seq: 8},
		{name: "3-frame, empty topic", frames: [][]byte{{}, seqFrame(9), p}, seq: 9},
		{name: "vLLM end", frames: [][]byte{{}, zmtp.EndSeq, {}}, end: true},
		{name: "REQ end", frames: [][]byte{zmtp.EndSeq, {}}, end: true},
		{name: "3-frame end with delimiter", frames: [][]byte{{}, {}, zmtp.EndSeq, {}}, end: true},
		{name: "one frame", frames: [][]byte{seqFrame(1)}, err: true},
		{name: "five frames", frames: [][]byte{{}, {1}, {2}, seqFrame(1), p}, err: true},
		{name: "short seq", frames: [][]byte{{1, 2, 3}, p}, err: true},
	} {
		seq, payload, end, err := parseReply(c.frames)
		switch {
		case c.err:
			if !errors.Is(err, errMalformedReply) {
				t.Errorf("%s: err %v", c.name, err)
			}
		case err != nil || end != c.end || (!end && (seq != c.seq || !bytes.Equal(payload, p))):
			t.Errorf("%s: seq %d payload %q end %v err %v", c.name, seq, payload, end, err)
		}
	}
}

// parseReply never panics, and what it accepts is a seq frame of 8 bytes
// among the last frames with the payload last.
func FuzzParseReply(f *testing.F) {
	f.Add([]byte{}, []byte("kv@a@m"), seqFrame(3), []byte("p"), uint8(4))
	f.Add([]byte{}, seqFrame(3), []byte("p"), []byte{}, uint8(3))
	f.Add(zmtp.EndSeq, []byte{}, []byte{}, []byte{}, uint8(2))
	f.Fuzz(func(t *testing.T, a, b, c, d []byte, n uint8) {
		frames := [][]byte{a, b, c, d}[:n%5]
		seq, payload, end, err := parseReply(frames)
		if err != nil {
			if !errors.Is(err, errMalformedReply) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		last := frames[len(frames)-1]
		if !bytes.Equal(payload, last) && !end {
			t.Fatalf("payload %q is not the last frame %q", payload, last)
		}
		if !end && !bytes.Contains(bytes.Join(frames, nil), seqFrame(seq)) {
			t.Fatalf("seq %d not in the frames", seq)
		}
	})
}
