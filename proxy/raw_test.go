package proxy

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/rawsock"
	"github.com/hermes-securelink/securelink/internal/rawsock/rawsocktest"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// countedListener hands the front real TCP connections (their SyscallConn
// shows through) that count the calls of their net.Conn Read and Write.
type countedListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*rawsocktest.Counted
}

func (l *countedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &rawsocktest.Counted{TCPConn: c.(*net.TCPConn)}
	l.mu.Lock()
	l.conns = append(l.conns, cc)
	l.mu.Unlock()
	return cc, nil
}

// The front's accepted client sockets move their bytes with raw system
// calls (internal/rawsock) under its TLS, never through the connection's
// own Read and Write, which enter the runtime's system-call bookkeeping
// (after an idle spell each first call woke the runtime's monitor thread:
// a futex and about one nanosleep per WebSocket echo). A small GET, the
// health answer and a /relay/ws echo are served whole; the upstream pool's
// connections are raw ones too (the bridge's Relay leg: relay's
// TestRelayLegIsRaw).
func TestFrontSocketsMoveBytesWithRawCalls(t *testing.T) {
	if !rawsock.Enabled {
		t.Skip("raw system calls are Linux-only")
	}
	cl := &countedListener{}
	h := newHarness(t, func(h *harness) { cl.Listener = h.ln; h.ln = cl })
	for range 3 {
		if resp, body := h.get("/api/small"); resp.StatusCode != http.StatusOK || string(body) != "upstream ok" {
			t.Fatalf("GET /api/small: %d %q", resp.StatusCode, body)
		}
	}
	if resp, _ := h.get("/relay/health"); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /relay/health: %d", resp.StatusCode)
	}
	c := h.mustDialWS("/relay/ws", "")
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("auth verdict %s, want the Relay's auth.ok unchanged", got)
	}
	for i := range 10 {
		wsSend(t, c, websocket.MessageText, []byte{'m', byte('0' + i)})
		if _, msg, err := wsRead(c); err != nil || string(msg) != string([]byte{'m', byte('0' + i)}) {
			t.Fatalf("echo %d: %q, %v", i, msg, err)
		}
	}
	c.Close(websocket.StatusNormalClosure, "done")
	if e := h.relay.NextEnd(); e.Code != websocket.StatusNormalClosure {
		t.Fatalf("relay saw %v, want 1000", e)
	}
	cl.mu.Lock()
	conns := cl.conns
	cl.mu.Unlock()
	if len(conns) < 2 {
		t.Fatalf("%d connections accepted, want the HTTP client's and the WebSocket's", len(conns))
	}
	for i, cc := range conns {
		if r, w := cc.Reads.Load(), cc.Writes.Load(); r != 0 || w != 0 {
			t.Errorf("accepted connection %d: %d Read and %d Write calls, want none: the bytes moved through them", i, r, w)
		}
	}

	// The upstream leg: the pool's connections.
	pool := newUpstreamPool(&net.Dialer{Timeout: testTimeout}, h.api.url.Host, time.Minute, 1)
	pc, err := pool.get(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.conn.Close()
	if _, ok := pc.conn.(*rawsock.Conn); !ok || pc.raw == nil {
		t.Errorf("the upstream pool's connection is a %T (RawConn %v), want a *rawsock.Conn", pc.conn, pc.raw != nil)
	}
}
