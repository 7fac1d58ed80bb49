package proxy

// Tests of upConn.send, the direct path's write of a request head that then
// waits for the answer without reading: over real loopback TCP, with socket
// buffers small enough that a large head cannot go out in one write.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"testing"
	"time"
)

// sendPair is a pooled upstream connection (dialed by the direct path's
// pool) and the upstream's end of it. Both sockets get 4 KiB buffers.
func sendPair(t *testing.T) (*upConn, net.Conn) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			// Inherited by accepted sockets, and set before the handshake
			// so that the advertised window stays small.
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialer := &net.Dialer{Timeout: testTimeout}
	p := newUpstreamPool(dialer, ln.Addr().String(), time.Minute, 4)
	t.Cleanup(p.close)
	pc, err := p.get(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.conn.Close() })
	var serr error
	err = pc.raw.Control(func(fd uintptr) { // pc.conn is a rawsock.Conn
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
	})
	if err := errors.Join(err, serr); err != nil {
		t.Fatal(err)
	}
	up, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	pc.limit = maxResponseHead // as roundTrip sets it
	return pc, up
}

// A head far larger than both socket buffers leaves send's own write short;
// the rest goes out whole and in order, and the answer is then read.
func TestSendDeliversAHeadLargerThanTheSocketBuffers(t *testing.T) {
	pc, up := sendPair(t)
	head := bytes.Repeat([]byte("X-Filler: 0123456789abcdef\r\n"), (1<<20)/28)
	pc.head.Write(head)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(head))
		_, err := io.ReadFull(up, b)
		if err != nil {
			b = nil
		}
		got <- b
		up.Write([]byte("answer"))
	}()
	pc.armRead(testTimeout, time.Time{})
	n, err := pc.send()
	if err != nil || n != len(head) {
		t.Fatalf("send: %d of %d bytes, %v", n, len(head), err)
	}
	if b := <-got; !bytes.Equal(b, head) {
		t.Fatalf("the upstream got %d bytes, not the head as written", len(b))
	}
	ans := make([]byte, 6)
	if _, err := io.ReadFull(pc.br, ans); err != nil || string(ans) != "answer" {
		t.Fatalf("answer %q, %v", ans, err)
	}
	if pc.head.Len() != 0 || pc.head.Cap() > maxKeptHead {
		t.Fatalf("send left the head buffer at %d bytes, %d capacity", pc.head.Len(), pc.head.Cap())
	}
	// The next head goes through the same writer into the same field.
	pc.bw.WriteString("GET /next HTTP/1.1\r\n\r\n")
	pc.bw.Flush()
	if pc.head.String() != "GET /next HTTP/1.1\r\n\r\n" {
		t.Fatalf("the head buffer holds %q after a release", pc.head.String())
	}
}

// send returns once the answer is there, and the answer is read whole.
func TestSendReturnsWithTheAnswerReadable(t *testing.T) {
	pc, up := sendPair(t)
	pc.head.WriteString("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	go func() {
		b := make([]byte, 27)
		if _, err := io.ReadFull(up, b); err == nil {
			up.Write([]byte("HTTP/1.1 204 No Content\r\n\r\n"))
		}
	}()
	pc.armRead(testTimeout, time.Time{})
	if _, err := pc.send(); err != nil {
		t.Fatal(err)
	}
	line, err := pc.br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 204 No Content\r\n" {
		t.Fatalf("read %q, %v", line, err)
	}
}

// A silent upstream: send's wait ends at the read deadline, and the read
// that follows reports the timeout (the exchange's idle-read limit).
func TestSendWaitEndsAtTheReadDeadline(t *testing.T) {
	pc, up := sendPair(t)
	pc.head.WriteString("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	pc.armRead(50*time.Millisecond, time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := pc.send()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("send: %v, want the head written", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("send waited past the read deadline")
	}
	var ne net.Error
	if _, err := pc.br.ReadByte(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read after the deadline: %v, want a timeout", err)
	}
	b := make([]byte, 27)
	if _, err := io.ReadFull(up, b); err != nil {
		t.Fatalf("the upstream did not get the head: %v", err)
	}

	// A deadline already past does not keep the head from going out (the
	// answer's read times out, not the write: nothing is retried).
	pc.head.WriteString("GET / HTTP/1.1\r\nHost: y\r\n\r\n")
	pc.armRead(testTimeout, time.Now().Add(-time.Second)) // a total already past
	if _, err := pc.send(); err != nil {
		t.Fatalf("send after the deadline: %v", err)
	}
	if _, err := io.ReadFull(up, b); err != nil || !bytes.Contains(b, []byte("Host: y")) {
		t.Fatalf("the upstream got %q, %v", b, err)
	}
}

// The client leaving (cancel from another goroutine) ends send's wait at
// once; a connection canceled before send writes nothing.
func TestSendIsCanceled(t *testing.T) {
	pc, up := sendPair(t)
	pc.head.WriteString("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	pc.armRead(testTimeout, time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := pc.send()
		done <- err
	}()
	b := make([]byte, 27)
	if _, err := io.ReadFull(up, b); err != nil {
		t.Fatal(err)
	}
	pc.cancel()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("cancel did not end send's wait")
	}
	if _, err := pc.br.ReadByte(); err == nil {
		t.Fatal("a canceled exchange read a byte")
	}

	pc2, up2 := sendPair(t)
	pc2.cancel()
	pc2.head.WriteString("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if n, err := pc2.send(); err == nil || n != 0 {
		t.Fatalf("send on a canceled connection: %d bytes, %v", n, err)
	}
	pc2.conn.Close()
	if n, _ := io.Copy(io.Discard, up2); n != 0 {
		t.Fatalf("the upstream got %d bytes from a canceled exchange", n)
	}
}

// deadlineCount counts the read deadlines set on a connection.
type deadlineCount struct {
	net.Conn
	n int
}

func (c *deadlineCount) SetReadDeadline(t time.Time) error {
	c.n++
	return c.Conn.SetReadDeadline(t)
}

// Back-to-back exchanges on one pooled connection keep the read deadline
// the first one armed (it still grants each wait the whole idle read), so
// the runtime timer is not re-armed per request.
func TestExchangesKeepTheReadDeadline(t *testing.T) {
	pc, up := sendPair(t)
	cc := &deadlineCount{Conn: pc.conn}
	pc.conn = cc
	const n = 3
	go func() {
		br := bufio.NewReader(up)
		for range n {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			req.Body.Close()
			up.Write([]byte("HTTP/1.1 204 No Content\r\n\r\n"))
		}
	}()
	f := &forwarder{limits: DefaultLimits()}
	for i := range n {
		out := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/"}, Host: "up", Header: http.Header{}}
		resp, err := f.roundTrip(nil, pc, out, new(responseSlot), time.Now().Add(f.limits.UpstreamTotal))
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("exchange %d: %v, %v", i, resp, err)
		}
	}
	if cc.n != 1 {
		t.Fatalf("%d exchanges set the read deadline %d times, want once", n, cc.n)
	}
}
