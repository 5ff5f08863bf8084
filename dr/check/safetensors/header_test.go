package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func file(t *testing.T, header string, dataLen int) []byte {
	t.Helper()
	b := make([]byte, 8, 8+len(header)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

func TestLayoutRoundTrip(t *testing.T) {
	ts := []Tensor{
		{Name: "b", DType: "BF16", Shape: []uint64{4, 2}},
		{Name: "a", DType: "F32", Shape: []uint64{3}},
		{Name: "z", DType: "I32", Shape: []uint64{0, 5}},
		{Name: "f4", DType: "F4", Shape: []uint64{2, 3}},
	}
	hdr, dataLen, err := Layout(ts, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	if len(hdr)%8 != 0 {
		t.Fatalf("header not padded to 8: %d", len(hdr))
	}
	if dataLen != 16+12+0+3 {
		t.Fatalf("dataLen = %d", dataLen)
	}
	f := append(append([]byte{}, hdr...), make([]byte, dataLen)...)
	h, err := ReadHeader(bytes.NewReader(f), int64(len(f)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.CheckSize(int64(len(f))); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(h.Names(), ","); got != "b,a,z,f4" {
		t.Fatalf("names in offset order = %s", got)
	}
	if h.Metadata["format"] != "pt" || h.DataLen != dataLen || h.FileSize() != uint64(len(f)) {
		t.Fatalf("header %+v", h)
	}
}

func TestHeaderErrors(t *testing.T) {
	cases := []struct {
		name   string
		file   []byte
		reason string // substring of the error; "" means it must parse
	}{
		{"ok", file(t, `{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}   `, 4), ""},
		{"empty object", file(t, `{}`, 0), ""},
		{"too small", []byte{1, 2, 3}, "shorter than the 8-byte"},
		{"huge length", append(binary.LittleEndian.AppendUint64(nil, MaxHeaderBytes+1), '{', '}'), "exceeds"},
		{"beyond file", append(binary.LittleEndian.AppendUint64(nil, 100), '{', '}'), "past the end"},
		{"not an object", file(t, `[1]`, 0), "does not start with '{'"},
		{"bad json", file(t, `{"a":`, 0), "bad"},
		{"trailing", file(t, `{} x`, 0), "trailing bytes"},
		{"unknown dtype", file(t, `{"a":{"dtype":"F12","shape":[1],"data_offsets":[0,2]}}`, 2), `unknown dtype "F12"`},
		{"gap", file(t, `{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), "do not start at 0"},
		{"overlap", file(t, `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`, 3), "do not start at 2"},
		{"shape mismatch", file(t, `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4), "needs 8"},
		{"reversed", file(t, `{"a":{"dtype":"U8","shape":[0],"data_offsets":[3,0]}}`, 3), "end before"},
		{"sub-byte", file(t, `{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}`, 1), "whole number of bytes"},
		{"overflow", file(t, `{"a":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,1]}}`, 1), "overflows"},
		{"duplicate", file(t, `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), "duplicate key"},
		{"bad metadata", file(t, `{"__metadata__":{"k":1}}`, 0), "__metadata__"},
		{"missing offsets", file(t, `{"a":{"dtype":"U8","shape":[1]}}`, 1), "data_offsets must be"},
		{"negative shape", file(t, `{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`, 1), "bad tensor entry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := Parse(c.file)
			if c.reason == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if err := h.CheckSize(int64(len(c.file))); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("parsed %+v, want error containing %q", h, c.reason)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("error %q does not contain %q", err, c.reason)
			}
		})
	}
}

func TestCheckSize(t *testing.T) {
	f := file(t, `{"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]}}`, 10)
	h, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	var se *SizeError
	if err := h.CheckSize(int64(len(f) - 3)); !errors.As(err, &se) || !se.Truncated() || se.Want-se.Got != 3 {
		t.Fatalf("truncated: %v", err)
	}
	if err := h.CheckSize(int64(len(f) + 1)); !errors.As(err, &se) || se.Truncated() {
		t.Fatalf("trailing: %v", err)
	}
	// A header that still parses from a truncated file: only the data is short.
	if _, err := Parse(f[:len(f)-5]); err != nil {
		t.Fatalf("header of truncated file should parse: %v", err)
	}
}

func TestReadHeaderReadsOnlyTheHeader(t *testing.T) {
	f := file(t, `{"a":{"dtype":"U8","shape":[1000],"data_offsets":[0,1000]}}`, 1000)
	r := bytes.NewReader(f)
	if _, err := ReadHeader(r, int64(len(f))); err != nil {
		t.Fatal(err)
	}
	if left := r.Len(); left != 1000 {
		t.Fatalf("ReadHeader left %d bytes unread, want exactly the 1000 data bytes", left)
	}
}
