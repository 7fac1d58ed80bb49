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
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
	"github.com/hermes-securelink/securelink/proxy"
	"github.com/hermes-securelink/securelink/relay"
)

// step bounds every single wait, so a broken component fails a test
// instead of hanging it. It is never an assertion about speed.
const step = 10 * time.Second

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
// Small helpers

// logSink keeps log lines so tests can check that no secret was logged, and
// mirrors them to the test log in -v runs until the test ends.
type logSink struct {
	t    *testing.T
	mu   sync.Mutex
	buf  bytes.Buffer
	done bool
}

func newLog(t *testing.T) (zerolog.Logger, *logSink) {
	s := &logSink{t: t}
	t.Cleanup(func() {
		s.mu.Lock()
		s.done = true
		s.mu.Unlock()
	})
	return zerolog.New(s).Level(zerolog.DebugLevel), s
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() < 8<<20 {
		l.buf.Write(p)
	}
	if !l.done && testing.Verbose() {
		l.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitFor polls cond until it holds or step passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(step)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// secret returns a fresh random marker that cannot occur by chance.
func secret(prefix string) string {
	b := make([]byte, 16)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// writeCert creates a self-signed broker certificate for 127.0.0.1 and
// returns its files and a pool trusting it (the test CA).
func writeCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "reach test broker"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

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
	t         *testing.T
	cfg       server.Config
	capture   bool
	tlsCert   tls.Certificate
	pool      *x509.CertPool
	addr      string
	hostID    string
	hostToken wire.Secret
	logs      *logSink

	b      *server.Broker
	ln     *trackingListener
	cancel context.CancelFunc
	done   chan error

	mu   sync.Mutex
	recs []*client.Recorder // capture: one per accepted connection
}

func startBroker(t *testing.T, o brokerOptions) *testBroker {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
	cfg.HostsFile = filepath.Join(dir, "hosts.json")
	cfg.StateFile = filepath.Join(dir, "state.json")
	cfg.AttemptsPerMinute = 100000
	cfg.ShutdownGrace = 2 * time.Second
	if o.capture {
		cfg.InsecurePlaintext = true
		cfg.TLSCertFile, cfg.TLSKeyFile = "", ""
	}
	if o.mutate != nil {
		o.mutate(&cfg)
	}
	hostID, token, err := store.AddHost(cfg.HostsFile)
	if err != nil {
		t.Fatal(err)
	}
	tb := &testBroker{t: t, cfg: cfg, capture: o.capture, tlsCert: cert, pool: pool,
		addr: "127.0.0.1:0", hostID: hostID, hostToken: token}
	tb.start()
	t.Cleanup(tb.stop)
	return tb
}

// start serves on tb.addr: a new port the first time, the same one after
// stop or kill.
func (tb *testBroker) start() {
	t := tb.t
	t.Helper()
	raw, err := net.Listen("tcp", tb.addr)
	if err != nil {
		t.Fatal(err)
	}
	tb.addr = raw.Addr().String()
	tb.ln = &trackingListener{Listener: raw, conns: map[net.Conn]struct{}{}}
	var ln net.Listener = tb.ln
	if tb.capture {
		ln = &recordingListener{
			Listener: tls.NewListener(tb.ln, &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{tb.tlsCert},
				NextProtos:   []string{"http/1.1"},
			}),
			tb: tb,
		}
	}
	lg, sink := newLog(t)
	tb.logs = sink
	b, err := server.New(tb.cfg, lg.Level(zerolog.InfoLevel))
	if err != nil {
		raw.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.b, tb.cancel, tb.done = b, cancel, make(chan error, 1)
	go func() { tb.done <- b.ServeListener(ctx, ln) }()
}

// stop shuts the broker down gracefully.
func (tb *testBroker) stop() {
	if tb.cancel == nil {
		return
	}
	tb.cancel()
	tb.cancel = nil
	select {
	case err := <-tb.done:
		if err != nil {
			tb.t.Errorf("broker: %v", err)
		}
	case <-time.After(2 * step):
		tb.t.Error("the broker did not stop")
	}
}

// kill stops the broker the way a crash does, as far as a process can do
// to itself: the listener and every TCP connection are cut without a
// WebSocket close, and the state file is put back to what was on disk at
// that moment (the graceful shutdown that follows must not save anything
// a killed process would have lost).
func (tb *testBroker) kill() {
	t := tb.t
	t.Helper()
	state, err := os.ReadFile(tb.cfg.StateFile)
	if err != nil {
		t.Fatalf("state file at the kill: %v", err)
	}
	tb.ln.Close()
	tb.ln.cutAll()
	tb.cancel()
	tb.cancel = nil
	select {
	case <-tb.done: // an error is expected: the listener was cut
	case <-time.After(2 * step):
		t.Fatal("the killed broker did not stop")
	}
	if err := os.WriteFile(tb.cfg.StateFile, state, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (tb *testBroker) url() string { return "wss://" + tb.addr + wire.ConnectPath }

func (tb *testBroker) recorders() []*client.Recorder {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]*client.Recorder(nil), tb.recs...)
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
// client.Recorder each: the recorder keeps what the broker reads as
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
	rec := &client.Recorder{}
	l.tb.mu.Lock()
	l.tb.recs = append(l.tb.recs, rec)
	l.tb.mu.Unlock()
	return rec.Wrap(c), nil
}

// ---------------------------------------------------------------------------
// Fake upstreams

// fakeRelay speaks the Relay's first-frame authentication: the client's
// first message is its auth frame, the answer an auth.ok carrying the
// session token the client presented or a new random one; then it echoes.
// It counts every message a client got through to it.
type fakeRelay struct {
	srv      *httptest.Server
	upgrades atomic.Int64
	frames   atomic.Int64

	mu       sync.Mutex
	auths    [][]byte // the first frame of each session
	sessions []string // the session tokens handed out
}

func newFakeRelay(t *testing.T) *fakeRelay {
	f := &fakeRelay{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			io.WriteString(w, `{"ok":true}`)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		f.upgrades.Add(1)
		c.SetReadLimit(4 << 20)
		ctx := r.Context()
		_, first, err := c.Read(ctx)
		if err != nil {
			return
		}
		f.frames.Add(1)
		var auth struct {
			Payload struct {
				SessionToken string `json:"session_token"`
			} `json:"payload"`
		}
		json.Unmarshal(first, &auth)
		sess := auth.Payload.SessionToken
		if sess == "" {
			sess = secret("relay-session-")
		}
		f.mu.Lock()
		if len(f.auths) < 100 {
			f.auths = append(f.auths, first)
			f.sessions = append(f.sessions, sess)
		}
		f.mu.Unlock()
		sessJSON, _ := json.Marshal(sess)
		ok := `{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":` + string(sessJSON) +
			`,"server_version":"0.9.1","expires_at":null}}`
		if c.Write(ctx, websocket.MessageText, []byte(ok)) != nil {
			return
		}
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			f.frames.Add(1)
			if c.Write(ctx, typ, msg) != nil {
				return
			}
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

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
	relay *fakeRelay
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
		relay: newFakeRelay(t),
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
	lg, _ := newLog(t)
	f.opts = proxy.Options{
		AuthorityHost: authorityHost, AuthorityPort: authorityPort,
		ExtraNames: []string{aliasHost},
		Upstreams:  proxy.Upstreams{Relay: u(f.relay.srv.URL), API: u(f.api.srv.URL), Dashboard: u(f.dash.srv.URL)},
		Limits:     lim,
		Relay:      relay.Options{Handoff: c.Handoff()},
		Log:        lg.Level(zerolog.InfoLevel),
	}
	f.srv, err = proxy.New(f.opts, id)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- f.srv.Serve(c.Listener()) }()
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

func connectorConfig(t *testing.T, tb *testBroker) (connector.Config, *logSink) {
	lg, sink := newLog(t)
	return connector.Config{
		BrokerURL: tb.url(), HostID: tb.hostID, Token: tb.hostToken, RootCAs: tb.pool, Log: lg,
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
	clog  *logSink
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
	waitFor(t, "the connector to register", func() bool { return c.Status().State == connector.StateConnected })
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
	lg, _ := newLog(r.t)
	return client.Config{
		BrokerURL:      r.tb.url(),
		HostID:         r.tb.hostID,
		CredentialKind: string(kind),
		Token:          token,
		RootCAs:        r.tb.pool,
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
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	used := false
	ws, _, err := websocket.Dial(ctx, fmt.Sprintf("wss://%s:%d/relay/ws", authorityHost, authorityPort), &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: &http.Transport{
			DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
				if used {
					return nil, errors.New("one connection only")
				}
				used = true
				return in.tc, nil
			},
		}},
	})
	if err != nil {
		in.t.Fatalf("relay upgrade: %v", err)
	}
	in.t.Cleanup(func() { ws.CloseNow() })
	ws.SetReadLimit(4 << 20)
	if err := ws.Write(ctx, websocket.MessageText, []byte(authFrame)); err != nil {
		in.t.Fatal(err)
	}
	_, msg, err := ws.Read(ctx)
	if err != nil {
		in.t.Fatalf("auth answer: %v", err)
	}
	return ws, msg
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
