package relay

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// The frame forwarder's fast path: headers parsed in place in the read
// buffer, the data frames a read brought in whole forwarded in one write,
// and a write deadline moved only when it runs short. These tests hold it
// to the same frame and message rules as the rest of the bridge.

// countingConn counts the writes and write-deadline changes made on a
// connection.
type countingConn struct {
	net.Conn
	writes    atomic.Int64
	deadlines atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func (c *countingConn) SetWriteDeadline(t time.Time) error {
	c.deadlines.Add(1)
	return c.Conn.SetWriteDeadline(t)
}

// tcpPair is a connected loopback TCP pair, closed when the test ends.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if b, err = ln.Accept(); err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// burstResult is what forwarding one burst of client frames gave.
type burstResult struct {
	msgs   []fuzzMsg
	err    error
	writes int64 // writes on the destination leg
	pongs  int   // pong frames sent back to the client
}

// forwardBurst writes wire (client frames) in one write to a client leg
// whose read buffer holds it whole, forwards its frames the way a pump in
// frame mode does, and reports what a reader of the forwarded bytes got.
func forwardBurst(t *testing.T, wire []byte, limit int64) burstResult {
	t.Helper()
	peer, conn := tcpPair(t)
	if _, err := peer.Write(wire); err != nil {
		t.Fatal(err)
	}
	_ = peer.(*net.TCPConn).CloseWrite()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(abruptEOFConn{conn}, 4096)
	// The whole burst is in the read buffer before the first header is read.
	if _, err := br.Peek(min(len(wire), 4096)); err != nil {
		t.Fatalf("burst not buffered: %v", err)
	}
	src := newLeg(abruptEOFConn{conn}, br, true, "client", 10*time.Second)
	var res burstResult
	res.msgs, res.writes, res.err = forwardAllCounted(src, limit)
	_ = conn.Close()
	// What came back to the client: pongs only.
	back, _ := io.ReadAll(peer)
	far := newLeg(nil, bufio.NewReader(bytes.NewReader(back)), false, "back", time.Second)
	for {
		h, err := far.readHeader()
		if err != nil {
			break
		}
		if h.op != opPong {
			t.Fatalf("the client got frame op %#x, want pongs only", h.op)
		}
		res.pongs++
		_, _ = far.br.Discard(int(h.length))
	}
	return res
}

func textFrame(fin bool, op byte, payload string) []byte {
	f := clientFrame(op, []byte(payload))
	if !fin {
		f[0] &^= 0x80
	}
	return f
}

func cat(frames ...[]byte) []byte { return bytes.Join(frames, nil) }

// A burst of client frames is forwarded in as few writes as its control
// frames allow, byte for byte, and stops at the first frame the rules
// refuse: the frames before it arrive, the error is the one the frame path
// reports for that frame on its own (FuzzFrameHeaders compares both against
// one model over arbitrary bursts).
func TestForwardFramesBurst(t *testing.T) {
	const limit = 100
	rsv := textFrame(true, opText, "r")
	rsv[0] |= 0x40
	big := string(bytes.Repeat([]byte{'z'}, 5000)) // past the 4 KiB read buffer
	for _, tc := range []struct {
		name      string
		wire      []byte
		msgs      []string
		tooBig    bool
		protocol  bool
		maxWrites int64
		pongs     int
	}{
		{"three frames, two messages", cat(textFrame(true, opText, "one"), textFrame(false, opBinary, "tw"), textFrame(true, opContinuation, "o")),
			[]string{"one", "two"}, false, false, 1, 0},
		{"a ping between frames", cat(textFrame(true, opText, "a"), textFrame(true, opPing, "p"), textFrame(true, opText, "b")),
			[]string{"a", "b"}, false, false, 2, 1},
		{"a message over the limit across fragments", cat(textFrame(true, opText, "ok"), textFrame(false, opText, string(bytes.Repeat([]byte{'x'}, 60))),
			textFrame(true, opContinuation, string(bytes.Repeat([]byte{'y'}, 60)))),
			[]string{"ok"}, true, false, 1, 0},
		{"a continuation outside a message", cat(textFrame(true, opText, "a"), textFrame(true, opContinuation, "b")),
			[]string{"a"}, false, true, 1, 0},
		{"a new message inside a fragmented one", cat(textFrame(false, opText, "a"), textFrame(true, opText, "b")),
			nil, false, true, 1, 0},
		{"reserved bits", cat(textFrame(true, opText, "a"), rsv), []string{"a"}, false, true, 1, 0},
		{"a frame the buffer does not hold whole", cat(textFrame(true, opText, "a"), textFrame(true, opBinary, big), textFrame(true, opText, "c")),
			[]string{"a", big, "c"}, false, false, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := int64(limit)
			if tc.name == "a frame the buffer does not hold whole" {
				lim = 8192
			}
			got := forwardBurst(t, tc.wire, lim)
			if len(got.msgs) != len(tc.msgs) {
				t.Fatalf("%d messages then %v, want %d", len(got.msgs), got.err, len(tc.msgs))
			}
			for i, m := range tc.msgs {
				if string(got.msgs[i].data) != m {
					t.Fatalf("message %d: %.40q, want %.40q", i, got.msgs[i].data, m)
				}
			}
			var perr errProtocol
			switch {
			case tc.tooBig && !errors.Is(got.err, errTooBig):
				t.Fatalf("ended with %v, want errTooBig", got.err)
			case tc.protocol && !errors.As(got.err, &perr):
				t.Fatalf("ended with %v, want a protocol error", got.err)
			case !tc.tooBig && !tc.protocol && !errors.Is(got.err, io.ErrUnexpectedEOF):
				t.Fatalf("ended with %v, want the stream's end", got.err)
			}
			if got.writes > tc.maxWrites {
				t.Fatalf("%d writes for the burst, want at most %d: frames buffered whole go out together", got.writes, tc.maxWrites)
			}
			if got.pongs != tc.pongs {
				t.Fatalf("%d pongs, want %d", got.pongs, tc.pongs)
			}
		})
	}
}

// Through the whole bridge: frames the Relay sends in one burst reach the
// client in one TLS record (one write on the client leg), byte for byte.
func TestBridgeForwardsARelayBurstInOneRecord(t *testing.T) {
	reply := cat(serverFrame(0x80|opText, []byte("one")), serverFrame(opBinary, []byte("tw")),
		serverFrame(0x80|opContinuation, []byte("o")), serverFrame(0x80|opText, bytes.Repeat([]byte{'x'}, 1000)))
	ask := clientFrame(opText, []byte("go"))
	rr := newRawRelay(t, len(ask), reply)
	u, _ := url.Parse(rr.srv.URL)
	b := newBridge(t, Options{Upstream: u, DialTimeout: 3 * time.Second})
	mux := http.NewServeMux()
	mux.Handle("/relay/ws", b)
	front := httptest.NewUnstartedServer(mux)
	front.StartTLS()
	t.Cleanup(front.Close)

	conn, err := tls.Dial("tcp", front.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "GET /relay/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(conn)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	conn.Write(clientFrame(opText, testfake.AuthFrame(testfake.GoodCode)))
	if op, msg := readServerFrame(t, br); op != opText || string(msg) != testfake.AuthOKMsg {
		t.Fatalf("verdict (%d) %q", op, msg)
	}
	if n := br.Buffered(); n != 0 {
		t.Fatalf("%d bytes read ahead of the auth.ok", n)
	}
	conn.Write(ask)
	select {
	case <-rr.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the Relay did not receive the client's frame")
	}
	// One tls.Conn.Read returns at most one record's data.
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:n], reply) {
		if n < len(reply) && bytes.Equal(buf[:n], reply[:n]) {
			t.Fatalf("the first record held %d of the burst's %d bytes: the frames went out one write each", n, len(reply))
		}
		t.Fatalf("the client got %x, want %x", buf[:n], reply)
	}
}

// frameSource repeats one frame forever.
type frameSource struct {
	frame []byte
	off   int
}

func (f *frameSource) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], f.frame[f.off:])
		n += c
		f.off = (f.off + c) % len(f.frame)
	}
	return n, nil
}

// Forwarding a frame allocates nothing: no header, buffer or timer per frame.
func TestForwardFramesAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop buffers at random")
	}
	out, in := tcpPair(t)
	go io.Copy(io.Discard, in)
	for _, size := range []int{10, 1000, 40 << 10} {
		src := newLeg(nil, bufio.NewReaderSize(&frameSource{frame: clientFrame(opBinary, make([]byte, size))}, 512), true, "client", time.Second)
		dst := newLeg(out, nil, false, "relay", 10*time.Second)
		var st msgState
		allocs := testing.AllocsPerRun(200, func() {
			h, err := src.nextDataFrame(&st, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			var c frameCount
			if err := forwardFrames(src, dst, h, &st, 1<<20, &c); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("%d-byte frames: %.1f allocations per frame, want none", size, allocs)
		}
	}
}

// A leg's write deadline is moved when it runs short, not per write; every
// write still gets at least the leg's bound before it fails.
func TestLegWriteDeadline(t *testing.T) {
	out, in := tcpPair(t)
	go io.Copy(io.Discard, in)
	cc := &countingConn{Conn: out}
	l := newLeg(cc, nil, false, "relay", 30*time.Second)
	for range 100 {
		if err := l.writeFrame(opBinary, []byte("frame"), l.wt); err != nil {
			t.Fatal(err)
		}
	}
	if n := cc.deadlines.Load(); n > 2 {
		t.Fatalf("%d write-deadline changes for 100 frames, want the deadline moved only when it runs short", n)
	}
	// Another bound (a close frame's) is its own deadline, and the next
	// ordinary write gets the leg's bound back.
	if err := l.writeFrame(opPing, nil, closeWait); err != nil {
		t.Fatal(err)
	}
	before := cc.deadlines.Load()
	if err := l.writeFrame(opBinary, []byte("frame"), l.wt); err != nil {
		t.Fatal(err)
	}
	if cc.deadlines.Load() != before+1 {
		t.Fatal("the write after a close-bound write kept the close's deadline")
	}

	// A peer that stops reading: the write that blocks fails, after at
	// least the bound.
	stall, quiet := tcpPair(t)
	_ = stall.(*net.TCPConn).SetWriteBuffer(16 << 10)
	_ = quiet.(*net.TCPConn).SetReadBuffer(16 << 10)
	const bound = 300 * time.Millisecond
	sl := newLeg(stall, nil, false, "relay", bound)
	chunk := make([]byte, 64<<10)
	guard := time.Now().Add(20 * time.Second)
	for {
		start := time.Now()
		err := sl.writeFrame(opBinary, chunk, sl.wt)
		if err == nil {
			if time.Now().After(guard) {
				t.Fatal("writes to a peer that reads nothing never blocked")
			}
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the blocked write failed with %v, want its deadline", err)
		}
		if took := time.Since(start); took < bound {
			t.Fatalf("the blocked write failed after %v, before its bound of %v", took, bound)
		}
		break
	}
}

// The Relay's upgrade head is read up to 64 KiB: beyond, the upgrade fails
// (502 to the client) instead of reading on; a head under the bound works.
func TestBridgeRelayUpgradeHeadBound(t *testing.T) {
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pads, _ := strconv.Atoi(r.URL.Query().Get("pads"))
		key := r.Header.Get("Sec-WebSocket-Key")
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		pad := bytes.Repeat([]byte{'a'}, 1000)
		fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n", acceptKey(key))
		for i := range pads {
			if _, err := fmt.Fprintf(conn, "X-Pad-%d: %s\r\n", i, pad); err != nil {
				return
			}
		}
		io.WriteString(conn, "\r\n")
		time.Sleep(time.Second)
	}))
	t.Cleanup(relay.Close)
	u, _ := url.Parse(relay.URL)
	b := newBridge(t, Options{Upstream: u, DialTimeout: 3 * time.Second})
	front := frontFor(t, b, false)
	c, resp, err := dial(t, front, dialOpt{query: "pads=40"})
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("a 40 KB upgrade head: %v %v, want 101", resp, err)
	}
	c.CloseNow()
	_, resp, err = dial(t, front, dialOpt{query: "pads=80"})
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("an 80 KB upgrade head: %v %v, want 502", resp, err)
	}
}
