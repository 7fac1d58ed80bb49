package msgconn

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// connTypes runs every conformance test over the in-memory Pipe and over
// real WebSockets on 127.0.0.1, so the tests of the three roles, which use
// the pipe, test what the WebSocket adapter does.
var connTypes = []struct {
	name string
	pair func(t *testing.T) (a, b Conn)
}{
	{"pipe", func(t *testing.T) (Conn, Conn) {
		a, b := Pipe(4)
		b.SetLends(true)
		t.Cleanup(func() { a.CloseNow() })
		return a, b
	}},
	{"websocket", func(t *testing.T) (Conn, Conn) {
		client, server := pair(t)
		return FromWebSocket(client, "server"), FromWebSocket(server, "client")
	}},
}

func forEachConnType(t *testing.T, test func(t *testing.T, a, b Conn)) {
	for _, ct := range connTypes {
		t.Run(ct.name, func(t *testing.T) {
			a, b := ct.pair(t)
			test(t, a, b)
		})
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestConnKeepsTypesAndBoundaries(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		ctx := testCtx(t)
		b.SetReadLimit(2 << 20)
		msgs := []struct {
			typ  MessageType
			data []byte
		}{
			{Text, []byte(`{"type":"register"}`)},
			{Binary, []byte{}},
			{Binary, []byte{7}},
			{Binary, bytes.Repeat([]byte{0xfe, 0x01}, 1<<19)}, // 1 MiB: fragmented on the wire
			{Text, []byte("short again")},
		}
		go func() {
			for _, m := range msgs {
				if a.Write(ctx, m.typ, m.data) != nil {
					return
				}
			}
		}()
		for i, m := range msgs {
			typ, data, err := b.Read(ctx)
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			if typ != m.typ || !bytes.Equal(data, m.data) {
				t.Fatalf("message %d: got %v with %d bytes, want %v with %d", i, typ, len(data), m.typ, len(m.data))
			}
		}
	})
}

func TestConnReadLimitIsErrTooBig(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		ctx := testCtx(t)
		b.SetReadLimit(100)
		go a.Write(ctx, Binary, make([]byte, 101))
		if _, _, err := b.Read(ctx); !errors.Is(err, ErrTooBig) {
			t.Fatalf("got %v, want ErrTooBig", err)
		}
		// The socket is closed with 1009.
		if _, _, err := a.Read(ctx); CloseStatus(err) != 1009 {
			t.Fatalf("the writer got %v, want close 1009", err)
		}
	})
}

func TestConnCloseCarriesCodeAndReason(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		ctx := testCtx(t)
		go b.Close(4001, "replaced")
		_, _, err := a.Read(ctx)
		var ce *CloseError
		if !errors.As(err, &ce) || ce.Code != 4001 || ce.Reason != "replaced" {
			t.Fatalf("got %v, want close 4001 replaced", err)
		}
	})
}

// A pong is seen only while this end reads and sent only while the peer
// reads.
func TestConnPingNeedsBothReaders(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		ctx := testCtx(t)
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := a.Ping(pctx)
		cancel()
		if err == nil {
			t.Fatal("a ping was answered while nobody read")
		}
		go func() {
			for {
				if _, _, err := a.Read(ctx); err != nil {
					return
				}
			}
		}()
		go func() {
			for {
				if _, _, err := b.Read(ctx); err != nil {
					return
				}
			}
		}()
		if err := a.Ping(ctx); err != nil {
			t.Fatalf("ping with both ends reading: %v", err)
		}
	})
}

func TestKeepaliveDropsASilentPeerButForgivesPauses(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		ctx := testCtx(t)
		go func() { // a reads (so it would see pongs); b never reads, so never answers
			for {
				if _, _, err := a.Read(ctx); err != nil {
					return
				}
			}
		}()
		var p Pause
		dead := make(chan struct{})
		p.Enter()
		go Keepalive{Conn: a, Interval: 20 * time.Millisecond, Timeout: 60 * time.Millisecond, Pause: &p,
			Dead: func() { close(dead) }}.Run(ctx)
		select {
		case <-dead:
			t.Fatal("dropped during a pause")
		case <-time.After(300 * time.Millisecond):
		}
		p.Leave()
		select {
		case <-dead:
		case <-ctx.Done():
			t.Fatal("a silent peer was not dropped after the pause ended")
		}
	})
}

func TestKeepaliveStopEndsWithoutDead(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		stop := make(chan struct{})
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			Keepalive{Conn: a, Interval: time.Millisecond, Timeout: time.Hour, Stop: stop,
				Dead: func() { t.Error("Dead after Stop") }}.Run(context.Background())
		}()
		time.Sleep(20 * time.Millisecond)
		close(stop)
		<-ended
	})
}

// The library waits at most 5 s for its write lock when it sends a ping;
// behind a data write that the peer's backpressure holds, the adapter
// retries until the pong's own deadline instead of failing at 5 s.
func TestWebSocketPingOutlastsABlockedWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("waits past the library's 5 s control-write wait")
	}
	client, server := pair(t)
	a, b := FromWebSocket(client, "server"), FromWebSocket(server, "client")
	ctx := testCtx(t)
	b.SetReadLimit(64 << 20)
	go func() { // a reads, so it sees the pong
		for {
			if _, _, err := a.Read(ctx); err != nil {
				return
			}
		}
	}()
	// A write larger than the loopback socket buffers, which b does not
	// read for 6 s.
	go a.Write(ctx, Binary, make([]byte, 48<<20))
	release := time.AfterFunc(6*time.Second, func() {
		for {
			if _, _, err := b.Read(ctx); err != nil {
				return
			}
		}
	})
	defer release.Stop()
	time.Sleep(100 * time.Millisecond) // the write holds the lock
	if err := a.Ping(ctx); err != nil {
		t.Fatalf("ping behind a write held for 6 s: %v", err)
	}
}
