package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
)

// unixListenPrefix starts a --listen address that is a Unix socket's path
// (unix:/run/quotad.sock) rather than host:port.
const unixListenPrefix = "unix:"

// listen opens the API's listener on addr, as --listen gives it (valid):
// TCP on host:port, or a Unix socket on unix:PATH. The socket file is
// made by the listen and removed when the listener closes; one left by a
// process that was killed stops quotad with the line that says to remove
// it.
func listen(addr string) (net.Listener, error) {
	path, unix := strings.CutPrefix(addr, unixListenPrefix)
	if !unix {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return ln, nil
	}
	ln, err := net.Listen("unix", path)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("listen on %s: %s exists: if no process serves on it (one that was killed leaves it), remove it and start again", addr, path)
	case err != nil:
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}
