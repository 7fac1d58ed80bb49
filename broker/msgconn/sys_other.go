//go:build !linux

package msgconn

import "syscall"

// rawIO: elsewhere than on Linux a BatchConn reads and writes through the
// connection's own Read and Write (no read-ahead).
const rawIO = false

func sysRead(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.ENOSYS }
func sysWrite(uintptr, []byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }
func awaitReadable(uintptr) bool                    { return true }
