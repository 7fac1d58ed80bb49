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

// canWriteRaw: upConn.send may write on the descriptor itself.
const canWriteRaw = true

// writeRaw is one non-blocking write(2) on fd; n is never negative.
func writeRaw(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Write(int(fd), p)
		if err == syscall.EINTR {
			continue
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}
