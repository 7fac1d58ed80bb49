//go:build !linux

package rawsock

import "syscall"

// Enabled: elsewhere than on Linux no socket is raw (Of reports none, Wrap
// returns the connection itself).
const Enabled = false

func sysRead(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.ENOSYS }
func sysWrite(uintptr, []byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }
func sysPeek(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.ENOSYS }
func awaitReadable(uintptr) bool                    { return true }
