package reachtest

// The assembly every test runs: a real broker serving wss:// on 127.0.0.1
// with a test CA, a real connector registered with it, the real front
// serving the connector's streams with a pinned identity, fake Relay, API
// and Dashboard upstreams that record what reaches them, and clients built
// on broker/client.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/testfake"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
	"github.com/hermes-securelink/securelink/proxy"
	"github.com/hermes-securelink/securelink/relay"
)

// step bounds every single wait, so a broken component fails a test
// instead of hanging it. It is never an assertion about speed.
const step = testenv.Step

// bulkDeadline bounds one bulk transfer the same way.
const bulkDeadline = 90 * time.Second

// The front's authority as clients name it in the inner TLS. It never
// resolves: inner connections run over broker streams, not DNS.
const (
	authorityHost = "host.example"
	// aliasHost is accepted by the front (SNI, Host) but not named by its
	// certificate, so a client naming it must refuse the pinned key.
	aliasHost     = "alias.example"
	authorityPort = 9443
)

// ---------------------------------------------------------------------------
// Broker

type brokerOptions struct {
	mutate func(*server.Config)
	// capture makes the test terminate the broker's TLS itself and hand the
	// broker the decrypted connections (insecure_plaintext on 127.0.0.1,
	// the supported "TLS-terminating proxy on the same machine" setup).
	// Every byte the broker reads or writes on every connection is then
	// recorded exactly as the broker process sees it, while connector and
	// clients still speak wss:// with the test CA.
	capture bool
}

type testBroker struct {
	*testenv.Broker
	hostID    string
	hostToken wire.Secret
	ln        *trackingListener // the running broker's

	mu   sync.Mutex
	recs []*testfake.Recorder // capture: one per accepted connection
}

func startBroker(t *testing.T, o brokerOptions) *testBroker {
	t.Helper()
	tb := &testBroker{}
	tb.Broker = testenv.StartBroker(t, testenv.BrokerOptions{
		Mutate:    o.mutate,
		Plaintext: o.capture,
		Listen: func(b *testenv.Broker, raw net.Listener) net.Listener {
			tb.ln = &trackingListener{Listener: raw, conns: map[net.Conn]struct{}{}}
			if !o.capture {
				return tb.ln
			}
			return &recordingListener{
				Listener: tls.NewListener(tb.ln, &tls.Config{
					MinVersion:   tls.VersionTLS12,
					Certificates: []tls.Certificate{b.Cert},
					NextProtos:   []string{"http/1.1"},
				}),
				tb: tb,
			}
		},
	})
	tb.hostID, tb.hostToken = tb.Hosts[0].ID, tb.Hosts[0].Token
	return tb
}

// kill stops the broker the way a crash does, as far as a process can do
// to itself: the listener and every TCP connection are cut without a
// WebSocket close, and the state file is put back to what was on disk at
// that moment (the graceful shutdown that follows must not save anything
// a killed process would have lost).
func (tb *testBroker) kill(t *testing.T) {
	t.Helper()
	state, err := os.ReadFile(tb.Cfg.StateFile)
	if err != nil {
		t.Fatalf("state file at the kill: %v", err)
	}
	tb.ln.Close()
	tb.ln.cutAll()
	tb.Halt() // an error is expected: the listener was cut
	if err := os.WriteFile(tb.Cfg.StateFile, state, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (tb *testBroker) recorders() []*testfake.Recorder {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]*testfake.Recorder(nil), tb.recs...)
}

// trackingListener remembers the raw TCP connections it accepted, so kill
// can cut them.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

func (l *trackingListener) cutAll() {
	l.mu.Lock()
	all := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		all = append(all, c)
	}
	l.mu.Unlock()
	for _, c := range all {
		c.Close()
	}
}

type trackedConn struct {
	net.Conn
	l *trackingListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// recordingListener hands the broker decrypted connections wrapped in a
// testfake.Recorder each: the recorder keeps what the broker reads as
// "received" and what it writes as "sent".
type recordingListener struct {
	net.Listener
	tb *testBroker
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	rec := &testfake.Recorder{}
	l.tb.mu.Lock()
	l.tb.recs = append(l.tb.recs, rec)
	l.tb.mu.Unlock()
	return rec.Wrap(c), nil
}

// ---------------------------------------------------------------------------
// Fake upstreams

// seenRequest is what an upstream recorded of one request.
type seenRequest struct {
	path, authorization, cookie string
}

// fakeUpstream is the API or the Dashboard: handlers by exact path, a
// default answer naming the path, and a record of every request except the
// front's availability probes.
type fakeUpstream struct {
	srv       *httptest.Server
	probePath string
	requests  atomic.Int64

	mu     sync.Mutex
	routes map[string]http.HandlerFunc
	seen   []seenRequest
}

func newFakeUpstream(t *testing.T, probePath, probeBody string) *fakeUpstream {
	f := &fakeUpstream{probePath: probePath, routes: map[string]http.HandlerFunc{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == probePath {
			io.WriteString(w, probeBody)
			return
		}
		f.requests.Add(1)
		f.mu.Lock()
		if len(f.seen) < 1000 {
			f.seen = append(f.seen, seenRequest{r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Cookie")})
		}
		h := f.routes[r.URL.Path]
		f.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		io.WriteString(w, "upstream:"+r.URL.Path)
	}))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // cut streams are expected
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeUpstream) handle(path string, h http.HandlerFunc) {
	f.mu.Lock()
	f.routes[path] = h
	f.mu.Unlock()
}

func (f *fakeUpstream) requestsSeen() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.seen...)
}

// ---------------------------------------------------------------------------
// Front

type testFront struct {
	srv   *proxy.Server
	opts  proxy.Options
	idCfg pinning.IdentityConfig
	relay *testenv.FakeRelay
	api   *fakeUpstream
	dash  *fakeUpstream
}

func startFront(t *testing.T, c *connector.Connector, limits func(*proxy.Limits)) *testFront {
	t.Helper()
	f := &testFront{
		idCfg: pinning.IdentityConfig{
			StateDir:  filepath.Join(t.TempDir(), "identity"),
			Authority: pinning.Authority{Host: authorityHost, Port: authorityPort},
		},
		relay: testenv.NewFakeRelay(t),
		api:   newFakeUpstream(t, "/health", `{"status":"ok"}`),
		dash:  newFakeUpstream(t, "/api/health", `{"status":"ok","auth_required":true}`),
	}
	id, err := pinning.LoadOrCreate(f.idCfg)
	if err != nil {
		t.Fatal(err)
	}
	lim := proxy.DefaultLimits()
	lim.MaxRequestBody = 64 << 20
	lim.MaxResponseBody = 2 << 30
	if limits != nil {
		limits(&lim)
	}
	u := func(s string) *url.URL { v, _ := url.Parse(s); return v }
	lg, _ := testenv.NewLog(t)
	f.opts = proxy.Options{
		AuthorityHost: authorityHost, AuthorityPort: authorityPort,
		ExtraNames: []string{aliasHost},
		Upstreams:  proxy.Upstreams{Relay: u(f.relay.Srv.URL), API: u(f.api.srv.URL), Dashboard: u(f.dash.srv.URL)},
		Limits:     lim,
		Relay:      relay.Options{Handoff: c.Handoff()},
		Log:        lg.Level(zerolog.InfoLevel),
	}
	f.srv, err = proxy.New(f.opts, id)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- f.srv.ServeReach(c.Listener()) }()
	t.Cleanup(func() {
		f.srv.Close()
		select {
		case <-served:
		case <-time.After(step):
			t.Error("the front did not stop serving")
		}
	})
	return f
}

func (f *testFront) pin() string { return f.srv.Identity().Pin }

// rotate replaces the front's identity the way `securelink pin --rotate`
// followed by a reload does.
func (f *testFront) rotate(t *testing.T) {
	t.Helper()
	id, err := pinning.Rotate(f.idCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Reload(f.opts, id); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// Connector

func connectorConfig(t *testing.T, tb *testBroker) (connector.Config, *testenv.LogSink) {
	lg, sink := testenv.NewLog(t)
	return connector.Config{
		BrokerURL: tb.URL(), HostID: tb.hostID, Token: tb.hostToken, RootCAs: tb.Pool, Log: lg,
		BackoffBase: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	}, sink
}

// runConnector runs c until the returned stop is called or the test ends.
func runConnector(t *testing.T, c *connector.Connector) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("connector Run: %v", err)
				}
			case <-time.After(2 * step):
				t.Error("connector Run did not return after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// reach is the whole assembly, running.
type reach struct {
	t     *testing.T
	tb    *testBroker
	c     *connector.Connector
	clog  *testenv.LogSink
	front *testFront
	stopC func()
}

type reachOptions struct {
	broker    brokerOptions
	connector func(*connector.Config)
	limits    func(*proxy.Limits)
}

func startReach(t *testing.T, o reachOptions) *reach {
	t.Helper()
	tb := startBroker(t, o.broker)
	cfg, sink := connectorConfig(t, tb)
	if o.connector != nil {
		o.connector(&cfg)
	}
	c, err := connector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	front := startFront(t, c, o.limits)
	stop := runConnector(t, c)
	testenv.WaitFor(t, "the connector to register", func() bool { return c.Status().State == connector.StateConnected })
	return &reach{t: t, tb: tb, c: c, clog: sink, front: front, stopC: stop}
}

// bootstrap publishes a fresh bootstrap credential (one stream).
func (r *reach) bootstrap() wire.Secret {
	r.t.Helper()
	b, err := r.c.PublishBootstrap(context.Background(), 0)
	if err != nil {
		r.t.Fatal(err)
	}
	return wire.Secret(b.Token)
}

func (r *reach) clientConfig(kind wire.Kind, token wire.Secret) client.Config {
	lg, _ := testenv.NewLog(r.t)
	return client.Config{
		BrokerURL:      r.tb.URL(),
		HostID:         r.tb.hostID,
		CredentialKind: string(kind),
		Token:          token,
		RootCAs:        r.tb.Pool,
		DialTimeout:    step,
		Log:            lg,
	}
}

// dialTLS opens a broker stream and the pinned inner TLS over it.
func (r *reach) dialTLS(kind wire.Kind, token wire.Secret, serverName, pin string, wrap func(net.Conn) net.Conn) (*innerConn, error) {
	cfg := r.clientConfig(kind, token)
	cfg.WrapOuter = wrap
	ctx, cancel := context.WithTimeout(context.Background(), 2*step)
	defer cancel()
	tc, err := client.DialTLS(ctx, cfg, serverName, pin)
	if err != nil {
		return nil, err
	}
	r.t.Cleanup(func() { tc.Close() })
	return &innerConn{t: r.t, tc: tc, br: bufio.NewReaderSize(tc, 64<<10)}, nil
}

// open is dialTLS with a fresh bootstrap credential and the right pin.
func (r *reach) open() *innerConn {
	r.t.Helper()
	in, err := r.dialTLS(wire.KindBootstrap, r.bootstrap(), authorityHost, r.front.pin(), nil)
	if err != nil {
		r.t.Fatalf("open a stream: %v", err)
	}
	return in
}

// innerConn is a client's TLS connection to the front through a stream.
type innerConn struct {
	t  *testing.T
	tc *tls.Conn
	br *bufio.Reader
}

// writeRequest sends one HTTP/1.1 request; body may be nil.
func (in *innerConn) writeRequest(method, path string, hdr http.Header, body io.Reader, length int64) error {
	req, err := http.NewRequest(method, fmt.Sprintf("https://%s:%d%s", authorityHost, authorityPort, path), body)
	if err != nil {
		return err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.ContentLength = length
	if length == 0 {
		req.Body = nil
	}
	return req.Write(in.tc)
}

// try does one request and reads the whole response, without failing the
// test (for goroutines).
func (in *innerConn) try(method, path string, hdr http.Header, body []byte) (*http.Response, []byte, error) {
	in.tc.SetDeadline(time.Now().Add(step))
	defer in.tc.SetDeadline(time.Time{})
	if err := in.writeRequest(method, path, hdr, bytes.NewReader(body), int64(len(body))); err != nil {
		return nil, nil, fmt.Errorf("request: %w", err)
	}
	resp, err := http.ReadResponse(in.br, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("response: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp, nil, fmt.Errorf("response body: %w", err)
	}
	return resp, data, nil
}

func (in *innerConn) get(path string, hdr http.Header) (*http.Response, []byte) {
	in.t.Helper()
	resp, body, err := in.try(http.MethodGet, path, hdr, nil)
	if err != nil {
		in.t.Fatalf("GET %s: %v", path, err)
	}
	return resp, body
}

// relayWS opens /relay/ws over the inner connection and sends authFrame;
// it returns the socket and the Relay's answer.
func (in *innerConn) relayWS(authFrame string) (*websocket.Conn, []byte) {
	in.t.Helper()
	return testfake.RelayWS(in.t, in.tc, fmt.Sprintf("wss://%s:%d/relay/ws", authorityHost, authorityPort), authFrame)
}

// routeCredential is what a phone keeps from its first Relay session
// through the broker.
type routeCredential struct {
	token        wire.Secret
	credentialID string
	sessionToken string
	authOK       []byte
}

// parseAuthOK extracts the session token and the route credential.
func parseAuthOK(t *testing.T, authOK []byte) routeCredential {
	t.Helper()
	var m struct {
		Type    string `json:"type"`
		Payload struct {
			SessionToken string `json:"session_token"`
			RC           *struct {
				Kind         string `json:"kind"`
				CredentialID string `json:"credential_id"`
				Token        string `json:"token"`
			} `json:"route_credential"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(authOK, &m); err != nil || m.Type != "auth.ok" || m.Payload.RC == nil ||
		m.Payload.RC.Kind != "broker_route" || m.Payload.RC.Token == "" {
		t.Fatalf("auth.ok without a route credential: %s", authOK)
	}
	return routeCredential{
		token: wire.Secret(m.Payload.RC.Token), credentialID: m.Payload.RC.CredentialID,
		sessionToken: m.Payload.SessionToken, authOK: authOK,
	}
}

// authFrame is a Relay auth message.
func authFrame(fields map[string]string) string {
	b, _ := json.Marshal(map[string]any{"type": "auth", "payload": fields})
	return string(b)
}
