package client

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// path is a TCP forwarder between the client and the real broker, like a
// route on the way: stall makes it stop forwarding in both directions
// without closing anything (a blackholed or half-open path), and a rate
// throttles the client→broker direction.
type path struct {
	addr    string
	rate    int // client→broker bytes per second; 0: as fast as it goes
	stalled chan struct{}
	once    sync.Once
	done    chan struct{} // the test ended
}

func newPath(t *testing.T, broker string, rate int) *path {
	p := &path{rate: rate, stalled: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { close(p.done) })
	p.addr = testenv.Forward(t, broker, func(client, server net.Conn) {
		// A small receive buffer, so the throttle, not the kernel's
		// buffers, paces the client's writes.
		client.(*net.TCPConn).SetReadBuffer(64 << 10)
		go p.copy(client, server, 0)
		go p.copy(server, client, p.rate)
	})
	return p
}

func (p *path) stall() { p.once.Do(func() { close(p.stalled) }) }

// copy moves bytes from src to dst, at most rate per second on average
// (0: no limit; a late wake-up is made up for), until src ends or the path
// stalls; a stalled path holds what it read.
func (p *path) copy(dst, src net.Conn, rate int) {
	const tick = 10 * time.Millisecond
	buf := make([]byte, 64<<10)
	if rate > 0 {
		buf = make([]byte, max(rate/int(time.Second/tick), 1))
	}
	start, sent := time.Now(), 0
	for {
		if rate > 0 {
			// Wait until the bytes sent so far are due at rate.
			if ahead := time.Duration(sent)*time.Second/time.Duration(rate) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		n, err := src.Read(buf)
		select {
		case <-p.stalled:
			<-p.done
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			sent += n
		}
		if err != nil {
			return
		}
	}
}

// stallConfig is host 0's configuration through p, with a short keepalive
// (the write bound is its pong timeout).
func stallConfig(e *env, p *path, tok wire.Secret, pongTimeout time.Duration) Config {
	cfg := e.config(0, wire.KindRoute, tok)
	cfg.BrokerURL = "wss://" + p.addr + wire.ConnectPath
	cfg.PingInterval = pongTimeout / 5
	cfg.PongTimeout = pongTimeout
	return cfg
}

// counter is a host service that reads everything and hashes it.
type counter struct {
	mu  sync.Mutex
	n   int
	sum chan [32]byte
}

func newCounter(want int) (*counter, func(net.Conn)) {
	k := &counter{sum: make(chan [32]byte, 1)}
	return k, func(c net.Conn) {
		defer c.Close()
		h := sha256.New()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			h.Write(buf[:n])
			k.mu.Lock()
			k.n += n
			got := k.n
			k.mu.Unlock()
			if got == want {
				k.sum <- [32]byte(h.Sum(nil))
			}
			if err != nil {
				return
			}
		}
	}
}

func (k *counter) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n
}

// writeUntilError writes to c until a Write fails (at most 1 GiB) and
// sends the error.
func writeUntilError(c net.Conn) <-chan error {
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for range 1 << 14 {
			if _, err := c.Write(buf); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	return errc
}

// TestStalledPathEndsAWrite: a path to the broker that stops forwarding in
// the middle of an upload fails the client's Write once a fragment has
// made no progress for the pong timeout; before, the write waited inside
// the keepalive's pause until the kernel gave up on the connection
// (~15 minutes of TCP retransmissions).
func TestStalledPathEndsAWrite(t *testing.T) {
	k, sink := newCounter(-1)
	e, _, tok := published(t, nil, wire.KindRoute, sink)
	p := newPath(t, e.addr, 0)
	const pongTimeout = 500 * time.Millisecond
	c := dialConfig(t, stallConfig(e, p, tok, pongTimeout))
	defer c.Close()
	if _, err := c.Write([]byte("through the path")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the first bytes at the host", func() bool { return k.count() == len("through the path") })

	p.stall()
	errc := writeUntilError(c)
	select {
	case err := <-errc:
		if !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("write on a stalled path: %v, want ErrConnectionLost", err)
		}
		// Named as the write watch's cut (msgconn.ErrWriteStalled), not
		// as any other loss of the socket.
		if !strings.Contains(err.Error(), "took no stream bytes") {
			t.Fatalf("write on a stalled path: %v, want the stall named", err)
		}
	case <-time.After(testenv.Step):
		t.Fatalf("a write on a stalled path still blocks %v later (the bound is %v of no progress)", testenv.Step, pongTimeout)
	}
	// The stream is over both ways, so Forward's copy from the broker
	// ends too and resets the local connection.
	c.SetReadDeadline(time.Now().Add(testenv.Step))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("read after the stalled write: %v, want ErrConnectionLost", err)
	}
}

// TestStalledPathKeepsTheWriteDeadline: the caller's write deadline still
// ends a write on a stalled path before the (longer) progress bound, as a
// timeout, and ends the stream.
func TestStalledPathKeepsTheWriteDeadline(t *testing.T) {
	k, sink := newCounter(-1)
	e, _, tok := published(t, nil, wire.KindRoute, sink)
	p := newPath(t, e.addr, 0)
	c := dialConfig(t, stallConfig(e, p, tok, time.Minute))
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the first byte at the host", func() bool { return k.count() == 1 })
	p.stall()
	c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
	errc := writeUntilError(c)
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("write past its deadline on a stalled path: %v", err)
		}
	case <-time.After(testenv.Step):
		t.Fatal("the write deadline did not end a write on a stalled path")
	}
	// The deadline fired inside a message: the stream is over.
	c.SetWriteDeadline(time.Time{})
	testenv.WaitFor(t, "a write after the deadline cut a message to fail", func() bool {
		_, err := c.Write([]byte("y"))
		return err != nil
	})
}

// TestThrottledUploadIsNotCut: a slow but moving path is never cut, even
// when the whole upload (one Write) takes several times the bound. The
// client's send buffer is kept small, as on a slow link (Linux sizes it
// after the path): a writer blocked on a full buffer wakes once about a
// third of it drained, so on loopback's autotuned 4 MiB a throttled path
// moves the writer on only every 2 MiB.
func TestThrottledUploadIsNotCut(t *testing.T) {
	const size = 3 << 20
	k, sink := newCounter(size)
	e, _, tok := published(t, nil, wire.KindRoute, sink)
	p := newPath(t, e.addr, 2<<20) // 2 MiB/s: ~1.5 s for the upload
	const pongTimeout = 500 * time.Millisecond
	cfg := stallConfig(e, p, tok, pongTimeout)
	cfg.WrapOuter = func(c net.Conn) net.Conn {
		raw := c.(*tls.Conn).NetConn().(*msgconn.BatchConn).Conn.(*net.TCPConn)
		if err := raw.SetWriteBuffer(64 << 10); err != nil {
			t.Error(err)
		}
		return c
	}
	c := dialConfig(t, cfg)
	defer c.Close()
	data := make([]byte, size)
	rand.Read(data)
	start := time.Now()
	if n, err := c.Write(data); err != nil || n != size {
		t.Fatalf("throttled upload: wrote %d of %d: %v", n, size, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*testenv.Step)
	defer cancel()
	select {
	case sum := <-k.sum:
		if sum != sha256.Sum256(data) {
			t.Fatal("the host received different bytes")
		}
	case <-ctx.Done():
		t.Fatalf("the host got %d of %d bytes", k.count(), size)
	}
	if d := time.Since(start); d < 2*pongTimeout {
		t.Logf("the upload took %v, not several bounds: the throttle did not hold it back", d)
	}
	if err := c.Close(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
}
