//go:build unix

package regional

import (
	"net"
	"syscall"
)

// canCheckIdle: connAlive can tell a closed connection here.
const canCheckIdle = true

// connAlive reports whether an idle connection can carry a request: the
// pod has not closed it and sent nothing unasked (one non-blocking peek,
// what the transport's reader goroutine learns while it waits).
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		rerr := peek(fd, b[:])
		alive = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true // never wait
	})
	return err == nil && alive
}
