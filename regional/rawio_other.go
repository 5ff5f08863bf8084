//go:build !linux

package regional

import (
	"io"
	"net"
)

// rawReadWriter returns c: raw I/O (rawio_linux.go) is for Linux only.
func rawReadWriter(c net.Conn) io.ReadWriter { return c }

// rawReadAhead returns c (see rawReadWriter).
func rawReadAhead(c net.Conn) io.ReadWriter { return c }
