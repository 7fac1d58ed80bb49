//go:build !unix

package rawsock

import "syscall"

func sysRead(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.ENOSYS }
func sysWrite(uintptr, []byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }
func sysPeek(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.ENOSYS }
