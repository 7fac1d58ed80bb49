package connector

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// connTypes runs a connector↔broker exchange over the transports the
// connector runs on (the yamux testConnTypes style): the real broker core
// over an in-memory msgconn.Pipe, and the same broker over a real
// WebSocket with TLS on 127.0.0.1.
var connTypes = []struct {
	name string
	use  func(t *testing.T, c *Connector, rb *realBroker)
}{
	{"pipe", func(t *testing.T, c *Connector, rb *realBroker) {
		var served sync.WaitGroup
		t.Cleanup(served.Wait) // the broker's Close at cleanup ends every Serve
		c.dial = func(ctx context.Context) (msgconn.Conn, *http.Response, error) {
			ours, brokers := msgconn.Pipe(16)
			brokers.SetLends(true)
			brokers.SetRemoteAddr("127.0.0.1:1")
			served.Add(1)
			go func() { defer served.Done(); rb.B.Serve(context.Background(), brokers) }()
			return ours, nil, nil
		}
	}},
	{"websocket", func(*testing.T, *Connector, *realBroker) {}},
}

func TestExchangeWithBrokerOverEachTransport(t *testing.T) {
	for _, ct := range connTypes {
		t.Run(ct.name, func(t *testing.T) {
			rb := startBroker(t, nil)
			cfg := rb.connectorConfig(t)
			cfg.PingInterval = 50 * time.Millisecond // keepalive runs during the exchange
			cfg.PongTimeout = 5 * time.Second
			c := newConnector(t, cfg)
			ct.use(t, c, rb)
			run(t, c)
			waitConnected(t, c)

			ctx, cancel := context.WithTimeout(context.Background(), step)
			defer cancel()
			ws, st := bootstrapStream(t, c, rb)
			echo(st)
			big := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KiB: several chunks each way
			for _, msg := range [][]byte{[]byte("hello"), big} {
				if err := ws.Write(ctx, websocket.MessageBinary, msg); err != nil {
					t.Fatal(err)
				}
				if got := readBytes(ctx, t, ws, len(msg)); !bytes.Equal(got, msg) {
					t.Fatalf("echo of %d bytes came back as %d different bytes", len(msg), len(got))
				}
			}
			time.Sleep(200 * time.Millisecond) // several pings
			if st := c.Status(); st.State != StateConnected || st.Attempts != 1 || st.ActiveStreams != 1 {
				t.Fatalf("status %+v", st)
			}
			ws.Close(websocket.StatusNormalClosure, "")
			testenv.WaitFor(t, "the stream to end", func() bool { return c.Status().ActiveStreams == 0 })
		})
	}
}

// TestDownloadLeavesInFullTLSRecords: the connector's DATA frames reach the
// broker in TLS records larger than the WebSocket library's 4 KiB write
// buffer (which made every 4 KiB its own record to seal and open), and the
// bytes arrive intact.
func TestDownloadLeavesInFullTLSRecords(t *testing.T) {
	rb := startBroker(t, nil)
	cfg := rb.connectorConfig(t)
	rec := testenv.ForwardRecords(t, rb.Addr)
	cfg.BrokerURL = "wss://" + rec.Addr + wire.ConnectPath
	c := newConnector(t, cfg)
	run(t, c)
	waitConnected(t, c)

	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	ws, st := bootstrapStream(t, c, rb)
	big := make([]byte, 2<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	go st.Write(big)
	if got := readBytes(ctx, t, ws, len(big)); !bytes.Equal(got, big) {
		t.Fatalf("%d bytes sent, %d different bytes received", len(big), len(got))
	}
	n, maxRec := rec.Seen()
	// 2 MiB in 4 KiB records is more than 500 of them, none above
	// 4096 + 17 bytes (TLS 1.3's content type and tag).
	if maxRec <= 8<<10 || n > 400 {
		t.Fatalf("the connector sent %d TLS records of at most %d bytes for 2 MiB of DATA", n, maxRec)
	}
	t.Logf("%d records, largest %d bytes", n, maxRec)
	ws.Close(websocket.StatusNormalClosure, "")
}

// bootstrapStream publishes a bootstrap of c's host and opens a stream with
// it as a client: the client's socket and the stream the front accepts.
func bootstrapStream(t *testing.T, c *Connector, rb *realBroker) (*websocket.Conn, *stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	bs, err := c.PublishBootstrap(ctx, time.Minute)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	ws, err := dialBroker(t, rb, wire.KindBootstrap, bs.Token)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return ws, accept(t, c)
}

// readBytes reads the client's messages until at least n bytes came.
func readBytes(ctx context.Context, t *testing.T, ws *websocket.Conn, n int) []byte {
	t.Helper()
	var got []byte
	for len(got) < n {
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("client read: %v", err)
		}
		got = append(got, data...)
	}
	return got
}
