package regional

import (
	"bytes"
	"io"
	"math/bits"
	"sync"
)

// A request body is read into a buffer taken from a pool and given back
// when the request is over, rather than allocated for each request (a
// 2k-token chat body is 8-12 KB, a long conversation hundreds: allocated
// per request they were a third of the controller's allocated bytes, and
// the collector's work with them).
//
// The buffer's lifetime is the handler's: everything that reads the body
// does so before the handler returns, which is when it goes back, with two
// exceptions:
//   - ParseBodyShared's message contents are strings over the buffer. They
//     are read by Prompts.Encode only (rendered into a new text, which is
//     what the caches keep), never after.
//   - A body handed to an http.Client (relay's fallback: https pods, a
//     connect timer, a redirect, a forward to another region) may be read
//     by the transport's goroutines after the call returns (RoundTrip may
//     close a request's body after it returns). relay marks the request
//     then (parsed.escaped) and its buffer is left to the collector.
//
// postToPod copies the body into the serialized request it writes itself,
// so the common path keeps the buffer.

const (
	minBodyShift = 12 // the smallest class: 4 KiB
	bodyClasses  = 9  // 4 KiB .. 1 MiB; larger bodies are not pooled
)

// bodyPool holds body buffers by size class (powers of two).
type bodyPool struct {
	classes [bodyClasses]sync.Pool // of *[]byte, cap 1<<(minBodyShift+i)
	// poison, set by tests, overwrites a buffer as it is given back, so
	// that whatever still reads it then reads garbage (and the race
	// detector sees the write).
	poison bool
}

// bodyClass is the class of the smallest buffer that holds n bytes, or
// false when n is too large to pool.
func bodyClass(n int) (int, bool) {
	if n <= 1<<minBodyShift {
		return 0, true
	}
	c := bits.Len(uint(n-1)) - minBodyShift
	return c, c < bodyClasses
}

// get returns a buffer of length 0 and capacity at least n (n within the
// largest class), not zeroed.
func (bp *bodyPool) get(n int) *[]byte {
	c, _ := bodyClass(n)
	if v := bp.classes[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:0]
		return b
	}
	// bytes.Buffer.Grow allocates without zeroing what it will overwrite.
	var bb bytes.Buffer
	bb.Grow(1 << (minBodyShift + c))
	b := bb.AvailableBuffer()
	return &b
}

// put gives b (from get) back; nothing may refer to its memory after.
func (bp *bodyPool) put(b *[]byte) {
	c, ok := bodyClass(cap(*b))
	if !ok || cap(*b) != 1<<(minBodyShift+c) {
		return
	}
	if bp.poison {
		full := (*b)[:cap(*b)]
		for i := range full {
			full[i] = 0xee
		}
	}
	*b = (*b)[:0]
	bp.classes[c].Put(b)
}

// readBody reads a request body: into a pooled buffer (returned as
// pooled, to be given back to bp) when its declared length is known and
// poolable, else into one buffer sized from the length (io.ReadAll would
// double its way up from 512 bytes). On error nothing is kept.
func readBody(r io.Reader, length, max int64, bp *bodyPool) (raw []byte, pooled *[]byte, err error) {
	if length > 0 && length <= max {
		// One byte of room past the length: the read that finds the end
		// does not need a larger buffer.
		if _, ok := bodyClass(int(length) + 1); ok {
			buf := bp.get(int(length) + 1)
			b := *buf
			for len(b) < cap(b) {
				n, rerr := r.Read(b[len(b):cap(b)])
				b = b[:len(b)+n]
				if rerr == io.EOF {
					*buf = b
					return b, buf, nil
				}
				if rerr != nil {
					bp.put(buf)
					return nil, nil, rerr
				}
			}
			// Longer than declared (a reader that is not an HTTP body):
			// go on in an unpooled buffer.
			var bb bytes.Buffer
			bb.Grow(len(b) + bytes.MinRead)
			bb.Write(b)
			bp.put(buf)
			_, err = bb.ReadFrom(r)
			return bb.Bytes(), nil, err
		}
	}
	var buf bytes.Buffer
	if length > 0 && length <= max {
		buf.Grow(int(length) + bytes.MinRead)
	}
	_, err = buf.ReadFrom(r)
	return buf.Bytes(), nil, err
}
