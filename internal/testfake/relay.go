// Package testfake holds the project's test stand-ins for the parts it does
// not ship: the one fake Hermes Relay (relay.go) and the one fake Reach
// broker (broker.go). They listen on 127.0.0.1 only.
//
// The fake Relay serves the tests of the /relay/ws bridge (package relay),
// of the front that mounts it (package proxy), of the daemon and of the
// binary: one that answers GET /health, speaks the first-frame auth
// protocol on /ws exactly as the contract describes it and then echoes, so
// that every package's tests agree on what a Relay does.
package testfake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The first-frame protocol as the fake Relay speaks it. SessionToken is in
// AuthOKMsg so tests can check that it never reaches a log.
const (
	GoodCode     = "ABC123"
	SessionToken = "sess-secret-token"
	AuthOKMsg    = `{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":"` + SessionToken +
		`","expires_at":1893456000.5,"grants":{"chat":true},"transport_hint":"wss"}}`
	AuthFailMsg = `{"channel":"system","type":"auth.fail","payload":{"reason":"invalid pairing code"}}`
)

// MaxMessage is the contract's per-message limit; the "big" and "exact"
// commands send one byte more and exactly this many.
const MaxMessage = 4 << 20

// wait bounds every wait of a helper, so a broken bridge fails the test
// instead of hanging it. It is never an assertion about speed.
const wait = 15 * time.Second

// AuthFrame is a client's first frame carrying the pairing code.
func AuthFrame(code string) []byte {
	return []byte(`{"channel":"system","type":"auth","id":"1","payload":{"pairing_code":"` + code +
		`","device_id":"dev-1","device_name":"Test Phone"}}`)
}

// End is how one WebSocket peer saw its connection end: the close code and
// reason it received, or Code -1 when the connection dropped without a close
// frame.
type End struct {
	Code   websocket.StatusCode
	Reason string
}

// EndOf reads an End from the error a read or write returned.
func EndOf(err error) End {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return End{ce.Code, ce.Reason}
	}
	return End{Code: -1}
}

// Relay is the fake. Configure the exported fields in New's configure
// function (Refuse may also change later); read the counters at any time.
//
// After a successful auth it echoes every message, except these texts:
// "close4000" closes with 4000 "relay bye", "closeNoStatus" closes without
// status, "drop" drops the connection, "big" answers with a binary message
// of MaxMessage+1 bytes and "exact" with one of MaxMessage bytes. Each ended
// connection reports how the Relay saw it end (NextEnd); one the Relay closed
// itself reports its own code with reason "sent by relay".
type Relay struct {
	URL *url.URL // http://127.0.0.1:port, the bridge's upstream

	Subprotocols []string // selectable subprotocols
	NoPong       bool     // never answer pings (a dead peer)
	// NoAuth skips the first-frame protocol: every message is echoed from
	// the first. For clients' own stacks that only check the route.
	NoAuth bool
	// HoldAuth, when set, holds every verdict pending: after reading a
	// client's auth frame the Relay waits for one value from HoldAuth before
	// answering it (a slow Relay, or guesses still in flight); closing it
	// answers them all.
	HoldAuth chan struct{}

	Refuse   atomic.Int32 // non-zero: refuse upgrades with this status
	Probes   atomic.Int64 // GET /health requests
	Upgrades atomic.Int64 // requests to /ws, refused ones included
	Held     atomic.Int64 // auth frames waiting on HoldAuth now
	Received atomic.Int64 // messages read after a successful auth

	t    testing.TB
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
	ends chan End
	stop chan struct{} // closed at cleanup: held verdicts give up
}

// NewRelay starts a fake Relay on 127.0.0.1, closed when the test ends.
func NewRelay(t testing.TB, configure func(*Relay)) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return NewRelayOn(t, ln, configure)
}

// NewRelayOn is NewRelay serving on ln (a test that must shape the
// accepted sockets, or a helper process that is killed instead of closed).
func NewRelayOn(t testing.TB, ln net.Listener, configure func(*Relay)) *Relay {
	t.Helper()
	f := &Relay{t: t, ends: make(chan End, 64), stop: make(chan struct{})}
	if configure != nil {
		configure(f)
	}
	f.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(f.serve)}}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	// Runs before srv.Close, which waits for the handlers still holding.
	t.Cleanup(func() { close(f.stop) })
	var err error
	if f.URL, err = url.Parse(f.srv.URL); err != nil {
		t.Fatal(err)
	}
	return f
}

// end records how a connection ended; beyond the buffer (nobody reads
// NextEnd) it is dropped rather than holding the handler.
func (f *Relay) end(e End) {
	select {
	case f.ends <- e:
	default:
	}
}

// Requests returns the requests to /ws so far, oldest first.
func (f *Relay) Requests() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.reqs...)
}

// LastRequest is the latest request to /ws; the test fails without one.
func (f *Relay) LastRequest() *http.Request {
	f.t.Helper()
	r := f.Requests()
	if len(r) == 0 {
		f.t.Fatal("relay received no upgrade")
	}
	return r[len(r)-1]
}

// NextEnd waits for the next connection to end.
func (f *Relay) NextEnd() End {
	f.t.Helper()
	select {
	case e := <-f.ends:
		return e
	case <-time.After(wait):
		f.t.Fatal("relay connection did not end")
		return End{}
	}
}

func (f *Relay) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		f.Probes.Add(1)
		io.WriteString(w, `{"ok":true}`)
		return
	}
	if r.URL.Path != "/ws" {
		http.NotFound(w, r)
		return
	}
	f.Upgrades.Add(1)
	f.mu.Lock()
	f.reqs = append(f.reqs, r.Clone(context.Background()))
	f.mu.Unlock()
	if code := f.Refuse.Load(); code != 0 {
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Set-Cookie", "relay=secret")
		http.Error(w, "refused by relay", int(code))
		return
	}
	opts := &websocket.AcceptOptions{Subprotocols: f.Subprotocols, InsecureSkipVerify: true}
	if f.NoPong {
		opts.OnPingReceived = func(context.Context, []byte) bool { return false }
	}
	c, err := websocket.Accept(w, r, opts)
	if err != nil {
		return
	}
	c.SetReadLimit(16 << 20)
	ctx := context.Background()
	if f.NoAuth {
		f.echo(ctx, c)
		return
	}
	_, first, err := c.Read(ctx)
	if err != nil {
		f.end(EndOf(err))
		return
	}
	if f.HoldAuth != nil {
		f.Held.Add(1)
		select {
		case <-f.HoldAuth:
			f.Held.Add(-1)
		case <-f.stop:
			f.Held.Add(-1)
			_ = c.CloseNow()
			return
		}
	}
	var auth struct {
		Type    string `json:"type"`
		Payload struct {
			PairingCode string `json:"pairing_code"`
		} `json:"payload"`
	}
	if json.Unmarshal(first, &auth) != nil || auth.Type != "auth" || auth.Payload.PairingCode != GoodCode {
		_ = c.Write(ctx, websocket.MessageText, []byte(AuthFailMsg))
		_ = c.Close(websocket.StatusPolicyViolation, "auth failed")
		f.end(End{websocket.StatusPolicyViolation, "sent by relay"})
		return
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(AuthOKMsg)); err != nil {
		f.end(EndOf(err))
		return
	}
	f.echo(ctx, c)
}

// echo answers every message after the auth (see Relay).
func (f *Relay) echo(ctx context.Context, c *websocket.Conn) {
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			f.end(EndOf(err))
			return
		}
		f.Received.Add(1)
		switch string(msg) {
		case "close4000":
			_ = c.Close(4000, "relay bye")
			f.end(End{4000, "sent by relay"})
			return
		case "closeNoStatus":
			_ = c.Close(websocket.StatusNoStatusRcvd, "")
			f.end(End{websocket.StatusNoStatusRcvd, "sent by relay"})
			return
		case "drop":
			_ = c.CloseNow()
			f.end(End{-1, "dropped by relay"})
			return
		case "big":
			msg, typ = make([]byte, MaxMessage+1), websocket.MessageBinary
		case "exact":
			msg, typ = bytes.Repeat([]byte{'x'}, MaxMessage), websocket.MessageBinary
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			// The bridge closed while we wrote; report how it closed.
			_, _, rerr := c.Read(ctx)
			f.end(EndOf(rerr))
			return
		}
	}
}

// Authenticate sends the first-frame auth with code on c, a client's
// connection through the bridge, and returns the verdict message.
func Authenticate(t testing.TB, c *websocket.Conn, code string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, AuthFrame(code)); err != nil {
		t.Fatalf("writing the auth frame: %v", err)
	}
	typ, msg, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("reading the auth verdict: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("verdict type = %v", typ)
	}
	return string(msg)
}
