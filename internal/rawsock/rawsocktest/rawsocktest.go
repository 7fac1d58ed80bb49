// Package rawsocktest holds what the tests of the raw socket path share
// (internal/rawsock, the broker's BatchConn, the front's sockets): a real
// socket pair, a socket that shows whether bytes moved through its net.Conn
// methods, and a small-message exchange over one.
package rawsocktest

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
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

// TCPPair is a connected pair of real loopback TCP sockets, closed when
// the test ends.
func TCPPair(t testing.TB) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ac, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	bc, err := ln.Accept()
	if err != nil {
		ac.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { ac.Close(); bc.Close() })
	return ac.(*net.TCPConn), bc.(*net.TCPConn)
}

// Exchange sends rounds small messages each way between peer and c (the
// connection under test), checking every byte: c reads what peer wrote,
// then writes it back for peer to read.
func Exchange(t testing.TB, peer, c net.Conn, rounds int) {
	t.Helper()
	small := []byte("sixty-four bytes or so, a small message crossing the socket....")
	p := make([]byte, 1<<10)
	for i := range rounds {
		if _, err := peer.Write(small); err != nil {
			t.Fatal(err)
		}
		if n, err := io.ReadAtLeast(c, p, len(small)); err != nil || !bytes.Equal(p[:n], small) {
			t.Fatalf("read %d: %q, %v", i, p[:n], err)
		}
		if _, err := c.Write(small); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, p[:len(small)]); err != nil || !bytes.Equal(p[:len(small)], small) {
			t.Fatalf("peer read %d: %q, %v", i, p[:len(small)], err)
		}
	}
}
