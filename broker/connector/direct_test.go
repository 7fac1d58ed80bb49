package connector

import (
	"bytes"
	"context"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// stackConn notes which DATA frames a stream's own Write sent (the caller's
// goroutine) rather than the session's writer.
type stackConn struct {
	msgconn.Conn
	direct, frames atomic.Int32
}

func (c *stackConn) Write(ctx context.Context, typ msgconn.MessageType, data []byte) error {
	if f, err := wire.ParseFrame(data); typ == msgconn.Binary && err == nil && f.Flags == wire.FlagData {
		c.frames.Add(1)
		buf := make([]byte, 16<<10)
		if bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("connector.(*stream).Write")) {
			c.direct.Add(1)
		}
	}
	return c.Conn.Write(ctx, typ, data)
}

// A small Write of an interactive exchange, made while the writer has
// nothing to send, leaves from the caller's goroutine (no hand-off to the
// writer and back), and the bytes arrive as written.
func TestSmallWriteLeavesFromTheCaller(t *testing.T) {
	rb := startBroker(t, nil)
	c := newConnector(t, rb.connectorConfig(t))
	var sc *stackConn
	var served sync.WaitGroup
	t.Cleanup(served.Wait)
	c.dial = func(ctx context.Context) (msgconn.Conn, *http.Response, error) {
		ours, brokers := msgconn.Pipe(16)
		brokers.SetLends(true)
		brokers.SetRemoteAddr("127.0.0.1:1")
		served.Add(1)
		go func() { defer served.Done(); rb.B.Serve(context.Background(), brokers) }()
		sc = &stackConn{Conn: ours}
		return sc, nil, nil
	}
	run(t, c)
	waitConnected(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	bs, err := c.PublishBootstrap(ctx, 60e9)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	ws, err := dialBroker(t, rb, wire.KindBootstrap, bs.Token)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	st := accept(t, c)
	const rounds = 8
	for i := range rounds {
		msg := bytes.Repeat([]byte{byte('a' + i)}, 64)
		if _, err := st.Write(msg); err != nil {
			t.Fatal(err)
		}
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("client read: %v", err)
		}
		if !bytes.Equal(data, msg) {
			t.Fatalf("round %d: got %q", i, data)
		}
	}
	t.Logf("%d of %d frames from the caller", sc.direct.Load(), sc.frames.Load())
	if n, d := sc.frames.Load(), sc.direct.Load(); n != rounds || d == 0 {
		t.Fatalf("%d DATA frames, %d of them sent by the stream's Write: want %d, most from the caller", n, d, rounds)
	}
}
