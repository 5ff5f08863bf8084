//go:build linux

package regional

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	b, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = r.c.Close(); _ = b.Close() })
	return r.c, b
}

func TestRawReadWriterIsRaw(t *testing.T) {
	a, _ := tcpPair(t)
	if _, ok := rawReadWriter(a).(*rawIO); !ok {
		t.Fatalf("rawReadWriter(%T) = %T, want *rawIO", a, rawReadWriter(a))
	}
	var c net.Conn = &lenientConn{Conn: a}
	if rw := rawReadWriter(c); rw != io.ReadWriter(c) {
		t.Fatalf("rawReadWriter of a wrapped conn = %T, want the conn", rw)
	}
}

// TestRawIOLikeConn: what goes through rawIO, reading ahead or not, both
// ways, in chunks of any size (past the socket buffers, so writes wait for
// the peer and reads for data; below and above readAheadSize), arrives as
// net.Conn delivers it: the same bytes in order, then io.EOF when the peer
// closes.
func TestRawIOLikeConn(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		a, b := tcpPair(t)
		raw := rawReadWriter(a)
		ahead := rapid.Bool().Draw(rt, "ahead")
		if ahead {
			raw = rawReadAhead(a)
		}
		for i, ops := 0, rapid.IntRange(1, 4).Draw(rt, "ops"); i < ops; i++ {
			size := rapid.IntRange(0, 256<<10).Draw(rt, "size")
			data := make([]byte, size)
			for j := range data {
				data[j] = byte(j*7 + i)
			}
			chunk := rapid.OneOf(rapid.IntRange(1, 64<<10), rapid.IntRange(1, 2*readAheadSize)).Draw(rt, "chunk")
			var from io.Writer = b
			var to io.Reader = raw
			if rapid.Bool().Draw(rt, "outward") {
				from, to = raw, b
			}
			werr := make(chan error, 1)
			go func() {
				n, err := from.Write(data)
				if err == nil && n != len(data) {
					err = io.ErrShortWrite
				}
				werr <- err
			}()
			got := make([]byte, 0, size)
			buf := make([]byte, chunk)
			for len(got) < size {
				n, err := to.Read(buf)
				if err != nil {
					rt.Fatalf("read after %d of %d bytes: %v", len(got), size, err)
				}
				got = append(got, buf[:n]...)
			}
			if err := <-werr; err != nil {
				rt.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, data) {
				rt.Fatalf("%d bytes arrived altered", size)
			}
			if r := raw.(*rawIO); r.abuf != nil || len(r.a) != 0 {
				rt.Fatalf("after every byte was taken, the read-ahead buffer is still held (%d bytes unread)", len(r.a))
			}
		}
		_ = b.Close()
		if n, err := raw.Read(make([]byte, 16)); n != 0 || err != io.EOF {
			rt.Fatalf("read after the peer closed = %d, %v; want 0, EOF", n, err)
		}
		if n, err := raw.Read(nil); n != 0 || err != nil {
			rt.Fatalf("empty read = %d, %v; want 0, nil", n, err)
		}
	})
}

// TestRawIOErrorsLikeConn: past a deadline, after Close, and against a
// peer that reset the connection, rawIO's errors are net.Conn's: the same
// operation, timeout and cause (errors.Is).
func TestRawIOErrorsLikeConn(t *testing.T) {
	type outcome struct {
		op      string
		timeout bool
		is      []bool
	}
	causes := []error{os.ErrDeadlineExceeded, net.ErrClosed, syscall.EPIPE, syscall.ECONNRESET}
	describe := func(err error) outcome {
		var oe *net.OpError
		if !errors.As(err, &oe) {
			t.Fatalf("%v (%T): not a *net.OpError", err, err)
		}
		o := outcome{op: oe.Op, timeout: oe.Timeout()}
		for _, c := range causes {
			o.is = append(o.is, errors.Is(err, c))
		}
		return o
	}
	cases := map[string]func(c net.Conn, rw io.ReadWriter) error{
		"read past deadline": func(c net.Conn, rw io.ReadWriter) error {
			_ = c.SetReadDeadline(aLongTimeAgo)
			_, err := rw.Read(make([]byte, 8))
			return err
		},
		"write past deadline": func(c net.Conn, rw io.ReadWriter) error {
			_ = c.SetWriteDeadline(aLongTimeAgo)
			_, err := rw.Write([]byte("x"))
			return err
		},
		// A read that waits is broken off by a deadline set meanwhile
		// (net/http's abortPendingRead).
		"waiting read, deadline set": func(c net.Conn, rw io.ReadWriter) error {
			errc := make(chan error, 1)
			go func() { _, err := rw.Read(make([]byte, 8)); errc <- err }()
			_ = c.SetReadDeadline(aLongTimeAgo)
			return <-errc
		},
		"read after close": func(c net.Conn, rw io.ReadWriter) error {
			_ = c.Close()
			_, err := rw.Read(make([]byte, 8))
			return err
		},
		"write after close": func(c net.Conn, rw io.ReadWriter) error {
			_ = c.Close()
			_, err := rw.Write([]byte("x"))
			return err
		},
	}
	for name, do := range cases {
		for _, raw := range []func(net.Conn) io.ReadWriter{rawReadWriter, rawReadAhead} {
			t.Run(name, func(t *testing.T) {
				a1, _ := tcpPair(t)
				a2, _ := tcpPair(t)
				want := do(a1, a1)
				got := do(a2, raw(a2))
				if w, g := describe(want), describe(got); w.op != g.op || w.timeout != g.timeout || !slices.Equal(w.is, g.is) {
					t.Fatalf("rawIO: %v %+v; net.Conn: %v %+v", got, g, want, w)
				}
			})
		}
	}
	t.Run("peer reset", func(t *testing.T) {
		// The peer closes with unread data: it resets the connection, and
		// a write fails, with EPIPE or ECONNRESET as on net.Conn.
		a, b := tcpPair(t)
		raw := rawReadWriter(a)
		if _, err := raw.Write([]byte("unread")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		_ = b.Close()
		var err error
		for err == nil {
			_, err = raw.Write(make([]byte, 64<<10))
		}
		o := describe(err)
		if o.op != "write" || !(errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
			t.Fatalf("write to a reset connection: %v %+v", err, o)
		}
	})
}

// TestReadAhead: a small read takes what the socket has, up to
// readAheadSize, in one call and returns the rest from memory, even past a
// read deadline (as a bufio.Reader would); a read that finds nothing holds
// no buffer while it waits; a big read goes straight to the socket.
func TestReadAhead(t *testing.T) {
	a, b := tcpPair(t)
	raw := rawReadAhead(a).(*rawIO)
	msg := bytes.Repeat([]byte("0123456789abcdef"), 600) // 9,600 bytes, as a chat request
	if _, err := b.Write(msg); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 4096)
	got := 0
	for got < len(first) {
		n, err := raw.Read(first[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	// The sender wrote everything at once: the socket holds it all
	// unless the kernel split it, which loopback does not below 64 KB.
	// Either way what was read ahead is exactly what follows.
	if len(raw.a) == 0 {
		t.Fatalf("a 4 KB read of a 9.6 KB message read nothing ahead")
	}
	if !bytes.Equal(raw.a, msg[4096:4096+len(raw.a)]) {
		t.Fatal("the bytes read ahead are not the ones that follow")
	}
	_ = a.SetReadDeadline(aLongTimeAgo)
	rest := make([]byte, len(msg))
	n, err := raw.Read(rest)
	if err != nil || n == 0 {
		t.Fatalf("read of bytes read ahead, past the deadline = %d, %v; want them", n, err)
	}
	if !bytes.Equal(append(first, rest[:n]...), msg[:4096+n]) {
		t.Fatal("bytes read ahead arrived altered")
	}
	_ = a.SetReadDeadline(time.Time{})
	for 4096+n < len(msg) {
		m, err := raw.Read(rest[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += m
	}
	if raw.abuf != nil {
		t.Fatal("buffer held after its bytes were taken")
	}

	// An attempt that finds nothing to read (the read then waits for the
	// poller) keeps no buffer: an idle connection holds none.
	small := make([]byte, 8)
	raw.rmu.Lock()
	raw.rp, raw.rahead = small, true
	var waits bool
	if err := raw.rc.Control(func(fd uintptr) { waits = !raw.read(fd) }); err != nil {
		t.Fatal(err)
	}
	held := raw.abuf != nil
	raw.rp = nil
	raw.rmu.Unlock()
	if !waits || held {
		t.Fatalf("read attempt on an empty socket: waits %v, buffer held %v; want true, false", waits, held)
	}
	done := make(chan error, 1)
	go func() {
		_, err := raw.Read(small)
		done <- err
	}()
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if small[0] != 'x' || raw.abuf != nil || len(raw.a) != 0 {
		t.Fatalf("one byte read ahead: got %q, buffer held %v", small[0], raw.abuf != nil)
	}

	// A read of readAheadSize or more goes to the socket directly.
	big := make([]byte, readAheadSize)
	if _, err := b.Write([]byte("yz")); err != nil {
		t.Fatal(err)
	}
	if n, err := raw.Read(big); err != nil || string(big[:n]) != "yz"[:n] || raw.abuf != nil {
		t.Fatalf("big read = %d, %v, buffer held %v", n, err, raw.abuf != nil)
	}
}

// TestPeekLikeRecvfrom: peek answers as recvfrom with MSG_PEEK does, and
// takes nothing.
func TestPeekLikeRecvfrom(t *testing.T) {
	a, b := tcpPair(t)
	rc, err := a.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, want error) {
		t.Helper()
		var got, ref error
		_ = rc.Control(func(fd uintptr) {
			var x [1]byte
			got = peek(fd, x[:])
			_, _, ref = syscall.Recvfrom(int(fd), x[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		})
		is := func(err error) bool { return want == nil && err == nil || want != nil && errors.Is(err, want) }
		if !is(got) || !is(ref) {
			t.Fatalf("%s: peek %v, recvfrom %v; want %v", what, got, ref, want)
		}
	}
	check("nothing sent", syscall.EAGAIN)
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// Wait for the byte without taking it.
	if err := rc.Read(func(fd uintptr) bool { var x [1]byte; return peek(fd, x[:]) != syscall.EAGAIN }); err != nil {
		t.Fatal(err)
	}
	check("a byte sent", nil)
	if n, err := a.Read(make([]byte, 4)); n != 1 || err != nil {
		t.Fatalf("read after peeks = %d, %v; want the byte", n, err)
	}
}
