package msgconn

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/rawsock"
	"github.com/hermes-securelink/securelink/internal/rawsock/rawsocktest"
)

// tcpPair is a real loopback TCP connection: a (the side under test) and b.
func tcpPair(t *testing.T) (a, b net.Conn) {
	ac, bc := rawsocktest.TCPPair(t)
	return ac, bc
}

type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// Held writes leave in one write, in order, and a write by another
// goroutine meanwhile (a pong) leaves with them, whole.
func TestBatchConnGathersHeldWritesInOrder(t *testing.T) {
	a, b := tcpPair(t)
	cc := &countingConn{Conn: a}
	bc := NewBatchConn(cc)
	var want bytes.Buffer
	bc.Hold()
	for i := 0; i < 16; i++ {
		chunk := bytes.Repeat([]byte{byte('a' + i)}, 4096)
		want.Write(chunk)
		if _, err := bc.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	pong := []byte("PONG")
	done := make(chan struct{})
	go func() { bc.Write(pong); close(done) }()
	<-done // joins the batch: it does not wait for the Release
	want.Write(pong)
	if n := cc.writes.Load(); n != 0 {
		t.Fatalf("%d writes before Release", n)
	}
	if err := bc.Release(); err != nil {
		t.Fatal(err)
	}
	if n := cc.writes.Load(); n != 1 {
		t.Fatalf("%d writes for one held batch, want 1", n)
	}
	// Not held: straight through.
	tail := []byte("tail")
	bc.Write(tail)
	want.Write(tail)
	if n := cc.writes.Load(); n != 2 {
		t.Fatalf("%d writes after an unheld write, want 2", n)
	}
	got := make([]byte, want.Len())
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatal("bytes arrived out of order or changed")
	}
	if bc.buf != nil {
		t.Fatal("an empty batch still holds its buffer")
	}
}

// A batch the peer never reads blocks its Release, but a write that arrives
// meanwhile (TLS's close alert) returns at once and Close ends the stuck
// write.
func TestBatchConnCloseDoesNotWaitForAStuckBatch(t *testing.T) {
	a, _ := tcpPair(t) // b never reads
	bc := NewBatchConn(a)
	big := make([]byte, 8<<20) // beyond both socket buffers
	released := make(chan error, 1)
	go func() {
		bc.Hold()
		bc.Write(big)
		released <- bc.Release()
	}()
	waitUntil(t, func() bool {
		bc.mu.Lock()
		defer bc.mu.Unlock()
		return bc.flushing
	})
	wrote := make(chan struct{})
	go func() { bc.Write([]byte("alert")); close(wrote) }()
	select {
	case <-wrote:
	case <-time.After(5 * time.Second):
		t.Fatal("a write waited behind a stuck batch")
	}
	bc.Close()
	select {
	case err := <-released:
		if err == nil {
			t.Fatal("the stuck batch reported success after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the stuck batch")
	}
	if _, err := bc.Write([]byte("x")); err == nil {
		t.Fatal("a write after a failed batch succeeded")
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached")
}

// A batched message to a peer that stopped reading fails once its context
// ends, like an unbatched one: the last batch, written after the library
// returned, is cut with the socket instead of blocking forever.
func TestBatchedWriteToAStuckPeerEndsWithItsContext(t *testing.T) {
	stuck := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		<-stuck // never reads
		c.CloseNow()
	}))
	defer srv.Close()
	defer close(stuck)
	var bc *BatchConn
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		bc = NewBatchConn(raw)
		return bc, nil
	}}}
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	w := FromWebSocket(ws, "peer")
	w.SetBatch(bc)
	msg := make([]byte, 200<<10) // below the batch limit: only the last batch writes
	failed := make(chan error, 1)
	go func() {
		for i := 0; i < 1000; i++ { // 200 MB: far beyond both socket buffers
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			err := w.Write(ctx, Binary, msg)
			cancel()
			if err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	}()
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("200 MB went to a peer that reads nothing")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a write to a stuck peer outlived its context")
	}
}

// Once a read filled what was asked, one read(2) takes what the socket
// holds, so Reads after it are served without the socket (here: after its
// read deadline passed); drained, the BatchConn holds no buffer, and the
// deadline and EOF apply again.
func TestBatchConnReadsAhead(t *testing.T) {
	a, b := tcpPair(t)
	bc := NewBatchConn(b)
	msg := make([]byte, 64<<10)
	for i := range msg {
		msg[i] = byte(i % 253)
	}
	if _, err := a.Write(msg); err != nil {
		t.Fatal(err)
	}
	a.Close() // loopback: the bytes and the FIN are queued at b now
	got := make([]byte, 0, len(msg))
	p := make([]byte, 1<<10)
	// The first read is plain; it fills p, so the second reads ahead.
	for i := 0; i < 2; i++ {
		n, err := bc.Read(p)
		if err != nil || n == 0 {
			t.Fatalf("read %d: %d, %v", i, n, err)
		}
		got = append(got, p[:n]...)
	}
	if err := bc.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	for len(got) < len(msg) {
		n, err := bc.Read(p)
		if err != nil {
			t.Fatalf("after %d bytes: %v (the rest was not read ahead)", len(got), err)
		}
		got = append(got, p[:n]...)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("bytes differ")
	}
	if bc.ahead != nil {
		t.Fatal("a drained BatchConn still holds its read-ahead buffer")
	}
	var ne net.Error
	if _, err := bc.Read(p); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	bc.SetReadDeadline(time.Time{})
	if n, err := bc.Read(p); n != 0 || err != io.EOF {
		t.Fatalf("read at the end: %d, %v, want io.EOF", n, err)
	}
	if bc.ahead != nil {
		t.Fatal("EOF left a read-ahead buffer held")
	}
}

// A socket of small messages keeps plain reads: a read that did not fill
// what was asked turns read-ahead off, and so does a read-ahead that
// brought no more than was asked.
func TestBatchConnSmallReadsStayPlain(t *testing.T) {
	a, b := tcpPair(t)
	bc := NewBatchConn(b)
	p := make([]byte, 1<<10)
	steps := []struct {
		size int
		bulk bool // read-ahead on after this message
	}{
		{1 << 10, true},  // a plain read that filled p
		{100, false},     // a read-ahead that brought less than asked
		{1 << 10, true},  // plain, full again
		{1 << 10, false}, // a read-ahead that brought exactly what was asked
		{100, false},     // plain, short
	}
	for i, st := range steps {
		size := st.size
		if _, err := a.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		// Loopback: the bytes are queued at b once Write returns.
		if n, err := bc.Read(p); err != nil || n != size {
			t.Fatalf("message %d: %d, %v", i, n, err)
		}
		if bc.bulk != st.bulk {
			t.Fatalf("message %d of %d bytes: read-ahead %v, want %v", i, size, bc.bulk, st.bulk)
		}
		if bc.ahead != nil {
			t.Fatalf("message %d: a buffer is held with nothing left to read", i)
		}
	}
}

// A BatchConn moves its socket's bytes with raw system calls through the
// socket's RawConn, never through the connection's Read and Write, which
// tell the runtime of every call (entersyscall: after each idle spell the
// first one woke the runtime's monitor thread, a futex and a context
// switch per small message on the broker). Small messages both ways, a
// held batch larger than the socket buffers (the write waits for the
// poller until the peer reads), and the deadlines, which still apply (EOF:
// TestBatchConnReadsAhead).
func TestBatchConnMovesBytesWithRawCalls(t *testing.T) {
	a, b := tcpPair(t)
	sc := &rawsocktest.Counted{TCPConn: b.(*net.TCPConn)}
	bc := NewBatchConn(sc)
	rawsocktest.Exchange(t, a, bc, 100)
	p := make([]byte, 1<<10)
	big := make([]byte, 16<<20) // more than both socket buffers hold
	for i := range big {
		big[i] = byte(i % 251)
	}
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the batch's write finds the socket full
		buf := make([]byte, len(big))
		io.ReadFull(a, buf)
		got <- buf
	}()
	bc.Hold()
	for off := 0; off < len(big); off += 16 << 10 {
		if _, err := bc.Write(big[off : off+16<<10]); err != nil {
			t.Fatal(err)
		}
	}
	if err := bc.Release(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(<-got, big) {
		t.Fatal("the peer read other bytes than the batch's")
	}
	bc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var ne net.Error
	if _, err := bc.Read(p); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read with nothing sent, past the deadline: %v, want a timeout", err)
	}
	bc.SetReadDeadline(time.Time{})
	bc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	var werr error
	for werr == nil { // the peer reads no more: the socket fills
		_, werr = bc.Write(big)
	}
	if !errors.As(werr, &ne) || !ne.Timeout() {
		t.Fatalf("write to a full socket past the deadline: %v, want a timeout", werr)
	}
	if r, w := sc.Reads.Load(), sc.Writes.Load(); r != 0 || w != 0 {
		t.Errorf("%d Read and %d Write calls on the connection, want none: the bytes moved through them", r, w)
	}
}

// waitWatch is a real TCP connection whose RawConn counts the calls of
// its Read (the raw path's read steps and waits go through it) and says on
// waiting when a step asks to wait for the poller.
type waitWatch struct {
	*net.TCPConn
	calls   atomic.Int64
	waiting chan struct{}
}

func (c *waitWatch) SyscallConn() (syscall.RawConn, error) {
	rc, err := c.TCPConn.SyscallConn()
	return watchedRaw{RawConn: rc, w: c}, err
}

type watchedRaw struct {
	syscall.RawConn
	w *waitWatch
}

func (r watchedRaw) Read(f func(fd uintptr) bool) error {
	r.w.calls.Add(1)
	return r.RawConn.Read(func(fd uintptr) bool {
		if f(fd) {
			return true
		}
		select {
		case r.w.waiting <- struct{}{}:
		default:
		}
		return false
	})
}

// A busy socket's read waits for its bytes as the plain connection's
// does, in one call into the RawConn (no ppoll(2) around the poller's
// wait, no second read call); a new socket's read, and one after a read
// that waited longer than quietAfter, waits holding nothing: the empty
// read, the stateless wait and the read, three calls. A busy socket's
// waiting read still ends with Close.
func TestBatchConnBusySocketWaitsOnThePoller(t *testing.T) {
	if !rawsock.Enabled {
		t.Skip("no raw socket path on this system")
	}
	// Long enough that a descheduled read on a loaded machine still
	// counts as quick, short enough for the "goes quiet" step below.
	defer func(d time.Duration) { quietAfter = d }(quietAfter)
	quietAfter = 200 * time.Millisecond
	a, b := tcpPair(t)
	w := &waitWatch{TCPConn: b.(*net.TCPConn), waiting: make(chan struct{}, 1)}
	bc := NewBatchConn(w)
	msg := []byte("a small message")
	p := make([]byte, 1<<10)
	// read is one Read of msg, which the peer sends once the read waits
	// (and pause after that): the calls into the RawConn it made.
	read := func(step string, pause time.Duration) int64 {
		t.Helper()
		select { // a wait signalled and not consumed (a spurious wake-up)
		case <-w.waiting:
		default:
		}
		sent := make(chan error, 1)
		go func() {
			<-w.waiting
			time.Sleep(pause)
			_, err := a.Write(msg)
			sent <- err
		}()
		c0 := w.calls.Load()
		n, err := bc.Read(p)
		if err != nil || !bytes.Equal(p[:n], msg) {
			t.Fatalf("%s: read %q, %v", step, p[:n], err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		return w.calls.Load() - c0
	}
	// busy makes the socket busy: busyAfter reads of bytes already there,
	// each returning at once.
	busy := func() {
		t.Helper()
		for range busyAfter {
			if _, err := a.Write(msg); err != nil {
				t.Fatal(err)
			}
			if n, err := bc.Read(p); err != nil || !bytes.Equal(p[:n], msg) {
				t.Fatalf("read %q, %v", p[:n], err)
			}
		}
	}
	if c := read("new socket", 0); c != 3 {
		t.Fatalf("a new socket's read that waited made %d calls into the RawConn, want 3 (the stateless wait)", c)
	}
	busy()
	if c := read("busy", 0); c != 1 {
		t.Fatalf("a busy socket's read that waited made %d calls into the RawConn, want 1 (a wait on the poller holding its op)", c)
	}
	read("goes quiet", 3*quietAfter)
	if c := read("quiet", 0); c != 3 {
		t.Fatalf("a quiet socket's read that waited made %d calls into the RawConn, want 3 (the stateless wait)", c)
	}
	// Busy again, then Close while a read waits.
	busy()
	ended := make(chan error, 1)
	go func() {
		_, err := bc.Read(p)
		ended <- err
	}()
	<-w.waiting
	bc.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a waiting read on a closed socket: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a busy socket's waiting read did not end with Close")
	}
}

// A BatchConn above TLS (NewBatchConnAbove) writes and reads through the
// connection it wraps even when that connection exposes a socket's
// RawConn: raw system calls there would send its plaintext past TLS.
func TestBatchConnAboveTLSUsesTheConnection(t *testing.T) {
	a, b := tcpPair(t)
	sc := &rawsocktest.Counted{TCPConn: b.(*net.TCPConn)} // a wrapper exposing SyscallConn
	under := NewBatchConn(sc)
	plain := NewBatchConnAbove(sc, under)
	go io.Copy(a, a)
	plain.Hold()
	if _, err := plain.Write([]byte("gathered above TLS")); err != nil {
		t.Fatal(err)
	}
	if err := plain.Release(); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 64)
	plain.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := io.ReadAtLeast(plain, p, len("gathered above TLS"))
	if err != nil || string(p[:n]) != "gathered above TLS" {
		t.Fatalf("echo: %q %v", p[:n], err)
	}
	if sc.Writes.Load() == 0 || sc.Reads.Load() == 0 {
		t.Fatalf("%d writes and %d reads through the wrapped connection: the BatchConn above TLS made raw system calls", sc.Writes.Load(), sc.Reads.Load())
	}
}

// A peer that stops reading while it sends pings must not grow the batch
// by a pong per ping: writes that arrive during a stuck flush return at
// once (TLS's close alert must not wait), so before the bound the pongs
// piled up in memory, ~6 bytes per 2-byte ping, until the write timeout.
// Both ways a socket is made (Accept and Dial; both answer pings with
// answerPing).
func TestPingFloodDuringAStuckBatchIsBounded(t *testing.T) {
	t.Run("accepted", func(t *testing.T) {
		l := listenTCP(t)
		got := serveBatched(t, batchListener{l})
		peer, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer peer.Close()
		fmt.Fprintf(peer, "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(peer), nil)
		if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", res, err)
		}
		w := <-got
		done := make(chan struct{})
		// Masked empty pings, as a client sends them.
		stuckBatchStaysBounded(t, w, w.batch, done, func() { floodPings(peer, []byte{0x89, 0x80, 1, 2, 3, 4}, done) })
	})
	t.Run("dialed", func(t *testing.T) {
		l := listenTCP(t)
		peer := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				close(peer)
				return
			}
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err != nil {
				c.Close()
				close(peer)
				return
			}
			sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
			fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(sum[:]))
			peer <- c
		}()
		raw, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		bc := NewBatchConn(raw)
		hc := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return bc, nil }}}
		w, _, err := Dial(context.Background(), "ws://"+l.Addr().String()+"/", &websocket.DialOptions{HTTPClient: hc}, "peer")
		if err != nil {
			t.Fatal(err)
		}
		c := <-peer
		if c == nil {
			t.Fatal("no upgrade")
		}
		defer c.Close()
		w.SetBatch(bc)
		done := make(chan struct{})
		stuckBatchStaysBounded(t, w, bc, done, func() { floodPings(c, []byte{0x89, 0x00}, done) })
	})
}

type batchKey struct{}

// serveBatched serves l, whose connections are BatchConns, and hands out
// every socket it accepts, with its writes through its BatchConn, as the
// broker does.
func serveBatched(t *testing.T, l net.Listener) <-chan *WebSocket {
	got := make(chan *WebSocket, 1)
	srv := &http.Server{
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, batchKey{}, c)
		},
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			w, err := Accept(rw, r, nil, "peer")
			if err != nil {
				return
			}
			w.SetBatch(r.Context().Value(batchKey{}).(*BatchConn))
			got <- w
			<-r.Context().Done()
		}),
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return got
}

// batchListener hands every accepted connection out as a BatchConn, as the
// broker's listener does.
type batchListener struct{ net.Listener }

func (l batchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return NewBatchConn(c), nil
}

func listenTCP(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// floodPings is the peer: it writes ping frames, never reading, as fast as
// the socket takes them (at most 2M, or until a write waits 2 s).
func floodPings(peer net.Conn, ping []byte, done chan<- struct{}) {
	defer close(done)
	chunk := bytes.Repeat(ping, 64<<10/len(ping))
	for i := 0; i < 64; i++ {
		peer.SetWriteDeadline(time.Now().Add(2 * time.Second))
		if _, err := peer.Write(chunk); err != nil {
			return
		}
	}
}

// stuckBatchStaysBounded is the side under test: it reads (answering the
// pings) and writes 200 KiB messages, each held and released after the
// library's write, until a Release is stuck on the peer that never reads;
// then flood runs, and once it ended the bytes waiting in bc are checked.
func stuckBatchStaysBounded(t *testing.T, w *WebSocket, bc *BatchConn, done <-chan struct{}, flood func()) {
	t.Helper()
	defer w.CloseNow()
	go func() {
		for {
			if _, _, err := w.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	go func() {
		msg := make([]byte, 200<<10) // below the batch limit: the flush runs in Release
		for w.Write(context.Background(), Binary, msg) == nil {
		}
	}()
	waitUntil(t, func() bool {
		bc.mu.Lock()
		defer bc.mu.Unlock()
		return bc.flushing
	})
	go flood()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the peer's pings did not end")
	}
	time.Sleep(500 * time.Millisecond) // the reader answers what arrived
	bc.mu.Lock()
	var queued int
	if bc.buf != nil {
		queued = len(*bc.buf)
	}
	flushing := bc.flushing
	bc.mu.Unlock()
	t.Logf("%d bytes wait behind the stuck batch", queued)
	if !flushing {
		t.Fatal("the batch is no longer stuck: the peer read")
	}
	if queued > 64<<10 {
		t.Fatalf("%d bytes of pongs gathered behind a stuck batch: unbounded", queued)
	}
}
