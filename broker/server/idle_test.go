package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/memprofile"
)

// An idle socket costs the broker one goroutine, its reader: the writer
// runs only while something is queued, and the keepalive and the idle watch
// are timers (issue 15: ≤ 1 goroutine per idle socket). Real TLS
// WebSockets through ServeListener, keepalive armed with the spec's
// timings; the test's peers read only synchronously, so between reads they
// own no goroutine and every goroutine counted is the broker's.
//
// And it keeps little heap (issue 15: ≤ 32 KiB RSS per idle socket, the
// reader's stack included): every allocation is recorded, and what the
// broker's own stacks allocated and still hold is divided by the sockets.
func TestIdleSocketCost(t *testing.T) {
	const nStreams = 16
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	e, addr, client := serveIdleTLS(t, func(c *Config) {
		c.PingInterval, c.PongTimeout = 15*time.Second, 45*time.Second
		c.MaxStreamsPerHost = nStreams
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*step)
	defer cancel()
	dial := func() *websocket.Conn { return dialTLS(ctx, t, addr, client) }
	send := func(ws *websocket.Conn, m wire.Message) {
		t.Helper()
		msg, _ := wire.Marshal(m)
		if err := ws.Write(ctx, websocket.MessageText, msg); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(ws *websocket.Conn, want string) {
		t.Helper()
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m, err := wire.ParseBrokerMessage(data)
		if err != nil || m.Type() != want {
			t.Fatalf("got %q, want %s (%v)", data, want, err)
		}
	}

	base := settledGoroutines(t, -1)
	heap0 := brokerHeap(t)
	var hosts []*websocket.Conn
	for i := range e.hosts {
		ws := dial()
		send(ws, wire.Register{Role: wire.RoleHost, HostID: e.hosts[i].id, ConnectionID: wire.NewID(), CredentialKind: wire.KindHost, Token: e.hosts[i].token})
		expect(ws, wire.TypeRegistered)
		hosts = append(hosts, ws)
	}
	perHost := settledGoroutines(t, base+len(hosts)) - base
	// Idle streams on host 0, each with a bootstrap of its own.
	toks := make([]wire.Secret, nStreams)
	for i := range toks {
		toks[i] = wire.NewToken()
		send(hosts[0], wire.PublishBootstrap{PairingID: fmt.Sprintf("p%d", i), TokenSHA256: wire.TokenDigest(string(toks[i])), ExpiresAt: e.clock.Now().Add(10 * time.Minute).Unix()})
		expect(hosts[0], wire.TypePublished)
	}
	mid := settledGoroutines(t, -1)
	for _, tok := range toks {
		c := dial()
		send(c, wire.Register{Role: wire.RoleClient, HostID: e.hosts[0].id, ConnectionID: wire.NewID(), CredentialKind: wire.KindBootstrap, Token: tok})
		expect(c, wire.TypeMatched)
	}
	if n := e.b.Stats().ActiveStreams; n != nStreams {
		t.Fatalf("%d live streams, want %d", n, nStreams)
	}
	perStream := settledGoroutines(t, mid+nStreams) - mid
	t.Logf("broker goroutines: %d for %d idle hosts, %d for %d idle streams", perHost, len(hosts), perStream, nStreams)
	if perHost > len(hosts) || perStream > nStreams {
		t.Fatalf("%d goroutines for %d idle hosts and %d for %d idle streams: want at most one per socket",
			perHost, len(hosts), perStream, nStreams)
	}
	sockets := int64(len(hosts) + nStreams)
	perSocket := (brokerHeap(t) - heap0) / sockets
	t.Logf("broker heap: %d bytes per idle socket (%d sockets)", perSocket, sockets)
	if perSocket > idleHeapPerSocket {
		t.Fatalf("the broker holds %d bytes of heap per idle socket, want at most %d", perSocket, idleHeapPerSocket)
	}
}

// idleHeapPerSocket bounds the heap an idle socket keeps in the broker
// (TLS state, WebSocket, session, timers, its share of the tables): about
// 12.9 KiB here, of which crypto/tls holds 6 (the input and handshake
// buffers a post-quantum ClientHello grew, the two AEADs, its Conn); it was
// 17.5 KiB with net/http's 4 KiB write buffer, a With logger's 500-byte
// field buffer per host and per stream, and a lingered writer's timer, and
// 13.4 KiB with a 512-byte read buffer. A credit stream's window-tuning
// state (56 bytes) and the pong notes came later: 13,460-13,540 bytes on a
// fresh process, then 12,780-12,860 with a 128-byte write buffer (was
// 512), no watch of the broker's context per session and no logger per
// stream, and 12,330-12,380 with no context of a session's own (later
// runs in one process see less). (The keepalive's context,
// ~350 bytes more after its first ping, was
// TestKeepaliveKeepsNoContextOfItsPings'; no ping is due within this
// test.)
const idleHeapPerSocket = 12550

// brokerHeap is the heap in use, as of a fresh collection, by objects that
// the broker's goroutines allocated: a stack through this package or
// net/http's connection goroutine, and through no test file (the test's
// own peers dial from it). Exact only with runtime.MemProfileRate 1 from
// before the allocations.
func brokerHeap(t *testing.T) int64 {
	t.Helper()
	inUse, _ := memprofile.Sum(brokerStack)
	return inUse
}

func brokerStack(pcs []uintptr) bool {
	frames := runtime.CallersFrames(pcs)
	broker := false
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.File, "_test.go") {
			return false
		}
		if strings.HasPrefix(f.Function, "github.com/hermes-securelink/securelink/broker/server.") ||
			f.Function == "net/http.(*conn).serve" {
			broker = true
		}
		if !more {
			return broker
		}
	}
}

// settledGoroutines waits until the goroutine count is at most want (-1:
// until it has not changed for longer than a writer lingers) and returns
// it; it gives up after a few seconds and returns the last count.
// Goroutines that merely finish (a drained writer's linger, the test's
// dials) are not counted that way.
func settledGoroutines(t *testing.T, want int) int {
	t.Helper()
	deadline := time.Now().Add(3*writerLinger + 2*time.Second)
	last, since := runtime.NumGoroutine(), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if want >= 0 && n <= want {
			return n
		}
		if n != last {
			last, since = n, time.Now()
		}
		if want < 0 && time.Since(since) > writerLinger+200*time.Millisecond {
			return n
		}
	}
	return runtime.NumGoroutine()
}

// serveIdleTLS runs a broker on a TLS loopback listener (the broker's own
// ServeListener) and returns its address and an HTTP client that trusts it.
// dialTLS opens a WebSocket to the connect path of serveIdleTLS's broker
// at addr, closed when the test ends.
func dialTLS(ctx context.Context, t *testing.T, addr string, hc *http.Client) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.Dial(ctx, "wss://"+addr+wire.ConnectPath, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	return ws
}

func serveIdleTLS(t *testing.T, mutate func(*Config)) (*env, string, *http.Client) {
	t.Helper()
	var pool = new(tls.Config)
	e := newEnv(t, func(c *Config) {
		c.InsecurePlaintext = false
		c.TLSCertFile, c.TLSKeyFile, pool.RootCAs = writeTestCert(t, t.TempDir())
		mutate(c)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.b.ServeListener(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	tr := &http.Transport{TLSClientConfig: pool}
	t.Cleanup(tr.CloseIdleConnections)
	return e, ln.Addr().String(), &http.Client{Transport: tr}
}

// A client may send its first frames right behind the upgrade request (in
// the same TCP segment): the bytes net/http already buffered reach the
// WebSocket through the broker's own small read buffer.
func TestUpgradeKeepsBytesSentWithTheRequest(t *testing.T) {
	e, addr, client := serveIdleTLS(t, func(*Config) {})
	reg, _ := wire.Marshal(wire.Register{Role: wire.RoleHost, HostID: e.hosts[0].id, ConnectionID: wire.NewID(), CredentialKind: wire.KindHost, Token: e.hosts[0].token})
	conn, err := tls.Dial("tcp", addr, client.Transport.(*http.Transport).TLSClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(step))
	req := "GET " + wire.ConnectPath + " HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	// One masked text frame (RFC 6455 §5.2), in the same write as the request.
	frame := []byte{0x81, 0x80 | 126, byte(len(reg) >> 8), byte(len(reg)), 1, 2, 3, 4}
	for i, c := range reg {
		frame = append(frame, c^byte(i%4+1))
	}
	if _, err := conn.Write(append([]byte(req), frame...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil || hdr[0] != 0x81 || hdr[1] >= 126 {
		t.Fatalf("first frame header % x: %v", hdr, err)
	}
	msg := make([]byte, hdr[1])
	if _, err := io.ReadFull(br, msg); err != nil {
		t.Fatal(err)
	}
	if m, err := wire.ParseBrokerMessage(msg); err != nil || m.Type() != wire.TypeRegistered {
		t.Fatalf("answered %q (%v)", msg, err)
	}
}
