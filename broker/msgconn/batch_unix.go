//go:build unix

package msgconn

import (
	"io"
	"syscall"
)

const canReadNow = true

// readNow makes one non-blocking read(2) on rc; done is false when nothing
// was waiting (the caller then reads as usual, through the poller).
func readNow(rc syscall.RawConn, buf []byte) (n int, err error, done bool) {
	cerr := rc.Read(func(fd uintptr) bool {
		n, err = syscall.Read(int(fd), buf)
		return true
	})
	switch {
	case cerr != nil:
		return 0, cerr, true
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return 0, nil, false
	case err != nil:
		return 0, err, true
	case n == 0:
		return 0, io.EOF, true
	}
	return n, nil, true
}
