package server

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/memprofile"
)

// A small message crossing the broker costs few allocations (issue 14:
// broker CPU per small message): the writers bound their writes with the
// socket's one write watch (msgconn.WriteGate), not a context, a timer and
// the library's watch of the context per write; the readers read under a
// context that never ends (the session's ending cuts the socket once);
// the queues keep their arrays. Real TLS WebSockets
// through ServeListener; a client and its host echo 64 B messages, one in
// flight, and every allocation on the broker's stacks is counted.
func TestSmallMessageRelayAllocatesLittle(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	ts := openTLSStream(t, 4*step)
	write, read, host, client := ts.write, ts.read, ts.host, ts.client
	msg := bytes.Repeat([]byte{0x5a}, 64)
	echo := func() {
		t.Helper()
		write(client, websocket.MessageBinary, msg)
		f, err := wire.ParseFrame(read(host))
		if err != nil || f.Flags != wire.FlagData || !bytes.Equal(f.Payload, msg) {
			t.Fatalf("host got %v %v", f, err)
		}
		write(host, websocket.MessageBinary, dataFrame(ts.id, msg))
		if got := read(client); !bytes.Equal(got, msg) {
			t.Fatalf("client got %x", got)
		}
	}
	for range 50 { // warm: pools, the writers' first runs
		echo()
	}
	const n = 400
	_, before := memprofile.Sum(brokerStack)
	for range n {
		echo()
	}
	_, after := memprofile.Sum(brokerStack)
	perMsg := float64(after-before) / (2 * n)
	t.Logf("the broker allocates %.2f objects per small message it relays", perMsg)
	if perMsg > maxAllocsPerSmallMessage {
		t.Errorf("the broker allocates %.2f objects per small message, want at most %d", perMsg, maxAllocsPerSmallMessage)
	}
}

// tlsStream is one stream through serveIdleTLS's broker (plain v1): a host
// registered over a real TLS WebSocket, a client matched to it with a
// bootstrap, and the stream's id (from the host's open).
type tlsStream struct {
	e            *env
	host, client *websocket.Conn
	id           wire.ID
	write        func(ws *websocket.Conn, typ websocket.MessageType, b []byte)
	read         func(ws *websocket.Conn) []byte
}

// openTLSStream opens a tlsStream; every read and write is bounded by
// within, counted from now.
func openTLSStream(t *testing.T, within time.Duration) *tlsStream {
	t.Helper()
	e, addr, hc := serveIdleTLS(t, func(c *Config) { c.DisableCredit = true })
	ctx, cancel := context.WithTimeout(context.Background(), within)
	t.Cleanup(cancel)
	ts := &tlsStream{e: e}
	ts.write = func(ws *websocket.Conn, typ websocket.MessageType, b []byte) {
		t.Helper()
		if err := ws.Write(ctx, typ, b); err != nil {
			t.Fatal(err)
		}
	}
	ts.read = func(ws *websocket.Conn) []byte {
		t.Helper()
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	send := func(ws *websocket.Conn, m wire.Message) {
		t.Helper()
		msg, _ := wire.Marshal(m)
		ts.write(ws, websocket.MessageText, msg)
	}
	ts.host = dialTLS(ctx, t, addr, hc)
	send(ts.host, wire.Register{Role: wire.RoleHost, HostID: e.hosts[0].id, ConnectionID: wire.NewID(), CredentialKind: wire.KindHost, Token: e.hosts[0].token})
	ts.read(ts.host) // registered
	tok := wire.NewToken()
	send(ts.host, wire.PublishBootstrap{PairingID: "p", TokenSHA256: wire.TokenDigest(string(tok)), ExpiresAt: e.clock.Now().Add(10 * time.Minute).Unix()})
	ts.read(ts.host) // published
	ts.client = dialTLS(ctx, t, addr, hc)
	send(ts.client, wire.Register{Role: wire.RoleClient, HostID: e.hosts[0].id, ConnectionID: wire.NewID(), CredentialKind: wire.KindBootstrap, Token: tok})
	ts.read(ts.client) // matched
	m, err := wire.ParseBrokerMessage(ts.read(ts.host))
	open, ok := m.(wire.Open)
	if err != nil || !ok {
		t.Fatalf("host got %v %v, want open", m, err)
	}
	ts.id = open.StreamID
	return ts
}

// maxAllocsPerSmallMessage: about 2 objects here (crypto/tls's reader of
// a record, the copy of a small payload), 4.2 under -race (sync.Pool drops
// a share of what it is given); 27 with a context, its timer and the
// library's watch of it per write and a watch of the reader's context per
// read, 5 with the latter only.
const maxAllocsPerSmallMessage = 8
