package relay

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// rawRelay is a Relay that speaks WebSocket by hand: it answers the
// bridge's auth frame with auth.ok, then hands the test the next want bytes
// it receives as they are, and sends back reply as they are.
type rawRelay struct {
	srv  *httptest.Server
	got  chan []byte
	want int
}

func newRawRelay(t *testing.T, want int, reply []byte) *rawRelay {
	rr := &rawRelay{got: make(chan []byte, 1), want: want}
	rr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: "+acceptKey(r.Header.Get("Sec-WebSocket-Key"))+"\r\n\r\n")
		br := brw.Reader
		if op, msg := readMaskedFrame(t, br); op != opText || !bytes.Contains(msg, []byte(`"auth"`)) {
			t.Errorf("raw relay: first frame (%d) %q, want the auth message", op, msg)
			return
		}
		conn.Write(serverFrame(0x80|opText, []byte(testfake.AuthOKMsg)))
		buf := make([]byte, rr.want)
		if _, err := io.ReadFull(br, buf); err != nil {
			t.Errorf("raw relay: reading %d bytes: %v", rr.want, err)
			return
		}
		rr.got <- buf
		conn.Write(reply)
		// Until the bridge closes: its close frame is answered.
		for {
			var h [2]byte
			if _, err := io.ReadFull(br, h[:]); err != nil {
				return
			}
			if h[0]&0x0f == opClose {
				conn.Write(serverFrame(0x80|opClose, nil))
				return
			}
			io.CopyN(io.Discard, br, int64(h[1]&0x7f)+4)
		}
	}))
	t.Cleanup(rr.srv.Close)
	return rr
}

// readMaskedFrame reads one masked, unfragmented client frame under 64 KiB.
func readMaskedFrame(t *testing.T, br *bufio.Reader) (byte, []byte) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil || h[1]&0x80 == 0 || h[1]&0x7f == 127 {
		t.Errorf("raw relay: frame header %x, %v", h, err)
		return 0, nil
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var l [2]byte
		io.ReadFull(br, l[:])
		n = int(binary.BigEndian.Uint16(l[:]))
	}
	var key [4]byte
	io.ReadFull(br, key[:])
	p := make([]byte, n)
	io.ReadFull(br, p)
	for i := range p {
		p[i] ^= key[i%4]
	}
	return h[0] & 0x0f, p
}

// serverFrame is one unmasked frame with the given first byte (FIN, opcode).
func serverFrame(b0 byte, payload []byte) []byte {
	f := []byte{b0}
	if len(payload) < 126 {
		f = append(f, byte(len(payload)))
	} else {
		f = append(f, 126)
		f = binary.BigEndian.AppendUint16(f, uint16(len(payload)))
	}
	return append(f, payload...)
}

// After the Relay's auth.ok the bridge forwards frames as they are: the
// client's fragments reach the Relay byte for byte (still masked with the
// client's keys), the Relay's reach the client byte for byte. With frame
// forwarding off (messagesOnly) the same exchange arrives re-framed, which
// shows the comparison can tell the two paths apart.
func TestBridgeForwardsFramesAsTheyAreAfterAuthOK(t *testing.T) {
	for _, messages := range []bool{false, true} {
		first := fragmentFrames(opText, bytes.Repeat([]byte("frag"), 100), 150) // 3 fragments
		second := clientFrame(opBinary, []byte{1, 2, 3})
		fromClient := append(append([]byte(nil), first...), second...)
		reply := append(serverFrame(opText, []byte("rep")), serverFrame(0x80, []byte("ly"))...)
		want := len(fromClient)
		if messages {
			want = (2 + 2 + 4 + 400) + (2 + 4 + 3) // one frame per message, the bridge's own mask keys
		}
		rr := newRawRelay(t, want, reply)
		u, _ := url.Parse(rr.srv.URL)
		b := newBridge(t, Options{Upstream: u, DialTimeout: 3 * time.Second, messagesOnly: messages})
		front := frontFor(t, b, false)

		conn, br := rawUpgrade(t, front.Listener.Addr().String(), "/relay/ws")
		conn.Write(clientFrame(opText, testfake.AuthFrame(testfake.GoodCode)))
		if op, msg := readServerFrame(t, br); op != opText || string(msg) != testfake.AuthOKMsg {
			t.Fatalf("verdict (%d) %q", op, msg)
		}
		conn.Write(fromClient)
		var got []byte
		select {
		case got = <-rr.got:
		case <-time.After(10 * time.Second):
			t.Fatal("the Relay did not receive the client's frames")
		}
		back := make([]byte, len(reply))
		if messages {
			back = back[:2+5] // "reply" as one frame
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadFull(br, back)
		same := bytes.Equal(got, fromClient) && err == nil && bytes.Equal(back, reply)
		if !messages && !same {
			t.Fatalf("frames were not forwarded as they are:\nclient sent %x\nrelay got   %x\nrelay sent  %x\nclient got  %x (%v)",
				fromClient, got, reply, back, err)
		}
		if messages && same {
			t.Fatal("with messagesOnly the frames still arrived unchanged: the test cannot tell the paths apart")
		}
		conn.Close()
	}
}
