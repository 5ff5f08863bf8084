package summary

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the committed fuzz seed corpus")

func sampleSummary(t testing.TB, n int) (*Summary, []byte) {
	t.Helper()
	in := testInput("ap-southeast-1", 42)
	in.Models = []string{"kimi-k2", "llama-3.1-70b"}
	in.Load = append(in.Load, ProfileLoad{Profile: "b200", Pods: 2, Slots: 512, FreeKVBlocks: 1 << 40})
	s, err := Build(in, randomHashes(uint64(n), n), BuildConfig{MaxBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 50, 20_000} {
		s, b := sampleSummary(t, n)
		d, err := Decode(b)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		b2, _ := d.MarshalBinary()
		if !bytes.Equal(b, b2) {
			t.Fatalf("n=%d: re-encoding differs", n)
		}
		if d.Region != s.Region || d.Generation != s.Generation || !d.BuiltAt.Equal(s.BuiltAt) || d.SampleRate != s.SampleRate ||
			d.Blocks != s.Blocks || d.Sampled != s.Sampled || fmt.Sprint(d.Models) != fmt.Sprint(s.Models) || fmt.Sprint(d.Load) != fmt.Sprint(s.Load) {
			t.Fatalf("n=%d: decoded %+v, built %+v", n, d, s)
		}
		hs := randomHashes(uint64(n), n)
		for _, h := range hs {
			if s.MayContain(h) != d.MayContain(h) {
				t.Fatalf("n=%d: decoded filter answers differently", n)
			}
		}
	}
}

// fixCRC recomputes the trailer after an edit, so a test reaches the field
// checks behind the checksum.
func fixCRC(b []byte) []byte {
	b = append([]byte(nil), b...)
	if len(b) >= trailerSize {
		binary.LittleEndian.PutUint32(b[len(b)-trailerSize:], crc32.Checksum(b[:len(b)-trailerSize], castagnoli))
	}
	return b
}

// TestDecodeRejects: each kind of bad input gets a *DecodeError with the
// right sentinel and field.
func TestDecodeRejects(t *testing.T) {
	_, good := sampleSummary(t, 2000)
	regionOff := fixedHeader
	modelsOff := regionOff + 1 + len("ap-southeast-1")
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := []struct {
		name  string
		in    []byte
		err   error
		field string
	}{
		{"empty", nil, ErrBadMagic, "magic"},
		{"bad magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), ErrBadMagic, "magic"},
		{"version", edit(func(b []byte) []byte { b[4] = 2; return b }), ErrVersion, "version"},
		{"short", good[:20], ErrTruncated, "header"},
		{"checksum", edit(func(b []byte) []byte { b[100] ^= 1; return b }), ErrChecksum, "checksum"},
		{"truncated", fixCRC(good[:len(good)-10]), ErrTruncated, "fingerprints"},
		{"trailing", fixCRC(append(append(append([]byte(nil), good[:len(good)-4]...), 0), good[len(good)-4:]...)), ErrField, "fingerprints"},
		{"scheme", fixCRC(edit(func(b []byte) []byte { b[5] = 9; return b })), ErrField, "scheme"},
		{"flags", fixCRC(edit(func(b []byte) []byte { b[6] = 1; return b })), ErrField, "flags"},
		{"segment length", fixCRC(edit(func(b []byte) []byte { b[7] = 30; return b })), ErrField, "segment length"},
		{"segment count", fixCRC(edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[52:], 0); return b })), ErrField, "segment count"},
		{"block size", fixCRC(edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[40:], 0); return b })), ErrField, "block size"},
		{"sample rate", fixCRC(edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[44:], 0); return b })), ErrField, "sample rate"},
		{"sampled > blocks", fixCRC(edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 1); return b })), ErrField, "sampled"},
		{"region empty", fixCRC(edit(func(b []byte) []byte { b[regionOff] = 0; return b })), ErrField, "region"},
		{"region control", fixCRC(edit(func(b []byte) []byte { b[regionOff+1] = 0x01; return b })), ErrField, "region"},
		{"model order", fixCRC(edit(func(b []byte) []byte {
			b[modelsOff+1+2] = 'z' // "kimi-k2" becomes "zimi-k2", after "llama-3.1-70b"
			return b
		})), ErrField, "models[1]"},
		{"too many models", fixCRC(edit(func(b []byte) []byte { b[modelsOff] = MaxModels + 1; return b })), ErrField, "model count"},
	}
	for _, c := range cases {
		_, err := Decode(c.in)
		var de *DecodeError
		if !errors.As(err, &de) || !errors.Is(err, c.err) || !strings.HasPrefix(de.Field, c.field) {
			t.Errorf("%s: err = %v, want %v in field %s", c.name, err, c.err, c.field)
			continue
		}
		if de.Reason() == "" || !strings.HasPrefix(err.Error(), "decode summary: ") {
			t.Errorf("%s: message %q", c.name, err)
		}
	}
}

// FuzzDecode: arbitrary bytes never panic; whatever is accepted re-encodes
// to the same bytes and answers queries.
func FuzzDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) { checkDecode(t, b) })
}

// FuzzDecodeFields mutates past the checksum: the trailer is recomputed
// before decoding, so the fuzzer reaches the field checks.
func FuzzDecodeFields(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) { checkDecode(t, fixCRC(b)) })
}

func checkDecode(t *testing.T, b []byte) {
	s, err := Decode(b)
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("error %v is not a *DecodeError", err)
		}
		return
	}
	b2, err := s.MarshalBinary()
	if err != nil || !bytes.Equal(b, b2) {
		t.Fatalf("accepted input does not re-encode to itself (err %v)", err)
	}
	_ = s.Depth([]uint64{1, 2, 3, 4, 5, 6, 7, 8})
	_ = s.Candidate(testTime, []uint64{9, 10}, 100)
}

func addSeeds(f *testing.F) {
	for _, n := range []int{0, 3, 300} {
		_, b := sampleSummary(f, n)
		f.Add(b)
	}
	f.Add([]byte("MRSM\x01"))
}

// TestWriteFuzzCorpus rewrites the committed seed corpus with -update.
func TestWriteFuzzCorpus(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite testdata/fuzz")
	}
	var seeds [][]byte
	for _, n := range []int{0, 3, 300} {
		_, b := sampleSummary(t, n)
		seeds = append(seeds, b)
	}
	seeds = append(seeds, []byte("MRSM\x01"), []byte("MRSM\x02garbage"), nil)
	for _, target := range []string{"FuzzDecode", "FuzzDecodeFields"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, b := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
