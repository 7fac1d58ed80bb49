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

func TestReadMessage(t *testing.T) {
	const limit = 3000
	sizes := []int{0, 1, 511, 512, 513, 1024, 2048, limit - 1, limit, limit + 1, limit + 2, 2 * limit}
	readers := map[string]func([]byte) io.Reader{
		"whole":    func(p []byte) io.Reader { return bytes.NewReader(p) },
		"one byte": func(p []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(p)) },
		"data+EOF": func(p []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(p)) },
	}
	for name, mk := range readers {
		for _, start := range []int{0, 512, 1024} {
			for _, n := range sizes {
				msg := bytes.Repeat([]byte{'m'}, n)
				for i := range msg {
					msg[i] = byte(i)
				}
				got, err := readMessage(mk(msg), make([]byte, 0, start), limit)
				if err != nil {
					t.Fatalf("%s/%d/%d: %v", name, start, n, err)
				}
				want := msg[:min(n, limit+1)]
				if !bytes.Equal(got, want) {
					t.Fatalf("%s/%d/%d: got %d bytes, want %d", name, start, n, len(got), len(want))
				}
				if int64(cap(got)) > limit+1 && cap(got) > start {
					t.Fatalf("%s/%d/%d: buffer grew to %d, past limit+1", name, start, n, cap(got))
				}
			}
		}
	}
	// A buffer larger than the limit (pooled, small MaxMessageBytes) still
	// reads no more than limit+1 bytes.
	src := &countingReader{r: bytes.NewReader(make([]byte, 5000))}
	got, err := readMessage(src, make([]byte, 0, 1024), 100)
	if err != nil || len(got) != 101 || src.n != 101 {
		t.Fatalf("small limit: %d bytes returned, %d read, err %v; want 101 and 101", len(got), src.n, err)
	}
	// A message that exactly fills the buffer is not copied to find its end.
	buf := make([]byte, 0, 1024)
	got, err = readMessage(bytes.NewReader(make([]byte, 1024)), buf, limit)
	if err != nil || len(got) != 1024 || &got[0] != &buf[:1][0] {
		t.Fatalf("exact fit: %d bytes, err %v, same buffer %v", len(got), err, err == nil && &got[0] == &buf[:1][0])
	}
	// Read errors are returned as they are.
	boom := errors.New("boom")
	if _, err := readMessage(iotest.ErrReader(boom), nil, limit); !errors.Is(err, boom) {
		t.Fatalf("error: %v", err)
	}
	if _, err := readMessage(io.MultiReader(strings.NewReader(strings.Repeat("x", 600)), iotest.ErrReader(boom)), nil, limit); !errors.Is(err, boom) {
		t.Fatalf("error after data: %v", err)
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
func TestBridgeSmallMessageLimit(t *testing.T) {
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
