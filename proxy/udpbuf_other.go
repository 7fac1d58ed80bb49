//go:build !unix

package proxy

import "net"

// udpBuffers cannot read socket buffer sizes here; no warning is logged.
func udpBuffers(net.PacketConn) (rcv, snd int, ok bool) { return 0, 0, false }
