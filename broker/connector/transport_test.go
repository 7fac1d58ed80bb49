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
			bs, err := c.PublishBootstrap(ctx, time.Minute)
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			ws, err := dialBroker(t, rb, wire.KindBootstrap, bs.Token)
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			st := accept(t, c)
			echo(st)
			big := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KiB: several chunks each way
			for _, msg := range [][]byte{[]byte("hello"), big} {
				if err := ws.Write(ctx, websocket.MessageBinary, msg); err != nil {
					t.Fatal(err)
				}
				var got []byte
				for len(got) < len(msg) {
					_, data, err := ws.Read(ctx)
					if err != nil {
						t.Fatalf("client read: %v", err)
					}
					got = append(got, data...)
				}
				if !bytes.Equal(got, msg) {
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
