//go:build linux && !race

package rawsock

import (
	"syscall"
	"unsafe"
)

// sysRead and sysWrite are read(2) and write(2) on a socket's non-blocking
// descriptor as raw system calls: they return at once (EAGAIN when the
// socket is empty or full) and never block, so the runtime need not be
// told (entersyscall/exitsyscall). On the broker's and the front's data
// paths that telling cost more than the calls' own entry: every first
// system call after the process went idle woke the runtime's monitor
// thread (sysmon) from its deep sleep, with a futex and a context switch,
// and it then polled every 20 µs until the process was idle again — about
// a fifth of the process's CPU per small message. Under the race detector
// the syscall package's calls are used instead (sys_std.go), which tell
// the detector about the bytes moved.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) { return rawRW(syscall.SYS_READ, fd, p) }

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) { return rawRW(syscall.SYS_WRITE, fd, p) }

// rawRW is read(2) or write(2) (trap) of p on fd, retried on EINTR.
func rawRW(trap, fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), 0
	}
}

// sysPeek is recvfrom(2) of p on fd with MSG_PEEK|MSG_DONTWAIT, raw.
func sysPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)),
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), 0
	}
}
