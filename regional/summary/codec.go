package summary

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"strings"
	"time"
)

// Encoding, version 1 (all integers little-endian):
//
//	off  size  field
//	  0     4  magic "MRSM"
//	  4     1  version (1)
//	  5     1  scheme (1: SchemeChainV1)
//	  6     1  flags (0; reserved)
//	  7     1  log2 of the filter's segment length (0 when the filter is empty)
//	  8     8  generation
//	 16     8  built at, Unix nanoseconds
//	 24     8  blocks held
//	 32     8  filter seed
//	 40     4  block size (tokens)
//	 44     4  sample rate S
//	 48     4  sampled hashes in the filter
//	 52     4  filter segment count (0 when the filter is empty)
//	 56        region: u8 length, bytes
//	           models: u8 count; each u16 length, bytes (strictly ascending)
//	           profiles: u8 count; each u8 length, name bytes, u32 pods,
//	             u64 pending prefill tokens, u32 running, u32 slots,
//	             u64 free KV blocks (strictly ascending by name)
//	           fingerprints: (segment count + 2) << log2 segment length bytes
//	     4     CRC-32C (Castagnoli) of every byte before it
//
// The encoding is canonical: Decode accepts only what Encode produces, so a
// decoded summary re-encodes to the same bytes.
const (
	magic         = "MRSM"
	version1      = 1
	fixedHeader   = 56
	trailerSize   = 4
	profileFixed  = 4 + 8 + 4 + 4 + 8
	minEncodedLen = fixedHeader + 1 + 1 + 1 + trailerSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Decode errors wrap one of these; DecodeError says where.
var (
	ErrTruncated = errors.New("truncated")
	ErrBadMagic  = errors.New("not a meridian summary")
	ErrVersion   = errors.New("unsupported version")
	ErrChecksum  = errors.New("checksum mismatch")
	ErrField     = errors.New("invalid field")
)

// DecodeError reports why and where Decode rejected its input.
type DecodeError struct {
	Field  string // e.g. "region", "profiles[2].name", "fingerprints"
	Offset int    // byte offset of the field
	Err    error  // ErrTruncated, ErrBadMagic, ErrVersion, ErrChecksum or ErrField
	Detail string
}

func (e *DecodeError) Error() string {
	s := fmt.Sprintf("decode summary: %s at byte %d: %v", e.Field, e.Offset, e.Err)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *DecodeError) Unwrap() error { return e.Err }

// Reason is a short label for metrics: truncated, magic, version, checksum
// or field.
func (e *DecodeError) Reason() string {
	switch e.Err {
	case ErrTruncated:
		return "truncated"
	case ErrBadMagic:
		return "magic"
	case ErrVersion:
		return "version"
	case ErrChecksum:
		return "checksum"
	}
	return "field"
}

// headerSize is the encoded size of everything but the fingerprints.
func headerSize(in *Input) int {
	n := fixedHeader + 1 + len(in.Region) + 1 + 1 + trailerSize
	for _, m := range in.Models {
		n += 2 + len(m)
	}
	for _, p := range in.Load {
		n += 1 + len(p.Profile) + profileFixed
	}
	return n
}

// EncodedSize is the length of the summary's encoding.
func (s *Summary) EncodedSize() int {
	in := Input{Region: s.Region, Models: s.Models, Load: s.Load}
	return headerSize(&in) + len(s.filter.fp)
}

// MarshalBinary returns the encoding of the summary.
func (s *Summary) MarshalBinary() ([]byte, error) {
	return s.AppendBinary(make([]byte, 0, s.EncodedSize()))
}

// AppendBinary appends the encoding of the summary to b.
func (s *Summary) AppendBinary(b []byte) ([]byte, error) {
	start := len(b)
	b = append(b, magic...)
	b = append(b, version1, byte(s.Scheme), 0, s.filter.segBits)
	b = binary.LittleEndian.AppendUint64(b, s.Generation)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.BuiltAt.UnixNano()))
	b = binary.LittleEndian.AppendUint64(b, s.Blocks)
	b = binary.LittleEndian.AppendUint64(b, s.filter.seed)
	b = binary.LittleEndian.AppendUint32(b, uint32(s.BlockSize))
	b = binary.LittleEndian.AppendUint32(b, s.SampleRate)
	b = binary.LittleEndian.AppendUint32(b, s.Sampled)
	b = binary.LittleEndian.AppendUint32(b, s.filter.segCount)
	b = append(b, byte(len(s.Region)))
	b = append(b, s.Region...)
	b = append(b, byte(len(s.Models)))
	for _, m := range s.Models {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	b = append(b, byte(len(s.Load)))
	for _, p := range s.Load {
		b = append(b, byte(len(p.Profile)))
		b = append(b, p.Profile...)
		b = binary.LittleEndian.AppendUint32(b, uint32(p.Pods))
		b = binary.LittleEndian.AppendUint64(b, uint64(p.PendingPrefillTokens))
		b = binary.LittleEndian.AppendUint32(b, uint32(p.Running))
		b = binary.LittleEndian.AppendUint32(b, uint32(p.Slots))
		b = binary.LittleEndian.AppendUint64(b, uint64(p.FreeKVBlocks))
	}
	b = append(b, s.filter.fp...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
}

// reader walks an encoding, turning every short read into ErrTruncated.
type reader struct {
	b   []byte
	off int
	err *DecodeError
}

func (r *reader) fail(field string, off int, err error, format string, args ...any) {
	if r.err == nil {
		r.err = &DecodeError{Field: field, Offset: off, Err: err, Detail: fmt.Sprintf(format, args...)}
	}
}

func (r *reader) take(field string, n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail(field, r.off, ErrTruncated, "need %d bytes, %d left", n, len(r.b)-r.off)
		return nil
	}
	v := r.b[r.off : r.off+n]
	r.off += n
	return v
}

func (r *reader) u8(field string) uint8 {
	if v := r.take(field, 1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16(field string) uint16 {
	if v := r.take(field, 2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32(field string) uint32 {
	if v := r.take(field, 4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64(field string) uint64 {
	if v := r.take(field, 8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

// name reads a length-prefixed name and checks it.
func (r *reader) name(field string, length, maxLen int) string {
	off := r.off
	v := r.take(field, length)
	if r.err != nil {
		return ""
	}
	s := string(v)
	if err := checkName(field, s, maxLen); err != nil {
		r.fail(field, off, ErrField, "%v", err)
	}
	return s
}

// Decode parses an encoded summary. It rejects anything Encode would not
// produce with a *DecodeError naming the field; it copies what it keeps, so
// b may be reused afterwards.
func Decode(b []byte) (*Summary, error) {
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil, &DecodeError{Field: "magic", Err: ErrBadMagic, Detail: fmt.Sprintf("first bytes %q", b[:min(len(b), len(magic))])}
	}
	if len(b) < len(magic)+1 {
		return nil, &DecodeError{Field: "version", Offset: 4, Err: ErrTruncated}
	}
	if v := b[4]; v != version1 {
		return nil, &DecodeError{Field: "version", Offset: 4, Err: ErrVersion, Detail: fmt.Sprintf("version %d, want %d", v, version1)}
	}
	if len(b) < minEncodedLen {
		return nil, &DecodeError{Field: "header", Offset: len(b), Err: ErrTruncated, Detail: fmt.Sprintf("%d bytes, want at least %d", len(b), minEncodedLen)}
	}
	body := b[:len(b)-trailerSize]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(b[len(body):]); got != want {
		return nil, &DecodeError{Field: "checksum", Offset: len(body), Err: ErrChecksum, Detail: fmt.Sprintf("computed %08x, stored %08x", got, want)}
	}
	r := &reader{b: body, off: 5}
	s := &Summary{}
	s.Scheme = Scheme(r.u8("scheme"))
	if s.Scheme != SchemeChainV1 {
		r.fail("scheme", 5, ErrField, "scheme %d, want %d", s.Scheme, SchemeChainV1)
	}
	if flags := r.u8("flags"); flags != 0 {
		r.fail("flags", 6, ErrField, "flags %#x, want 0", flags)
	}
	segBits := r.u8("segment length")
	s.Generation = r.u64("generation")
	s.BuiltAt = time.Unix(0, int64(r.u64("built at"))).UTC()
	s.Blocks = r.u64("blocks")
	seed := r.u64("filter seed")
	blockSize := r.u32("block size")
	s.SampleRate = r.u32("sample rate")
	s.Sampled = r.u32("sampled")
	segCount := r.u32("segment count")
	if blockSize < 1 || blockSize > MaxBlockSize {
		r.fail("block size", 40, ErrField, "%d, want 1..%d", blockSize, MaxBlockSize)
	}
	s.BlockSize = int(blockSize)
	if s.SampleRate < 1 {
		r.fail("sample rate", 44, ErrField, "0, want >= 1")
	}
	if uint64(s.Sampled) > s.Blocks {
		r.fail("sampled", 48, ErrField, "%d sampled of %d blocks", s.Sampled, s.Blocks)
	}
	s.Region = r.name("region", int(r.u8("region length")), MaxRegionLen)

	if n := int(r.u8("model count")); n > MaxModels {
		r.fail("model count", r.off-1, ErrField, "%d, want <= %d", n, MaxModels)
	} else if n > 0 {
		s.Models = make([]string, 0, n)
		for i := 0; i < n && r.err == nil; i++ {
			field := fmt.Sprintf("models[%d]", i)
			off := r.off
			m := r.name(field, int(r.u16(field)), MaxModelLen)
			if i > 0 && m <= s.Models[i-1] && r.err == nil {
				r.fail(field, off, ErrField, "%q not after %q (want strictly ascending)", m, s.Models[i-1])
			}
			s.Models = append(s.Models, m)
		}
	}
	if n := int(r.u8("profile count")); n > MaxProfiles {
		r.fail("profile count", r.off-1, ErrField, "%d, want <= %d", n, MaxProfiles)
	} else if n > 0 {
		s.Load = make([]ProfileLoad, 0, n)
		for i := 0; i < n && r.err == nil; i++ {
			field := fmt.Sprintf("profiles[%d]", i)
			off := r.off
			var p ProfileLoad
			p.Profile = r.name(field+".name", int(r.u8(field+".name")), MaxProfileLen)
			if i > 0 && r.err == nil && strings.Compare(p.Profile, s.Load[i-1].Profile) <= 0 {
				r.fail(field+".name", off, ErrField, "%q not after %q (want strictly ascending)", p.Profile, s.Load[i-1].Profile)
			}
			p.Pods = int(r.u32(field + ".pods"))
			pending := r.u64(field + ".pending_prefill_tokens")
			p.Running = int(r.u32(field + ".running"))
			p.Slots = int(r.u32(field + ".slots"))
			free := r.u64(field + ".free_kv_blocks")
			if pending > math.MaxInt64 || free > math.MaxInt64 {
				r.fail(field, off, ErrField, "pending %d / free %d beyond int64", pending, free)
			}
			p.PendingPrefillTokens, p.FreeKVBlocks = int64(pending), int64(free)
			s.Load = append(s.Load, p)
		}
	}
	if r.err != nil {
		return nil, r.err
	}

	fpOff := r.off
	f := fuse8{seed: seed, segBits: segBits, segCount: segCount}
	switch {
	case s.Sampled == 0:
		if segBits != 0 || segCount != 0 {
			r.fail("fingerprints", fpOff, ErrField, "empty filter with segment length 2^%d and %d segments", segBits, segCount)
		}
	case segBits < minSegBits || segBits > maxSegBits:
		r.fail("segment length", 7, ErrField, "2^%d, want 2^%d..2^%d", segBits, minSegBits, maxSegBits)
	case segCount < 1 || uint64(segCount)+fuseArity-1 > (1<<31)>>segBits:
		r.fail("segment count", 52, ErrField, "%d segments of 2^%d", segCount, segBits)
	default:
		size := (int(segCount) + fuseArity - 1) << segBits
		if uint64(s.Sampled) > uint64(size) {
			r.fail("sampled", 48, ErrField, "%d keys in %d slots", s.Sampled, size)
			break
		}
		if fp := r.take("fingerprints", size); fp != nil {
			f.fp = append([]byte(nil), fp...)
		}
	}
	if r.err == nil && r.off != len(body) {
		r.fail("fingerprints", r.off, ErrField, "%d bytes after the fingerprints", len(body)-r.off)
	}
	if r.err != nil {
		return nil, r.err
	}
	s.filter = f
	s.sampler = NewSampler(s.SampleRate)
	return s, nil
}
