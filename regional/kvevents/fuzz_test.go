package kvevents

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// fuzzConfig keeps fuzzed messages small so buffer bounds are checkable.
func fuzzConfig() DecoderConfig {
	c := DefaultDecoderConfig()
	c.MaxMessageBytes = 1 << 16
	c.MaxEvents = 256
	c.MaxBlocksPerEvent = 256
	c.MaxTokensPerEvent = 4096
	c.MaxStringBytes = 256
	c.MaxDepth = 16
	return c
}

// FuzzDecode feeds arbitrary bytes to the decoder. It must never panic; a
// failure must be a *DecodeError with a known reason and an offset inside
// the message; a success must be well-formed msgpack by an independent
// implementation, re-encode (in every style) to the same batch, render as
// valid JSON, and re-key without trouble; and the decoder's buffers must stay
// within a fixed multiple of the message size.
func FuzzDecode(f *testing.F) {
	d, err := NewDecoder(fuzzConfig())
	if err != nil {
		f.Fatal(err)
	}
	d2, _ := NewDecoder(fuzzConfig())
	cfg := DefaultRekeyConfig()
	cfg.Model, cfg.BlockSize, cfg.MaxEntries = "m", 4, 64
	r, _ := NewRekeyer(cfg)
	f.Fuzz(func(t *testing.T, data []byte) {
		// A reused decoder (as in production) and a fresh one (whose buffers
		// show what this message alone made it take) must agree.
		fresh, _ := NewDecoder(fuzzConfig())
		b, err := fresh.Decode(data)
		bReused, errReused := d.Decode(data)
		if (err == nil) != (errReused == nil) || (err == nil && !bytes.Equal(AppendJSON(nil, b), AppendJSON(nil, bReused))) {
			t.Fatalf("reused decoder disagrees: %v / %v", err, errReused)
		}
		if err != nil {
			de, ok := err.(*DecodeError)
			if !ok || !slices.Contains(Reasons(), de.Reason) || de.Offset < 0 || de.Offset > len(data) {
				t.Fatalf("bad error %#v", err)
			}
			return
		}
		dec := msgpack.NewDecoder(bytes.NewReader(data))
		if err := dec.Skip(); err != nil {
			t.Fatalf("we decoded what vmihailenco/msgpack rejects: %v", err)
		}
		if err := dec.Skip(); err != io.EOF {
			t.Fatalf("vmihailenco/msgpack sees more after the batch: %v", err)
		}
		n := len(data)
		if cap(fresh.tokens) > 2*n+16 || cap(fresh.hashes) > 2*n+16 || cap(fresh.rawBuf) > 2*n+16 || cap(fresh.events) > 2*n+16 {
			t.Fatalf("buffers %d tokens, %d hashes, %d raw bytes, %d events for a %d-byte message",
				cap(fresh.tokens), cap(fresh.hashes), cap(fresh.rawBuf), cap(fresh.events), n)
		}
		if !json.Valid(AppendJSON(nil, b)) {
			t.Fatalf("invalid JSON %s", AppendJSON(nil, b))
		}
		for _, enc := range allEncodings() {
			msg, err := enc.AppendBatch(nil, b)
			if errors.Is(err, errLoRAAndSalt) {
				continue // a map event can hold both; an array event cannot
			}
			if err != nil {
				t.Fatal(err)
			}
			b2, err := d2.Decode(msg)
			if err != nil {
				if ReasonOf(err) == ReasonTooLarge {
					continue // map keys and bytes hashes can outgrow the limit
				}
				t.Fatalf("%+v: re-encoded batch does not decode: %v", enc, err)
			}
			assertSameBatch(t, b, b2)
		}
		r.Apply(nil, b)
		if r.Len() > 64 {
			t.Fatalf("rekeyer holds %d entries, cap 64", r.Len())
		}
	})
}

// TestWriteFuzzCorpus writes the committed seed corpus of FuzzDecode from
// the vectors and a few encoder outputs, with -update.
func TestWriteFuzzCorpus(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite testdata/fuzz/FuzzDecode")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(data)))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range loadVectors(t) {
		write("vector-"+v.name, v.msg)
	}
	for i, enc := range allEncodings() {
		write(fmt.Sprintf("encoded-%02d", i), benchBatch(t, 2, 2, 4, enc))
	}
	write("stream", engineStream(t, 2, 12, 4, Encoding{Events: EventsMap})[0])
}

// FuzzRekeySequence feeds a fresh re-keyer a sequence of messages (each
// prefixed with its length, two bytes little-endian), as one pod's stream:
// the re-keyer must not panic whatever the order, sizes and parents of the
// blocks (FuzzDecode, whose re-keyer outlives each input, found
// TestRekeySizeChangeMidChain's panic by chance; here a sequence is one
// input, so such a find reproduces), and must stay within its cap.
func FuzzRekeySequence(f *testing.F) {
	frame := func(msgs ...[]byte) []byte {
		var out []byte
		for _, m := range msgs {
			out = binary.LittleEndian.AppendUint16(out, uint16(len(m)))
			out = append(out, m...)
		}
		return out
	}
	enc := func(evs ...Event) []byte {
		m, err := Encoding{}.AppendBatch(nil, &Batch{TS: 1, Events: evs})
		if err != nil {
			f.Fatal(err)
		}
		return m
	}
	f.Add(frame(enc(stored(Opt[uint64]{}, 4, seq(4, 0), 1)), enc(stored(Opt[uint64]{}, 2, seq(6, 100), 1, 2, 3))))
	f.Add(frame(enc(stored(Opt[uint64]{}, 2, seq(4, 0), 1, 2)), enc(stored(Some[uint64](2), 2, seq(4, 9), 3, 4)),
		enc(removed("GPU", 2)), enc(stored(Some[uint64](1), 2, seq(2, 7), 5)), enc(&AllBlocksCleared{})))
	f.Add(frame(engineStream(f, 2, 6, 2, Encoding{Events: EventsMap})...))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := NewDecoder(fuzzConfig())
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultRekeyConfig()
		cfg.Model, cfg.BlockSize, cfg.MaxEntries = "m", 4, 64
		r, err := NewRekeyer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 8 && len(data) >= 2; k++ {
			n := min(int(binary.LittleEndian.Uint16(data)), len(data)-2)
			msg := data[2 : 2+n]
			data = data[2+n:]
			b, err := d.Decode(msg)
			if err != nil {
				continue
			}
			r.ApplyEvents(nil, b.Rank(), b.Events)
			if r.Len() > 64 {
				t.Fatalf("message %d: re-keyer holds %d entries, cap 64", k, r.Len())
			}
		}
	})
}
