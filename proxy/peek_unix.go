//go:build unix

package proxy

import (
	"syscall"

	"github.com/hermes-securelink/securelink/internal/rawsock"
)

// peekAlive is true when the socket has nothing to read and is not closed:
// a keep-alive connection may be reused. The peek is internal/rawsock's, a
// raw system call on Linux like the connection's reads and writes.
func peekAlive(fd uintptr) bool {
	var b [1]byte
	_, errno := rawsock.PeekFD(fd, b[:])
	return errno == syscall.EAGAIN
}

// canWriteRaw: upConn.send may write on the descriptor itself.
const canWriteRaw = true

// writeRaw is one non-blocking write(2) on fd (internal/rawsock's); n is
// never negative.
func writeRaw(fd uintptr, p []byte) (int, error) {
	n, errno := rawsock.WriteFD(fd, p)
	if errno != 0 {
		return 0, errno
	}
	return n, nil
}
