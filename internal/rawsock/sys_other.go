//go:build !linux

package rawsock

// Enabled: elsewhere than on Linux no socket is raw (Of reports none, Wrap
// returns the connection itself); WriteFD and PeekFD are the syscall
// package's calls on other Unix systems (sys_std.go).
const Enabled = false

func awaitReadable(uintptr) bool { return true }
