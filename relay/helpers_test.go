package relay

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

func testOptions(t *testing.T, relay *testfake.Relay) Options {
	return Options{
		Upstream:     relay.URL,
		DialTimeout:  3 * time.Second,
		Log:          zerolog.New(zerolog.NewTestWriter(t)),
		messagesOnly: messagesOnly,
	}
}

// messagesOnly is what testOptions sets Options.messagesOnly to; bothModes
// switches it.
var messagesOnly bool

// bothModes runs f twice: with the bridge forwarding frames after auth.ok
// (the default, "frames") and reading whole messages throughout
// ("messages"), so every rule f checks holds on both paths.
func bothModes(t *testing.T, f func(t *testing.T)) {
	for _, mode := range []struct {
		name     string
		messages bool
	}{{"frames", false}, {"messages", true}} {
		t.Run(mode.name, func(t *testing.T) {
			messagesOnly = mode.messages
			defer func() { messagesOnly = false }()
			f(t)
		})
	}
}

// frontFor serves b on 127.0.0.1 the way the proxy mounts it; broker marks
// every connection as arrived through a Reach broker stream.
func frontFor(t *testing.T, b *Bridge, broker bool) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/relay/ws", b)
	srv := httptest.NewUnstartedServer(mux)
	if broker {
		srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
			return WithBrokerStream(ctx)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func newBridge(t *testing.T, o Options) *Bridge {
	t.Helper()
	b, err := NewBridge(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return b
}

// setup returns a fake relay, a bridge in front of it, and the front server.
func setup(t *testing.T, configureRelay func(*testfake.Relay), configure func(*Options)) (*testfake.Relay, *Bridge, *httptest.Server) {
	t.Helper()
	relay := testfake.NewRelay(t, configureRelay)
	o := testOptions(t, relay)
	if configure != nil {
		configure(&o)
	}
	b := newBridge(t, o)
	return relay, b, frontFor(t, b, false)
}

type dialOpt struct {
	localIP string
	header  http.Header
	query   string
	protos  []string
	noPong  bool
}

func wsURL(srv *httptest.Server, query string) string {
	u := "ws://" + srv.Listener.Addr().String() + "/relay/ws"
	if query != "" {
		u += "?" + query
	}
	return u
}

func dial(t *testing.T, srv *httptest.Server, o dialOpt) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	if o.localIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(o.localIP)}
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	opts := &websocket.DialOptions{HTTPClient: hc, HTTPHeader: o.header, Subprotocols: o.protos}
	if o.noPong {
		opts.OnPingReceived = func(context.Context, []byte) bool { return false }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL(srv, o.query), opts)
	if c != nil {
		c.SetReadLimit(16 << 20)
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

func mustDial(t *testing.T, srv *httptest.Server, o dialOpt) *websocket.Conn {
	t.Helper()
	c, resp, err := dial(t, srv, o)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial: %v (status %d)", err, status)
	}
	return c
}

func readMsg(t *testing.T, c *websocket.Conn) (websocket.MessageType, []byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return c.Read(ctx)
}

func send(t *testing.T, c *websocket.Conn, typ websocket.MessageType, msg []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.Write(ctx, typ, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// failAuth runs one failed authentication from localIP to completion.
func failAuth(t *testing.T, srv *httptest.Server, localIP string) {
	t.Helper()
	c := mustDial(t, srv, dialOpt{localIP: localIP})
	if got := testfake.Authenticate(t, c, "WRONG1"); got != testfake.AuthFailMsg {
		t.Fatalf("verdict = %s, want auth.fail", got)
	}
	if _, _, err := readMsg(t, c); testfake.EndOf(err).Code != websocket.StatusPolicyViolation {
		t.Fatalf("after auth.fail: %v, want close 1008", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func headerNames(h http.Header) []string {
	var out []string
	for k := range h {
		out = append(out, strings.ToLower(k))
	}
	return out
}

// abruptEOFConn is a connection whose reads end as a leg's do (abruptEOF),
// for tests that build legs over plain connections.
type abruptEOFConn struct{ net.Conn }

func (c abruptEOFConn) Read(p []byte) (int, error) { return abruptEOF{c.Conn}.Read(p) }
