//go:build unix

package proxy

import "syscall"

// peekAlive is true when the socket has nothing to read and is not closed:
// a keep-alive connection may be reused.
func peekAlive(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == syscall.EAGAIN
}
