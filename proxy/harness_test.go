package proxy

// The harness runs the real front on 127.0.0.1:0 with real TLS, in front of
// httptest upstreams that record what they received, and talks to it the way
// Hermes clients do: pinned TLS (pinning.PinnedTLSConfig), never an
// unverified connection. Raw HTTP/1.1 over a pinned tls.Conn is used where
// Go's client would normalize the request.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/testfake"
	"github.com/hermes-securelink/securelink/pinning"
)

// extraName is an additional name of every test front (identity SAN, SNI and
// Host policy).
const extraName = "front.example"

// probeUA is the User-Agent of the front's availability probes; the fakes
// count probes by it so probes never count as forwarded traffic.
const probeUA = "hermes-securelink-probe"

// testTimeout bounds every wait of a test, so a broken front fails the test
// instead of hanging it. It is never an assertion about speed.
const testTimeout = 15 * time.Second

// seen is one request as an upstream received it.
type seen struct {
	Method     string
	RequestURI string
	Host       string
	Proto      string
	Header     http.Header
	BodyLen    int64
	BodyErr    error
}

// upstream is a fake API or Dashboard. Probe requests (GET on probePath by
// the prober) are answered by health and counted apart; every other request
// is recorded and answered by handler (default: read the whole body, 200).
type upstream struct {
	t         *testing.T
	srv       *httptest.Server
	url       *url.URL
	probePath string

	probes atomic.Int64
	hits   atomic.Int64

	mu      sync.Mutex
	reqs    []*seen
	handler http.HandlerFunc
	health  http.HandlerFunc
}

func newUpstream(t *testing.T, probePath string, health http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{t: t, probePath: probePath, health: health}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	var err error
	if u.url, err = url.Parse(u.srv.URL); err != nil {
		t.Fatal(err)
	}
	return u
}

func newAPI(t *testing.T) *upstream {
	return newUpstream(t, "/health", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"status":"ok"}`)
	})
}

func newDashboard(t *testing.T) *upstream {
	return newUpstream(t, "/api/health", gateHealth(`{"status":"ok","auth_required":true}`, 200))
}

func gateHealth(body string, status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

func (u *upstream) port() string { return u.url.Port() }

// handle replaces the answer to forwarded requests.
func (u *upstream) handle(h http.HandlerFunc) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.handler = h
}

// setHealth replaces the answer to probes.
func (u *upstream) setHealth(h http.HandlerFunc) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.health = h
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	health, handler := u.health, u.handler
	u.mu.Unlock()
	if r.Method == http.MethodGet && r.URL.Path == u.probePath && r.Header.Get("User-Agent") == probeUA {
		u.probes.Add(1)
		health(w, r)
		return
	}
	s := &seen{
		Method: r.Method, RequestURI: r.RequestURI, Host: r.Host, Proto: r.Proto,
		Header: r.Header.Clone(), BodyLen: -1,
	}
	u.mu.Lock()
	u.reqs = append(u.reqs, s)
	u.mu.Unlock()
	u.hits.Add(1)
	if handler != nil {
		handler(w, r)
		return
	}
	n, err := io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	s.BodyLen, s.BodyErr = n, err
	u.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "upstream ok")
}

func (u *upstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]seen, len(u.reqs))
	for i, s := range u.reqs {
		out[i] = *s
	}
	return out
}

func (u *upstream) last() seen {
	u.t.Helper()
	r := u.requests()
	if len(r) == 0 {
		u.t.Fatal("upstream received no request")
	}
	return r[len(r)-1]
}

// logSink collects the front's log lines (to check that secrets never
// appear) and mirrors them to the test log until the test ends, so a late
// background log line cannot panic the test binary.
type logSink struct {
	t    *testing.T
	mu   sync.Mutex
	buf  bytes.Buffer
	done bool
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
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

// harness is one running front with its three fake upstreams.
type harness struct {
	t     *testing.T
	srv   *Server
	ln    net.Listener
	port  int
	addr  string // 127.0.0.1:port, the authority
	udp   string // the HTTP/3 socket's address, once serveHTTP3 ran
	idCfg pinning.IdentityConfig
	id    *pinning.Identity
	opts  Options
	logs  *logSink

	api, dash *upstream
	relay     *testfake.Relay

	served chan error
}

// option adjusts a harness before the front is built.
type option func(*harness)

func withLimits(f func(*Limits)) option { return func(h *harness) { f(&h.opts.Limits) } }

func withOptions(f func(*Options)) option { return func(h *harness) { f(&h.opts) } }

// forwardingPaths are the front as it runs (a request without a body takes
// the direct path) and the front sending every request through the
// ReverseProxy path: a test of the request matrix runs on both.
var forwardingPaths = []struct {
	name string
	opt  option
}{
	{"direct", func(*harness) {}},
	{"reverseproxy", withOptions(func(o *Options) { o.reverseProxyOnly = true })},
}

// onBothPaths runs test once per forwarding path, passing the option that
// selects it.
func onBothPaths(t *testing.T, test func(t *testing.T, path option)) {
	for _, p := range forwardingPaths {
		t.Run(p.name, func(t *testing.T) { test(t, p.opt) })
	}
}

// testLimits are the contract's limits with a probe cache long enough that
// probe counts are exact within one test.
func testLimits() Limits {
	l := DefaultLimits()
	l.ProbeInterval = time.Minute
	l.ProbeTimeout = 5 * time.Second
	return l
}

func newHarness(t *testing.T, opts ...option) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ln: ln, served: make(chan error, 1)}
	h.port = ln.Addr().(*net.TCPAddr).Port
	h.addr = ln.Addr().String()
	h.api, h.dash, h.relay = newAPI(t), newDashboard(t), testfake.NewRelay(t, nil)
	h.logs = &logSink{t: t}
	h.idCfg = pinning.IdentityConfig{
		StateDir:   t.TempDir() + "/s",
		Authority:  pinning.Authority{Host: "127.0.0.1", Port: h.port},
		ExtraNames: []string{extraName},
	}
	if h.id, err = pinning.LoadOrCreate(h.idCfg); err != nil {
		t.Fatal(err)
	}
	h.opts = Options{
		AuthorityHost: "127.0.0.1",
		AuthorityPort: h.port,
		ExtraNames:    []string{extraName},
		Upstreams:     Upstreams{Relay: h.relay.URL, API: h.api.url, Dashboard: h.dash.url},
		Limits:        testLimits(),
		Log:           zerolog.New(h.logs).Level(zerolog.DebugLevel),
	}
	for _, o := range opts {
		o(h)
	}
	if h.srv, err = New(h.opts, h.id); err != nil {
		ln.Close()
		t.Fatal(err)
	}
	go func() { h.served <- h.srv.Serve(h.ln) }() // an option may wrap h.ln
	t.Cleanup(func() {
		h.srv.Close()
		select {
		case <-h.served:
		case <-time.After(testTimeout):
			t.Error("Serve did not return after Close")
		}
		h.logs.mu.Lock()
		h.logs.done = true
		h.logs.mu.Unlock()
	})
	return h
}

// tlsConfig is exactly what a Hermes client uses for this front.
func (h *harness) tlsConfig() *tls.Config {
	return h.tlsConfigFor("127.0.0.1", h.id.Pin)
}

func (h *harness) tlsConfigFor(serverName, pin string) *tls.Config {
	h.t.Helper()
	cfg, err := pinning.PinnedTLSConfig(serverName, pin)
	if err != nil {
		h.t.Fatal(err)
	}
	return cfg
}

func (h *harness) url(path string) string { return "https://" + h.addr + path }

// client is an HTTP/1.1 pinned client that neither follows redirects nor
// asks for or undoes compression.
func (h *harness) client() *http.Client {
	tr := &http.Transport{
		TLSClientConfig:    h.tlsConfig(),
		DisableCompression: true,
		Proxy:              nil,
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		Timeout:       testTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// do sends req with a fresh pinned client and returns the response with its
// whole body.
func (h *harness) do(req *http.Request) (*http.Response, []byte) {
	h.t.Helper()
	resp, err := h.client().Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: reading body: %v", req.Method, req.URL.Path, err)
	}
	return resp, body
}

func (h *harness) get(path string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.url(path), nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.do(req)
}

// dialTLS opens a pinned TLS connection to the front.
func (h *harness) dialTLS(cfg *tls.Config) (*tls.Conn, error) {
	return h.dialTLSFrom("", cfg)
}

// dialTLSFrom is dialTLS from a chosen loopback source address.
func (h *harness) dialTLSFrom(localIP string, cfg *tls.Config) (*tls.Conn, error) {
	nd := &net.Dialer{Timeout: testTimeout}
	if localIP != "" {
		nd.LocalAddr = &net.TCPAddr{IP: net.ParseIP(localIP)}
	}
	d := &tls.Dialer{NetDialer: nd, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", h.addr)
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// raw writes one request exactly as given over a fresh pinned TLS connection
// and reads the response. The request must carry its own headers; raw adds
// nothing.
func (h *harness) raw(method, request string) (*http.Response, []byte) {
	h.t.Helper()
	return h.rawFrom("", method, request)
}

func (h *harness) rawFrom(localIP, method, request string) (*http.Response, []byte) {
	h.t.Helper()
	c, err := h.dialTLSFrom(localIP, h.tlsConfig())
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	if _, err := io.WriteString(c, request); err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		h.t.Fatalf("reading response to %q: %v", firstLine(request), err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// rawReq sends "METHOD target HTTP/1.1" with the authority as Host, the
// given extra header lines and Connection: close.
func (h *harness) rawReq(method, target string, headers ...string) (*http.Response, []byte) {
	h.t.Helper()
	return h.rawReqFrom("", method, target, headers...)
}

func (h *harness) rawReqFrom(localIP, method, target string, headers ...string) (*http.Response, []byte) {
	h.t.Helper()
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\n")
	hasHost := false
	for _, l := range headers {
		if strings.HasPrefix(strings.ToLower(l), "host:") {
			hasHost = true
		}
	}
	if !hasHost {
		b.WriteString("Host: " + h.addr + "\r\n")
	}
	for _, l := range headers {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	return h.rawFrom(localIP, method, b.String())
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	return l
}

// wsClient is a pinned HTTP/1.1 client for WebSocket dials; localIP binds the
// client's source address (127.0.0.2 is a second loopback source).
func (h *harness) wsClient(localIP string) *http.Client {
	return h.wsClientVia(localIP, "")
}

// wsClientVia dials via instead of the URL's address when set (another
// listener of the same front, reached under the authority's name).
func (h *harness) wsClientVia(localIP, via string) *http.Client {
	d := &net.Dialer{Timeout: testTimeout}
	if localIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(localIP)}
	}
	dial := d.DialContext
	if via != "" {
		dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, via)
		}
	}
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(), DialContext: dial, DisableKeepAlives: true}
	return &http.Client{Transport: tr}
}

// wsOpts are the optional parts of a client WebSocket dial.
type wsOpts struct {
	localIP string
	via     string // dial this address instead (see wsClientVia)
	header  http.Header
	protos  []string
}

// dialWS opens a WebSocket through the front (wss://authority/path).
func (h *harness) dialWS(path, localIP string) (*websocket.Conn, *http.Response, error) {
	return h.dialWSWith(path, wsOpts{localIP: localIP})
}

func (h *harness) dialWSWith(path string, o wsOpts) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "wss://"+h.addr+path, &websocket.DialOptions{
		HTTPClient:   h.wsClientVia(o.localIP, o.via),
		HTTPHeader:   o.header,
		Subprotocols: o.protos,
	})
	if c != nil {
		c.SetReadLimit(16 << 20)
		h.t.Cleanup(func() { c.CloseNow() })
	}
	return c, resp, err
}

func (h *harness) mustDialWS(path, localIP string) *websocket.Conn {
	h.t.Helper()
	c, resp, err := h.dialWS(path, localIP)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		h.t.Fatalf("dial %s: %v (status %d)", path, err, status)
	}
	return c
}

func wsSend(t *testing.T, c *websocket.Conn, typ websocket.MessageType, msg []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := c.Write(ctx, typ, msg); err != nil {
		t.Fatalf("websocket write: %v", err)
	}
}

func wsRead(c *websocket.Conn) (websocket.MessageType, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	return c.Read(ctx)
}

// closedURL is an http:// loopback URL where nothing listens.
func closedURL(t *testing.T) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return &url.URL{Scheme: "http", Host: addr}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantStatus(t *testing.T, what string, resp *http.Response, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s: status %d, want %d", what, resp.StatusCode, want)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// The "reverseproxy" option really moves a bodiless GET off the direct
// path: only the direct path keeps connections in its own pool.
func TestForwardingPathsSelectThePath(t *testing.T) {
	for _, p := range forwardingPaths {
		h := newHarness(t, p.opt)
		resp, _ := h.get("/api/v1/x")
		wantStatus(t, p.name+": GET /api/v1/x", resp, 200)
		st := h.srv.state.Load()
		pooled := func() int {
			st.api.pool.mu.Lock()
			defer st.api.pool.mu.Unlock()
			return len(st.api.pool.idle)
		}
		if p.name == "direct" {
			waitFor(t, "the direct path to pool its connection", func() bool { return pooled() > 0 })
		} else if n := pooled(); n != 0 {
			t.Errorf("%s: %d connections in the direct path's pool", p.name, n)
		}
	}
}

// holdUpstream makes the api upstream hold a request until release is
// called (at the latest at cleanup), then answer "finished"; started closes
// when the request arrives. One request only: a second would close started
// again.
func (h *harness) holdUpstream(t *testing.T) (started <-chan struct{}, release func()) {
	t.Helper()
	arrived, held := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(held) })
	t.Cleanup(release)
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-held
		io.WriteString(w, "finished")
	})
	return arrived, release
}
