package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/rawsock/rawsocktest"
)

// A wrapped socket moves its bytes with raw system calls through its
// RawConn, never through the connection's own Read and Write (which enter
// the runtime's system-call bookkeeping), and keeps what net/http and the
// front rely on: small messages both ways, a write larger than both socket
// buffers (it waits on the poller until the peer reads), read and write
// deadlines as timeouts named "read" and "write", CloseWrite (the peer
// reads the end), and Close ending a read that waits.
func TestConnMovesBytesWithRawCalls(t *testing.T) {
	if !Enabled {
		t.Skip("raw system calls are Linux-only")
	}
	a, b := rawsocktest.TCPPair(t)
	sc := &rawsocktest.Counted{TCPConn: b}
	c := Wrap(sc)
	if _, ok := c.(*Conn); !ok {
		t.Fatalf("Wrap of a TCP connection is a %T, want a *Conn", c)
	}
	rawsocktest.Exchange(t, a, c, 100)
	p := make([]byte, 1<<10)
	big := make([]byte, 16<<20) // more than both socket buffers hold
	for i := range big {
		big[i] = byte(i % 251)
	}
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the write finds the socket full
		buf := make([]byte, len(big))
		io.ReadFull(a, buf)
		got <- buf
	}()
	if n, err := c.Write(big); err != nil || n != len(big) {
		t.Fatalf("write of 16 MiB: %d, %v", n, err)
	}
	if !bytes.Equal(<-got, big) {
		t.Fatal("the peer read other bytes than written")
	}

	var ne net.Error
	var oe *net.OpError
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.Read(p)
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("read with nothing sent, past the deadline: %v, want a read timeout", err)
	}
	c.SetReadDeadline(time.Time{})
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	var werr error
	for werr == nil { // the peer reads no more: the socket fills
		_, werr = c.Write(big)
	}
	if !errors.As(werr, &ne) || !ne.Timeout() || !errors.As(werr, &oe) || oe.Op != "write" {
		t.Fatalf("write to a full socket past the deadline: %v, want a write timeout", werr)
	}
	if r, w := sc.Reads.Load(), sc.Writes.Load(); r != 0 || w != 0 {
		t.Errorf("%d Read and %d Write calls on the connection, want none: the bytes moved through them", r, w)
	}

	// The end: CloseWrite is seen by the peer, Close ends a waiting read.
	a2, b2 := rawsocktest.TCPPair(t)
	c2 := Wrap(b2)
	if err := c2.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := a2.Read(p); n != 0 || err != io.EOF {
		t.Fatalf("peer read after CloseWrite: %d, %v, want EOF", n, err)
	}
	a2.Close()
	if n, err := c2.Read(p); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v, want EOF", n, err)
	}
	_, b3 := rawsocktest.TCPPair(t)
	c3 := Wrap(b3)
	done := make(chan error, 1)
	go func() {
		_, err := c3.Read(p[:1])
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // the read waits on the poller
	c3.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read ended by Close: %v, want net.ErrClosed", err)
	}
}

// A connection that is not a socket (in memory, a broker stream) is
// served as it is.
func TestWrapLeavesOtherConnectionsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if c := Wrap(a); c != a {
		t.Fatalf("Wrap of a pipe is a %T, want the pipe itself", c)
	}
}
