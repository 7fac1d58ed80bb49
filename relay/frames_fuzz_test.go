package relay

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// The frame path of the bridge: readHeader parses the frame headers and
// nextDataFrame enforces the message rules and the per-message limit across
// fragments, under both modes of a pump: whole messages (nextMessage, before
// the Relay's auth.ok) and frames forwarded as they arrive (forwardFrame,
// after it). FuzzFrameHeaders sends arbitrary client frame sequences over a
// real connection, through the bridge's own handshake, to a server reading
// in each mode, and checks the result against one model of RFC 6455: no
// panic, every message delivered is the one the frames carried and at most
// limit bytes, and a message over the limit is always errTooBig, whatever
// its frames declared. In frame mode "delivered" is what a reader of the
// forwarded byte stream gets: the frames reach the far side unchanged.

// fuzzMaskKey masks every generated client frame.
var fuzzMaskKey = [4]byte{0x37, 0xfa, 0x21, 0x3d}

// Terminal outcomes the model expects after its complete messages.
const (
	endError  = iota // an error that is not errTooBig (protocol error, close, EOF)
	endTooBig        // errTooBig
	endEither        // a frame cut short: errTooBig or another error
)

type fuzzMsg struct {
	typ  websocket.MessageType
	data []byte
}

// fuzzModel is what the server must report for one generated stream.
type fuzzModel struct {
	msgs []fuzzMsg
	end  int
}

// fuzzBudget bounds the payload bytes one input generates.
const fuzzBudget = 64 << 10

// genFrames turns fuzz input into client frames (the wire bytes) and the
// model's expectation for a server reading with the given limit. Each frame
// takes a control byte (FIN, opcode from a table that includes reserved
// ones, now and then RSV bits or no mask) and a length byte choosing the
// declared length and its encoding (minimal, forced 16- or 64-bit, or a huge
// 64-bit value); the payload is generated, and a frame declaring more than
// the budget is cut short, ending the stream.
func genFrames(in []byte, limit int64) ([]byte, fuzzModel) {
	var wire bytes.Buffer
	var m fuzzModel
	next := func() byte {
		if len(in) == 0 {
			return 0
		}
		b := in[0]
		in = in[1:]
		return b
	}
	ops := [8]byte{0x1, 0x2, 0x0, 0x0, 0x9, 0xA, 0x8, 0x3}
	var cur []byte // the fragmented message in progress
	var curTyp websocket.MessageType
	inMsg, invalid := false, false
	budget := fuzzBudget
	for len(in) > 0 && !invalid {
		ctl, lb := next(), next()
		fin := ctl&0x80 != 0
		op := ops[ctl&0x07]
		if ctl&0x40 != 0 && ctl&0x08 != 0 {
			op = 0xB // reserved control opcode
		}
		flags := (ctl >> 3) & 0x07
		rsv := byte(0)
		if flags == 0x07 && ctl&0x40 == 0 {
			rsv = 0x40 >> ((ctl & 0x03) % 3) // RSV1, RSV2 or RSV3
		}
		masked := !(flags == 0x06 && ctl&0x40 == 0)

		var n uint64
		form := lb >> 6
		switch form {
		case 0:
			n = uint64(lb & 0x3F)
		case 1, 2:
			n = uint64(binary.BigEndian.Uint16([]byte{next(), next()})) % uint64(2*limit+3)
		case 3:
			var b [8]byte
			for i := range b {
				b[i] = next()
			}
			n = binary.BigEndian.Uint64(b[:]) | 1<<40 // far beyond any budget
		}
		b0 := rsv | op
		if fin {
			b0 |= 0x80
		}
		var hdr []byte
		var mbit byte
		if masked {
			mbit = 0x80
		}
		switch {
		case form == 0 || (form == 1 && n < 126):
			hdr = []byte{b0, mbit | byte(n)}
		case form == 1 && n < 1<<16:
			hdr = binary.BigEndian.AppendUint16([]byte{b0, mbit | 126}, uint16(n))
		default:
			hdr = binary.BigEndian.AppendUint64([]byte{b0, mbit | 127}, n)
		}
		if masked {
			hdr = append(hdr, fuzzMaskKey[:]...)
		}
		wire.Write(hdr)
		send := n
		cut := false
		if n > uint64(budget) {
			send, cut = uint64(budget), true
		}
		budget -= int(send)
		payload := make([]byte, send)
		seed := next()
		for i := range payload {
			payload[i] = seed + byte(i)
		}
		for i, b := range payload {
			wire.WriteByte(b ^ fuzzMaskKey[i%4])
		}

		// The model, in the order the library checks.
		switch {
		case int64(n) < 0, rsv != 0, !masked:
			invalid = true
		case op >= 0x8: // control frames
			if op > 0xA || !fin || n > 125 || cut {
				invalid = true
			} else if op == 0x8 {
				invalid = true // a close frame ends reading, valid or not
			}
		case op == 0x0 && !inMsg, op != 0x0 && inMsg, op > 0x2:
			invalid = true // continuation without a start, a new message mid-way, reserved
		default:
			if !inMsg {
				inMsg, cur, curTyp = true, nil, websocket.MessageType(op)
			}
			cur = append(cur, payload...)
			if int64(len(cur)) > limit {
				m.end = endTooBig
				return wire.Bytes(), m
			}
			if cut {
				m.end = endEither
				return wire.Bytes(), m
			}
			if fin {
				m.msgs = append(m.msgs, fuzzMsg{curTyp, cur})
				inMsg = false
			}
		}
		if cut && !invalid {
			invalid = true
		}
	}
	m.end = endError
	return wire.Bytes(), m
}

// fuzzResult is what the server read: the messages and how reading ended.
type fuzzResult struct {
	msgs  []fuzzMsg
	err   error
	panic any
}

func FuzzFrameHeaders(f *testing.F) {
	type seed struct {
		frames []byte
		limit  uint16
	}
	for _, s := range []seed{
		{[]byte{0x80, 0x05, 'a'}, 100},                                          // one text frame
		{[]byte{0x00, 0x40, 0x00, 0x40, 'a', 0x82, 0x40, 0x00, 0x40, 'b'}, 100}, // fragments
		{[]byte{0x01, 0x20, 'x', 0x84, 0x03, 'p', 0x82, 0x20, 'y'}, 50},         // ping between fragments
		{[]byte{0x80, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 'z'}, 4096},                 // huge 64-bit length
		{[]byte{0x80, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 'z'}, 4096},              // negative length
		{[]byte{0x80, 0x80, 0x00, 0xFF, 'q'}, 100},                              // forced 64-bit, small
		{[]byte{0x86, 0x02, 0x03, 0xE8}, 10},                                    // close frame
		{[]byte{0xB8, 0x01, 'r'}, 10},                                           // RSV bit set
	} {
		f.Add(s.frames, s.limit)
	}
	results := make(chan fuzzResult, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var res fuzzResult
		defer func() {
			if p := recover(); p != nil {
				res.panic = p
			}
			results <- res
		}()
		limit, _ := strconv.ParseInt(r.URL.Query().Get("limit"), 10, 64)
		// Through the bridge's own handshake, as the client leg reads.
		conn, br, err := acceptClient(w, r, "", 10*time.Second)
		if err != nil {
			res.err = err
			return
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		src := newLeg(conn, br, true, "client", 10*time.Second)
		if r.URL.Query().Get("mode") == "message" {
			for {
				typ, bp, err := src.nextMessage(limit)
				if err != nil {
					res.err = err
					return
				}
				res.msgs = append(res.msgs, fuzzMsg{websocket.MessageType(typ), bytes.Clone(*bp)})
			}
		}
		res.msgs, res.err = forwardAll(src, limit)
	}))
	defer srv.Close()

	f.Fuzz(func(t *testing.T, in []byte, limitSeed uint16) {
		limit := 1 + int64(limitSeed%8192)
		wire, want := genFrames(in, limit)
		for _, mode := range []string{"message", "frame"} {
			conn, br := rawUpgrade(t, srv.Listener.Addr().String(), fmt.Sprintf("/?limit=%d&mode=%s", limit, mode))
			// Pongs come back; drain them so no write blocks.
			go io.Copy(io.Discard, br)
			if _, err := conn.Write(wire); err != nil && !errors.Is(err, net.ErrClosed) {
				t.Logf("write: %v (the server may have closed first)", err)
			}
			_ = conn.CloseWrite()
			checkFuzzResult(t, mode, limit, <-results, want)
		}
	})
}

// forwardAll forwards src's frames (the frame mode) over a real loopback
// connection until src's stream ends, and returns what a reader of the
// forwarded bytes gets: its complete messages, and the error that ended
// the forwarding.
func forwardAll(src *leg, limit int64) ([]fuzzMsg, error) {
	msgs, _, err := forwardAllCounted(src, limit)
	return msgs, err
}

// forwardAllCounted is forwardAll, also counting the writes on the
// forwarded connection.
func forwardAllCounted(src *leg, limit int64) ([]fuzzMsg, int64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, err
	}
	defer ln.Close()
	out, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, 0, err
	}
	in, err := ln.Accept()
	if err != nil {
		out.Close()
		return nil, 0, err
	}
	defer in.Close()
	// The forwarded frames are still masked with the client's key: the far
	// side reads them as a server reads a client.
	far := newLeg(abruptEOFConn{in}, bufio.NewReader(abruptEOFConn{in}), true, "far", 10*time.Second)
	got := make(chan []fuzzMsg, 1)
	go func() {
		var msgs []fuzzMsg
		for {
			typ, bp, err := far.nextMessage(1 << 30)
			if err != nil {
				got <- msgs
				return
			}
			msgs = append(msgs, fuzzMsg{websocket.MessageType(typ), bytes.Clone(*bp)})
		}
	}()
	cc := &countingConn{Conn: out}
	dst := newLeg(cc, nil, false, "relay", 10*time.Second)
	var st msgState
	for {
		h, ferr := src.nextDataFrame(&st, limit)
		if ferr == nil {
			var c frameCount
			ferr = forwardFrames(src, dst, h, &st, limit, &c)
		}
		if ferr != nil {
			out.Close()
			return <-got, cc.writes.Load(), ferr
		}
	}
}

func checkFuzzResult(t *testing.T, mode string, limit int64, got fuzzResult, want fuzzModel) {
	t.Helper()
	if got.panic != nil {
		t.Fatalf("%s mode: panic reading frames: %v", mode, got.panic)
	}
	for i, msg := range got.msgs {
		if int64(len(msg.data)) > limit {
			t.Fatalf("message %d of %d bytes passed a limit of %d", i, len(msg.data), limit)
		}
	}
	if len(got.msgs) != len(want.msgs) {
		t.Fatalf("%s mode, limit %d: read %d messages then %v; the model expects %d then end %d",
			mode, limit, len(got.msgs), got.err, len(want.msgs), want.end)
	}
	for i := range want.msgs {
		if got.msgs[i].typ != want.msgs[i].typ || !bytes.Equal(got.msgs[i].data, want.msgs[i].data) {
			t.Fatalf("%s mode, message %d: got %v %d bytes, want %v %d bytes", mode, i, got.msgs[i].typ, len(got.msgs[i].data),
				want.msgs[i].typ, len(want.msgs[i].data))
		}
	}
	tooBig := errors.Is(got.err, errTooBig)
	switch want.end {
	case endTooBig:
		if !tooBig {
			t.Fatalf("%s mode, limit %d: a message over the limit ended with %v, want errTooBig", mode, limit, got.err)
		}
	case endError:
		if tooBig || got.err == nil {
			t.Fatalf("%s mode, limit %d: ended with %v, want an error other than errTooBig", mode, limit, got.err)
		}
	}
}

// A client that stops sending in the middle of a message (a first fragment,
// then EOF) must not have that fragment forwarded as a whole message: the
// Relay would take it for one. The library alone reads the EOF as the message's
// end.
func TestBridgeDoesNotForwardATruncatedMessage(t *testing.T) {
	bothModes(t, testBridgeDoesNotForwardATruncatedMessage)
}

func testBridgeDoesNotForwardATruncatedMessage(t *testing.T) {
	relay, _, front := setup(t, nil, nil)
	conn, br := rawUpgrade(t, front.Listener.Addr().String(), "/relay/ws")
	conn.Write(clientFrame(0x1, testfake.AuthFrame(testfake.GoodCode)))
	if op, msg := readServerFrame(t, br); op != 0x1 || string(msg) != testfake.AuthOKMsg {
		t.Fatalf("verdict (%d) %q", op, msg)
	}
	fragment := clientFrame(0x1, []byte("half a message"))
	fragment[0] &^= 0x80 // not FIN: more fragments would follow
	conn.Write(fragment)
	conn.CloseWrite()
	if op, msg := readServerFrame(t, br); op != 0x8 {
		t.Fatalf("after a truncated message the client got (%d) %q, want a close frame", op, msg)
	}
	if end := relay.NextEnd(); end.Code != websocket.StatusNoStatusRcvd {
		t.Fatalf("the Relay saw %+v, want a close without status", end)
	}
	if n := relay.Received.Load(); n != 0 {
		t.Fatalf("the Relay received %d messages, want none: the fragment went through as a message", n)
	}
}

// rawUpgrade opens a WebSocket to addr by hand, for tests that write frames
// the library would never send; the connection closes when the test ends.
func rawUpgrade(t *testing.T, addr, target string) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", target)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return c.(*net.TCPConn), br
}
