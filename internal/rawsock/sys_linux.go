//go:build linux

package rawsock

import (
	"syscall"
	"unsafe"
)

// Enabled: a Sock moves its socket's bytes with raw system calls (sysRead,
// sysWrite) through the socket's RawConn.
const Enabled = true

// pollfd is struct pollfd of poll(2).
type pollfd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn = 0x1 // POLLIN

// awaitReadable is what a Sock's reader waits with once a read found the
// socket empty: RawConn.Read calls it after resetting the poller's
// readiness and again after every wake-up, and it reports whether the
// socket is readable now (data, end of stream or an error: anything that
// ends a read) with a ppoll(2) that does not wait. It holds no state, so a
// socket whose reader waits holds nothing for it: the read itself (and
// the pooled buffer ReadPooled may take) happens after, in a RawConn.Read that returns
// at once. The level check makes the edge-triggered poller's reset safe:
// bytes that arrived before it are seen here.
func awaitReadable(fd uintptr) bool {
	p := pollfd{fd: int32(fd), events: pollIn}
	var ts syscall.Timespec // zero: return at once
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&p)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		return e != 0 || n > 0 // on an error, the read reports it
	}
}
