//go:build unix

package proxy

import (
	"net"
	"syscall"
)

// udpBuffers reads a UDP socket's receive and send buffer sizes as the
// kernel reports them (Linux: twice the value set), as quic-go compares them.
func udpBuffers(pc net.PacketConn) (rcv, snd int, ok bool) {
	sc, isSys := pc.(syscall.Conn)
	if !isSys {
		return 0, 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var rerr, serr error
	if err := raw.Control(func(fd uintptr) {
		rcv, rerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		snd, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	}); err != nil || rerr != nil || serr != nil {
		return 0, 0, false
	}
	return rcv, snd, true
}
