// Package rawsocktest holds what the tests of the raw socket path share
// (internal/rawsock, the broker's BatchConn, the front's sockets): a real
// socket that shows whether bytes moved through its net.Conn methods.
package rawsocktest

import (
	"net"
	"sync/atomic"
)

// Counted is a real TCP connection (its SyscallConn shows through, so the
// raw path can take it) that counts the calls of its net.Conn Read and
// Write: a socket moved by raw system calls sees none.
type Counted struct {
	*net.TCPConn
	Reads, Writes atomic.Int64
}

func (c *Counted) Read(p []byte) (int, error) {
	c.Reads.Add(1)
	return c.TCPConn.Read(p)
}

func (c *Counted) Write(p []byte) (int, error) {
	c.Writes.Add(1)
	return c.TCPConn.Write(p)
}
