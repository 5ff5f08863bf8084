//go:build unix && !linux

package regional

import "syscall"

// peek reads what fd has without waiting or taking it (recv with MSG_PEEK
// and MSG_DONTWAIT) and returns the call's error: EAGAIN when there is
// nothing.
func peek(fd uintptr, b []byte) error {
	_, _, err := syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err
}
