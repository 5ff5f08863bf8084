// Package reqbody holds the bodies of requests the controller proxies, read
// into buffers taken from a pool and given back when the request is over,
// rather than allocated for each request (a 2k-token chat body is 8-12 KB,
// a long conversation hundreds: allocated per request they were a third of
// the controller's allocated bytes, and the collector's work with them).
//
// A pooled buffer is reused by the next request as soon as it is given
// back, so nothing may read it after that. A Body's bytes are reachable
// only through two methods, which say which use is made of them:
//
//   - Borrow: read by the handler's own goroutine, or by calls that are
//     done with them before it releases the Body (serializing them into a
//     request, parsing them into values the handler drops). Strings over
//     borrowed bytes (tokenize.ParseBodyShared's message contents) are
//     borrowed too: nothing may keep them past the request.
//   - Keep: handed to something that may read them after the request is
//     over (an http.Client's transport may read and close a request's
//     body after RoundTrip returns). The Body is then marked: Release
//     leaves its buffer to the collector.
//
// Release gives the buffer back unless the Body was kept. A Pool's Poison,
// set by tests, overwrites every buffer as it is given back, so that
// whatever still reads it reads garbage (and the race detector sees the
// write).
package reqbody

import (
	"bytes"
	"io"
	"math/bits"
	"sync"
)

const (
	minShift = 12 // the smallest class: 4 KiB
	classes  = 9  // 4 KiB .. 1 MiB; larger bodies are not pooled
)

// Pool holds body buffers by size class (powers of two). The zero Pool is
// ready to use.
type Pool struct {
	classes [classes]sync.Pool // of *[]byte, cap 1<<(minShift+i)
	// Poison, set by tests before the pool is used, overwrites a buffer
	// as it is given back.
	Poison bool
}

// class is the class of the smallest buffer that holds n bytes, or false
// when n is too large to pool.
func class(n int) (int, bool) {
	if n <= 1<<minShift {
		return 0, true
	}
	c := bits.Len(uint(n-1)) - minShift
	return c, c < classes
}

// get returns a buffer of length 0 and capacity at least n (n within the
// largest class), not zeroed.
func (bp *Pool) get(n int) *[]byte {
	c, _ := class(n)
	if v := bp.classes[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:0]
		return b
	}
	// bytes.Buffer.Grow allocates without zeroing what it will overwrite.
	var bb bytes.Buffer
	bb.Grow(1 << (minShift + c))
	b := bb.AvailableBuffer()
	return &b
}

// put gives b (from get) back; nothing may refer to its memory after.
func (bp *Pool) put(b *[]byte) {
	c, ok := class(cap(*b))
	if !ok || cap(*b) != 1<<(minShift+c) {
		return
	}
	if bp.Poison {
		full := (*b)[:cap(*b)]
		for i := range full {
			full[i] = 0xee
		}
	}
	*b = (*b)[:0]
	bp.classes[c].Put(b)
}

// Body is a request body, in a pooled buffer or not. Its bytes are
// reachable through Borrow and Keep only (see the package comment). The
// zero Body is empty and not pooled.
type Body struct {
	b []byte // the body
	// buf is the pooled buffer the body was read into (b may have been
	// rewritten since, and the old bytes still be borrowed), pool its
	// pool; nil when not pooled or given back.
	buf  *[]byte
	pool *Pool
	kept bool // handed to a keeper: buf is the collector's
}

// Of is a Body of b, not pooled (b is not copied).
func Of(b []byte) Body { return Body{b: b} }

// Borrow returns the body's bytes for a use that is over before the Body
// is released: they must not be kept, nor handed to anything that may read
// them later (use Keep for that).
func (rb *Body) Borrow() []byte { return rb.b }

// Keep returns the body's bytes for something that may read them after
// the request is over, and marks the Body so that Release leaves its
// buffer to the collector.
func (rb *Body) Keep() []byte {
	rb.kept = true
	return rb.b
}

// Len is the body's length.
func (rb *Body) Len() int { return len(rb.b) }

// Rewrite replaces the body with f's result; f borrows the body's bytes
// (it may return them, or a new slice). The buffer read into stays until
// Release, whatever f returns: what was borrowed of it before may still be
// read.
func (rb *Body) Rewrite(f func([]byte) []byte) { rb.b = f(rb.b) }

// Pooled reports whether the body's buffer goes back to a pool on Release.
func (rb *Body) Pooled() bool { return rb.buf != nil && !rb.kept }

// Release gives the body's buffer back to its pool, unless it was kept.
// Nothing borrowed of it may be read after. Releasing twice is harmless.
func (rb *Body) Release() {
	if rb.buf != nil && !rb.kept {
		rb.pool.put(rb.buf)
	}
	rb.buf, rb.pool = nil, nil
}

// Read reads a request body: into a pooled buffer from bp when its
// declared length is known and poolable, else into one buffer sized from
// the length (io.ReadAll would double its way up from 512 bytes). On error
// nothing is kept. The caller releases the Body when the request is over.
func Read(r io.Reader, length, max int64, bp *Pool) (Body, error) {
	if length > 0 && length <= max {
		// One byte of room past the length: the read that finds the end
		// does not need a larger buffer.
		if _, ok := class(int(length) + 1); ok {
			buf := bp.get(int(length) + 1)
			b := *buf
			for len(b) < cap(b) {
				n, rerr := r.Read(b[len(b):cap(b)])
				b = b[:len(b)+n]
				if rerr == io.EOF {
					*buf = b
					return Body{b: b, buf: buf, pool: bp}, nil
				}
				if rerr != nil {
					bp.put(buf)
					return Body{}, rerr
				}
			}
			// Longer than declared (a reader that is not an HTTP body):
			// go on in an unpooled buffer.
			var bb bytes.Buffer
			bb.Grow(len(b) + bytes.MinRead)
			bb.Write(b)
			bp.put(buf)
			_, err := bb.ReadFrom(r)
			return readResult(bb.Bytes(), err)
		}
	}
	var buf bytes.Buffer
	if length > 0 && length <= max {
		buf.Grow(int(length) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(r)
	return readResult(buf.Bytes(), err)
}

func readResult(b []byte, err error) (Body, error) {
	if err != nil {
		return Body{}, err
	}
	return Body{b: b}, nil
}
