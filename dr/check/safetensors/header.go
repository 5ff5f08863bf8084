// Package safetensors reads and validates the header of a safetensors file
// without reading its tensor data, so a DR check can vouch for a multi-GB
// shard by reading a few kilobytes of it.
//
// The format: 8 bytes holding N, a little-endian u64; N bytes of UTF-8 JSON
// (an object starting with '{', possibly padded with spaces) mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an
// optional "__metadata__" object of string values; then the data buffer.
// A file is valid when, with the tensors sorted by offsets, each begins where
// the previous one ended (the first at 0), each spans exactly
// product(shape) * dtype size bytes, and the last one ends at the end of the
// file. N is at most MaxHeaderBytes.
//
// It imports nothing of ours.
package safetensors

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"strings"
	"unicode/utf8"
)

// MaxHeaderBytes is the largest header the reference implementation accepts.
const MaxHeaderBytes = 100_000_000

// PrefixLen is the size of the little-endian header-length prefix.
const PrefixLen = 8

var (
	// ErrTooSmall: the file is shorter than the 8-byte length prefix.
	ErrTooSmall = errors.New("file shorter than the 8-byte header length")
	// ErrHeaderTooLarge: N exceeds MaxHeaderBytes.
	ErrHeaderTooLarge = errors.New("header length exceeds 100000000 bytes")
	// ErrHeaderBeyondFile: 8 + N is past the end of the file.
	ErrHeaderBeyondFile = errors.New("header extends past the end of the file")
)

// FormatError reports a header that is not valid safetensors JSON or whose
// tensors are inconsistent. Tensor names the offending tensor, if any.
type FormatError struct {
	Tensor string
	Reason string
}

func (e *FormatError) Error() string {
	if e.Tensor == "" {
		return "invalid safetensors header: " + e.Reason
	}
	return fmt.Sprintf("invalid safetensors header: tensor %q: %s", e.Tensor, e.Reason)
}

// SizeError reports a file whose size disagrees with its header: Want is
// 8 + N + the end of the last tensor, Got the actual size. Got < Want means
// the file was truncated.
type SizeError struct {
	Want, Got int64
}

func (e *SizeError) Error() string {
	if e.Got < e.Want {
		return fmt.Sprintf("file is %d bytes but its header describes %d: %s missing at the end", e.Got, e.Want, bytesN(e.Want-e.Got))
	}
	return fmt.Sprintf("file is %d bytes but its header describes %d: %s too many", e.Got, e.Want, bytesN(e.Got-e.Want))
}

func bytesN(n int64) string {
	if n == 1 {
		return "1 byte"
	}
	return fmt.Sprintf("%d bytes", n)
}

// Truncated reports whether the file is shorter than its header says.
func (e *SizeError) Truncated() bool { return e.Got < e.Want }

// DType is a safetensors element type name, such as "BF16".
type DType string

var dtypeBits = map[DType]uint64{
	"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
	"I16": 16, "U16": 16, "F16": 16, "BF16": 16,
	"I32": 32, "U32": 32, "F32": 32,
	"I64": 64, "U64": 64, "F64": 64, "C64": 64,
}

// Bits returns the width of one element in bits, or 0 for an unknown type.
func (d DType) Bits() uint64 { return dtypeBits[d] }

// Tensor is one entry of the header. Begin and End are offsets into the data
// buffer, which starts right after the header.
type Tensor struct {
	Name       string
	DType      DType
	Shape      []uint64
	Begin, End uint64
}

// Header is a parsed, validated header.
type Header struct {
	// Len is N, the length of the JSON header in bytes.
	Len uint64
	// Tensors sorted by data offsets.
	Tensors []Tensor
	// Metadata is the optional "__metadata__" map (nil when absent).
	Metadata map[string]string
	// DataLen is the end of the last tensor: the size of the data buffer.
	DataLen uint64
	// Sum is the SHA-256 of the 8-byte prefix and the header bytes: two
	// shards with equal sums describe the same tensors at the same offsets.
	Sum [sha256.Size]byte
}

// FileSize is the size a file with this header must have.
func (h *Header) FileSize() uint64 { return PrefixLen + h.Len + h.DataLen }

// CheckSize returns a *SizeError when size differs from FileSize.
func (h *Header) CheckSize(size int64) error {
	want := h.FileSize()
	if want > 1<<63-1 || int64(want) != size {
		w := int64(1<<63 - 1)
		if want <= 1<<63-1 {
			w = int64(want)
		}
		return &SizeError{Want: w, Got: size}
	}
	return nil
}

// Names returns the tensor names in offset order.
func (h *Header) Names() []string {
	out := make([]string, len(h.Tensors))
	for i, t := range h.Tensors {
		out[i] = t.Name
	}
	return out
}

// ReadHeader reads the length prefix and the header from r, which is
// positioned at the start of a file of fileSize bytes, and validates the
// header. It reads exactly 8 + N bytes and never the tensor data. It does not
// compare the data length with fileSize: call CheckSize for that.
func ReadHeader(r io.Reader, fileSize int64) (*Header, error) {
	if fileSize < PrefixLen {
		return nil, ErrTooSmall
	}
	var prefix [PrefixLen]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, fmt.Errorf("read header length: %w", err)
	}
	n, err := headerLen(prefix[:], fileSize)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, PrefixLen+n)
	copy(buf, prefix[:])
	if _, err := io.ReadFull(r, buf[PrefixLen:]); err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	return parse(buf)
}

// Parse parses the header at the start of file (the whole file or at least
// its first 8 + N bytes) and validates it. Like ReadHeader, it does not check
// the data length against len(file).
func Parse(file []byte) (*Header, error) {
	if len(file) < PrefixLen {
		return nil, ErrTooSmall
	}
	n, err := headerLen(file[:PrefixLen], int64(len(file)))
	if err != nil {
		return nil, err
	}
	return parse(file[:PrefixLen+n])
}

func headerLen(prefix []byte, fileSize int64) (uint64, error) {
	n := binary.LittleEndian.Uint64(prefix)
	if n > MaxHeaderBytes {
		return 0, ErrHeaderTooLarge
	}
	if int64(n) > fileSize-PrefixLen {
		return 0, ErrHeaderBeyondFile
	}
	return n, nil
}

type rawTensor struct {
	DType   DType     `json:"dtype"`
	Shape   *[]uint64 `json:"shape"`
	Offsets *[]uint64 `json:"data_offsets"`
}

// parse parses and validates buf = prefix + header JSON.
func parse(buf []byte) (*Header, error) {
	h, err := decode(buf)
	if err != nil {
		return nil, err
	}
	if err := h.validate(); err != nil {
		return nil, err
	}
	return h, nil
}

// decode parses buf = prefix + header JSON without validating offsets.
func decode(buf []byte) (*Header, error) {
	js := buf[PrefixLen:]
	h := &Header{Len: uint64(len(js)), Sum: sha256.Sum256(buf)}
	if len(js) == 0 || js[0] != '{' {
		return nil, &FormatError{Reason: "header does not start with '{'"}
	}
	if !utf8.Valid(js) {
		return nil, &FormatError{Reason: "header is not valid UTF-8"}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	if _, err := dec.Token(); err != nil { // '{'
		return nil, &FormatError{Reason: "bad JSON: " + err.Error()}
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, &FormatError{Reason: "bad JSON: " + err.Error()}
		}
		name, _ := tok.(string)
		if seen[name] {
			return nil, &FormatError{Tensor: name, Reason: "duplicate key"}
		}
		seen[name] = true
		if name == "__metadata__" {
			var md map[string]string
			if err := dec.Decode(&md); err != nil {
				return nil, &FormatError{Reason: "__metadata__ is not an object of strings: " + jsonReason(err)}
			}
			if md == nil {
				md = map[string]string{}
			}
			h.Metadata = md
			continue
		}
		var rt rawTensor
		if err := dec.Decode(&rt); err != nil {
			return nil, &FormatError{Tensor: name, Reason: "bad tensor entry: " + jsonReason(err)}
		}
		t, err := rt.tensor(name)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, &FormatError{Reason: "bad JSON: " + err.Error()}
	}
	rest := js[dec.InputOffset():]
	if len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return nil, &FormatError{Reason: "trailing bytes after the header object"}
	}
	return h, nil
}

func jsonReason(err error) string {
	s := err.Error()
	return strings.TrimPrefix(s, "json: ")
}

func (rt rawTensor) tensor(name string) (Tensor, error) {
	if rt.DType == "" {
		return Tensor{}, &FormatError{Tensor: name, Reason: "missing dtype"}
	}
	if rt.DType.Bits() == 0 {
		return Tensor{}, &FormatError{Tensor: name, Reason: fmt.Sprintf("unknown dtype %q", rt.DType)}
	}
	if rt.Shape == nil {
		return Tensor{}, &FormatError{Tensor: name, Reason: "missing shape"}
	}
	if rt.Offsets == nil || len(*rt.Offsets) != 2 {
		return Tensor{}, &FormatError{Tensor: name, Reason: "data_offsets must be [begin, end]"}
	}
	off := *rt.Offsets
	shape := *rt.Shape
	if shape == nil {
		shape = []uint64{}
	}
	return Tensor{Name: name, DType: rt.DType, Shape: shape, Begin: off[0], End: off[1]}, nil
}

// validate sorts the tensors by offsets and checks they tile [0, DataLen)
// exactly, each with the byte length its dtype and shape imply.
func (h *Header) validate() error {
	slices.SortFunc(h.Tensors, func(a, b Tensor) int {
		if a.Begin != b.Begin {
			if a.Begin < b.Begin {
				return -1
			}
			return 1
		}
		if a.End != b.End {
			if a.End < b.End {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	var next uint64
	for _, t := range h.Tensors {
		if t.End < t.Begin {
			return &FormatError{Tensor: t.Name, Reason: fmt.Sprintf("data_offsets [%d, %d] end before they begin", t.Begin, t.End)}
		}
		if t.Begin != next {
			return &FormatError{Tensor: t.Name, Reason: fmt.Sprintf("data_offsets [%d, %d] do not start at %d, where the previous tensor ends (gap or overlap)", t.Begin, t.End, next)}
		}
		want, ok := ByteLen(t.DType, t.Shape)
		if !ok {
			return &FormatError{Tensor: t.Name, Reason: fmt.Sprintf("shape %v of %s overflows or is not a whole number of bytes", t.Shape, t.DType)}
		}
		if t.End-t.Begin != want {
			return &FormatError{Tensor: t.Name, Reason: fmt.Sprintf("data_offsets [%d, %d] span %d bytes but shape %v of %s needs %d", t.Begin, t.End, t.End-t.Begin, t.Shape, t.DType, want)}
		}
		next = t.End
	}
	h.DataLen = next
	return nil
}

// ByteLen returns the number of bytes a tensor of dtype d and the given shape
// occupies, and false if d is unknown, the size overflows a uint64 or it is
// not a whole number of bytes.
func ByteLen(d DType, shape []uint64) (uint64, bool) {
	b := d.Bits()
	if b == 0 {
		return 0, false
	}
	n := uint64(1)
	for _, s := range shape {
		hi, lo := bits.Mul64(n, s)
		if hi != 0 {
			return 0, false
		}
		n = lo
	}
	hi, nbits := bits.Mul64(n, b)
	if hi != 0 || nbits%8 != 0 {
		return 0, false
	}
	return nbits / 8, true
}
