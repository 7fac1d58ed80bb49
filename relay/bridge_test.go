package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

func TestBridgeRelaysTextAndBinaryInOrder(t *testing.T) {
	bothModes(t, testBridgeRelaysTextAndBinaryInOrder)
}

func testBridgeRelaysTextAndBinaryInOrder(t *testing.T) {
	_, _, front := setup(t, nil, nil)
	c := mustDial(t, front, dialOpt{})
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("auth.ok changed on the way: %s", got)
	}
	type msg struct {
		typ  websocket.MessageType
		data []byte
	}
	var sent []msg
	for i := range 20 {
		m := msg{websocket.MessageText, []byte("text " + string(rune('a'+i)))}
		if i%2 == 1 {
			m = msg{websocket.MessageBinary, []byte{0, byte(i), 0xff, 0xfe}}
		}
		sent = append(sent, m)
		send(t, c, m.typ, m.data)
	}
	for i, want := range sent {
		typ, data, err := readMsg(t, c)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if typ != want.typ || !bytes.Equal(data, want.data) {
			t.Fatalf("message %d = (%v, %q), want (%v, %q)", i, typ, data, want.typ, want.data)
		}
	}
}

func TestBridgeMessageSizeLimit(t *testing.T) { bothModes(t, testBridgeMessageSizeLimit) }

func testBridgeMessageSizeLimit(t *testing.T) {
	t.Run("exactly 4 MiB passes both ways", func(t *testing.T) {
		_, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		payload := bytes.Repeat([]byte{'z'}, testfake.MaxMessage)
		send(t, c, websocket.MessageBinary, payload)
		typ, data, err := readMsg(t, c)
		if err != nil || typ != websocket.MessageBinary || !bytes.Equal(data, payload) {
			t.Fatalf("echo of 4 MiB: type %v, %d bytes, err %v", typ, len(data), err)
		}
		send(t, c, websocket.MessageText, []byte("exact"))
		_, data, err = readMsg(t, c)
		if err != nil || len(data) != testfake.MaxMessage {
			t.Fatalf("relay's 4 MiB message: %d bytes, err %v", len(data), err)
		}
	})
	t.Run("client sends 4 MiB + 1", func(t *testing.T) {
		relay, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		send(t, c, websocket.MessageBinary, make([]byte, testfake.MaxMessage+1))
		_, _, err := readMsg(t, c)
		if got := testfake.EndOf(err).Code; got != websocket.StatusMessageTooBig {
			t.Fatalf("client saw %v, want 1009", err)
		}
		if got := relay.NextEnd().Code; got != websocket.StatusMessageTooBig {
			t.Fatalf("relay saw close %d, want 1009", got)
		}
	})
	t.Run("relay sends 4 MiB + 1", func(t *testing.T) {
		relay, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		send(t, c, websocket.MessageText, []byte("big"))
		_, _, err := readMsg(t, c)
		if got := testfake.EndOf(err).Code; got != websocket.StatusMessageTooBig {
			t.Fatalf("client saw %v, want 1009", err)
		}
		if got := relay.NextEnd().Code; got != websocket.StatusMessageTooBig {
			t.Fatalf("relay saw close %d, want 1009", got)
		}
	})
}

func TestBridgeCloseCodes(t *testing.T) { bothModes(t, testBridgeCloseCodes) }

func testBridgeCloseCodes(t *testing.T) {
	t.Run("relay 4000 reaches the client with its reason", func(t *testing.T) {
		_, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		send(t, c, websocket.MessageText, []byte("close4000"))
		_, _, err := readMsg(t, c)
		if got := testfake.EndOf(err); got != (testfake.End{Code: 4000, Reason: "relay bye"}) {
			t.Fatalf("client saw %+v, want 4000 \"relay bye\"", got)
		}
	})
	t.Run("client 4000 reaches the relay with its reason", func(t *testing.T) {
		relay, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		if err := c.Close(4000, "client bye"); err != nil {
			t.Fatalf("client close handshake: %v", err)
		}
		if got := relay.NextEnd(); got != (testfake.End{Code: 4000, Reason: "client bye"}) {
			t.Fatalf("relay saw %+v, want 4000 \"client bye\"", got)
		}
	})
	t.Run("client 1000 reaches the relay", func(t *testing.T) {
		relay, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		_ = c.Close(websocket.StatusNormalClosure, "")
		if got := relay.NextEnd(); got != (testfake.End{Code: websocket.StatusNormalClosure, Reason: ""}) {
			t.Fatalf("relay saw %+v, want 1000", got)
		}
	})
	t.Run("relay close without status stays without status", func(t *testing.T) {
		_, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		send(t, c, websocket.MessageText, []byte("closeNoStatus"))
		_, _, err := readMsg(t, c)
		if got := testfake.EndOf(err).Code; got != websocket.StatusNoStatusRcvd {
			t.Fatalf("client saw %v, want a close frame without status (1005)", err)
		}
	})
	t.Run("relay dropping the socket (1006) becomes a close without status", func(t *testing.T) {
		_, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		send(t, c, websocket.MessageText, []byte("drop"))
		_, _, err := readMsg(t, c)
		if got := testfake.EndOf(err).Code; got != websocket.StatusNoStatusRcvd {
			t.Fatalf("client saw %v, want a close frame without status (1005)", err)
		}
	})
}

func TestForwardCloseMapping(t *testing.T) {
	for _, tc := range []struct {
		in   error
		want closeSpec
	}{
		{websocket.CloseError{Code: 4000, Reason: "x"}, closeSpec{4000, "x"}},
		{websocket.CloseError{Code: 1000}, closeSpec{1000, ""}},
		{websocket.CloseError{Code: 1001, Reason: "bye"}, closeSpec{1001, "bye"}},
		{websocket.CloseError{Code: 1008, Reason: "p"}, closeSpec{1008, "p"}},
		{websocket.CloseError{Code: 1011}, closeSpec{1011, ""}},
		{websocket.CloseError{Code: 1014}, closeSpec{1014, ""}},
		{websocket.CloseError{Code: 3000}, closeSpec{3000, ""}},
		{websocket.CloseError{Code: 4999, Reason: "r"}, closeSpec{4999, "r"}},
		{websocket.CloseError{Code: 1005}, noStatus},
		{websocket.CloseError{Code: 1006, Reason: "x"}, noStatus},
		{websocket.CloseError{Code: 1015}, noStatus},
		{websocket.CloseError{Code: 1004}, noStatus},
		{websocket.CloseError{Code: 2000}, noStatus},
		{websocket.CloseError{Code: 5000}, noStatus},
		{websocket.CloseError{Code: 4000, Reason: "\xff"}, closeSpec{4000, ""}},
		{io.EOF, noStatus},
		{net.ErrClosed, noStatus},
	} {
		if got := forwardClose(tc.in); got != tc.want {
			t.Errorf("forwardClose(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestBridgeRelayDownIs502(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	relay := testfake.NewRelay(t, nil)
	o := testOptions(t, relay)
	o.Upstream.Host = addr // nothing listens there any more
	b := newBridge(t, o)
	front := frontFor(t, b, false)
	_, resp, err := dial(t, front, dialOpt{})
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("got err %v, resp %v; want 502 before any 101", err, resp)
	}
	if b.Active() != 0 {
		t.Fatalf("Active = %d", b.Active())
	}
}

func TestBridgePassesRelayRefusalStatus(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusUnauthorized, http.StatusServiceUnavailable} {
		relay, _, front := setup(t, func(f *testfake.Relay) { f.Refuse.Store(int32(status)) }, nil)
		_, resp, err := dial(t, front, dialOpt{})
		if err == nil || resp == nil || resp.StatusCode != status {
			t.Fatalf("relay refused with %d: got err %v resp %v", status, err, resp)
		}
		if got := resp.Header.Get("Retry-After"); got != "7" {
			t.Errorf("Retry-After = %q, want the relay's 7", got)
		}
		if got := resp.Header.Get("Set-Cookie"); got != "" {
			t.Errorf("relay's Set-Cookie leaked: %q", got)
		}
		if len(relay.Requests()) != 1 {
			t.Fatalf("relay saw %d upgrades", len(relay.Requests()))
		}
	}
}

func TestBridgeMethodsAndNonUpgrade(t *testing.T) {
	relay, _, front := setup(t, nil, nil)
	base := "http://" + front.Listener.Addr().String() + "/relay/ws"
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead, http.MethodOptions, http.MethodPatch} {
		req, _ := http.NewRequest(m, base, nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" {
			t.Errorf("%s: status %d Allow %q, want 405 GET", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("plain GET: %d, want 400", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, base, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "8")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired || resp.Header.Get("Sec-WebSocket-Version") != "13" {
		t.Errorf("version 8: %d, want 426 with Sec-WebSocket-Version 13", resp.StatusCode)
	}
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "short")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad key: %d, want 400", resp.StatusCode)
	}
	if n := len(relay.Requests()); n != 0 {
		t.Fatalf("relay was dialed %d times for refused requests", n)
	}
}

func TestBridgeBlocksSourceAfterAuthFailures(t *testing.T) {
	_, b, front := setup(t, nil, nil)
	for range 5 {
		failAuth(t, front, "127.0.0.1")
	}
	_, resp, err := dial(t, front, dialOpt{localIP: "127.0.0.1"})
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("6th upgrade from 127.0.0.1: err %v resp %v, want 429", err, resp)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "300" {
		t.Errorf("Retry-After = %q, want 300", ra)
	}
	// Another source is unaffected.
	c := mustDial(t, front, dialOpt{localIP: "127.0.0.2"})
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("127.0.0.2 got %s", got)
	}
	if _, blocked := b.limiter.blocked("127.0.0.2/32"); blocked {
		t.Fatal("127.0.0.2 blocked")
	}
}

func TestBridgeFourFailuresDoNotBlock(t *testing.T) {
	_, _, front := setup(t, nil, nil)
	for range 4 {
		failAuth(t, front, "127.0.0.1")
	}
	c := mustDial(t, front, dialOpt{localIP: "127.0.0.1"})
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("got %s", got)
	}
}

func TestBridgeUpstreamHeaders(t *testing.T) {
	client := http.Header{
		"Cookie":                 {"session=dashboard-cookie"},
		"Authorization":          {"Bearer api-key"},
		"X-Forwarded-For":        {"203.0.113.9"},
		"X-Forwarded-Host":       {"evil.example"},
		"X-Real-Ip":              {"203.0.113.9"},
		"Forwarded":              {"for=203.0.113.9"},
		"X-Hermes-Proxy-Secret":  {"forged"},
		"X-Hermes-Proxy-Peer":    {"203.0.113.9"},
		"X-Hermes-Relay-Session": {"forged"},
		"X-Custom":               {"nope"},
		"Origin":                 {"https://app.example"},
		"User-Agent":             {"HermesAndroid/1.0"},
	}
	base := []string{"connection", "upgrade", "sec-websocket-key", "sec-websocket-version",
		"origin", "user-agent", "sec-websocket-protocol"}

	t.Run("without proxy secret", func(t *testing.T) {
		relay, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{header: client.Clone(), protos: []string{"hermes.v1"}})
		testfake.Authenticate(t, c, testfake.GoodCode)
		got := relay.LastRequest().Header
		names := headerNames(got)
		slices.Sort(names)
		want := slices.Clone(base)
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Fatalf("upstream headers = %v, want exactly %v", names, want)
		}
		if got.Get("Origin") != "https://app.example" || got.Get("User-Agent") != "HermesAndroid/1.0" {
			t.Fatalf("Origin/User-Agent not passed: %v", got)
		}
	})
	t.Run("with proxy secret", func(t *testing.T) {
		relay, _, front := setup(t, nil, func(o *Options) { o.ProxySecret = "s3cret-value" })
		c := mustDial(t, front, dialOpt{header: client.Clone()})
		testfake.Authenticate(t, c, testfake.GoodCode)
		got := relay.LastRequest().Header
		names := headerNames(got)
		slices.Sort(names)
		want := []string{"connection", "upgrade", "sec-websocket-key", "sec-websocket-version",
			"origin", "user-agent", "x-hermes-proxy-secret", "x-hermes-proxy-peer"}
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Fatalf("upstream headers = %v, want exactly %v", names, want)
		}
		if v := got.Values("X-Hermes-Proxy-Secret"); len(v) != 1 || v[0] != "s3cret-value" {
			t.Fatalf("secret = %q", v)
		}
		if v := got.Values("X-Hermes-Proxy-Peer"); len(v) != 1 || v[0] != "127.0.0.1" {
			t.Fatalf("peer = %q", v)
		}
	})
	t.Run("no User-Agent invented", func(t *testing.T) {
		relay, _, front := setup(t, nil, nil)
		c := mustDial(t, front, dialOpt{header: http.Header{"User-Agent": {""}}})
		testfake.Authenticate(t, c, testfake.GoodCode)
		if ua, ok := relay.LastRequest().Header["User-Agent"]; ok {
			t.Fatalf("upstream got User-Agent %q", ua)
		}
	})
}

func TestBridgePreservesRawQuery(t *testing.T) {
	relay, _, front := setup(t, nil, nil)
	const q = "profile=a%2Fb&x=%20y+z&flag&ticket=AbC-_~.%7E"
	c := mustDial(t, front, dialOpt{query: q})
	testfake.Authenticate(t, c, testfake.GoodCode)
	r := relay.LastRequest()
	if r.URL.RawQuery != q || r.URL.Path != "/ws" {
		t.Fatalf("upstream got %q ? %q, want /ws ? %q", r.URL.Path, r.URL.RawQuery, q)
	}
}

func TestBridgeReturnsRelaySelectedSubprotocol(t *testing.T) {
	relay, _, front := setup(t, func(f *testfake.Relay) { f.Subprotocols = []string{"hermes.v2"} }, nil)
	c := mustDial(t, front, dialOpt{protos: []string{"hermes.v1", "hermes.v2"}})
	if got := c.Subprotocol(); got != "hermes.v2" {
		t.Fatalf("client got subprotocol %q, want the relay's hermes.v2", got)
	}
	offered := offeredSubprotocols(relay.LastRequest().Header)
	if !slices.Equal(offered, []string{"hermes.v1", "hermes.v2"}) {
		t.Fatalf("relay was offered %v", offered)
	}
	// Relay selecting none: the client gets none either.
	relay2, _, front2 := setup(t, nil, nil)
	c2 := mustDial(t, front2, dialOpt{protos: []string{"hermes.v1"}})
	if got := c2.Subprotocol(); got != "" {
		t.Fatalf("client got subprotocol %q though the relay selected none", got)
	}
	_ = relay2
}

func TestBridgeShutdownSends1001(t *testing.T) { bothModes(t, testBridgeShutdownSends1001) }

func testBridgeShutdownSends1001(t *testing.T) {
	relay, b, front := setup(t, nil, nil)
	c := mustDial(t, front, dialOpt{})
	testfake.Authenticate(t, c, testfake.GoodCode)
	waitFor(t, "session registered", func() bool { return b.Active() == 1 })
	readErr := make(chan error, 1)
	go func() {
		_, _, err := c.Read(context.Background())
		readErr <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := testfake.EndOf(<-readErr).Code; got != websocket.StatusGoingAway {
		t.Fatalf("client saw close %d, want 1001", got)
	}
	if got := relay.NextEnd().Code; got != websocket.StatusGoingAway {
		t.Fatalf("relay saw close %d, want 1001", got)
	}
	if b.Active() != 0 {
		t.Fatalf("Active = %d after Shutdown", b.Active())
	}
	_, resp, err := dial(t, front, dialOpt{})
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("upgrade after Shutdown: err %v resp %v, want 503", err, resp)
	}
}

func TestBridgeActiveCountsSessions(t *testing.T) {
	_, b, front := setup(t, nil, nil)
	c1 := mustDial(t, front, dialOpt{})
	c2 := mustDial(t, front, dialOpt{})
	waitFor(t, "two sessions", func() bool { return b.Active() == 2 })
	_ = c1.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "one session", func() bool { return b.Active() == 1 })
	_ = c2.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "no session", func() bool { return b.Active() == 0 })
}

func TestBridgeUpdateAppliesToNewConnections(t *testing.T) {
	relay1, b, front := setup(t, nil, nil)
	relay2 := testfake.NewRelay(t, nil)
	old := mustDial(t, front, dialOpt{})
	testfake.Authenticate(t, old, testfake.GoodCode)

	b.Update(relay2.URL, "new-secret")
	c := mustDial(t, front, dialOpt{})
	testfake.Authenticate(t, c, testfake.GoodCode)
	if n := len(relay2.Requests()); n != 1 {
		t.Fatalf("relay2 saw %d upgrades", n)
	}
	if got := relay2.LastRequest().Header.Get("X-Hermes-Proxy-Secret"); got != "new-secret" {
		t.Fatalf("new secret not applied: %q", got)
	}
	// The established connection still talks to relay1.
	send(t, old, websocket.MessageText, []byte("still here"))
	if _, msg, err := readMsg(t, old); err != nil || string(msg) != "still here" {
		t.Fatalf("old connection: %q %v", msg, err)
	}
	if n := len(relay1.Requests()); n != 1 {
		t.Fatalf("relay1 saw %d upgrades", n)
	}
	// An invalid reload keeps the previous upstream.
	b.Update(nil, "")
	c3 := mustDial(t, front, dialOpt{})
	testfake.Authenticate(t, c3, testfake.GoodCode)
	if n := len(relay2.Requests()); n != 2 {
		t.Fatalf("after invalid Update relay2 saw %d upgrades, want 2", n)
	}
}

// recordingHandoff stands in for the Reach hook (the hook itself is another
// package's job); it marks the message it returns.
type recordingHandoff struct {
	mu          sync.Mutex
	calls       int
	clientAuth  []byte
	authOK      []byte
	hadDeadline bool
	block       bool
}

const routeMark = `"payload":{"route_credential":{"kind":"broker_route"},`

func (h *recordingHandoff) AuthOK(ctx context.Context, clientAuth, authOK []byte) []byte {
	h.mu.Lock()
	h.calls++
	h.clientAuth, h.authOK = clientAuth, authOK
	_, h.hadDeadline = ctx.Deadline()
	block := h.block
	h.mu.Unlock()
	if block {
		<-ctx.Done()
		return []byte(`{"channel":"system","type":"auth.ok","payload":{"late":true}}`)
	}
	return bytes.Replace(authOK, []byte(`"payload":{`), []byte(routeMark), 1)
}

func (h *recordingHandoff) snapshot() (int, []byte, []byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls, h.clientAuth, h.authOK, h.hadDeadline
}

func TestBridgeHandoffOnlyForBrokerFirstAuthOK(t *testing.T) {
	bothModes(t, testBridgeHandoffOnlyForBrokerFirstAuthOK)
}

func testBridgeHandoffOnlyForBrokerFirstAuthOK(t *testing.T) {
	relay := testfake.NewRelay(t, nil)
	hook := &recordingHandoff{}
	o := testOptions(t, relay)
	o.Handoff = hook
	b := newBridge(t, o)
	brokerFront := frontFor(t, b, true)
	directFront := frontFor(t, b, false)

	// Direct connection: never handed off, even with Handoff configured.
	d := mustDial(t, directFront, dialOpt{})
	if got := testfake.Authenticate(t, d, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("direct client got %s", got)
	}
	if calls, _, _, _ := hook.snapshot(); calls != 0 {
		t.Fatalf("handoff called %d times for a direct connection", calls)
	}

	c := mustDial(t, brokerFront, dialOpt{})
	got := testfake.Authenticate(t, c, testfake.GoodCode)
	if !strings.Contains(got, routeMark) {
		t.Fatalf("broker client got %s, want the handed-off auth.ok", got)
	}
	calls, clientAuth, authOK, hadDeadline := hook.snapshot()
	if calls != 1 || !bytes.Equal(clientAuth, testfake.AuthFrame(testfake.GoodCode)) || string(authOK) != testfake.AuthOKMsg || !hadDeadline {
		t.Fatalf("handoff: calls %d clientAuth %s authOK %s deadline %v", calls, clientAuth, authOK, hadDeadline)
	}
	// A later auth.ok-looking message (echoed) is not handed off again.
	send(t, c, websocket.MessageText, []byte(testfake.AuthOKMsg))
	if _, msg, err := readMsg(t, c); err != nil || string(msg) != testfake.AuthOKMsg {
		t.Fatalf("second auth.ok: %s %v", msg, err)
	}
	if calls, _, _, _ := hook.snapshot(); calls != 1 {
		t.Fatalf("handoff called %d times", calls)
	}
}

func TestBridgeHandoffTimeoutForwardsUnchanged(t *testing.T) {
	relay := testfake.NewRelay(t, nil)
	hook := &recordingHandoff{block: true}
	o := testOptions(t, relay)
	o.Handoff = hook
	o.HandoffTimeout = 100 * time.Millisecond
	b := newBridge(t, o)
	front := frontFor(t, b, true)
	c := mustDial(t, front, dialOpt{})
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("got %s, want the Relay's auth.ok unchanged", got)
	}
	// Messages after the auth.ok still flow.
	send(t, c, websocket.MessageText, []byte("after"))
	if _, msg, err := readMsg(t, c); err != nil || string(msg) != "after" {
		t.Fatalf("%q %v", msg, err)
	}
}

func TestBridgeHandoffNotCalledOnAuthFail(t *testing.T) {
	relay := testfake.NewRelay(t, nil)
	hook := &recordingHandoff{}
	o := testOptions(t, relay)
	o.Handoff = hook
	b := newBridge(t, o)
	front := frontFor(t, b, true)
	failAuth(t, front, "")
	if calls, _, _, _ := hook.snapshot(); calls != 0 {
		t.Fatalf("handoff called %d times on auth.fail", calls)
	}
}

func TestBridgeBrokerConnectionsCountAsReach(t *testing.T) {
	relay := testfake.NewRelay(t, nil)
	b := newBridge(t, testOptions(t, relay))
	brokerFront := frontFor(t, b, true)
	directFront := frontFor(t, b, false)
	for range 5 {
		failAuth(t, brokerFront, "127.0.0.1")
	}
	if _, blocked := b.limiter.blocked(SourceReach); !blocked {
		t.Fatal(`source "reach" not blocked`)
	}
	_, resp, err := dial(t, brokerFront, dialOpt{localIP: "127.0.0.2"})
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("broker upgrade from another IP: err %v resp %v, want 429 (all broker clients are one source)", err, resp)
	}
	// The same IP connecting directly is a different source.
	c := mustDial(t, directFront, dialOpt{localIP: "127.0.0.1"})
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("direct client got %s", got)
	}
}

func TestBridgeDropsPeerWithoutPong(t *testing.T) { bothModes(t, testBridgeDropsPeerWithoutPong) }

func testBridgeDropsPeerWithoutPong(t *testing.T) {
	t.Run("client", func(t *testing.T) {
		relay, b, front := setup(t, nil, func(o *Options) {
			o.PingInterval = 50 * time.Millisecond
			o.PongTimeout = 500 * time.Millisecond
			o.WriteTimeout = 400 * time.Millisecond
			o.HandoffTimeout = 400 * time.Millisecond
		})
		c := mustDial(t, front, dialOpt{noPong: true})
		testfake.Authenticate(t, c, testfake.GoodCode)
		_, _, err := readMsg(t, c) // keeps reading so pings arrive (and go unanswered)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatal("the bridge never dropped the client that does not answer pings")
		}
		if got := testfake.EndOf(err).Code; got != -1 {
			t.Fatalf("dead client got close %d, want the connection dropped", got)
		}
		if got := relay.NextEnd().Code; got != websocket.StatusNoStatusRcvd {
			t.Fatalf("relay saw %d, want a close without status", got)
		}
		waitFor(t, "session gone", func() bool { return b.Active() == 0 })
	})
	t.Run("relay", func(t *testing.T) {
		_, b, front := setup(t, func(f *testfake.Relay) { f.NoPong = true }, func(o *Options) {
			o.PingInterval = 50 * time.Millisecond
			o.PongTimeout = 500 * time.Millisecond
			o.WriteTimeout = 400 * time.Millisecond
			o.HandoffTimeout = 400 * time.Millisecond
		})
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		_, _, err := readMsg(t, c)
		if got := testfake.EndOf(err).Code; got != websocket.StatusNoStatusRcvd {
			t.Fatalf("client got %v, want a close without status", err)
		}
		waitFor(t, "session gone", func() bool { return b.Active() == 0 })
	})
	t.Run("live peers survive many pings", func(t *testing.T) {
		_, _, front := setup(t, nil, func(o *Options) {
			o.PingInterval = 20 * time.Millisecond
			o.PongTimeout = 3 * time.Second
			o.WriteTimeout = 2 * time.Second
			o.HandoffTimeout = 2 * time.Second
		})
		c := mustDial(t, front, dialOpt{})
		testfake.Authenticate(t, c, testfake.GoodCode)
		for i := range 10 {
			time.Sleep(30 * time.Millisecond) // several ping rounds between messages
			send(t, c, websocket.MessageText, []byte("ping-round"))
			if _, msg, err := readMsg(t, c); err != nil || string(msg) != "ping-round" {
				t.Fatalf("round %d: %q %v", i, msg, err)
			}
		}
	})
}

// FuzzOfferedSubprotocols: every token offered upstream is non-empty,
// trimmed, comma-free and taken from the client's values, in order; and
// re-offering the list as one header reproduces it (what coder/websocket's
// Dial sends is what the Relay parses).
func FuzzOfferedSubprotocols(f *testing.F) {
	for _, s := range []string{"a, b", "hermes.v1", " , ,x,", "", ",", "a,,b ,\tc"} {
		f.Add(s, "second")
	}
	f.Fuzz(func(t *testing.T, v1, v2 string) {
		got := offeredSubprotocols(http.Header{"Sec-Websocket-Protocol": {v1, v2}})
		rest := v1 + "," + v2
		for _, p := range got {
			if p == "" || strings.Contains(p, ",") || strings.TrimSpace(p) != p {
				t.Fatalf("bad token %q from %q %q", p, v1, v2)
			}
			i := strings.Index(rest, p)
			if i < 0 {
				t.Fatalf("token %q not in order in %q %q", p, v1, v2)
			}
			rest = rest[i+len(p):]
		}
		again := offeredSubprotocols(http.Header{"Sec-Websocket-Protocol": {strings.Join(got, ",")}})
		if !slices.Equal(again, got) {
			t.Fatalf("re-offer %q gives %q", got, again)
		}
	})
}

// panickingHandoff panics with the messages it was given, as a careless
// hook's error might.
type panickingHandoff struct{}

func (panickingHandoff) AuthOK(_ context.Context, clientAuth, authOK []byte) []byte {
	panic(fmt.Sprintf("bad messages %s %s", clientAuth, authOK))
}

// A hook that panics forwards the Relay's auth.ok unchanged, and its panic
// value (which may quote the client's credentials) stays out of the log.
func TestBridgeHandoffPanicForwardsUnchangedAndLogsNoSecret(t *testing.T) {
	var logs testfake.LogBuffer
	relay := testfake.NewRelay(t, nil)
	o := testOptions(t, relay)
	o.Handoff = panickingHandoff{}
	o.Log = zerolog.New(&logs).Level(zerolog.DebugLevel)
	front := frontFor(t, newBridge(t, o), true)
	c := mustDial(t, front, dialOpt{})
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("got %s, want the Relay's auth.ok unchanged", got)
	}
	waitFor(t, "the panic to be logged", func() bool {
		return strings.Contains(logs.String(), "handoff panicked")
	})
	if out := logs.String(); strings.Contains(out, testfake.GoodCode) {
		t.Fatalf("the log quotes the pairing code:\n%s", out)
	}
}
