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

// idleCheck is connAlive for one connection, checked again and again: its
// RawConn and the function given to it are made once, not per check.
// Only the goroutine that holds the connection uses it.
type idleCheck struct {
	rc    syscall.RawConn
	fn    func(fd uintptr) bool
	alive bool
	b     [1]byte
}

func newIdleCheck(c net.Conn) *idleCheck {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	k := &idleCheck{rc: rc}
	k.fn = func(fd uintptr) bool {
		rerr := peek(fd, k.b[:])
		k.alive = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true // never wait
	}
	return k
}

// check is connAlive(c) for the c k was made for; a nil k is not alive.
func (k *idleCheck) check() bool {
	if k == nil {
		return false
	}
	k.alive = false
	err := k.rc.Read(k.fn)
	return err == nil && k.alive
}
