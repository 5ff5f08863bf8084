//go:build linux

package regional

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a TCP connection's socket with raw system calls
// (syscall.RawSyscall), waiting for it through the runtime's poller as
// net.Conn does. The socket is non-blocking, so a call never blocks; what
// it saves is the runtime's bookkeeping around a blocking call: each
// read or write that net.Conn makes tells the scheduler it may block,
// which wakes the runtime's monitor thread (sysmon) from its sleep, and
// sysmon then polls every 20 us while the process is busy, a thread wakeup
// each time, and hands a P whose call lasts over 20 us (a loopback write
// on these virtual CPUs) to another thread, another wakeup. Measured on
// the proxied request path that was about 15% of the controller's CPU
// (scripts/proxy-vs-nginx's load at 1k req/s, perf record). Sysmon still
// wakes for timers, blocking calls elsewhere and the collector, and still
// preempts goroutines that run long.
//
// What a caller sees is what net.Conn gives: the same bytes, io.EOF at the
// end, *net.OpError for failures ("read"/"write", wrapping the system
// call's error, os.ErrDeadlineExceeded past a deadline, net.ErrClosed on
// a closed connection), deadlines and concurrent Close honoured (the
// poller's, through syscall.RawConn).
//
// A rawIO made by rawReadAhead also reads ahead: asked for less than
// readAheadSize, it asks the socket for up to readAheadSize and keeps the
// rest for the next reads. net/http's server reads its connections 4 KB
// at a time, so a chat request of 4-16 KB (a 2k-token prompt is about
// 8 KB) took two or more read calls on the request's path; read ahead it
// takes one, and a copy from memory. The buffer comes from a pool while a
// read is under way and goes back when its bytes are taken or the read
// finds nothing, so an idle connection (one waiting for its next request)
// holds none. Bytes read ahead are returned before the socket is read
// again, whatever the deadline: as a bufio.Reader's would be.
type rawIO struct {
	c  net.Conn
	rc syscall.RawConn

	// The state of the read and of the write under way, which the
	// functions given to rc work on: closures over a call's own
	// variables would be allocated on every call. rmu and wmu keep
	// concurrent reads (writes) apart, as the poller's own lock does.
	rmu    sync.Mutex
	rp     []byte
	rn     int
	rerrno syscall.Errno
	readFn func(fd uintptr) bool

	// Read-ahead (rawReadAhead), under rmu: the read under way reads into
	// abuf when rahead; a holds abuf's bytes not yet returned.
	ahead  bool
	rahead bool
	abuf   *[]byte
	a      []byte

	wmu     sync.Mutex
	wp      []byte
	wn      int
	werrno  syscall.Errno
	writeFn func(fd uintptr) bool
}

// rawReadWriter returns raw I/O for c when it is a TCP connection, or c.
func rawReadWriter(c net.Conn) io.ReadWriter {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	r := &rawIO{c: c, rc: rc}
	r.readFn, r.writeFn = r.read, r.write
	return r
}

// readAheadSize is how much a read-ahead rawIO asks the socket for.
const readAheadSize = 16 << 10

var readAheadPool = sync.Pool{New: func() any {
	b := make([]byte, readAheadSize)
	return &b
}}

// rawReadAhead is rawReadWriter reading ahead (see rawIO).
func rawReadAhead(c net.Conn) io.ReadWriter {
	rw := rawReadWriter(c)
	if r, ok := rw.(*rawIO); ok {
		r.ahead = true
	}
	return rw
}

func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.rmu.Lock()
	if len(r.a) > 0 {
		n := r.take(p)
		r.rmu.Unlock()
		return n, nil
	}
	r.rahead = r.ahead && len(p) < readAheadSize
	r.rp, r.rn, r.rerrno = p, 0, 0
	err := r.rc.Read(r.readFn)
	n, errno := r.rn, r.rerrno
	r.rp = nil
	if r.abuf != nil {
		// read kept the buffer: it holds n > 0 bytes.
		r.a = (*r.abuf)[:n]
		n = r.take(p)
	}
	r.rmu.Unlock()
	switch {
	case err != nil:
		return 0, r.opError("read", err)
	case errno != 0:
		return 0, r.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// take copies read-ahead bytes into p, giving the buffer back once they
// are all taken; rmu is held.
func (r *rawIO) take(p []byte) int {
	n := copy(p, r.a)
	r.a = r.a[n:]
	if len(r.a) == 0 {
		readAheadPool.Put(r.abuf)
		r.abuf, r.a = nil, nil
	}
	return n
}

// read is one attempt of Read on fd: false when it must wait. Reading
// ahead, it reads into a pooled buffer that it keeps (r.abuf) only when
// the read brought bytes.
func (r *rawIO) read(fd uintptr) bool {
	p := r.rp
	if r.rahead {
		r.abuf = readAheadPool.Get().(*[]byte)
		p = *r.abuf
	}
	for {
		m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if r.abuf != nil && (e != 0 || m == 0) {
			readAheadPool.Put(r.abuf)
			r.abuf = nil
		}
		if e == syscall.EAGAIN {
			return false // wait until readable
		}
		r.rn, r.rerrno = int(m), e
		return true
	}
}

func (r *rawIO) Write(p []byte) (int, error) {
	r.wmu.Lock()
	r.wp, r.wn, r.werrno = p, 0, 0
	err := r.rc.Write(r.writeFn)
	n, errno := r.wn, r.werrno
	r.wp = nil
	r.wmu.Unlock()
	switch {
	case err != nil:
		return n, r.opError("write", err)
	case errno != 0:
		return n, r.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// write is one attempt of Write on fd: false when it must wait.
func (r *rawIO) write(fd uintptr) bool {
	p := r.wp
	for r.wn < len(p) {
		m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[r.wn])), uintptr(len(p)-r.wn))
		switch e {
		case 0:
			r.wn += int(m)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false // wait until writable
		default:
			r.werrno = e
			return true
		}
	}
	return true
}

// opError is err as net.Conn reports it: an *net.OpError for op. The
// errors of syscall.RawConn already are one (op "raw-read"/"raw-write").
func (r *rawIO) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		oe.Op = op
		return oe
	}
	return &net.OpError{Op: op, Net: "tcp", Source: r.c.LocalAddr(), Addr: r.c.RemoteAddr(), Err: err}
}

// peek reads what fd has without waiting or taking it (recv with MSG_PEEK
// and MSG_DONTWAIT) and returns the call's error: EAGAIN when there is
// nothing. A raw call, as rawIO's.
func peek(fd uintptr, b []byte) error {
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
