//go:build !unix

package regional

import "net"

// canCheckIdle: connAlive cannot tell a closed connection here, so pods
// are reached through http.Transport.
const canCheckIdle = false

func connAlive(net.Conn) bool { return false }

type idleCheck struct{}

func newIdleCheck(net.Conn) *idleCheck { return nil }

func (*idleCheck) check() bool { return false }
