package connector

// Integration tests: the real broker (broker/server over TLS with a test
// CA) and the real front (proxy.Server with a pinned identity and httptest
// upstreams) on 127.0.0.1, with a minimal client written here: it registers
// at the broker like a phone and speaks TLS, checked by pin, to the front
// through its stream.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
	"github.com/hermes-securelink/securelink/pinning"
	"github.com/hermes-securelink/securelink/proxy"
	"github.com/hermes-securelink/securelink/relay"
)

// The connector's hook satisfies the bridge's interface without the
// connector importing relay.
var _ relay.Handoff = (*Handoff)(nil)

// ---------------------------------------------------------------------------
// Real broker

type realBroker struct {
	*testenv.Broker
	hostID string
	token  wire.Secret
}

func startBroker(t *testing.T, mutate func(*server.Config)) *realBroker {
	t.Helper()
	tb := testenv.StartBroker(t, testenv.BrokerOptions{Mutate: mutate})
	return &realBroker{Broker: tb, hostID: tb.Hosts[0].ID, token: tb.Hosts[0].Token}
}

func (rb *realBroker) connectorConfig(t *testing.T) Config {
	log, _ := testenv.NewLog(t)
	return Config{
		BrokerURL: rb.URL(), HostID: rb.hostID, Token: rb.token, RootCAs: rb.Pool, Log: log,
		BackoffBase: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	}
}

// credentials reads the broker's state file.
func (rb *realBroker) credentials(t *testing.T) []store.Credential {
	t.Helper()
	snap, err := store.LoadState(rb.Cfg.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Credentials
}

// ---------------------------------------------------------------------------
// Real front with fake upstreams

const frontPort = 9443 // the authority clients name; the front never listens on TCP here

type testFront struct {
	srv   *proxy.Server
	id    *pinning.Identity
	relay *testenv.FakeRelay
	tcp   string // the same front on a TCP listener, for direct clients
}

func newAPI(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			io.WriteString(w, `{"status":"ok"}`)
		case "/echo":
			// Read everything first: net/http closes a connection whose
			// handler answers while more than 256 KiB of body is unread.
			body, _ := io.ReadAll(r.Body)
			w.Write(body)
		default:
			io.WriteString(w, "api:"+r.URL.Path)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func startFront(t *testing.T, c *Connector) *testFront {
	t.Helper()
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{
		StateDir:  filepath.Join(t.TempDir(), "identity"),
		Authority: pinning.Authority{Host: "127.0.0.1", Port: frontPort},
	})
	if err != nil {
		t.Fatal(err)
	}
	fr := testenv.NewFakeRelay(t)
	api := newAPI(t)
	dash := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"status":"ok","auth_required":true}`)
	}))
	t.Cleanup(dash.Close)
	u := func(s string) *url.URL { v, _ := url.Parse(s); return v }
	log, _ := testenv.NewLog(t)
	srv, err := proxy.New(proxy.Options{
		AuthorityHost: "127.0.0.1", AuthorityPort: frontPort,
		Upstreams: proxy.Upstreams{Relay: u(fr.Srv.URL), API: u(api.URL), Dashboard: u(dash.URL)},
		Limits:    proxy.DefaultLimits(),
		Relay:     relay.Options{Handoff: c.Handoff()},
		Log:       log.Level(1),
	}, id)
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 2)
	go func() { served <- srv.ServeReach(c.Listener()) }()
	go func() { served <- srv.Serve(tcp) }()
	t.Cleanup(func() {
		srv.Close()
		for i := 0; i < 2; i++ {
			select {
			case <-served:
			case <-time.After(step):
				t.Error("the front did not stop serving")
			}
		}
	})
	return &testFront{srv: srv, id: id, relay: fr, tcp: tcp.Addr().String()}
}

// openDirect connects to the front over TCP, not through the broker.
func openDirect(t *testing.T, f *testFront) *inner {
	t.Helper()
	cfg, err := pinning.PinnedTLSConfig("127.0.0.1", f.id.Pin)
	if err != nil {
		t.Fatal(err)
	}
	d := &tls.Dialer{Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	nc, err := d.DialContext(ctx, "tcp", f.tcp)
	if err != nil {
		t.Fatal(err)
	}
	tc := nc.(*tls.Conn)
	t.Cleanup(func() { tc.Close() })
	return &inner{t: t, tc: tc, br: bufio.NewReader(tc)}
}

// reach is a broker, a connector and a front, all running.
type reach struct {
	rb    *realBroker
	c     *Connector
	front *testFront
	logs  *testenv.LogSink
}

func startReach(t *testing.T, mutateBroker func(*server.Config), mutate func(*Config)) *reach {
	t.Helper()
	rb := startBroker(t, mutateBroker)
	cfg := rb.connectorConfig(t)
	log, sink := testenv.NewLog(t)
	cfg.Log = log
	if mutate != nil {
		mutate(&cfg)
	}
	c := newConnector(t, cfg)
	front := startFront(t, c)
	run(t, c)
	waitConnected(t, c)
	return &reach{rb: rb, c: c, front: front, logs: sink}
}

// ---------------------------------------------------------------------------
// Minimal client

// registerClient connects a client socket and sends its registration.
func registerClient(t *testing.T, rb *realBroker, kind wire.Kind, token string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, rb.URL(), &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: rb.Pool}}},
	})
	if err != nil {
		t.Fatalf("client dial: %v", err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	ws.SetReadLimit(wire.MaxClientFrame + 1)
	msg, err := wire.Marshal(wire.Register{
		Role: wire.RoleClient, HostID: mustID(t, rb.hostID), ConnectionID: wire.NewID(),
		CredentialKind: kind, Token: wire.Secret(token),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatal(err)
	}
	return ws
}

// dialBroker registers a client and returns its socket once matched, or
// the broker's error.
func dialBroker(t *testing.T, rb *realBroker, kind wire.Kind, token string) (*websocket.Conn, error) {
	t.Helper()
	ws := registerClient(t, rb, kind, token)
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	_, data, err := ws.Read(ctx)
	if err != nil {
		t.Fatalf("client read: %v", err)
	}
	m, err := wire.ParseBrokerMessage(data)
	if err != nil {
		t.Fatal(err)
	}
	switch m := m.(type) {
	case wire.Matched:
		return ws, nil
	case wire.ErrorMsg:
		ws.CloseNow()
		return nil, m.Err()
	}
	t.Fatalf("client got %#v", m)
	return nil, nil
}

// inner is the client's TLS connection to the front through its stream.
type inner struct {
	t  *testing.T
	tc *tls.Conn
	br *bufio.Reader
}

func openInner(t *testing.T, ws *websocket.Conn, pin string) *inner {
	t.Helper()
	nc := websocket.NetConn(context.Background(), ws, websocket.MessageBinary)
	cfg, err := pinning.PinnedTLSConfig("127.0.0.1", pin)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(nc, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatalf("inner TLS handshake: %v", err)
	}
	t.Cleanup(func() { tc.Close() })
	return &inner{t: t, tc: tc, br: bufio.NewReader(tc)}
}

func (in *inner) do(method, path string, body []byte) (int, []byte) {
	in.t.Helper()
	code, data, err := in.try(method, path, body)
	if err != nil {
		in.t.Fatal(err)
	}
	return code, data
}

// try is do without failing the test, for other goroutines.
func (in *inner) try(method, path string, body []byte) (int, []byte, error) {
	in.tc.SetDeadline(time.Now().Add(step))
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n\r\n", method, path, frontPort, len(body))
	if _, err := in.tc.Write(append([]byte(req), body...)); err != nil {
		return 0, nil, fmt.Errorf("request: %w", err)
	}
	resp, err := http.ReadResponse(in.br, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("response: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("response body: %w", err)
	}
	return resp.StatusCode, data, nil
}

// relayWS opens /relay/ws over the inner connection and authenticates.
func (in *inner) relayWS(authFrame string) (*websocket.Conn, []byte) {
	in.t.Helper()
	return testfake.RelayWS(in.t, in.tc, fmt.Sprintf("wss://127.0.0.1:%d/relay/ws", frontPort), authFrame)
}

// ---------------------------------------------------------------------------
// Tests

func TestReachFrontThroughBroker(t *testing.T) {
	r := startReach(t, nil, nil)
	b, err := r.c.PublishBootstrap(context.Background(), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	if b.HostID != r.rb.hostID || b.BrokerURL != r.rb.URL() || len(b.Token) != wire.TokenLen ||
		!wire.ValidLabel(b.PairingID) || b.ExpiresAt < now+590 || b.ExpiresAt > now+610 {
		t.Fatalf("bootstrap %+v", b)
	}
	ws, err := dialBroker(t, r.rb, wire.KindBootstrap, b.Token)
	if err != nil {
		t.Fatal(err)
	}
	in := openInner(t, ws, r.front.id.Pin)
	code, body := in.do("GET", "/relay/health", nil)
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"status":"ok"`)) {
		t.Fatalf("/relay/health: %d %s", code, body)
	}
	code, body = in.do("GET", "/api/x", nil)
	if code != http.StatusOK || string(body) != "api:/x" {
		t.Fatalf("/api/x: %d %s", code, body)
	}
	if n := r.c.Status().ActiveStreams; n != 1 {
		t.Fatalf("active streams %d", n)
	}

	// The bootstrap allowed exactly one stream.
	if _, err := dialBroker(t, r.rb, wire.KindBootstrap, b.Token); !errors.Is(err, wire.ErrReplayed) {
		t.Fatalf("second use of the bootstrap: %v, want replayed", err)
	}
	in.tc.Close()
	ws.Close(websocket.StatusNormalClosure, "")
	testenv.WaitFor(t, "the stream to complete", func() bool { return r.c.Status().CompletedStreams == 1 })
	if logs := r.logs.String(); strings.Contains(logs, b.Token) || strings.Contains(logs, string(r.rb.token)) {
		t.Fatal("a token reached the log")
	}
}

func TestReachRouteCredentialHandoff(t *testing.T) {
	r := startReach(t, nil, nil)
	b, err := r.c.PublishBootstrap(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := dialBroker(t, r.rb, wire.KindBootstrap, b.Token)
	if err != nil {
		t.Fatal(err)
	}
	in := openInner(t, ws, r.front.id.Pin)
	relayWS, authOK := in.relayWS(`{"type":"auth","payload":{"pairing_code":"P1","device_id":"dev-42"}}`)

	// Shape and derivations.
	var m struct {
		Payload struct {
			SessionToken string                     `json:"session_token"`
			RC           map[string]json.RawMessage `json:"route_credential"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(authOK, &m); err != nil || m.Payload.RC == nil {
		t.Fatalf("auth.ok without route_credential: %s", authOK)
	}
	rc := m.Payload.RC
	keys := []string{"kind", "broker_url", "host_id", "credential_id", "token", "expires_at"}
	if len(rc) != len(keys) {
		t.Fatalf("route_credential keys: %v", rc)
	}
	str := func(k string) string { var s string; json.Unmarshal(rc[k], &s); return s }
	if str("kind") != "broker_route" || str("broker_url") != r.rb.URL() || str("host_id") != r.rb.hostID ||
		str("credential_id") != wire.RouteCredentialID(m.Payload.SessionToken) || len(str("token")) != wire.TokenLen {
		t.Fatalf("route_credential %s", authOK)
	}
	exp := string(rc["expires_at"])
	if strings.ContainsAny(exp, ".eE\"") {
		t.Fatalf("expires_at %s is not an integer", exp)
	}
	var expAt int64
	json.Unmarshal(rc["expires_at"], &expAt)
	if d := expAt - time.Now().Add(30*24*time.Hour).Unix(); d < -10 || d > 10 {
		t.Fatalf("expires_at %d is not now + 30 days", expAt)
	}
	// Every other byte is the Relay's.
	start := bytes.Index(authOK, []byte(`{"kind"`))
	ins := `,"route_credential":` + string(authOK[start:start+bytes.IndexByte(authOK[start:], '}')+1])
	if got := strings.Replace(string(authOK), ins, "", 1); got != string(r.front.relay.LastAuthOK()) {
		t.Fatalf("the Relay's members changed:\n%s\n%s", got, r.front.relay.LastAuthOK())
	}
	// The broker holds only digests: of the token and of the device id.
	var found bool
	for _, cr := range r.rb.credentials(t) {
		if cr.Kind == wire.KindRoute && cr.ID == str("credential_id") {
			found = true
			if cr.Digest != wire.TokenDigest(str("token")) || cr.DeviceIDHash != wire.TokenDigest("dev-42") || cr.ExpiresAt != expAt {
				t.Fatalf("published %+v", cr)
			}
		}
	}
	if !found {
		t.Fatal("the route credential was not published before auth.ok")
	}
	// Later Relay messages flow after the auth.ok.
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	relayWS.Write(ctx, websocket.MessageText, []byte("echo me"))
	if _, msg, err := relayWS.Read(ctx); err != nil || string(msg) != "echo me" {
		t.Fatalf("echo: %q %v", msg, err)
	}

	// The route token reconnects as a `route` client; the same session gets
	// the cached credential again.
	ws2, err := dialBroker(t, r.rb, wire.KindRoute, str("token"))
	if err != nil {
		t.Fatalf("route client: %v", err)
	}
	in2 := openInner(t, ws2, r.front.id.Pin)
	sessJSON, _ := json.Marshal(m.Payload.SessionToken)
	_, authOK2 := in2.relayWS(`{"type":"auth","payload":{"session_token":` + string(sessJSON) + `,"device_id":"dev-42"}}`)
	if !bytes.Contains(authOK2, rc["token"]) {
		t.Fatalf("reconnect did not get the cached credential: %s", authOK2)
	}
	if n := r.c.Counts()["route_reused"]; n != 1 {
		t.Fatalf("route_reused = %d", n)
	}

	// A client of the same front over TCP never gets one, even with the
	// same session.
	_, direct := openDirect(t, r.front).relayWS(`{"type":"auth","payload":{"session_token":` + string(sessJSON) + `}}`)
	if bytes.Contains(direct, []byte("route_credential")) || !bytes.Contains(direct, []byte(`"auth.ok"`)) {
		t.Fatalf("direct client got %s", direct)
	}

	// Revoking ends the live route stream, refuses the token, and forgets
	// the cached credential: the next handoff mints a new one.
	if err := r.c.Revoke(context.Background(), str("credential_id")); err != nil {
		t.Fatal(err)
	}
	in2.tc.SetReadDeadline(time.Now().Add(step))
	if _, err := in2.tc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the revoked stream is still open: %v", err)
	}
	if _, err := dialBroker(t, r.rb, wire.KindRoute, str("token")); !errors.Is(err, wire.ErrRevoked) {
		t.Fatalf("revoked token: %v", err)
	}
	b3, err := r.c.PublishBootstrap(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	ws3, err := dialBroker(t, r.rb, wire.KindBootstrap, b3.Token)
	if err != nil {
		t.Fatal(err)
	}
	_, authOK3 := openInner(t, ws3, r.front.id.Pin).relayWS(`{"type":"auth","payload":{"session_token":` + string(sessJSON) + `,"device_id":"dev-42"}}`)
	if tok3, id3, _ := routeOf(t, authOK3); tok3 == str("token") || id3 != str("credential_id") {
		t.Fatal("after a revoke the same credential was handed out again")
	}
	if logs := r.logs.String(); strings.Contains(logs, str("token")) || strings.Contains(logs, m.Payload.SessionToken) {
		t.Fatal("a secret reached the log")
	}
}

func TestReachTwoClientsAtOnce(t *testing.T) {
	r := startReach(t, nil, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		b, err := r.c.PublishBootstrap(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		ws, err := dialBroker(t, r.rb, wire.KindBootstrap, b.Token)
		if err != nil {
			t.Fatal(err)
		}
		in := openInner(t, ws, r.front.id.Pin)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for round := 0; round < 3; round++ {
				body := bytes.Repeat([]byte(fmt.Sprintf("client %d round %d|", i, round)), 20000)
				code, got, err := in.try("POST", "/api/echo", body)
				if err != nil {
					errs <- fmt.Errorf("client %d round %d: %w", i, round, err)
					return
				}
				if code != http.StatusOK || !bytes.Equal(got, body) {
					errs <- fmt.Errorf("client %d round %d: status %d, %d bytes back of %d", i, round, code, len(got), len(body))
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// routeToken gets a route credential the way a phone does.
func routeToken(t *testing.T, r *reach) string {
	t.Helper()
	b, err := r.c.PublishBootstrap(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := dialBroker(t, r.rb, wire.KindBootstrap, b.Token)
	if err != nil {
		t.Fatal(err)
	}
	_, authOK := openInner(t, ws, r.front.id.Pin).relayWS(`{"type":"auth","payload":{"pairing_code":"P"}}`)
	tok, _, _ := routeOf(t, authOK)
	return tok
}

// TestReachSurvivesBrokerRestart: the broker's graceful stop advises a
// reconnect delay in its close ("shutdown retry=1"), which the connector
// honours; the route credential still works after the restart.
func TestReachSurvivesBrokerRestart(t *testing.T) {
	r := startReach(t, func(c *server.Config) { c.ShutdownRetryAfter = time.Second }, nil)
	tok := routeToken(t, r)
	r.rb.Stop()
	testenv.WaitFor(t, "the connector to notice", func() bool { return r.c.Status().State != StateConnected })
	if n := r.c.Counts(); n["reconnect:advised"] != 1 {
		t.Fatalf("the shutdown close was not read as advice: %v", n)
	}
	r.rb.Start() // same port, same hosts and state files
	testenv.WaitFor(t, "the connector to register again", func() bool {
		st := r.c.Status()
		return st.State == StateConnected && st.Attempts >= 2
	})
	ws, err := dialBroker(t, r.rb, wire.KindRoute, tok)
	if err != nil {
		t.Fatalf("route credential after the restart: %v", err)
	}
	code, _ := openInner(t, ws, r.front.id.Pin).do("GET", "/relay/health", nil)
	if code != http.StatusOK {
		t.Fatalf("/relay/health after the restart: %d", code)
	}
}

func TestReachReplacedBacksOff(t *testing.T) {
	var sl sleeps
	sl.setBlock(true)
	r := startReach(t, nil, func(cfg *Config) { cfg.Sleep = sl.sleep; cfg.ReplacedBackoff = wire.ReplacedBackoff })
	c2 := newConnector(t, r.rb.connectorConfig(t))
	run(t, c2)
	waitConnected(t, c2)
	testenv.WaitFor(t, "the first connector to back off", func() bool { return r.c.Status().State == StateBackoff })
	st := r.c.Status()
	if st.LastError != codeReplaced || st.LastErrorDetail != "another process registered with this host_id" {
		t.Fatalf("status %+v", st)
	}
	if got := sl.list(); len(got) != 1 || got[0] != time.Minute {
		t.Fatalf("waits %v, want [1m]", got)
	}
	if st := c2.Status(); st.State != StateConnected || st.Attempts != 1 {
		t.Fatalf("the newer connector: %+v", st)
	}
}

func TestReachOpenBeyondMaxStreams(t *testing.T) {
	r := startReach(t, nil, func(cfg *Config) { cfg.MaxStreams = 1 })
	b1, _ := r.c.PublishBootstrap(context.Background(), 0)
	b2, _ := r.c.PublishBootstrap(context.Background(), 0)
	ws1, err := dialBroker(t, r.rb, wire.KindBootstrap, b1.Token)
	if err != nil {
		t.Fatal(err)
	}
	openInner(t, ws1, r.front.id.Pin) // holds the only stream
	// The broker matches the second client, the connector answers CLOSE at
	// once, and the broker closes that client with 1000 (possibly before
	// `matched` went out).
	ws2 := registerClient(t, r.rb, wire.KindBootstrap, b2.Token)
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	for {
		_, data, err := ws2.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("second stream: %v, want close 1000 after the host's CLOSE", err)
			}
			break
		}
		if m, _ := wire.ParseBrokerMessage(data); m == nil || m.Type() != wire.TypeMatched {
			t.Fatalf("second client got %q", data)
		}
	}
	if n := r.c.Counts()["open_over_limit"]; n != 1 {
		t.Fatalf("open_over_limit = %d", n)
	}
}

func TestReachConcurrentPublishersGetTheirOwnReplies(t *testing.T) {
	r := startReach(t, func(c *server.Config) { c.MaxCredentialsPerHost = 6 }, nil)
	const n = 10
	type res struct {
		b   Bootstrap
		err error
	}
	results := make(chan res, n)
	revokes := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			b, err := r.c.PublishBootstrap(context.Background(), 0)
			results <- res{b, err}
		}()
		go func(i int) {
			defer wg.Done()
			revokes <- r.c.Revoke(context.Background(), fmt.Sprintf("no-such-route-%d", i))
		}(i)
	}
	wg.Wait()
	close(results)
	close(revokes)
	for err := range revokes {
		if err != nil {
			t.Errorf("revoke: %v", err)
		}
	}
	published := map[string]wire.Digest{}
	var quota int
	for r := range results {
		switch {
		case r.err == nil:
			published[r.b.PairingID] = wire.TokenDigest(r.b.Token)
		case errors.Is(r.err, wire.ErrQuotaExceeded):
			quota++
		default:
			t.Errorf("publish: %v", r.err)
		}
	}
	if len(published) != 6 || quota != n-6 {
		t.Fatalf("%d published, %d over quota", len(published), quota)
	}
	// Each caller that was told `published` holds the token the broker
	// stored under its pairing_id.
	stored := map[string]wire.Digest{}
	for _, cr := range r.rb.credentials(t) {
		if cr.Kind == wire.KindBootstrap {
			stored[cr.ID] = cr.Digest
		}
	}
	for id, d := range published {
		if stored[id] != d {
			t.Fatalf("pairing %s: the broker stored another digest", id)
		}
	}
	if len(stored) != len(published) {
		t.Fatalf("broker stored %d bootstraps, callers were told %d", len(stored), len(published))
	}
	if a := r.c.Status().Attempts; a != 1 {
		t.Fatalf("attempts = %d: replies were mismatched", a)
	}
}

func TestReachAuthFailuresBackOffTenMinutes(t *testing.T) {
	t.Run("unauthorized", func(t *testing.T) {
		rb := startBroker(t, nil)
		var sl sleeps
		sl.setBlock(true)
		cfg := rb.connectorConfig(t)
		cfg.Token = wire.NewToken() // not this host's
		cfg.Sleep = sl.sleep
		c := newConnector(t, cfg)
		run(t, c)
		testenv.WaitFor(t, "backoff", func() bool { return c.Status().State == StateBackoff })
		if st := c.Status(); st.LastError != "unauthorized" || !strings.Contains(st.LastErrorDetail, "reach.host_id") {
			t.Fatalf("status %+v", st)
		}
		if got := sl.list(); len(got) != 1 || got[0] != 10*time.Minute {
			t.Fatalf("waits %v", got)
		}
	})
	t.Run("revoked", func(t *testing.T) {
		rb := startBroker(t, nil)
		var sl sleeps
		sl.setBlock(true)
		cfg := rb.connectorConfig(t)
		cfg.Sleep = sl.sleep
		c := newConnector(t, cfg)
		run(t, c)
		waitConnected(t, c)
		if err := store.RemoveHost(rb.Cfg.HostsFile, rb.hostID); err != nil {
			t.Fatal(err)
		}
		if err := rb.B.ReloadHosts(); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "backoff", func() bool { return c.Status().State == StateBackoff })
		if st := c.Status(); st.LastError != "revoked" {
			t.Fatalf("status %+v", st)
		}
		if got := sl.list(); len(got) != 1 || got[0] != 10*time.Minute {
			t.Fatalf("waits %v", got)
		}
	})
}

func TestReachNeverSpeaksPlaintext(t *testing.T) {
	t.Run("untrusted certificate", func(t *testing.T) {
		rb := startBroker(t, nil)
		var sl sleeps
		sl.setBlock(true)
		cfg := rb.connectorConfig(t)
		cfg.RootCAs = x509.NewCertPool() // not the test CA
		cfg.Sleep = sl.sleep
		c := newConnector(t, cfg)
		run(t, c)
		testenv.WaitFor(t, "backoff", func() bool { return c.Status().State == StateBackoff })
		if st := c.Status(); st.LastError != codeTLS {
			t.Fatalf("status %+v", st)
		}
		if n := rb.B.Stats().HostsOnline; n != 0 {
			t.Fatalf("%d hosts online", n)
		}
	})
	t.Run("plaintext broker", func(t *testing.T) {
		rb := startBroker(t, func(c *server.Config) {
			c.InsecurePlaintext = true
			c.TLSCertFile, c.TLSKeyFile = "", ""
		})
		cfg := rb.connectorConfig(t)
		cfg.BrokerURL = "ws://" + rb.Addr + wire.ConnectPath
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "wss") {
			t.Fatalf("New accepted ws://: %v", err)
		}
		var sl sleeps
		sl.setBlock(true)
		cfg = rb.connectorConfig(t)
		cfg.Sleep = sl.sleep
		c := newConnector(t, cfg) // wss:// to a broker that only speaks ws://
		run(t, c)
		testenv.WaitFor(t, "backoff", func() bool { return c.Status().State == StateBackoff })
		if st := c.Status(); st.LastError != codeTLS {
			t.Fatalf("status %+v", st)
		}
		if n := rb.B.Stats().HostsOnline; n != 0 {
			t.Fatalf("%d hosts online over plaintext", n)
		}
	})
}
