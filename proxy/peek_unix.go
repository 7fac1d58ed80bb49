//go:build unix

package proxy

import (
	"syscall"

	"github.com/hermes-securelink/securelink/internal/rawsock"
)

// peekAlive is true when the socket has nothing to read and is not closed:
// a keep-alive connection may be reused. On Linux the peek is a raw
// system call (internal/rawsock), like the connection's reads and writes.
func peekAlive(fd uintptr) bool {
	var b [1]byte
	if rawsock.Enabled {
		_, errno := rawsock.PeekFD(fd, b[:])
		return errno == syscall.EAGAIN
	}
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == syscall.EAGAIN
}

// canWriteRaw: upConn.send may write on the descriptor itself.
const canWriteRaw = true

// writeRaw is one non-blocking write(2) on fd; n is never negative. On
// Linux it is a raw system call (internal/rawsock).
func writeRaw(fd uintptr, p []byte) (int, error) {
	if rawsock.Enabled {
		n, errno := rawsock.WriteFD(fd, p)
		if errno != 0 {
			return 0, errno
		}
		return n, nil
	}
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
