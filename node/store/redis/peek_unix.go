//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos

package redis

import "syscall"

// peek reports whether the socket fd has bytes to read, or its peer
// closed it, without taking them and without waiting.
func peek(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return n > 0 || n == 0 && err == nil
}
