package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// msgpack format bytes (https://github.com/msgpack/msgpack/blob/master/spec.md).
const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

// reader walks one msgpack message. Every method checks bounds before it
// reads, and every length it returns has been checked against the bytes that
// remain, so no caller can be made to allocate more than the message could
// hold. Errors are *DecodeError with the offset of the value at fault.
type reader struct {
	b []byte
	i int
	// limited is set when b was cut to MaxMessageBytes: running off its end is
	// then too_large, not truncated.
	limited bool
}

func (r *reader) fail(off int, reason Reason, format string, args ...any) error {
	return &DecodeError{Offset: off, Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

func (r *reader) truncated(off int, what string) error {
	if r.limited {
		return r.fail(off, ReasonTooLarge, "%s runs past the message size limit of %d bytes", what, len(r.b))
	}
	return r.fail(off, ReasonTruncated, "%s runs past the end of the message (%d bytes)", what, len(r.b))
}

// need checks that n more bytes follow position i.
func (r *reader) need(n int, what string) error {
	if n < 0 || n > len(r.b)-r.i {
		return r.truncated(r.i, what)
	}
	return nil
}

func (r *reader) peek() (byte, error) {
	if r.i >= len(r.b) {
		return 0, r.truncated(r.i, "value")
	}
	return r.b[r.i], nil
}

// nextNil consumes a nil and reports whether there was one.
func (r *reader) nextNil() bool {
	if r.i < len(r.b) && r.b[r.i] == mpNil {
		r.i++
		return true
	}
	return false
}

func (r *reader) u8() uint8 { v := r.b[r.i]; r.i++; return v }
func (r *reader) u16() uint16 {
	v := binary.BigEndian.Uint16(r.b[r.i:])
	r.i += 2
	return v
}
func (r *reader) u32() uint32 {
	v := binary.BigEndian.Uint32(r.b[r.i:])
	r.i += 4
	return v
}
func (r *reader) u64() uint64 {
	v := binary.BigEndian.Uint64(r.b[r.i:])
	r.i += 8
	return v
}

// container reads an array or map header. isMap tells which; n is the number
// of elements (of key-value pairs for a map), checked against what remains.
func (r *reader) container(what string) (isMap bool, n int, err error) {
	start := r.i
	c, err := r.peek()
	if err != nil {
		return false, 0, err
	}
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.i++
		n = int(c & 0x0f)
	case c >= 0x80 && c <= 0x8f:
		r.i++
		n, isMap = int(c&0x0f), true
	case c == mpArray16 || c == mpMap16:
		if err := r.need(3, what); err != nil {
			return false, 0, err
		}
		r.i++
		n, isMap = int(r.u16()), c == mpMap16
	case c == mpArray32 || c == mpMap32:
		if err := r.need(5, what); err != nil {
			return false, 0, err
		}
		r.i++
		n, isMap = int(r.u32()), c == mpMap32
	default:
		return false, 0, r.fail(start, ReasonBadFieldType, "%s: want array or map, found %s", what, typeName(c))
	}
	// Every element takes at least one byte.
	min := n
	if isMap {
		min = 2 * n
	}
	if min > len(r.b)-r.i {
		return false, 0, r.truncated(start, fmt.Sprintf("%s of %d elements", what, n))
	}
	return isMap, n, nil
}

// array reads an array header; anything else is a bad_field_type error.
func (r *reader) array(what string) (int, error) {
	start := r.i
	isMap, n, err := r.container(what)
	if err != nil {
		return 0, err
	}
	if isMap {
		return 0, r.fail(start, ReasonBadFieldType, "%s: want array, found map", what)
	}
	return n, nil
}

// int64 reads any msgpack integer that fits in an int64.
func (r *reader) int64(what string) (int64, error) {
	start := r.i
	v, signed, err := r.intBits(what)
	if err != nil {
		return 0, err
	}
	if !signed && v > math.MaxInt64 {
		return 0, r.fail(start, ReasonBadFieldType, "%s: %d does not fit in int64", what, v)
	}
	return int64(v), nil
}

// intBits reads any msgpack integer and returns its 64 bits; signed tells
// whether it was a signed encoding (then the bits are two's complement).
func (r *reader) intBits(what string) (v uint64, signed bool, err error) {
	start := r.i
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	if c <= 0x7f {
		r.i++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.i++
		return uint64(int64(int8(c))), true, nil
	}
	var size int
	switch c {
	case mpUint8, mpInt8:
		size = 1
	case mpUint16, mpInt16:
		size = 2
	case mpUint32, mpInt32:
		size = 4
	case mpUint64, mpInt64:
		size = 8
	default:
		return 0, false, r.fail(start, ReasonBadFieldType, "%s: want integer, found %s", what, typeName(c))
	}
	if err := r.need(1+size, what); err != nil {
		return 0, false, err
	}
	r.i++
	switch c {
	case mpUint8:
		return uint64(r.u8()), false, nil
	case mpUint16:
		return uint64(r.u16()), false, nil
	case mpUint32:
		return uint64(r.u32()), false, nil
	case mpUint64:
		return r.u64(), false, nil
	case mpInt8:
		return uint64(int64(int8(r.u8()))), true, nil
	case mpInt16:
		return uint64(int64(int16(r.u16()))), true, nil
	case mpInt32:
		return uint64(int64(int32(r.u32()))), true, nil
	default: // mpInt64
		return r.u64(), true, nil
	}
}

// number reads a float or an integer as a float64.
func (r *reader) number(what string) (float64, error) {
	start := r.i
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case mpFloat32:
		if err := r.need(5, what); err != nil {
			return 0, err
		}
		r.i++
		return float64(math.Float32frombits(r.u32())), nil
	case mpFloat64:
		if err := r.need(9, what); err != nil {
			return 0, err
		}
		r.i++
		return math.Float64frombits(r.u64()), nil
	}
	if typeName(c) != "integer" {
		return 0, r.fail(start, ReasonBadFieldType, "%s: want number, found %s", what, typeName(c))
	}
	v, signed, err := r.intBits(what)
	if err != nil {
		return 0, err
	}
	if signed {
		return float64(int64(v)), nil
	}
	return float64(v), nil
}

// bytes reads a str or bin and returns its bytes (a sub-slice of the message).
// isStr tells which it was.
func (r *reader) bytes(what string, max int) (p []byte, isStr bool, err error) {
	start := r.i
	c, err := r.peek()
	if err != nil {
		return nil, false, err
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.i++
		n, isStr = int(c&0x1f), true
	case c == mpStr8 || c == mpBin8:
		if err := r.need(2, what); err != nil {
			return nil, false, err
		}
		r.i++
		n, isStr = int(r.u8()), c == mpStr8
	case c == mpStr16 || c == mpBin16:
		if err := r.need(3, what); err != nil {
			return nil, false, err
		}
		r.i++
		n, isStr = int(r.u16()), c == mpStr16
	case c == mpStr32 || c == mpBin32:
		if err := r.need(5, what); err != nil {
			return nil, false, err
		}
		r.i++
		n, isStr = int(r.u32()), c == mpStr32
	default:
		return nil, false, r.fail(start, ReasonBadFieldType, "%s: want string, found %s", what, typeName(c))
	}
	if n > max {
		return nil, false, r.fail(start, ReasonTooLarge, "%s: %d bytes, limit %d", what, n, max)
	}
	if n > len(r.b)-r.i {
		return nil, false, r.truncated(start, fmt.Sprintf("%s of %d bytes", what, n))
	}
	p = r.b[r.i : r.i+n : r.i+n]
	r.i += n
	return p, isStr, nil
}

// skip passes over one value of any type, nested at most depth levels more.
// It allocates nothing; its running time is bounded by the message length.
func (r *reader) skip(depth int) error {
	start := r.i
	c, err := r.peek()
	if err != nil {
		return err
	}
	var n int // payload bytes after the header
	switch {
	case c <= 0x7f || c >= 0xe0 || c == mpNil || c == mpFalse || c == mpTrue:
		r.i++
		return nil
	case c >= 0xa0 && c <= 0xbf:
		r.i++
		n = int(c & 0x1f)
	case c >= 0x80 && c <= 0x9f, c == mpArray16, c == mpArray32, c == mpMap16, c == mpMap32:
		if depth <= 0 {
			return r.fail(start, ReasonTooDeep, "values nested too deeply")
		}
		isMap, cnt, err := r.container("value")
		if err != nil {
			return err
		}
		if isMap {
			cnt *= 2
		}
		for k := 0; k < cnt; k++ {
			if err := r.skip(depth - 1); err != nil {
				return err
			}
		}
		return nil
	case c == mpUint8 || c == mpInt8:
		n = 1
		r.i++
	case c == mpUint16 || c == mpInt16:
		n = 2
		r.i++
	case c == mpUint32 || c == mpInt32 || c == mpFloat32:
		n = 4
		r.i++
	case c == mpUint64 || c == mpInt64 || c == mpFloat64:
		n = 8
		r.i++
	case c == mpStr8 || c == mpBin8 || c == mpStr16 || c == mpBin16 || c == mpStr32 || c == mpBin32:
		_, _, err := r.bytes("value", math.MaxInt32)
		return err
	case c >= mpFixExt1 && c <= mpFixExt16:
		r.i++
		n = 1 + 1<<(c-mpFixExt1) // type byte + 1, 2, 4, 8 or 16 data bytes
	case c == mpExt8 || c == mpExt16 || c == mpExt32:
		hdr := 1 << (c - mpExt8) // 1, 2 or 4 length bytes
		if err := r.need(1+hdr, "ext"); err != nil {
			return err
		}
		r.i++
		switch c {
		case mpExt8:
			n = int(r.u8())
		case mpExt16:
			n = int(r.u16())
		default:
			n = int(r.u32())
		}
		n++ // the ext type byte
	default: // 0xc1
		return r.fail(start, ReasonBadMsgpack, "byte 0x%02x starts no msgpack value", c)
	}
	if n > len(r.b)-r.i {
		r.i = start
		return r.truncated(start, typeName(c))
	}
	r.i += n
	return nil
}

func typeName(c byte) string {
	switch {
	case c <= 0x7f, c >= 0xe0:
		return "integer"
	case c <= 0x8f:
		return "map"
	case c <= 0x9f:
		return "array"
	case c <= 0xbf:
		return "string"
	}
	switch c {
	case mpNil:
		return "nil"
	case mpFalse, mpTrue:
		return "bool"
	case mpBin8, mpBin16, mpBin32:
		return "bytes"
	case mpExt8, mpExt16, mpExt32, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return "ext"
	case mpFloat32, mpFloat64:
		return "float"
	case mpUint8, mpUint16, mpUint32, mpUint64, mpInt8, mpInt16, mpInt32, mpInt64:
		return "integer"
	case mpStr8, mpStr16, mpStr32:
		return "string"
	case mpArray16, mpArray32:
		return "array"
	case mpMap16, mpMap32:
		return "map"
	}
	return fmt.Sprintf("invalid byte 0x%02x", c)
}
