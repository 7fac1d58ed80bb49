package proxy

// HTTP/3 runs the request matrix of the TCP tests through quic-go's own
// client, pinned as a Hermes client pins (pinning.PinnedTLSConfig:
// InsecureSkipVerify, exact SPKI pin and hostname in VerifyConnection), and
// expects the same answers. Raw requests (exact :method and :path) go
// through http3.ClientConn, which writes what it is given.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/pinning"
)

// serveHTTP3 starts ServeQUIC on a UDP socket of the front's own address
// (another loopback port only if that one is taken) and returns that
// socket's address; clients still name the authority (h.addr).
func (h *harness) serveHTTP3() string {
	h.t.Helper()
	pc, err := net.ListenPacket("udp", h.addr)
	if err != nil {
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			h.t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- h.srv.ServeQUIC(pc) }()
	h.t.Cleanup(func() {
		h.srv.Close()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("ServeQUIC: %v", err)
			}
		case <-time.After(testTimeout):
			h.t.Error("ServeQUIC did not return after Close")
		}
		pc.Close()
	})
	waitFor(h.t, "ServeQUIC to listen", func() bool { return h.srv.h3.serving.Load() > 0 })
	h.udp = pc.LocalAddr().String()
	return h.udp
}

// h3Transport is quic-go's HTTP/3 client pinned to pin, dialing the front's
// UDP socket for the authority's URLs.
func (h *harness) h3Transport(pin string) *http3.Transport {
	udp := h.udp
	tr := &http3.Transport{
		TLSClientConfig:    h.tlsConfigFor("127.0.0.1", pin),
		DisableCompression: true,
		Dial: func(ctx context.Context, _ string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			return quic.DialAddr(ctx, udp, tlsCfg, cfg)
		},
	}
	h.t.Cleanup(func() { tr.Close() })
	return tr
}

func (h *harness) h3Client() *http.Client {
	return &http.Client{
		Transport:     h.h3Transport(h.id.Pin),
		Timeout:       testTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// h3Raw sends one request with exactly method and path (and body, when not
// empty) on a fresh pinned QUIC connection and returns the status, or the
// error that ended the request.
func (h *harness) h3Raw(method, path, body string) (int, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg := h.tlsConfig()
	cfg.NextProtos = []string{http3.NextProtoH3}
	qc, err := quic.DialAddr(ctx, h.udp, cfg, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	defer qc.CloseWithError(0, "")
	cc := (&http3.Transport{}).NewClientConn(qc)
	req := &http.Request{
		Method: method, URL: &url.URL{Scheme: "https", Host: h.addr, Opaque: path},
		Header: http.Header{}, Host: h.addr,
	}
	if body != "" {
		req.Body, req.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
	}
	resp, err := cc.RoundTrip(req.WithContext(ctx))
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// h3Slow sends GET /api/slow on a new HTTP/3 client and delivers
// "<proto> <body>", or the error.
func (h *harness) h3Slow() chan string {
	slow := make(chan string, 1)
	c := h.h3Client()
	go func() {
		resp, err := c.Get(h.url("/api/slow"))
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- resp.Proto + " " + string(b)
	}()
	return slow
}

// transports are the two ways a client reaches the front in these tests.
type transport struct {
	name   string
	client func(h *harness) *http.Client
	proto  int
}

var tcpAndH3 = []transport{
	{"tcp", (*harness).client, 1},
	{"h3", (*harness).h3Client, 3},
}

func sendVia(t *testing.T, c *http.Client, want int, req *http.Request) *http.Response {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != want {
		t.Fatalf("%s %s: answered over %s", req.Method, req.URL.Path, resp.Proto)
	}
	return resp
}

func TestHTTP3RequestMatrixMatchesTCP(t *testing.T) {
	h := newHarness(t)
	h.serveHTTP3()
	type tc struct {
		name, method, path string
		host               string
		body               func() (io.Reader, int64)
		want               int
	}
	zeros := func(n, declared int64) func() (io.Reader, int64) {
		return func() (io.Reader, int64) { return &zeroReader{n}, declared }
	}
	cases := []tc{
		{name: "health", method: "GET", path: "/relay/health", want: 200},
		{name: "health HEAD", method: "HEAD", path: "/relay/health", want: 200},
		{name: "health POST", method: "POST", path: "/relay/health", want: 405},
		{name: "api", method: "GET", path: "/api/v1/models?x=1", want: 200},
		{name: "dashboard gate on", method: "GET", path: "/dashboard/", want: 200},
		{name: "unknown route", method: "GET", path: "/nope", want: 404},
		{name: "api without slash", method: "GET", path: "/api", want: 404},
		{name: "relay ws without upgrade", method: "GET", path: "/relay/ws", want: 400},
		{name: "TRACE", method: "TRACE", path: "/api/x", want: 405},
		{name: "hostile authority", method: "GET", path: "/api/x", host: "evil.example", want: 421},
		{name: "authority with another port", method: "GET", path: "/api/x", host: "127.0.0.1:1", want: 421},
		{name: "extra name", method: "GET", path: "/api/x", host: extraName, want: 200},
		{name: "declared body over the limit", method: "POST", path: "/api/upload", body: zeros(maxBody+1, maxBody+1), want: 413},
		{name: "streamed body of exactly the limit", method: "POST", path: "/api/upload", body: zeros(maxBody, -1), want: 200},
		{name: "streamed body over the limit", method: "POST", path: "/api/upload", body: zeros(maxBody+1, -1), want: 413},
	}
	for _, tr := range tcpAndH3 {
		c := tr.client(h)
		for _, k := range cases {
			var body io.Reader
			var n int64
			if k.body != nil {
				body, n = k.body()
			}
			req, err := http.NewRequest(k.method, h.url(k.path), body)
			if err != nil {
				t.Fatal(err)
			}
			if k.body != nil {
				req.ContentLength = n
			}
			if k.host != "" {
				req.Host = k.host
			}
			if resp := sendVia(t, c, tr.proto, req); resp.StatusCode != k.want {
				t.Errorf("%s %s: status %d, want %d", tr.name, k.name, resp.StatusCode, k.want)
			}
			if k.name == "streamed body of exactly the limit" {
				if got := h.api.last(); got.BodyLen != maxBody || got.BodyErr != nil {
					t.Errorf("%s: the upstream read %d bytes (%v)", tr.name, got.BodyLen, got.BodyErr)
				}
			}
		}

		// The API's credential passes, the client's cookies and Host never do.
		req, _ := http.NewRequest("GET", h.url("/api/v1/me"), nil)
		req.Header.Set("Authorization", "Bearer api-key")
		req.Header.Set("Cookie", "dash=1")
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		wantStatus(t, tr.name+" api with bearer", sendVia(t, c, tr.proto, req), 200)
		got := h.api.last()
		if got.Header.Get("Authorization") != "Bearer api-key" || got.Header.Get("Cookie") != "" ||
			got.Host != h.api.url.Host || got.Header.Get("X-Forwarded-For") == "203.0.113.9" || got.Proto != "HTTP/1.1" {
			t.Errorf("%s: the API received Host %q, %s, headers %v", tr.name, got.Host, got.Proto, got.Header)
		}
	}
}

func TestHTTP3DashboardGateOffIs503(t *testing.T) {
	h := newHarness(t)
	h.dash.setHealth(gateHealth(`{"status":"ok","auth_required":false}`, 200))
	h.serveHTTP3()
	for _, tr := range tcpAndH3 {
		req, _ := http.NewRequest("GET", h.url("/dashboard/"), nil)
		wantStatus(t, tr.name+" dashboard without its login gate", sendVia(t, tr.client(h), tr.proto, req), 503)
	}
	if n := h.dash.hits.Load(); n != 0 {
		t.Fatalf("the Dashboard got %d requests with its gate off", n)
	}
}

// The raw request matrix: every unsafe path and every target or method
// that is no HTTP/1.1 request line, on both forwarding paths.
func TestHTTP3RawPathsMethodsAndQueries(t *testing.T) {
	h := newHarness(t)
	h.serveHTTP3()
	for _, body := range []string{"", `{"q":1}`} { // the direct and the ReverseProxy path
		for _, prefix := range []string{"/api", "/dashboard"} {
			if code, err := h.h3Raw("GET", prefix+"/ok?a=b", body); err != nil || code != 200 {
				t.Fatalf("a plain raw h3 request: %d %v", code, err)
			}
			for _, tail := range unsafeTails {
				if code, err := h.h3Raw("GET", prefix+tail+"?q=1", body); err != nil || code != 400 {
					t.Errorf("h3 GET %s%s: %d %v, want 400", prefix, tail, code, err)
				}
			}
			for _, q := range []string{"/x?a b", "/x?a=1 HTTP/1.1", "/x?a=\xc3\xa9", "/x?a#b", "/x#frag"} {
				if code, err := h.h3Raw("GET", prefix+q, body); err != nil || code != 400 {
					t.Errorf("h3 GET %q: %d %v, want 400", prefix+q, code, err)
				}
			}
			// quic-go refuses a :method that is no token itself, as a
			// malformed request (RFC 9114 §4.1.2): the stream is reset
			// with H3_MESSAGE_ERROR before the handler runs.
			// So is a control byte in :path.
			for _, c := range []struct{ method, path string }{
				{"TRACE ", "/x"}, {"TRACE\t", "/x"}, {"GET /admin", "/x"}, {"HEAD ", "/x"},
				{"G\xc3\xa9T", "/x"}, {"GET(", "/x"}, {"GET,PUT", "/x"}, {"GET", "/x?a=\x7f"}, {"GET", "/x?a=\x01"},
			} {
				code, err := h.h3Raw(c.method, prefix+c.path, body)
				var he *http3.Error
				if !errors.As(err, &he) || he.ErrorCode != http3.ErrCodeMessageError {
					t.Errorf("h3 %q %q: status %d, error %v; want H3_MESSAGE_ERROR", c.method, prefix+c.path, code, err)
				}
			}
		}
	}
	for _, r := range append(h.api.requests(), h.dash.requests()...) {
		if r.RequestURI != "/ok?a=b" {
			t.Errorf("an upstream received %q %q", r.Method, r.RequestURI)
		}
	}
}

func TestHTTP3EventStreamsStream(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t)
			h.serveHTTP3()
			release := make(chan struct{})
			releaseOnce := sync.OnceFunc(func() { close(release) })
			t.Cleanup(releaseOnce)
			h.api.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: 1\n\n")
				w.(http.Flusher).Flush()
				<-release
				io.WriteString(w, "data: 2\n\n")
			})
			resp, err := h.h3Client().Do(p.request(t, h, "/api/events"))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.ProtoMajor != 3 || resp.StatusCode != 200 {
				t.Fatalf("%s %d", resp.Proto, resp.StatusCode)
			}
			br := bufio.NewReader(resp.Body)
			// The first event arrives while the upstream still holds the
			// stream open: the front flushes it, it does not buffer.
			if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
				t.Fatalf("first event %q, %v", line, err)
			}
			releaseOnce()
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "\ndata: 2\n\n" {
				t.Fatalf("the rest of the stream: %q, %v", rest, err)
			}
		})
	}
}

// A response that passes the limit after it started is cut (a stream reset),
// never a silently truncated success, on both paths.
func TestHTTP3OversizeStreamedResponseIsReset(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := limitedResponse(newHarness(t, withLimits(func(l *Limits) { l.MaxResponseBody = maxResp })))
			h.serveHTTP3()
			c := h.h3Client()
			resp, err := c.Do(p.request(t, h, "/api/big?n="+strconv.Itoa(maxResp+1)))
			if err != nil {
				return // cut before the head: not a success either
			}
			defer resp.Body.Close()
			if n, err := io.Copy(io.Discard, resp.Body); err == nil {
				t.Fatalf("an oversize h3 response completed normally (%d bytes)", n)
			}
			// The connection survives the reset of one stream.
			req, _ := http.NewRequest("GET", h.url("/relay/health"), nil)
			wantStatus(t, "health on the same QUIC connection", sendVia(t, c, 3, req), 200)
		})
	}
}

func TestHTTP3WrongPinAndUnknownSNIFail(t *testing.T) {
	m := metrics.NewFront()
	h := newHarness(t, withOptions(func(o *Options) { o.Metrics = m }))
	h.serveHTTP3()
	other, err := pinning.LoadOrCreate(pinning.IdentityConfig{
		StateDir: t.TempDir() + "/o", Authority: pinning.Authority{Host: "127.0.0.1", Port: h.port},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: h.h3Transport(other.Pin), Timeout: testTimeout}
	if _, err := c.Get(h.url("/relay/health")); err == nil || !strings.Contains(err.Error(), pinning.ErrPinMismatch.Error()) {
		t.Fatalf("h3 with a wrong pin: %v, want a pin mismatch", err)
	}

	// A name the front does not serve gets no certificate on QUIC either.
	cfg := h.tlsConfigFor(extraName, h.id.Pin)
	cfg.ServerName = "unknown.example"
	cfg.NextProtos = []string{http3.NextProtoH3}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if qc, err := quic.DialAddr(ctx, h.udp, cfg, nil); err == nil {
		qc.CloseWithError(0, "")
		t.Fatal("a QUIC handshake for an unknown server name succeeded")
	}
	if got := value(t, scrape(t, m), `securelink_tls_handshake_failures_total{reason="unknown_sni"}`); got != 1 {
		t.Fatalf("unknown SNI over QUIC counted %v times, want 1", got)
	}

	// The extra name is served, with the same pin.
	c = &http.Client{Transport: h.h3Transport(h.id.Pin), Timeout: testTimeout}
	c.Transport.(*http3.Transport).TLSClientConfig = h.tlsConfigFor(extraName, h.id.Pin)
	resp, err := c.Get(h.url("/relay/health"))
	if err != nil {
		t.Fatalf("h3 under the extra name: %v", err)
	}
	resp.Body.Close()
	if got := pinning.SPKIPin(resp.TLS.PeerCertificates[0]); got != h.id.Pin {
		t.Fatalf("QUIC presented %s, TCP presents %s", got, h.id.Pin)
	}
}

// Rotation + reload (what SIGHUP does): new QUIC handshakes show the new
// pin while a request open on an old QUIC connection completes.
func TestHTTP3RotationAppliesToNewHandshakes(t *testing.T) {
	h := newHarness(t)
	h.serveHTTP3()
	started, releaseOnce := h.holdUpstream(t)
	oldPin := h.id.Pin
	slow := h.h3Slow()
	<-started

	rotated, err := pinning.Rotate(h.idCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Reload(h.opts, rotated); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: h.h3Transport(rotated.Pin), Timeout: testTimeout}
	resp, err := c.Get(h.url("/relay/health"))
	if err != nil {
		t.Fatalf("a new QUIC handshake pinned to the rotated identity: %v", err)
	}
	resp.Body.Close()
	if got := pinning.SPKIPin(resp.TLS.PeerCertificates[0]); got != rotated.Pin || resp.ProtoMajor != 3 {
		t.Fatalf("new QUIC handshake presented %s over %s", got, resp.Proto)
	}
	c = &http.Client{Transport: h.h3Transport(oldPin), Timeout: testTimeout}
	if _, err := c.Get(h.url("/relay/health")); err == nil || !strings.Contains(err.Error(), pinning.ErrPinMismatch.Error()) {
		t.Fatalf("a new QUIC handshake pinned to the old identity: %v, want a pin mismatch", err)
	}
	releaseOnce()
	if got := <-slow; got != "HTTP/3.0 finished" {
		t.Fatalf("the request open across the rotation: %q", got)
	}
}

// Shutdown drains QUIC as it drains TCP: the request in flight finishes,
// then the connections close at once (not at the end of the grace), and
// ServeQUIC returns.
func TestHTTP3ShutdownDrainsInFlightRequests(t *testing.T) {
	h := newHarness(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	served := make(chan error, 1)
	go func() { served <- h.srv.ServeQUIC(pc) }()
	waitFor(t, "ServeQUIC to listen", func() bool { return h.srv.h3.serving.Load() > 0 })
	h.udp = pc.LocalAddr().String()

	started, releaseOnce := h.holdUpstream(t)
	idle := h.h3Client() // a second client with an idle connection
	req, _ := http.NewRequest("GET", h.url("/relay/health"), nil)
	sendVia(t, idle, 3, req)
	// And a client that ignores GOAWAY: a QUIC connection that never
	// speaks HTTP/3. It must not hold the drain for the whole grace.
	cfg := h.tlsConfig()
	cfg.NextProtos = []string{http3.NextProtoH3}
	dctx, dcancel := context.WithTimeout(context.Background(), testTimeout)
	defer dcancel()
	mute, err := quic.DialAddr(dctx, h.udp, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mute.CloseWithError(0, "")
	slow := h.h3Slow()
	<-started
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- h.srv.Shutdown(ctx)
	}()
	select {
	case err := <-shut:
		releaseOnce()
		t.Fatalf("Shutdown returned (%v) with a request in flight; active %d; the request: %q", err, h.srv.h3.active.Load(), <-slow)
	case <-time.After(200 * time.Millisecond):
	}
	releaseOnce()
	if got := <-slow; got != "HTTP/3.0 finished" {
		t.Fatalf("the request in flight during Shutdown: %q", got)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v (the drain waited for the whole grace)", err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("ServeQUIC: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("ServeQUIC did not return after Shutdown")
	}
	pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, "GET", h.url("/relay/health"), nil)
	if _, err := h.h3Client().Do(req); err == nil {
		t.Fatal("a new QUIC connection was served after Shutdown")
	}
}

func TestAltSvcOnTCPOnlyWhileHTTP3Serves(t *testing.T) {
	h := newHarness(t)
	resp, _ := h.get("/relay/health")
	if v := resp.Header.Values("Alt-Svc"); len(v) != 0 {
		t.Fatalf("Alt-Svc %q without HTTP/3", v)
	}
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Alt-Svc", `h3=":9"`) // an upstream's own is never passed on
	})
	h.serveHTTP3()
	want := `h3=":` + strconv.Itoa(h.port) + `"; ma=86400`
	for _, path := range []string{"/relay/health", "/api/x", "/nope"} {
		resp, _ := h.get(path)
		if v := resp.Header.Values("Alt-Svc"); len(v) != 1 || v[0] != want {
			t.Errorf("TCP %s: Alt-Svc %q, want %q", path, v, want)
		}
		resp, err := h.h3Client().Get(h.url(path))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if v := resp.Header.Values("Alt-Svc"); resp.ProtoMajor != 3 || len(v) != 0 {
			t.Errorf("%s %s: Alt-Svc %q", resp.Proto, path, v)
		}
	}
	// advertise_port is what clients are told.
	o := h.opts
	o.AuthorityPort = h.port + 1
	if err := h.srv.Reload(o, h.id); err != nil {
		t.Fatal(err)
	}
	resp, _ = h.rawReq("GET", "/relay/health", "Host: 127.0.0.1:"+strconv.Itoa(h.port+1))
	if got, want := resp.Header.Get("Alt-Svc"), `h3=":`+strconv.Itoa(h.port+1)+`"; ma=86400`; got != want {
		t.Fatalf("Alt-Svc after an advertise_port change: %q, want %q", got, want)
	}
	// The header is built once per port, not per response.
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/relay/health", nil)
	h.srv.advertiseHTTP3(w, r)
	if n := testing.AllocsPerRun(100, func() { h.srv.advertiseHTTP3(w, r) }); n != 0 {
		t.Fatalf("%.0f allocations to add Alt-Svc, want none", n)
	}
}

func TestHTTP3MetricsCountHandshakesAndRequests(t *testing.T) {
	m := metrics.NewFront()
	h := newHarness(t, withOptions(func(o *Options) { o.Metrics = m }))
	h.srv.RegisterMetrics(m)
	h.serveHTTP3()
	c := h.h3Client() // one connection, three requests
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("GET", h.url("/api/x?token=secret-query-token"), nil)
		sendVia(t, c, 3, req)
	}
	req, _ := http.NewRequest("GET", h.url("/relay/health"), nil)
	sendVia(t, h.h3Client(), 3, req) // a second connection
	h.get("/relay/health")           // TCP counts only in the shared series
	text := scrape(t, m)
	if got := value(t, text, "securelink_quic_handshakes_total"); got != 2 {
		t.Errorf("QUIC handshakes %v, want 2", got)
	}
	if got := value(t, text, "securelink_http3_requests_total"); got != 4 {
		t.Errorf("HTTP/3 requests %v, want 4", got)
	}
	if got := value(t, text, `securelink_requests_total{code="2xx",ns="api"}`); got != 3 {
		t.Errorf("API requests %v, want 3 (HTTP/3 requests count with the others)", got)
	}
	if strings.Contains(text, "secret-query-token") {
		t.Fatal("a query reached the metrics")
	}
}

func TestUDPBufferWarningOnceWithItsFix(t *testing.T) {
	logs := &logSink{t: t}
	h := newHarness(t, withOptions(func(o *Options) { o.Log = zerolog.New(logs) }))
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if err := pc.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := udpBuffers(pc); !ok {
		t.Skip("socket buffer sizes cannot be read on this platform")
	}
	h.srv.checkUDPBuffers(pc)
	h.srv.checkUDPBuffers(pc)
	out := logs.String()
	if n := strings.Count(out, `"event":"udp_buffer_small"`); n != 1 {
		t.Fatalf("%d buffer warnings, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "net.core.rmem_max=7500000") || !strings.Contains(out, `"level":"warn"`) {
		t.Fatalf("the warning does not name its fix: %s", out)
	}
}
