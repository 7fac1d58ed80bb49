//go:build unix && (race || !linux)

package rawsock

import "syscall"

// sysRead, sysWrite and sysPeek: see sys_raw.go. Under the race detector,
// the syscall package's calls (they tell the detector of the bytes they
// move); on other Unix systems the same, for WriteFD and PeekFD.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, err := syscall.Read(int(fd), p)
		if err != syscall.EINTR {
			return sysErr(n, err)
		}
	}
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, err := syscall.Write(int(fd), p)
		if err != syscall.EINTR {
			return sysErr(n, err)
		}
	}
}

func sysPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			return sysErr(n, err)
		}
	}
}

func sysErr(n int, err error) (int, syscall.Errno) {
	if err == nil {
		return n, 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return 0, e
	}
	return 0, syscall.EIO
}
