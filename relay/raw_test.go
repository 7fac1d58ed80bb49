package relay

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/rawsock"
)

// The bridge's Relay leg is a raw connection (internal/rawsock), as the
// front's client sockets are: its reads and writes never enter the
// runtime's system-call bookkeeping. A Relay that answers the upgrade by
// hand; the leg dialRelayWS returns is checked.
func TestRelayLegIsRaw(t *testing.T) {
	if !rawsock.Enabled {
		t.Skip("raw system calls are Linux-only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
			acceptKey(req.Header.Get("Sec-WebSocket-Key")) + "\r\n\r\n"))
		var b [1]byte
		c.Read(b[:]) // until the leg closes
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, _, err := dialRelayWS(ctx, "ws://"+ln.Addr().String()+"/ws", http.Header{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.conn.Close()
	if _, ok := rc.conn.(*rawsock.Conn); !ok {
		t.Fatalf("the Relay leg is a %T, want a *rawsock.Conn", rc.conn)
	}
}
