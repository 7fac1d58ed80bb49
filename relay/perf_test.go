package relay

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// clientFrame is one masked, unfragmented client frame.
func clientFrame(opcode byte, payload []byte) []byte {
	var f []byte
	f = append(f, 0x80|opcode)
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n < 1<<16:
		f = append(f, 0x80|126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	var key [4]byte
	_, _ = rand.Read(key[:])
	f = append(f, key[:]...)
	for i, b := range payload {
		f = append(f, b^key[i%4])
	}
	return f
}

// readServerFrame reads one unmasked, unfragmented server frame.
func readServerFrame(t *testing.T, br *bufio.Reader) (byte, []byte) {
	t.Helper()
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatalf("frame header: %v", err)
	}
	if h[0]&0x80 == 0 || h[1]&0x80 != 0 {
		t.Fatalf("unexpected frame header %x", h)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		_, _ = io.ReadFull(br, b[:])
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		_, _ = io.ReadFull(br, b[:])
		n = binary.BigEndian.Uint64(b[:])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(br, p); err != nil {
		t.Fatalf("frame payload: %v", err)
	}
	return h[0] & 0x0f, p
}

// A client may send frames right behind its upgrade request, before the 101.
// The server has read them into its own buffer by the time the connection is
// hijacked; the bridge's smaller buffers must carry them over, whether they
// fit the small read buffer or not.
func TestBridgeKeepsFramesPipelinedWithTheUpgrade(t *testing.T) {
	bothModes(t, testBridgeKeepsFramesPipelinedWithTheUpgrade)
}

func testBridgeKeepsFramesPipelinedWithTheUpgrade(t *testing.T) {
	for _, size := range []int{10, clientReadBufBytes * 5} {
		_, _, front := setup(t, nil, nil)
		conn, err := net.Dial("tcp", front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
		big := bytes.Repeat([]byte{'p'}, size)
		var req bytes.Buffer
		req.WriteString("GET /relay/ws HTTP/1.1\r\nHost: " + front.Listener.Addr().String() + "\r\n" +
			"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
		req.Write(clientFrame(0x1, testfake.AuthFrame(testfake.GoodCode)))
		req.Write(clientFrame(0x1, big))
		if _, err := conn.Write(req.Bytes()); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		if op, msg := readServerFrame(t, br); op != 0x1 || string(msg) != testfake.AuthOKMsg {
			t.Fatalf("size %d: first message (%d) %q, want auth.ok", size, op, msg)
		}
		if op, msg := readServerFrame(t, br); op != 0x1 || !bytes.Equal(msg, big) {
			t.Fatalf("size %d: echo (%d) of %d bytes, want the %d pipelined bytes", size, op, len(msg), size)
		}
	}
}

// An idle bridged connection costs the front two goroutines (one reader per
// leg): keepalives and write deadlines are timers, and the server's
// connection goroutine is released once the session runs.
func TestBridgeIdleConnectionGoroutines(t *testing.T) {
	_, b, front := setup(t, nil, func(o *Options) {
		// A ping loop written as a goroutine would show up here whatever
		// its interval; a short interval would only add the transient
		// goroutines of firing timers, which a loaded machine piles up.
		o.PingInterval = 10 * time.Second
		o.PongTimeout = 60 * time.Second
		o.WriteTimeout = 2 * time.Second
		o.HandoffTimeout = 2 * time.Second
	})
	// Warm-up: the test servers' own goroutines reach their steady state.
	c0 := mustDial(t, front, dialOpt{})
	testfake.Authenticate(t, c0, testfake.GoodCode)
	time.Sleep(100 * time.Millisecond)
	const n = 10
	base := runtime.NumGoroutine()
	for range n {
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
	}
	waitFor(t, "sessions", func() bool { return b.Active() == n+1 })
	// Per connection: the fake Relay's handler goroutine plus the bridge's.
	const want = n * (1 + 2)
	var got int
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = runtime.NumGoroutine() - base
		if got <= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got > want {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d idle connections added %d goroutines, want at most %d\n%s",
			n, got, want, buf[:runtime.Stack(buf, true)])
	}
	// Still bridging.
	send(t, c0, websocket.MessageText, []byte("still here"))
	if _, msg, err := readMsg(t, c0); err != nil || string(msg) != "still here" {
		t.Fatalf("%q %v", msg, err)
	}
}

// ServeHTTP returns once the session is running, so the server's connection
// goroutine (and the request it holds) does not park for the session's life.
func TestBridgeHandlerReturnsWhileSessionRuns(t *testing.T) {
	relay := testfake.NewRelay(t, nil)
	b := newBridge(t, testOptions(t, relay))
	returned := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.Handle("/relay/ws", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.ServeHTTP(w, r)
		returned <- struct{}{}
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := mustDial(t, srv, dialOpt{})
	testfake.Authenticate(t, c, testfake.GoodCode)
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeHTTP still running while the session is bridged")
	}
	if b.Active() != 1 {
		t.Fatalf("Active = %d, want 1", b.Active())
	}
	send(t, c, websocket.MessageText, []byte("after return"))
	if _, msg, err := readMsg(t, c); err != nil || string(msg) != "after return" {
		t.Fatalf("%q %v", msg, err)
	}
}

// fragmentFrames is msg as masked client frames of at most frag payload
// bytes each (frag 0: one frame).
func fragmentFrames(op byte, msg []byte, frag int) []byte {
	if frag == 0 || len(msg) <= frag {
		return clientFrame(op, msg)
	}
	var out []byte
	for first := true; len(msg) > 0; first = false {
		n := min(frag, len(msg))
		f := clientFrame(0, msg[:n])
		if first {
			f[0] = f[0]&0xF0 | op
		}
		if n < len(msg) {
			f[0] &^= 0x80 // not FIN
		}
		out = append(out, f...)
		msg = msg[n:]
	}
	return out
}

// nextMessage reassembles a message however its frames and the reads below
// cut it, grows its buffer no further than the limit, and refuses one byte
// more than the limit as errTooBig having read no byte past the limit.
func TestNextMessage(t *testing.T) {
	const limit = 3000
	sizes := []int{0, 1, 511, 512, 513, 1024, 2048, limit - 1, limit, limit + 1, 2 * limit}
	readers := map[string]func([]byte) io.Reader{
		"whole":    func(p []byte) io.Reader { return bytes.NewReader(p) },
		"one byte": func(p []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(p)) },
		"data+EOF": func(p []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(p)) },
	}
	for name, mk := range readers {
		for _, frag := range []int{0, 1000, 512} {
			for _, n := range sizes {
				msg := make([]byte, n)
				for i := range msg {
					msg[i] = byte(i)
				}
				wire := fragmentFrames(opBinary, msg, frag)
				src := &countingReader{r: mk(wire)}
				l := newLeg(nil, bufio.NewReaderSize(src, 16), true, "client", time.Second)
				typ, bp, err := l.nextMessage(limit)
				if n > limit {
					if !errors.Is(err, errTooBig) {
						t.Fatalf("%s/%d/%d: %v, want errTooBig", name, frag, n, err)
					}
					// At most the read buffer's 16 bytes of read-ahead past the limit.
					if read := src.n; read > len(wire)-(n-limit)+16 {
						t.Fatalf("%s/%d/%d: read %d bytes of %d, past the limit", name, frag, n, read, len(wire))
					}
					continue
				}
				if err != nil || typ != opBinary || !bytes.Equal(*bp, msg) {
					t.Fatalf("%s/%d/%d: type %d, %d bytes, %v", name, frag, n, typ, len(*bp), err)
				}
				if cap(*bp) > max(limit, pooledBufBytes) {
					t.Fatalf("%s/%d/%d: buffer grew to %d, past the limit", name, frag, n, cap(*bp))
				}
			}
		}
	}
	// Read errors are returned as they are; a stream ending mid-message is
	// never a message.
	boom := errors.New("boom")
	l := newLeg(nil, bufio.NewReader(iotest.ErrReader(boom)), true, "client", time.Second)
	if _, _, err := l.nextMessage(limit); !errors.Is(err, boom) {
		t.Fatalf("error: %v", err)
	}
	half := fragmentFrames(opText, []byte(strings.Repeat("x", 600)), 300)
	l = newLeg(nil, bufio.NewReader(abruptEOF{bytes.NewReader(half[:len(half)/2+10])}), true, "client", time.Second)
	if _, _, err := l.nextMessage(limit); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a message cut short: %v, want io.ErrUnexpectedEOF", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// Under a limit smaller than the pooled message buffer the bridge, not the
// library, still detects the oversize message: both legs get 1009.
func TestBridgeSmallMessageLimit(t *testing.T) { bothModes(t, testBridgeSmallMessageLimit) }

func testBridgeSmallMessageLimit(t *testing.T) {
	for _, size := range []int{1001, 5000} {
		relay, _, front := setup(t, nil, func(o *Options) { o.MaxMessageBytes = 1000 })
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		send(t, c, websocket.MessageText, bytes.Repeat([]byte{'a'}, 1000))
		if _, msg, err := readMsg(t, c); err != nil || len(msg) != 1000 {
			t.Fatalf("1000-byte echo: %d bytes, %v", len(msg), err)
		}
		send(t, c, websocket.MessageText, bytes.Repeat([]byte{'a'}, size))
		_, _, err := readMsg(t, c)
		if got := testfake.EndOf(err); got.Code != websocket.StatusMessageTooBig || got.Reason != "message too big" {
			t.Fatalf("%d bytes: client saw %v, want the bridge's 1009", size, err)
		}
		if got := relay.NextEnd().Code; got != websocket.StatusMessageTooBig {
			t.Fatalf("%d bytes: relay saw close %d, want 1009", size, got)
		}
	}
}
