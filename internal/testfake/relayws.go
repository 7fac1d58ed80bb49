package testfake

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// RelayWS opens the Relay WebSocket at wsURL over conn, an inner TLS
// connection to the front, sends authFrame and returns the socket and the
// Relay's answer.
func RelayWS(t testing.TB, conn net.Conn, wsURL, authFrame string) (*websocket.Conn, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	used := false
	ws, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: &http.Transport{
			DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
				if used {
					return nil, errors.New("one connection only")
				}
				used = true
				return conn, nil
			},
		}},
	})
	if err != nil {
		t.Fatalf("relay upgrade: %v", err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	ws.SetReadLimit(4 << 20)
	if err := ws.Write(ctx, websocket.MessageText, []byte(authFrame)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := ws.Read(ctx)
	if err != nil {
		t.Fatalf("auth answer: %v", err)
	}
	return ws, msg
}
