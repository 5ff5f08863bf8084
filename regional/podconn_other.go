//go:build !unix

package regional

import "net"

// canCheckIdle: connAlive cannot tell a closed connection here, so pods
// are reached through http.Transport.
const canCheckIdle = false

func connAlive(net.Conn) bool { return false }
