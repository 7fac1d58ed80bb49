package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// --- /relay/ws: the message-level bridge through the real front ---

func TestRelayMessagesEchoInOrder(t *testing.T) {
	h := newHarness(t)
	c := h.mustDialWS("/relay/ws", "")
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("auth verdict %s, want the Relay's auth.ok unchanged", got)
	}
	const n = 60
	for i := range n {
		typ := websocket.MessageText
		if i%2 == 1 {
			typ = websocket.MessageBinary
		}
		wsSend(t, c, typ, []byte(fmt.Sprintf("msg-%03d", i)))
	}
	for i := range n {
		typ, msg, err := wsRead(c)
		if err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
		want := websocket.MessageText
		if i%2 == 1 {
			want = websocket.MessageBinary
		}
		if string(msg) != fmt.Sprintf("msg-%03d", i) || typ != want {
			t.Fatalf("echo %d = %v %q", i, typ, msg)
		}
	}
	c.Close(websocket.StatusNormalClosure, "done")
	if e := h.relay.NextEnd(); e.Code != websocket.StatusNormalClosure {
		t.Fatalf("relay saw %v, want 1000", e)
	}
}

func TestRelayCloseCode4000ArrivesAs4000(t *testing.T) {
	h := newHarness(t)
	c := h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, c, testfake.GoodCode)
	wsSend(t, c, websocket.MessageText, []byte("close4000"))
	_, _, err := wsRead(c)
	if e := testfake.EndOf(err); e.Code != 4000 || e.Reason != "relay bye" {
		t.Fatalf("client saw %+v, want 4000 \"relay bye\"", e)
	}
	h.relay.NextEnd()

	// And the other way round: the client's code reaches the Relay.
	c = h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, c, testfake.GoodCode)
	c.Close(4123, "client bye")
	if e := h.relay.NextEnd(); e.Code != 4123 || e.Reason != "client bye" {
		t.Fatalf("relay saw %+v, want 4123 \"client bye\"", e)
	}
}

func TestRelayAuthFailuresBlockOnlyThatSource(t *testing.T) {
	h := newHarness(t)
	for i := range 5 {
		c := h.mustDialWS("/relay/ws", "127.0.0.1")
		if got := testfake.Authenticate(t, c, "WRONG"); got != testfake.AuthFailMsg {
			t.Fatalf("attempt %d: verdict %s", i, got)
		}
		if _, _, err := wsRead(c); testfake.EndOf(err).Code != websocket.StatusPolicyViolation {
			t.Fatalf("attempt %d: after auth.fail %v, want the Relay's 1008", i, err)
		}
		h.relay.NextEnd()
	}
	_, resp, err := h.dialWS("/relay/ws", "127.0.0.1")
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("6th upgrade from a blocked source: err %v resp %v, want 429", err, resp)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if n := h.relay.Upgrades.Load(); n != 5 {
		t.Fatalf("the Relay saw %d upgrades; a blocked source must not reach it", n)
	}
	// Another source is not blocked at the front, even with the right code.
	c := h.mustDialWS("/relay/ws", "127.0.0.2")
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("other source: verdict %s", got)
	}
	wsSend(t, c, websocket.MessageText, []byte("still here"))
	if _, msg, err := wsRead(c); err != nil || string(msg) != "still here" {
		t.Fatalf("other source echo %q %v", msg, err)
	}
	// The blocked source stays blocked.
	if _, resp, _ := h.dialWS("/relay/ws", "127.0.0.1"); resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatal("blocked source unblocked by another source's success")
	}
	// No verdict secret reaches the logs.
	for _, secret := range []string{testfake.GoodCode, testfake.SessionToken, "WRONG"} {
		if strings.Contains(h.logs.String(), secret) {
			t.Errorf("log contains %q", secret)
		}
	}
}

func TestRelayDownIs502OnUpgrade(t *testing.T) {
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.Relay = closedURL(t) }))
	c, resp, err := h.dialWS("/relay/ws", "")
	if err == nil {
		c.CloseNow()
		t.Fatal("upgrade succeeded with the Relay down")
	}
	if resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("upgrade with the Relay down: %v %v, want 502", resp, err)
	}
	health, _ := h.get("/relay/health")
	wantStatus(t, "health with the Relay down", health, 200)
}

func TestRelayRefusalPassesThroughWithItsStatus(t *testing.T) {
	h := newHarness(t)
	h.relay.Refuse.Store(http.StatusTooManyRequests)
	_, resp, err := h.dialWS("/relay/ws", "")
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("Relay refusal: %v %v, want its 429", resp, err)
	}
	if resp.Header.Get("Retry-After") != "7" {
		t.Errorf("Retry-After %q, want the Relay's", resp.Header.Get("Retry-After"))
	}
}

func TestRelayUpgradeCarriesOnlyAllowedHeaders(t *testing.T) {
	h := newHarness(t)
	hdr := http.Header{
		"Authorization":          {"Bearer api-secret"},
		"Cookie":                 {"dash=cookie-secret"},
		"X-Forwarded-For":        {"6.6.6.6"},
		"X-Real-Ip":              {"6.6.6.6"},
		"X-Hermes-Proxy-Secret":  {"forged"},
		"X-Hermes-Proxy-Peer":    {"6.6.6.6"},
		"X-Hermes-Relay-Session": {"forged"},
		"X-Custom":               {"nope"},
		"X_Forwarded_For":        {"6.6.6.6"},
		"Origin":                 {"https://app.example"},
		"User-Agent":             {"HermesTest/1"},
	}
	c, _, err := h.dialWSWith("/relay/ws?v=2&device=x", wsOpts{header: hdr})
	if err != nil {
		t.Fatal(err)
	}
	testfake.Authenticate(t, c, testfake.GoodCode)
	last := h.relay.LastRequest()
	got, uri := last.Header, last.RequestURI
	if uri != "/ws?v=2&device=x" {
		t.Errorf("relay target %q, want /ws?v=2&device=x", uri)
	}
	for _, name := range []string{"Authorization", "Cookie", "X-Forwarded-For", "X-Real-Ip", "X-Hermes-Proxy-Secret",
		"X-Hermes-Proxy-Peer", "X-Hermes-Relay-Session", "X-Custom"} {
		if v := got.Values(name); len(v) != 0 {
			t.Errorf("relay received %s: %q", name, v)
		}
	}
	for k := range got {
		if strings.Contains(k, "_") {
			t.Errorf("relay received the underscore header %s", k)
		}
	}
	if got.Get("Origin") != "https://app.example" || got.Get("User-Agent") != "HermesTest/1" {
		t.Errorf("Origin/User-Agent not passed: %v", got)
	}
}

func TestRelayProxySecretSentOnlyWhenConfigured(t *testing.T) {
	h := newHarness(t, withOptions(func(o *Options) { o.ProxySecret = "configured-proxy-secret" }))
	c, _, err := h.dialWSWith("/relay/ws", wsOpts{localIP: "127.0.0.2", header: http.Header{"X-Hermes-Proxy-Secret": {"forged"}}})
	if err != nil {
		t.Fatal(err)
	}
	testfake.Authenticate(t, c, testfake.GoodCode)
	got := h.relay.LastRequest().Header
	if v := got.Values("X-Hermes-Proxy-Secret"); len(v) != 1 || v[0] != "configured-proxy-secret" {
		t.Errorf("X-Hermes-Proxy-Secret %q", v)
	}
	if v := got.Values("X-Hermes-Proxy-Peer"); len(v) != 1 || v[0] != "127.0.0.2" {
		t.Errorf("X-Hermes-Proxy-Peer %q, want the client's address", v)
	}
	if strings.Contains(h.logs.String(), "configured-proxy-secret") {
		t.Error("the proxy secret reached the logs")
	}
}

// --- /api and /dashboard: byte-level WebSocket pass-through ---

// wsEcho is an upstream WebSocket endpoint that prefixes echoes with
// "echo:"; "drop" makes it drop the TCP connection, "close4002" close with
// 4002.
type wsEcho struct {
	ends chan testfake.End
}

func echoWS(u *upstream, protos ...string) *wsEcho {
	e := &wsEcho{ends: make(chan testfake.End, 8)}
	u.handle(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, Subprotocols: protos})
		if err != nil {
			return
		}
		ctx := context.Background()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				e.ends <- testfake.EndOf(err)
				return
			}
			switch string(msg) {
			case "drop":
				c.CloseNow()
				e.ends <- testfake.End{Code: -2, Reason: "upstream dropped"}
				return
			case "close4002":
				c.Close(4002, "upstream bye")
				e.ends <- testfake.End{Code: 4002, Reason: "upstream closed"}
				return
			}
			if err := c.Write(ctx, typ, append([]byte("echo:"), msg...)); err != nil {
				e.ends <- testfake.EndOf(err)
				return
			}
		}
	})
	return e
}

func (e *wsEcho) nextEnd(t *testing.T) testfake.End {
	t.Helper()
	select {
	case x := <-e.ends:
		return x
	case <-time.After(testTimeout):
		t.Fatal("upstream WebSocket did not end")
		return testfake.End{}
	}
}

func echoRoundTrip(t *testing.T, c *websocket.Conn) {
	t.Helper()
	wsSend(t, c, websocket.MessageText, []byte("hello"))
	if typ, msg, err := wsRead(c); err != nil || typ != websocket.MessageText || string(msg) != "echo:hello" {
		t.Fatalf("text echo %v %q %v", typ, msg, err)
	}
	wsSend(t, c, websocket.MessageBinary, []byte{0, 1, 2, 0xff})
	if typ, msg, err := wsRead(c); err != nil || typ != websocket.MessageBinary || string(msg) != "echo:\x00\x01\x02\xff" {
		t.Fatalf("binary echo %v %q %v", typ, msg, err)
	}
}

func TestDashboardWebSocketKeepsQuery(t *testing.T) {
	h := newHarness(t)
	echoWS(h.dash)
	c, _, err := h.dialWSWith("/dashboard/ws?token=abc&x=%2F", wsOpts{header: http.Header{
		"Cookie": {"dash_session=c1"}, "Authorization": {"Bearer api-key"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	echoRoundTrip(t, c)
	got := h.dash.last()
	if got.RequestURI != "/ws?token=abc&x=%2F" {
		t.Fatalf("dashboard got %q, want /ws?token=abc&x=%%2F", got.RequestURI)
	}
	if got.Header.Get("Cookie") != "dash_session=c1" || got.Header.Get("Authorization") != "" {
		t.Errorf("dashboard upgrade credentials: Cookie %q Authorization %q", got.Header.Get("Cookie"), got.Header.Get("Authorization"))
	}
	if got.Header.Get("X-Forwarded-Prefix") != "/dashboard" {
		t.Errorf("dashboard upgrade without X-Forwarded-Prefix")
	}
}

func TestAPIWebSocketPassThrough(t *testing.T) {
	h := newHarness(t)
	echoWS(h.api, "chosen")
	c, resp, err := h.dialWSWith("/api/v1/ws?session=s1", wsOpts{
		protos: []string{"other", "chosen"},
		header: http.Header{"Cookie": {"dash_session=c1"}, "Authorization": {"Bearer api-key"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || c.Subprotocol() != "chosen" {
		t.Fatalf("status %d subprotocol %q, want the upstream's choice", resp.StatusCode, c.Subprotocol())
	}
	echoRoundTrip(t, c)
	got := h.api.last()
	if got.RequestURI != "/v1/ws?session=s1" {
		t.Fatalf("API got %q", got.RequestURI)
	}
	if got.Header.Get("Authorization") != "Bearer api-key" || got.Header.Get("Cookie") != "" {
		t.Errorf("API upgrade credentials: Authorization %q Cookie %q", got.Header.Get("Authorization"), got.Header.Get("Cookie"))
	}
	if h.srv.ActiveUpgrades() != 1 {
		t.Errorf("ActiveUpgrades = %d, want 1", h.srv.ActiveUpgrades())
	}
}

func TestPassThroughUpstreamCloseClosesClient(t *testing.T) {
	h := newHarness(t)
	e := echoWS(h.api)
	// A close frame passes byte for byte.
	c := h.mustDialWS("/api/ws", "")
	wsSend(t, c, websocket.MessageText, []byte("close4002"))
	if _, _, err := wsRead(c); testfake.EndOf(err).Code != 4002 {
		t.Fatalf("client saw %v, want 4002", err)
	}
	e.nextEnd(t)
	// An upstream that drops TCP takes the client leg with it.
	c = h.mustDialWS("/api/ws", "")
	wsSend(t, c, websocket.MessageText, []byte("drop"))
	if _, _, err := wsRead(c); err == nil || testfake.EndOf(err).Code != -1 {
		t.Fatalf("after the upstream dropped: %v, want the connection closed", err)
	}
	e.nextEnd(t)
	waitFor(t, "upgrades to be released", func() bool { return h.srv.ActiveUpgrades() == 0 })
}

func TestPassThroughClientCloseClosesUpstream(t *testing.T) {
	h := newHarness(t)
	e := echoWS(h.dash)
	c := h.mustDialWS("/dashboard/ws", "")
	echoRoundTrip(t, c)
	c.Close(4001, "client bye")
	if x := e.nextEnd(t); x.Code != 4001 {
		t.Fatalf("upstream saw %+v, want 4001", x)
	}
	c = h.mustDialWS("/dashboard/ws", "")
	echoRoundTrip(t, c)
	c.CloseNow() // TCP gone, no close frame
	if x := e.nextEnd(t); x.Code != -1 {
		t.Fatalf("upstream saw %+v, want the connection dropped", x)
	}
	waitFor(t, "upgrades to be released", func() bool { return h.srv.ActiveUpgrades() == 0 })
}

// Header and keep-alive deadlines must not survive the upgrade.
func TestUpgradedConnectionsOutliveServerTimeouts(t *testing.T) {
	h := newHarness(t, withLimits(func(l *Limits) {
		l.ReadHeaderTimeout = 200 * time.Millisecond
		l.IdleTimeout = 200 * time.Millisecond
		l.BodyReadTimeout = 200 * time.Millisecond
	}))
	echoWS(h.api)
	pass := h.mustDialWS("/api/ws", "")
	bridged := h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, bridged, testfake.GoodCode)
	time.Sleep(800 * time.Millisecond) // four times every server timeout
	echoRoundTrip(t, pass)
	wsSend(t, bridged, websocket.MessageText, []byte("late"))
	if _, msg, err := wsRead(bridged); err != nil || string(msg) != "late" {
		t.Fatalf("bridged socket after the server timeouts: %q %v", msg, err)
	}
}

func TestShutdownClosesUpgradedConnections(t *testing.T) {
	h := newHarness(t)
	e := echoWS(h.api)
	pass := h.mustDialWS("/api/ws", "")
	echoRoundTrip(t, pass)
	bridged := h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, bridged, testfake.GoodCode)
	if h.srv.ActiveUpgrades() != 1 || h.srv.Bridge().Active() != 1 {
		t.Fatalf("before shutdown: %d pass-throughs, %d bridged", h.srv.ActiveUpgrades(), h.srv.Bridge().Active())
	}

	// Clients keep reading, as real ones do, so close handshakes complete.
	bridgedEnd, passEnd := make(chan error, 1), make(chan error, 1)
	go func() { _, _, err := wsRead(bridged); bridgedEnd <- err }()
	go func() { _, _, err := wsRead(pass); passEnd <- err }()

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-bridgedEnd; testfake.EndOf(err).Code != websocket.StatusGoingAway {
		t.Fatalf("bridged client saw %v, want 1001", err)
	}
	if x := h.relay.NextEnd(); x.Code != websocket.StatusGoingAway {
		t.Fatalf("relay saw %+v, want 1001", x)
	}
	if err := <-passEnd; err == nil {
		t.Fatal("pass-through client still open after Shutdown")
	}
	if x := e.nextEnd(t); x.Code != -1 {
		t.Fatalf("pass-through upstream saw %+v, want the connection closed", x)
	}
	select {
	case err := <-h.served:
		if err != nil {
			t.Fatalf("Serve returned %v after Shutdown", err)
		}
		h.served <- nil // for the harness cleanup
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return after Shutdown")
	}
	if h.srv.ActiveUpgrades() != 0 || h.srv.Bridge().Active() != 0 {
		t.Fatalf("after shutdown: %d pass-throughs, %d bridged", h.srv.ActiveUpgrades(), h.srv.Bridge().Active())
	}
}

func TestRelayMessageSizeLimit(t *testing.T) {
	h := newHarness(t)
	c := h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, c, testfake.GoodCode)
	exact := make([]byte, 4<<20)
	wsSend(t, c, websocket.MessageBinary, exact)
	if typ, msg, err := wsRead(c); err != nil || typ != websocket.MessageBinary || len(msg) != len(exact) {
		t.Fatalf("4 MiB message: %v %d bytes %v", typ, len(msg), err)
	}
	wsSend(t, c, websocket.MessageBinary, make([]byte, 4<<20+1))
	if _, _, err := wsRead(c); testfake.EndOf(err).Code != websocket.StatusMessageTooBig {
		t.Fatalf("client after an oversize message: %v, want 1009", err)
	}
	if x := h.relay.NextEnd(); x.Code != websocket.StatusMessageTooBig {
		t.Fatalf("relay saw %+v, want 1009", x)
	}
}

// claimsBroker is a listener whose connections carry a FromBroker method,
// as the connector's streams once did: serving it with Serve must not make
// them Reach connections (only ServeReach decides that).
type claimsBroker struct{ net.Listener }

type claimingConn struct{ net.Conn }

func (claimingConn) FromBroker() bool { return true }

func (l claimsBroker) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return claimingConn{c}, nil
}

// "Arrived through Reach" comes from the listener, never from what a
// connection type claims about itself.
func TestOnlyServeReachMarksReachConnections(t *testing.T) {
	h := newHarness(t, withOptions(func(o *Options) { o.ProxySecret = "configured-proxy-secret" }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h.srv.Serve(claimsBroker{ln})
	c, _, err := h.dialWSWith("/relay/ws", wsOpts{localIP: "127.0.0.2", via: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("auth: %s", got)
	}
	if peer := h.relay.LastRequest().Header.Get("X-Hermes-Proxy-Peer"); peer != "127.0.0.2" {
		t.Fatalf("a connection served by Serve has peer %q, want its own address", peer)
	}
}

// Every broker-arrived connection shares the single source "reach": their
// failures add up whatever their transport address, and they never block
// direct clients.
func TestBrokerConnectionsShareOneAuthFailureSource(t *testing.T) {
	h := newHarness(t, withOptions(func(o *Options) { o.ProxySecret = "configured-proxy-secret" }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h.srv.ServeReach(ln)
	viaBroker := func(src string) (*websocket.Conn, *http.Response, error) {
		return h.dialWSWith("/relay/ws", wsOpts{localIP: src, via: ln.Addr().String()})
	}

	for i := range 5 {
		src := []string{"127.0.0.1", "127.0.0.2"}[i%2]
		c, _, err := viaBroker(src)
		if err != nil {
			t.Fatal(err)
		}
		if got := testfake.Authenticate(t, c, "WRONG"); got != testfake.AuthFailMsg {
			t.Fatalf("attempt %d: %s", i, got)
		}
		if hdr := h.relay.LastRequest().Header; hdr.Get("X-Hermes-Proxy-Peer") != "reach" {
			t.Fatalf("broker connection peer %q, want reach", hdr.Get("X-Hermes-Proxy-Peer"))
		}
		h.relay.NextEnd()
	}
	for _, src := range []string{"127.0.0.1", "127.0.0.2"} {
		if _, resp, _ := viaBroker(src); resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("broker connection from %s after 5 reach failures: %v, want 429", src, resp)
		}
	}
	c := h.mustDialWS("/relay/ws", "127.0.0.1")
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("direct client after reach was blocked: %s", got)
	}
	if hdr := h.relay.LastRequest().Header; hdr.Get("X-Hermes-Proxy-Peer") != "127.0.0.1" {
		t.Fatalf("direct connection peer %q", hdr.Get("X-Hermes-Proxy-Peer"))
	}
}
