package main

import (
	"fmt"
	"net"
	"strconv"
)

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q: want 0..65535", p)
	}
	return host, port, nil
}

// listenOn returns a listen function that binds host regardless of the
// address kfake asks for (it listens on 127.0.0.1 by default).
func listenOn(host string) func(network, address string) (net.Listener, error) {
	return func(network, address string) (net.Listener, error) {
		_, p, err := net.SplitHostPort(address)
		if err != nil {
			return nil, err
		}
		return net.Listen(network, net.JoinHostPort(host, p))
	}
}
