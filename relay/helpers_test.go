package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"
)

const (
	goodCode = "ABC123"
	mib4     = 4 << 20
)

func authFrame(code string) []byte {
	return []byte(`{"channel":"system","type":"auth","id":"1","payload":{"pairing_code":"` + code +
		`","device_id":"dev-1","device_name":"Test Phone"}}`)
}

const authOKMsg = `{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":"sess-tok",` +
	`"expires_at":1893456000.5,"grants":{"chat":true},"transport_hint":"wss"}}`

const authFailMsg = `{"channel":"system","type":"auth.fail","payload":{"reason":"invalid pairing code"}}`

// seenClose is how one leg's peer saw the connection end.
type seenClose struct {
	code   websocket.StatusCode // -1: no close frame (connection dropped)
	reason string
}

func closeOf(err error) seenClose {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return seenClose{ce.Code, ce.Reason}
	}
	return seenClose{code: -1}
}

// fakeRelay speaks the Relay's first-frame auth on /ws, then echoes. Special
// text messages make it close or send an oversize message.
type fakeRelay struct {
	t            *testing.T
	srv          *httptest.Server
	refuse       int      // non-zero: refuse the upgrade with this status
	subprotocols []string // selectable subprotocols
	noPong       bool     // never answer pings (a dead peer)

	mu   sync.Mutex
	reqs []*http.Request

	closes chan seenClose // one per finished connection
}

func newFakeRelay(t *testing.T, configure func(*fakeRelay)) *fakeRelay {
	t.Helper()
	f := &fakeRelay{t: t, closes: make(chan seenClose, 64)}
	if configure != nil {
		configure(f)
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRelay) baseURL() *url.URL {
	u, err := url.Parse(f.srv.URL)
	if err != nil {
		f.t.Fatal(err)
	}
	return u
}

func (f *fakeRelay) requests() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.reqs...)
}

func (f *fakeRelay) lastRequest() *http.Request {
	f.t.Helper()
	r := f.requests()
	if len(r) == 0 {
		f.t.Fatal("relay received no request")
	}
	return r[len(r)-1]
}

func (f *fakeRelay) nextClose() seenClose {
	f.t.Helper()
	select {
	case c := <-f.closes:
		return c
	case <-time.After(15 * time.Second):
		f.t.Fatal("relay connection did not end")
		return seenClose{}
	}
}

func (f *fakeRelay) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.reqs = append(f.reqs, r.Clone(context.Background()))
	f.mu.Unlock()
	if r.URL.Path != "/ws" {
		http.NotFound(w, r)
		return
	}
	if f.refuse != 0 {
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Set-Cookie", "relay=secret")
		http.Error(w, "refused by relay", f.refuse)
		return
	}
	opts := &websocket.AcceptOptions{Subprotocols: f.subprotocols, InsecureSkipVerify: true}
	if f.noPong {
		opts.OnPingReceived = func(context.Context, []byte) bool { return false }
	}
	c, err := websocket.Accept(w, r, opts)
	if err != nil {
		return
	}
	c.SetReadLimit(16 << 20)
	ctx := context.Background()
	_, first, err := c.Read(ctx)
	if err != nil {
		f.closes <- closeOf(err)
		return
	}
	var auth struct {
		Payload struct {
			PairingCode string `json:"pairing_code"`
		} `json:"payload"`
	}
	if json.Unmarshal(first, &auth) != nil || auth.Payload.PairingCode != goodCode {
		_ = c.Write(ctx, websocket.MessageText, []byte(authFailMsg))
		_ = c.Close(websocket.StatusPolicyViolation, "auth failed")
		f.closes <- seenClose{websocket.StatusPolicyViolation, "sent by relay"}
		return
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(authOKMsg)); err != nil {
		f.closes <- closeOf(err)
		return
	}
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			f.closes <- closeOf(err)
			return
		}
		switch string(msg) {
		case "close4000":
			_ = c.Close(4000, "relay bye")
			f.closes <- seenClose{4000, "sent by relay"}
			return
		case "closeNoStatus":
			_ = c.Close(websocket.StatusNoStatusRcvd, "")
			f.closes <- seenClose{websocket.StatusNoStatusRcvd, "sent by relay"}
			return
		case "drop":
			_ = c.CloseNow()
			f.closes <- seenClose{-1, "dropped by relay"}
			return
		case "big":
			msg, typ = make([]byte, mib4+1), websocket.MessageBinary
		case "exact":
			msg, typ = bytes.Repeat([]byte{'x'}, mib4), websocket.MessageBinary
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			// The bridge closed while we wrote; report how it closed.
			_, _, rerr := c.Read(ctx)
			f.closes <- closeOf(rerr)
			return
		}
	}
}

func testOptions(t *testing.T, relay *fakeRelay) Options {
	return Options{
		Upstream:    relay.baseURL(),
		DialTimeout: 3 * time.Second,
		Log:         zerolog.New(zerolog.NewTestWriter(t)),
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
func setup(t *testing.T, configureRelay func(*fakeRelay), configure func(*Options)) (*fakeRelay, *Bridge, *httptest.Server) {
	t.Helper()
	relay := newFakeRelay(t, configureRelay)
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

// authenticate sends the first-frame auth and returns the Relay's answer.
func authenticate(t *testing.T, c *websocket.Conn, code string) string {
	t.Helper()
	send(t, c, websocket.MessageText, authFrame(code))
	typ, msg, err := readMsg(t, c)
	if err != nil {
		t.Fatalf("reading auth verdict: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("verdict type = %v", typ)
	}
	return string(msg)
}

// failAuth runs one failed authentication from localIP to completion.
func failAuth(t *testing.T, srv *httptest.Server, localIP string) {
	t.Helper()
	c := mustDial(t, srv, dialOpt{localIP: localIP})
	if got := authenticate(t, c, "WRONG1"); got != authFailMsg {
		t.Fatalf("verdict = %s, want auth.fail", got)
	}
	if _, _, err := readMsg(t, c); closeOf(err).code != websocket.StatusPolicyViolation {
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
