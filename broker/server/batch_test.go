package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// writeCounter counts the write calls the broker makes on each accepted
// socket (below its TLS), in accept order.
type writeCounter struct {
	net.Listener
	mu    sync.Mutex
	conns []*atomic.Int64
}

type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countedConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

func (l *writeCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := new(atomic.Int64)
	l.mu.Lock()
	l.conns = append(l.conns, n)
	l.mu.Unlock()
	return countedConn{c, n}, nil
}

func (l *writeCounter) conn(i int) *atomic.Int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[i]
}

// A 256 KiB message to a client leaves the broker in a few writes, not one
// per TLS record (and two per 64 KiB fragment for the library's 4 KiB
// buffer, ~20 in all before), and arrives byte-exact; so does the 1 MiB
// client message going the other way as two DATA frames.
func TestLargeMessagesLeaveInFewWrites(t *testing.T) {
	var pool *x509.CertPool
	e := newEnv(t, func(c *Config) {
		c.InsecurePlaintext = false
		c.TLSCertFile, c.TLSKeyFile, pool = writeTestCert(t, t.TempDir())
		c.DisableCredit = true // plain v1: no WINDOW frames in the count
	})
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &writeCounter{Listener: raw}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.b.ServeListener(ctx, ln) }()
	defer func() { cancel(); <-served }()

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	dctx, dcancel := context.WithTimeout(context.Background(), 4*step)
	defer dcancel()
	dial := func() *websocket.Conn {
		ws, _, err := websocket.Dial(dctx, "wss://"+raw.Addr().String()+wire.ConnectPath, &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatal(err)
		}
		ws.SetReadLimit(4 << 20)
		return ws
	}
	send := func(ws *websocket.Conn, typ websocket.MessageType, b []byte) {
		t.Helper()
		if err := ws.Write(dctx, typ, b); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(ws *websocket.Conn) []byte {
		t.Helper()
		_, b, err := ws.Read(dctx)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	reg := func(role wire.Role, kind wire.Kind, tok wire.Secret) []byte {
		m, _ := wire.Marshal(wire.Register{Role: role, HostID: e.hosts[0].id, ConnectionID: wire.NewID(), CredentialKind: kind, Token: tok})
		return m
	}

	host := dial()
	send(host, websocket.MessageText, reg(wire.RoleHost, wire.KindHost, e.hosts[0].token))
	recv(host) // registered
	tok := wire.Secret(wire.NewID().String() + wire.NewID().String())
	pub, _ := wire.Marshal(wire.PublishRoute{CredentialID: "c1", TokenSHA256: wire.TokenDigest(string(tok)),
		ExpiresAt: e.clock.Now().Add(time.Hour).Unix(), DeviceIDHash: wire.TokenDigest("device")})
	send(host, websocket.MessageText, pub)
	recv(host) // published
	client := dial()
	send(client, websocket.MessageText, reg(wire.RoleClient, wire.KindRoute, tok))
	open, err := wire.ParseBrokerMessage(recv(host))
	if err != nil {
		t.Fatal(err)
	}
	sid := open.(wire.Open).StreamID
	recv(client) // matched

	down := make([]byte, 256<<10)
	rand.Read(down)
	clientWrites := ln.conn(1)
	before := clientWrites.Load()
	send(host, websocket.MessageBinary, wire.SplitData(sid, down, wire.MaxHostFrameIn)[0])
	got := recv(client)
	if !bytes.Equal(got, down) {
		t.Fatalf("client got %d bytes, not the host's 256 KiB", len(got))
	}
	if n := clientWrites.Load() - before; n > 3 {
		t.Errorf("a 256 KiB client message took %d writes to the client's socket, want at most 3", n)
	}

	up := make([]byte, wire.MaxClientFrame)
	rand.Read(up)
	hostWrites := ln.conn(0)
	before = hostWrites.Load()
	send(client, websocket.MessageBinary, up)
	var moved []byte
	for len(moved) < len(up) {
		f, err := wire.ParseFrame(recv(host))
		if err != nil || f.Flags != wire.FlagData || f.StreamID != sid {
			t.Fatalf("host got %+v, %v", f, err)
		}
		moved = append(moved, f.Payload...)
	}
	if !bytes.Equal(moved, up) {
		t.Fatal("the host's DATA frames differ from the client's message")
	}
	// Two DATA frames of ~1 MiB: four batches of 256 KiB each at most, plus
	// the rest of each.
	if n := hostWrites.Load() - before; n > 8 {
		t.Errorf("a 1 MiB client message took %d writes to the host's socket, want at most 8", n)
	}
}

// holdRecorder is the broker's end of a host pipe that implements
// msgconn.Batcher and records which writes fall inside one hold; binary
// writes wait for gate.
type holdRecorder struct {
	*pipeConn
	gate              chan struct{}
	mu                sync.Mutex
	holding           bool
	inHold, maxInHold int
}

func (r *holdRecorder) HoldWrites() {
	r.mu.Lock()
	r.holding, r.inHold = true, 0
	r.mu.Unlock()
}

func (r *holdRecorder) SendHeld(context.Context) error {
	r.mu.Lock()
	r.holding = false
	r.mu.Unlock()
	return nil
}

func (r *holdRecorder) Write(ctx context.Context, typ msgconn.MessageType, data []byte) error {
	if typ == msgconn.Binary {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	if r.holding {
		r.inHold++
		r.maxInHold = max(r.maxInHold, r.inHold)
	}
	r.mu.Unlock()
	return r.pipeConn.Write(ctx, typ, data)
}

// The host writer drains what queued up behind a slow write in one hold
// of the transport (one socket write per 256 KiB on the WebSocket), not one
// write per frame.
func TestHostWriterHoldsWhileDraining(t *testing.T) {
	e := newEnv(t, nil)
	peer, brokerEnd := newPipe(e.pipeN, "127.0.0.1:1")
	rec := &holdRecorder{pipeConn: brokerEnd, gate: make(chan struct{})}
	e.served.Add(1)
	go func() {
		defer e.served.Done()
		e.b.Serve(context.Background(), rec)
	}()
	e.register(peer, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[0].token, wire.NewID())
	if m := readMsg(t, peer); m.Type() != wire.TypeRegistered {
		t.Fatalf("host registration answered %#v", m)
	}
	tok := wire.NewToken()
	e.publishRoute(peer, "r1", tok)
	c, id := e.client(peer, 0, wire.KindRoute, tok)

	const n, size = 10, 1000
	for i := 0; i < n; i++ {
		sendBinary(t, c, bytes.Repeat([]byte{byte(i)}, size))
	}
	// The first frame is stuck in its write; the others wait in the queue.
	waitFor(t, "all frames queued", func() bool { return e.b.Stats().QueuedBytes == n*(size+wire.HeaderLen) })
	close(rec.gate)
	for i := 0; i < n; i++ {
		if got := readBinary(t, peer); !bytes.Equal(got, dataFrame(id, bytes.Repeat([]byte{byte(i)}, size))) {
			t.Fatalf("frame %d: host got %d bytes", i, len(got))
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.maxInHold < n {
		t.Fatalf("the writer drained %d queued frames with at most %d in one hold, want all", n, rec.maxInHold)
	}
}
