package msgconn

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// pair returns a client socket and the server socket it reached, over a
// real WebSocket on 127.0.0.1.
func pair(t *testing.T) (client, server *websocket.Conn) {
	t.Helper()
	got := make(chan *websocket.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		got <- c
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.CloseNow() })
	server = <-got
	t.Cleanup(func() { server.CloseNow() })
	return client, server
}

func TestReadWholeMessages(t *testing.T) {
	client, server := pair(t)
	server.SetReadLimit(2 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs := []struct {
		typ  websocket.MessageType
		data []byte
	}{
		{websocket.MessageText, []byte(`{"type":"register"}`)},
		{websocket.MessageBinary, []byte{}},
		{websocket.MessageBinary, []byte{7}},
		{websocket.MessageBinary, bytes.Repeat([]byte("0123456789abcdef"), 3<<10)}, // above the initial size
		{websocket.MessageBinary, bytes.Repeat([]byte{0xfe, 0x01}, 1<<19)},         // 1 MiB, fragmented below
		{websocket.MessageText, []byte("short again")},
	}
	go func() {
		for _, m := range msgs {
			w, err := client.Writer(ctx, m.typ)
			if err != nil {
				return
			}
			for p := m.data; len(p) > 0; p = p[min(len(p), 100<<10):] {
				w.Write(p[:min(len(p), 100<<10)])
			}
			w.Close()
		}
	}()
	var rd Reader
	defer rd.Release()
	for i, m := range msgs {
		typ, data, err := rd.Read(ctx, server)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if typ != m.typ || !bytes.Equal(data, m.data) {
			t.Fatalf("message %d: got %v with %d bytes, want %v with %d", i, typ, len(data), m.typ, len(m.data))
		}
	}
}

func TestReadLimitStillApplies(t *testing.T) {
	client, server := pair(t)
	server.SetReadLimit(100)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go client.Write(ctx, websocket.MessageBinary, make([]byte, 101))
	var rd Reader
	if _, _, err := rd.Read(ctx, server); !errors.Is(err, websocket.ErrMessageTooBig) {
		t.Fatalf("got %v, want ErrMessageTooBig", err)
	}
	if rd.held != nil {
		t.Fatal("a failed read kept a buffer")
	}
}

// A buffer large enough for the message is filled in place: no allocation,
// unlike io.ReadAll, which starts at 512 bytes and grows.
func TestReadAllFillsInPlace(t *testing.T) {
	msg := bytes.Repeat([]byte{1, 2, 3}, 100_000)
	buf := make([]byte, 0, len(msg)+1)
	src := bytes.NewReader(msg)
	allocs := testing.AllocsPerRun(20, func() {
		src.Reset(msg)
		out, err := readAll(src, buf[:0])
		if err != nil || !bytes.Equal(out, msg) || &out[0] != &buf[:1][0] {
			t.Fatal("readAll did not fill the given buffer")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per message", allocs)
	}
}

// Take hands the buffer over with its headroom in front; the next Read
// fills another buffer, so the taken bytes stay as they were. A message
// filling less than half of its buffer is not handed over.
func TestTakeHandsTheBufferOver(t *testing.T) {
	client, server := pair(t)
	server.SetReadLimit(2 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// 1 MiB: at least half of any buffer the pool keeps, whatever earlier
	// reads left in it.
	big := bytes.Repeat([]byte("take me "), 128<<10)
	second := bytes.Repeat([]byte{0x55}, len(big))
	go func() {
		client.Write(ctx, websocket.MessageBinary, big)
		client.Write(ctx, websocket.MessageBinary, second)
		client.Write(ctx, websocket.MessageBinary, []byte("small"))
	}()
	var rd Reader
	defer rd.Release()
	rd.SetHeadroom(18)
	_, data, err := rd.Read(ctx, server)
	if err != nil || !bytes.Equal(data, big) {
		t.Fatalf("read %d bytes, %v", len(data), err)
	}
	buf := rd.Take()
	if len(buf) != 18+len(big) || &buf[18] != &data[0] {
		t.Fatalf("Take gave %d bytes, not the message's buffer with 18 bytes in front", len(buf))
	}
	if rd.Take() != nil {
		t.Fatal("a second Take of one message returned a buffer")
	}
	if _, data2, err := rd.Read(ctx, server); err != nil || !bytes.Equal(data2, second) {
		t.Fatalf("second message: %d bytes, %v", len(data2), err)
	}
	if !bytes.Equal(buf[18:], big) {
		t.Fatal("the next Read wrote into the buffer that was taken")
	}
	Recycle(buf)
	_, small, err := rd.Read(ctx, server)
	if err != nil || string(small) != "small" {
		t.Fatalf("small message: %q, %v", small, err)
	}
	if rd.Take() != nil {
		t.Fatal("a 5-byte message handed over a whole buffer")
	}
}

// One connection's 1 MiB buffers, back in the pool, are not handed to a
// reader of 60 KiB messages: its messages stay eligible for Take.
func TestTakeAfterAnotherConnectionsLargeMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bigC, bigS := pair(t)
	bigS.SetReadLimit(2 << 20)
	go func() {
		for range 4 {
			bigC.Write(ctx, websocket.MessageBinary, make([]byte, 1<<20))
		}
	}()
	var big Reader
	for range 4 {
		if _, _, err := big.Read(ctx, bigS); err != nil {
			t.Fatal(err)
		}
	}
	big.Release()

	c, s := pair(t)
	s.SetReadLimit(1 << 20)
	msg := bytes.Repeat([]byte{9}, 60<<10)
	go func() {
		for range 5 {
			c.Write(ctx, websocket.MessageBinary, msg)
		}
	}()
	var rd Reader
	defer rd.Release()
	for i := range 5 {
		_, data, err := rd.Read(ctx, s)
		if err != nil || !bytes.Equal(data, msg) {
			t.Fatalf("message %d: %d bytes, %v", i, len(data), err)
		}
		if buf := rd.Take(); i > 0 && buf == nil {
			t.Fatalf("message %d of 60 KiB was read into a buffer more than twice its size", i)
		}
	}
}
