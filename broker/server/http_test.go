package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// wsEnv is a broker behind a real HTTP server on 127.0.0.1.
type wsEnv struct {
	*env
	srv *httptest.Server
}

func newWSEnv(t *testing.T, mutate func(*Config)) *wsEnv {
	e := newEnv(t, mutate)
	srv := httptest.NewServer(e.b.Handler())
	t.Cleanup(func() {
		e.b.Close() // upgraded sockets first, or srv.Close would wait for them
		srv.Close()
	})
	return &wsEnv{env: e, srv: srv}
}

// client returns an HTTP client whose connections come from localIP.
func fromIP(localIP string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}, Timeout: step}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: step}
}

func (w *wsEnv) url(path string) string { return w.srv.URL + path }

// wsPeer is a test-side WebSocket whose reader runs all the time, as a real
// peer's does, so pings are answered whatever the test is doing.
type wsPeer struct {
	c     *websocket.Conn
	ch    chan wsResult
	pings atomic.Int64 // pings received (and answered)
}

type wsResult struct {
	typ  websocket.MessageType
	data []byte
	err  error
}

func (w *wsEnv) dialWS(t *testing.T, localIP string) *wsPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	p := &wsPeer{ch: make(chan wsResult, 64)}
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(w.url(wire.ConnectPath), "http"), &websocket.DialOptions{
		HTTPClient:     fromIP(localIP),
		OnPingReceived: func(context.Context, []byte) bool { p.pings.Add(1); return true },
	})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial: %v (HTTP %d)", err, status)
	}
	c.SetReadLimit(4 << 20)
	t.Cleanup(func() { c.CloseNow() })
	p.c = c
	go func() {
		for {
			typ, data, err := c.Read(context.Background())
			p.ch <- wsResult{typ, data, err}
			if err != nil {
				return
			}
		}
	}()
	return p
}

func wsSend(t *testing.T, p *wsPeer, typ websocket.MessageType, b []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if err := p.c.Write(ctx, typ, b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func wsRead(t *testing.T, p *wsPeer) (websocket.MessageType, []byte, error) {
	t.Helper()
	select {
	case r := <-p.ch:
		return r.typ, r.data, r.err
	case <-time.After(step):
		t.Fatalf("nothing arrived within %v", step)
		return 0, nil, nil
	}
}

func wsMsg(t *testing.T, c *wsPeer) wire.Message {
	t.Helper()
	typ, data, err := wsRead(t, c)
	if err != nil || typ != websocket.MessageText {
		t.Fatalf("expected text, got %v %d bytes %v", typ, len(data), err)
	}
	m, err := wire.ParseBrokerMessage(data)
	if err != nil {
		t.Fatalf("%q: %v", data, err)
	}
	return m
}

func wsClose(t *testing.T, c *wsPeer) websocket.StatusCode {
	t.Helper()
	_, data, err := wsRead(t, c)
	if err == nil {
		t.Fatalf("expected a close, got %q", trim(data))
	}
	return websocket.CloseStatus(err)
}

func (w *wsEnv) wsRegister(t *testing.T, c *wsPeer, role wire.Role, i int, kind wire.Kind, tok wire.Secret) {
	t.Helper()
	msg, _ := wire.Marshal(wire.Register{Role: role, HostID: w.hosts[i].id, ConnectionID: wire.NewID(), CredentialKind: kind, Token: tok})
	wsSend(t, c, websocket.MessageText, msg)
}

func TestHTTPRefusesCredentialsOutsideTheRegisterMessage(t *testing.T) {
	w := newWSEnv(t, nil)
	upgrade := func(req *http.Request) {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	}
	cases := map[string]func(*http.Request){
		"query string":   func(r *http.Request) { r.URL.RawQuery = "token=" + string(w.hosts[0].token) },
		"empty query":    func(r *http.Request) { r.URL.ForceQuery = true },
		"authorization":  func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+string(w.hosts[0].token)) },
		"empty auth hdr": func(r *http.Request) { r.Header["Authorization"] = []string{""} },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", w.url(wire.ConnectPath), nil)
			upgrade(req)
			mutate(req)
			resp, err := fromIP("127.0.0.1").Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("HTTP %d", resp.StatusCode)
			}
			if bytes.Contains(body, []byte(w.hosts[0].token)) {
				t.Fatal("the token was echoed")
			}
		})
	}
	// The same request without them upgrades.
	c := w.dialWS(t, "127.0.0.1")
	w.wsRegister(t, c, wire.RoleHost, 0, wire.KindHost, w.hosts[0].token)
	if m := wsMsg(t, c); m.Type() != wire.TypeRegistered {
		t.Fatalf("%#v", m)
	}
}

func TestHTTPRateLimitPerSource(t *testing.T) {
	w := newWSEnv(t, func(c *Config) { c.AttemptsPerMinute = 3 })
	status := func(ip string) int {
		req, _ := http.NewRequest("GET", w.url(wire.ConnectPath), nil) // not even an upgrade: still an attempt
		resp, err := fromIP(ip).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; i < 3; i++ {
		if s := status("127.0.0.1"); s == http.StatusTooManyRequests {
			t.Fatalf("attempt %d limited", i+1)
		}
	}
	if s := status("127.0.0.1"); s != http.StatusTooManyRequests {
		t.Fatalf("4th attempt: HTTP %d", s)
	}
	// Another source is not affected, and a WebSocket from it works.
	c := w.dialWS(t, "127.0.0.2")
	w.wsRegister(t, c, wire.RoleHost, 0, wire.KindHost, w.hosts[0].token)
	if m := wsMsg(t, c); m.Type() != wire.TypeRegistered {
		t.Fatalf("%#v", m)
	}
	// /health is not a registration attempt.
	resp, err := fromIP("127.0.0.1").Get(w.url("/health"))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
}

// A full table of sources forgets the least recently seen source to admit a
// new one (it used to refuse every newcomer), while a source over its limit
// that keeps trying stays tracked and limited.
func TestHTTPRateLimitTableForgetsLeastRecentlySeen(t *testing.T) {
	w := newWSEnv(t, func(c *Config) { c.MaxRateSources = 3 })
	status := func(ip string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", w.url(wire.ConnectPath), nil)
		resp, err := fromIP(ip).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; i < 30; i++ {
		if s := status("127.0.0.1"); s == http.StatusTooManyRequests {
			t.Fatalf("attempt %d limited", i+1)
		}
	}
	status("127.0.0.2")
	status("127.0.0.3")
	if s := status("127.0.0.1"); s != http.StatusTooManyRequests {
		t.Fatalf("31st attempt within a minute: HTTP %d", s)
	}
	// The table is full (.1, .2, .3; .2 least recently seen).
	if s := status("127.0.0.4"); s == http.StatusTooManyRequests {
		t.Fatal("a new source was refused because the table is full")
	}
	w.b.limiter.mu.Lock()
	forgot, keeps, n := !w.b.limiter.m.Contains("127.0.0.2"), w.b.limiter.m.Contains("127.0.0.1"), w.b.limiter.m.Len()
	w.b.limiter.mu.Unlock()
	if !forgot || !keeps || n != 3 {
		t.Fatalf("after a newcomer: forgot .2 %v, kept .1 %v, %d sources", forgot, keeps, n)
	}
	if s := status("127.0.0.1"); s != http.StatusTooManyRequests {
		t.Fatalf("the limited source escaped its limit: HTTP %d", s)
	}
}

func TestHTTPHealth(t *testing.T) {
	w := newWSEnv(t, nil)
	health := func() map[string]any {
		resp, err := fromIP("127.0.0.1").Get(w.url("/health"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("content type %q", ct)
		}
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	want := `{"active_streams":0,"hosts_online":0,"ok":true,"protocol_version":1,"service":"hermes_reach"}`
	if got := mustJSON(health()); got != want {
		t.Fatalf("health %s", got)
	}
	host := w.dialWS(t, "127.0.0.1")
	w.wsRegister(t, host, wire.RoleHost, 0, wire.KindHost, w.hosts[0].token)
	wsMsg(t, host)
	tok := wire.NewToken()
	msg, _ := wire.Marshal(wire.PublishRoute{CredentialID: "r", TokenSHA256: wire.TokenDigest(string(tok)), ExpiresAt: w.clock.Now().Unix() + 60, DeviceIDHash: wire.TokenDigest("d")})
	wsSend(t, host, websocket.MessageText, msg)
	wsMsg(t, host)
	c := w.dialWS(t, "127.0.0.1")
	w.wsRegister(t, c, wire.RoleClient, 0, wire.KindRoute, tok)
	wsMsg(t, host)
	wsMsg(t, c)
	if got := health(); got["hosts_online"] != 1.0 || got["active_streams"] != 1.0 {
		t.Fatalf("health %v", got)
	}
}

func TestWebSocketEndToEnd(t *testing.T) {
	w := newWSEnv(t, func(c *Config) {
		c.PingInterval = 50 * time.Millisecond
		// Generous: a loaded machine can take seconds to move a 1 MiB
		// message, and no pong is read meanwhile. Dropping silent peers
		// is TestKeepaliveDropsSilentPeers' job; here pings must flow.
		c.PongTimeout = time.Minute
	})
	host := w.dialWS(t, "127.0.0.1")
	w.wsRegister(t, host, wire.RoleHost, 0, wire.KindHost, w.hosts[0].token)
	if m := wsMsg(t, host); m.Type() != wire.TypeRegistered {
		t.Fatalf("%#v", m)
	}
	tok := wire.NewToken()
	msg, _ := wire.Marshal(wire.PublishRoute{CredentialID: "r", TokenSHA256: wire.TokenDigest(string(tok)), ExpiresAt: w.clock.Now().Unix() + 60, DeviceIDHash: wire.TokenDigest("d")})
	wsSend(t, host, websocket.MessageText, msg)
	if m := wsMsg(t, host); m != (wire.Published{CredentialKind: wire.KindRoute, Label: "r"}) {
		t.Fatalf("%#v", m)
	}
	open := func() (*wsPeer, wire.ID) {
		c := w.dialWS(t, "127.0.0.1")
		w.wsRegister(t, c, wire.RoleClient, 0, wire.KindRoute, tok)
		o, ok := wsMsg(t, host).(wire.Open)
		if !ok {
			t.Fatal("no open")
		}
		if m, ok := wsMsg(t, c).(wire.Matched); !ok || m.StreamID != o.StreamID {
			t.Fatal("no matched")
		}
		return c, o.StreamID
	}
	c, id := open()

	// A 1 MiB client message reaches the host as two frames of at most 1 MiB.
	big := make([]byte, wire.MaxClientFrame)
	for i := range big {
		big[i] = byte(i * 7)
	}
	wsSend(t, c, websocket.MessageBinary, big)
	var got []byte
	for i := 0; i < 2; i++ {
		typ, f, err := wsRead(t, host)
		if err != nil || typ != websocket.MessageBinary || len(f) > wire.MaxHostFrameOut {
			t.Fatalf("frame %d: %v %d bytes %v", i, typ, len(f), err)
		}
		fr, err := wire.ParseFrame(f)
		if err != nil || fr.StreamID != id {
			t.Fatal(err)
		}
		got = append(got, fr.Payload...)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("payload differs")
	}
	// A 1 MiB + 18 frame from the host reaches the client byte for byte.
	wsSend(t, host, websocket.MessageBinary, dataFrame2(id, big))
	var back []byte
	for len(back) < len(big) {
		typ, p, err := wsRead(t, c)
		if err != nil || typ != websocket.MessageBinary {
			t.Fatal(err)
		}
		back = append(back, p...)
	}
	if !bytes.Equal(back, big) {
		t.Fatal("host→client payload differs")
	}
	// Pings flow while both sides read: the broker pings again only once
	// it has seen the pong of its previous ping. Nobody is dropped.
	hostPings, clientPings := host.pings.Load(), c.pings.Load()
	waitFor(t, "more ping round trips with both peers", func() bool {
		return host.pings.Load() >= hostPings+3 && c.pings.Load() >= clientPings+3
	})
	if st := w.b.Stats(); st.HostsOnline != 1 || st.ActiveStreams != 1 {
		t.Fatalf("stats %+v", st)
	}

	// 1 MiB + 1 from the client: 1009, and CLOSE to the host.
	wsSend(t, c, websocket.MessageBinary, make([]byte, wire.MaxClientFrame+1))
	if code := wsClose(t, c); code != websocket.StatusMessageTooBig {
		t.Fatalf("client closed %d", code)
	}
	if _, f, _ := wsRead(t, host); !bytes.Equal(f, closeFrame(id)) {
		t.Fatalf("host got %x", f)
	}

	// Text after matched: error unauthorized, 1008.
	c2, id2 := open()
	wsSend(t, c2, websocket.MessageText, []byte(`{}`))
	if m := wsMsg(t, c2); m != (wire.ErrorMsg{Code: wire.CodeUnauthorized}) {
		t.Fatalf("%#v", m)
	}
	if code := wsClose(t, c2); code != websocket.StatusPolicyViolation {
		t.Fatalf("close %d", code)
	}
	if _, f, _ := wsRead(t, host); !bytes.Equal(f, closeFrame(id2)) {
		t.Fatalf("host got %x", f)
	}

	// The host's CLOSE ends the client with 1000.
	c3, id3 := open()
	wsSend(t, host, websocket.MessageBinary, closeFrame(id3))
	if code := wsClose(t, c3); code != websocket.StatusNormalClosure {
		t.Fatalf("close %d", code)
	}

	// A host frame above 1 MiB + 18: 1009 and the host is gone.
	c4, id4 := open()
	wsSend(t, host, websocket.MessageBinary, dataFrame2(id4, make([]byte, wire.MaxClientFrame+1)))
	if code := wsClose(t, host); code != websocket.StatusMessageTooBig {
		t.Fatalf("host closed %d", code)
	}
	if code := wsClose(t, c4); code != websocket.StatusGoingAway {
		t.Fatalf("client closed %d", code)
	}
}

func TestWebSocketRegistrationLimits(t *testing.T) {
	w := newWSEnv(t, nil)
	t.Run("4097 bytes is unauthorized", func(t *testing.T) {
		c := w.dialWS(t, "127.0.0.1")
		wsSend(t, c, websocket.MessageText, bytes.Repeat([]byte(" "), wire.MaxControlBytes+1))
		if m := wsMsg(t, c); m != (wire.ErrorMsg{Code: wire.CodeUnauthorized}) {
			t.Fatalf("%#v", m)
		}
		if code := wsClose(t, c); code != websocket.StatusPolicyViolation {
			t.Fatalf("close %d", code)
		}
	})
	// Not only one byte over: any frame the broker can still read whole
	// (up to twice the limit) is a bad registration, not a transport error.
	t.Run("up to 8192 bytes is unauthorized", func(t *testing.T) {
		for _, n := range []int{wire.MaxControlBytes + 2, wire.MaxControlBytes + 100, 2 * wire.MaxControlBytes} {
			c := w.dialWS(t, "127.0.0.1")
			wsSend(t, c, websocket.MessageText, bytes.Repeat([]byte(" "), n))
			if m := wsMsg(t, c); m != (wire.ErrorMsg{Code: wire.CodeUnauthorized}) {
				t.Fatalf("%d bytes: %#v", n, m)
			}
			if code := wsClose(t, c); code != websocket.StatusPolicyViolation {
				t.Fatalf("%d bytes: close %d", n, code)
			}
		}
	})
	t.Run("larger is 1009", func(t *testing.T) {
		c := w.dialWS(t, "127.0.0.1")
		wsSend(t, c, websocket.MessageText, bytes.Repeat([]byte(" "), 64<<10))
		if code := wsClose(t, c); code != websocket.StatusMessageTooBig {
			t.Fatalf("close %d", code)
		}
	})
	t.Run("replaced host sees reason replaced", func(t *testing.T) {
		old := w.dialWS(t, "127.0.0.1")
		w.wsRegister(t, old, wire.RoleHost, 1, wire.KindHost, w.hosts[1].token)
		wsMsg(t, old)
		newer := w.dialWS(t, "127.0.0.1")
		w.wsRegister(t, newer, wire.RoleHost, 1, wire.KindHost, w.hosts[1].token)
		wsMsg(t, newer)
		_, _, err := wsRead(t, old)
		var ce websocket.CloseError
		if !errorsAs(err, &ce) || ce.Code != websocket.StatusNormalClosure || ce.Reason != wire.CloseReasonReplaced {
			t.Fatalf("old host: %v", err)
		}
	})
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
