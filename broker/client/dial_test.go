package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
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

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
)

func TestDialTLSFetchesThroughBroker(t *testing.T) {
	id, _ := newIdentity(t)
	front := newHTTPFront(t, id)
	e, _, tok := published(t, nil, wire.KindRoute, front.serve)

	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	tc, err := DialTLS(ctx, e.config(0, wire.KindRoute, tok), authorityHost, id.Pin)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if cs := tc.ConnectionState(); !pinning.PinMatches(cs.PeerCertificates[0], id.Pin) {
		t.Fatal("inner TLS is not with the pinned identity")
	}
	code, body := get(t, tc, "/api/hello", nil)
	if code != http.StatusOK || body != "hello from the host: /api/hello" {
		t.Fatalf("got %d %q", code, body)
	}
	if n := len(front.requests()); n != 1 {
		t.Fatalf("front saw %d requests, want 1", n)
	}
}

func TestRouteTokenWorksRepeatedly(t *testing.T) {
	id, _ := newIdentity(t)
	front := newHTTPFront(t, id)
	e, h, tok := published(t, nil, wire.KindRoute, front.serve)
	cfg := e.config(0, wire.KindRoute, tok)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), step)
		tc, err := DialTLS(ctx, cfg, authorityHost, id.Pin)
		cancel()
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		if code, _ := get(t, tc, "/relay/health", nil); code != http.StatusOK {
			t.Fatalf("dial %d: status %d", i, code)
		}
		tc.Close()
	}
	if n := h.opens.Load(); n != 3 {
		t.Fatalf("host saw %d streams, want 3", n)
	}
}

func TestBootstrapServesOneStream(t *testing.T) {
	id, _ := newIdentity(t)
	front := newHTTPFront(t, id)
	e, h, tok := published(t, nil, wire.KindBootstrap, front.serve)
	cfg := e.config(0, wire.KindBootstrap, tok)

	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	tc, err := DialTLS(ctx, cfg, authorityHost, id.Pin)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, tc, "/relay/health", nil); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	tc.Close()

	_, err = Dial(ctx, cfg)
	if !errors.Is(err, wire.ErrReplayed) {
		t.Fatalf("second use of a bootstrap token: %v, want replayed", err)
	}
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeReplayed {
		t.Fatalf("error is not a *wire.Error: %T", err)
	}
	if strings.Contains(err.Error(), string(tok)) {
		t.Fatal("error reveals the token")
	}
	if n := h.opens.Load(); n != 1 {
		t.Fatalf("host saw %d streams, want 1", n)
	}
}

func TestUnknownTokenUnauthorized(t *testing.T) {
	e := newEnv(t, nil)
	h := e.host(0, func(c net.Conn) { c.Close() })
	h.publishRoute("route-1", wire.NewToken())
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	_, err := Dial(ctx, e.config(0, wire.KindRoute, wire.NewToken()))
	if !errors.Is(err, wire.ErrUnauthorized) {
		t.Fatalf("unknown token: %v", err)
	}
	if h.opens.Load() != 0 {
		t.Fatal("host saw a stream")
	}
}

func TestHostOffline(t *testing.T) {
	e, h, tok := published(t, nil, wire.KindRoute, func(c net.Conn) { c.Close() })
	h.ws.Close(websocket.StatusNormalClosure, "")
	testenv.WaitFor(t, "the host to go offline", func() bool { n, _ := e.health(); return n == 0 })

	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	_, err := Dial(ctx, e.config(0, wire.KindRoute, tok))
	if !errors.Is(err, wire.ErrHostOffline) {
		t.Fatalf("dial with the host offline: %v", err)
	}
}

// pinFailure dials with a configuration that must fail the inner handshake
// and asserts that the front's handler saw nothing, although the stream
// itself reached the host (so the test would notice a broken setup).
func pinFailure(t *testing.T, serverName string, pin func(served, other *pinning.Identity) string, rotate bool) error {
	t.Helper()
	served, ic := newIdentity(t)
	pinned := served
	if rotate {
		var err error
		if served, err = pinning.Rotate(ic); err != nil {
			t.Fatal(err)
		}
		if served.Pin == pinned.Pin {
			t.Fatal("rotation kept the key")
		}
	}
	other, _ := newIdentity(t)
	front := newHTTPFront(t, served)
	e, h, tok := published(t, nil, wire.KindRoute, front.serve)

	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	tc, err := DialTLS(ctx, e.config(0, wire.KindRoute, tok), serverName, pin(pinned, other))
	if err == nil {
		tc.Close()
		t.Fatal("inner TLS succeeded")
	}
	if h.opens.Load() != 1 {
		t.Fatalf("the stream did not reach the host (%d opens)", h.opens.Load())
	}
	// Give a request that slipped through time to show up.
	time.Sleep(50 * time.Millisecond)
	if n := len(front.requests()); n != 0 {
		t.Fatalf("the front's handler saw %d requests", n)
	}
	return err
}

func TestWrongPinFailsBeforeApplicationBytes(t *testing.T) {
	err := pinFailure(t, authorityHost, func(_, other *pinning.Identity) string { return other.Pin }, false)
	if !errors.Is(err, pinning.ErrPinMismatch) {
		t.Fatalf("wrong pin: %v", err)
	}
}

func TestWrongHostnameFailsBeforeApplicationBytes(t *testing.T) {
	err := pinFailure(t, "other.example", func(served, _ *pinning.Identity) string { return served.Pin }, false)
	if err == nil || !strings.Contains(err.Error(), "does not name other.example") {
		t.Fatalf("wrong hostname: %v", err)
	}
}

func TestRotatedCertificateFailsBeforeApplicationBytes(t *testing.T) {
	err := pinFailure(t, authorityHost, func(pinned, _ *pinning.Identity) string { return pinned.Pin }, true)
	if !errors.Is(err, pinning.ErrPinMismatch) {
		t.Fatalf("rotated identity: %v", err)
	}
}

func TestLargeWritesArriveIntact(t *testing.T) {
	const size = 2<<20 + 12345 // more than two client messages
	got := make(chan [32]byte, 1)
	e, _, tok := published(t, nil, wire.KindRoute, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, size)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Errorf("host read: %v", err)
			return
		}
		got <- sha256.Sum256(buf)
		if _, err := c.Write(buf); err != nil { // and the same bytes back
			t.Errorf("host write: %v", err)
		}
	})
	c := e.dial(tok)
	data := make([]byte, size)
	rand.Read(data)
	c.SetDeadline(time.Now().Add(3 * step))
	go func() {
		if n, err := c.Write(data); err != nil || n != size {
			t.Errorf("write: %d %v", n, err)
		}
	}()
	select {
	case sum := <-got:
		if sum != sha256.Sum256(data) {
			t.Fatal("the host received different bytes")
		}
	case <-time.After(3 * step):
		t.Fatal("the host did not receive everything")
	}
	back, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	if !bytes.Equal(back, data) {
		t.Fatalf("read back %d bytes, not the %d sent", len(back), size)
	}
}

func TestHostCloseIsEOF(t *testing.T) {
	e, _, tok := published(t, nil, wire.KindRoute, func(c net.Conn) {
		c.Write([]byte("bye"))
		c.Close()
	})
	c := e.dial(tok)
	c.SetReadDeadline(time.Now().Add(step))
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "bye" {
		t.Fatalf("got %q, %v; want \"bye\" then EOF", b, err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after EOF: %v", err)
	}
}

func TestHostOfflineMidStreamIsAnError(t *testing.T) {
	opened := make(chan net.Conn, 1)
	e, h, tok := published(t, nil, wire.KindRoute, func(c net.Conn) { opened <- c })
	c := e.dial(tok)
	<-opened
	h.ws.CloseNow()
	c.SetReadDeadline(time.Now().Add(step))
	_, err := c.Read(make([]byte, 1))
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != wire.CloseGoingAway {
		t.Fatalf("read with the host gone: %v, want close 1001", err)
	}
	if isEOF(err) {
		t.Fatal("a cut stream must not look like a clean end")
	}
}

func TestDeadlines(t *testing.T) {
	e, _, tok := published(t, nil, wire.KindRoute, echo)
	c := e.dial(tok)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	// A passed deadline leaves the stream usable once it is cleared.
	c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(step))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo after a timeout: %q %v", buf, err)
	}
	c.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) && !errors.As(err, &ne) {
		t.Fatalf("write past the deadline: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// TestPingsAnsweredWhileNotReading: the broker pings often and drops
// sockets that do not answer; a caller that does not read for a while must
// still have its stream afterwards.
func TestPingsAnsweredWhileNotReading(t *testing.T) {
	e, _, tok := published(t, func(c *server.Config) {
		c.PingInterval = 20 * time.Millisecond
		c.PongTimeout = 150 * time.Millisecond
	}, wire.KindRoute, echo)
	c := e.dial(tok)
	time.Sleep(600 * time.Millisecond) // several pong timeouts without a Read
	if _, err := c.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(step))
	buf := make([]byte, 10)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "still here" {
		t.Fatalf("stream after idling: %q %v", buf, err)
	}
}

// fakeBroker is an httptest TLS server on 127.0.0.1 speaking just enough of
// the protocol: it matches every client, then runs after(ws).
func fakeBroker(t *testing.T, after func(*websocket.Conn)) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx, cancel := context.WithTimeout(r.Context(), step)
		defer cancel()
		_, data, err := ws.Read(ctx)
		if err != nil {
			return
		}
		if _, err := wire.ParseRegister(data); err != nil {
			t.Errorf("client registration: %v", err)
			return
		}
		m, _ := wire.Marshal(wire.Matched{StreamID: wire.NewID()})
		ws.Write(ctx, websocket.MessageText, m)
		after(ws)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func fakeBrokerConfig(srv *httptest.Server) Config {
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	return Config{
		BrokerURL:      "wss://" + srv.Listener.Addr().String() + wire.ConnectPath,
		HostID:         wire.NewID().String(),
		CredentialKind: string(wire.KindRoute),
		Token:          wire.NewToken(),
		RootCAs:        pool,
		DialTimeout:    step,
	}
}

// dialFake opens a stream through the fake broker srv.
func dialFake(t *testing.T, srv *httptest.Server) net.Conn {
	t.Helper()
	return dialConfig(t, fakeBrokerConfig(srv))
}

// dialConfig opens a stream with cfg.
func dialConfig(t *testing.T, cfg Config) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestKeepaliveDropsSilentBroker(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv := fakeBroker(t, func(ws *websocket.Conn) { <-release }) // never reads: no pongs
	cfg := fakeBrokerConfig(srv)
	cfg.PingInterval = 20 * time.Millisecond
	cfg.PongTimeout = 100 * time.Millisecond
	cfg.Log = testLog(t)
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(step))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("read from a silent broker: %v", err)
	}
}

func TestKeepaliveKeepsAnsweringBroker(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv := fakeBroker(t, func(ws *websocket.Conn) {
		ctx := ws.CloseRead(context.Background()) // reads, so pings get pongs
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	cfg := fakeBrokerConfig(srv)
	cfg.PingInterval = 20 * time.Millisecond
	cfg.PongTimeout = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a live broker's stream ended: %v", err)
	}
}

func TestConfigRefusesPlaintextAndBadValues(t *testing.T) {
	good := Config{
		BrokerURL:      "wss://broker.example/v1/connect",
		HostID:         wire.NewID().String(),
		CredentialKind: "route",
		Token:          wire.NewToken(),
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*Config){
		"ws":           func(c *Config) { c.BrokerURL = "ws://127.0.0.1:9444/v1/connect" },
		"http":         func(c *Config) { c.BrokerURL = "https://broker.example/v1/connect" },
		"path":         func(c *Config) { c.BrokerURL = "wss://broker.example/v2/connect" },
		"query":        func(c *Config) { c.BrokerURL = "wss://broker.example/v1/connect?token=x" },
		"userinfo":     func(c *Config) { c.BrokerURL = "wss://u:p@broker.example/v1/connect" },
		"host_id":      func(c *Config) { c.HostID = "AAAAAAAAAAAAAAAAAAAAAB" },
		"kind host":    func(c *Config) { c.CredentialKind = "host" },
		"short token":  func(c *Config) { c.Token = "short" },
		"negative":     func(c *Config) { c.DialTimeout = -time.Second },
		"pong <= ping": func(c *Config) { c.PingInterval = time.Minute },
	}
	for name, mutate := range cases {
		c := good
		mutate(&c)
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), string(good.Token)) {
			t.Errorf("%s: error reveals the token", name)
		}
	}
}

// TestPlaintextNeverDialed: a ws:// broker URL and a broker redirecting to
// plaintext both fail without a single connection to the plaintext port.
func TestPlaintextNeverDialed(t *testing.T) {
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	cfg := Config{
		BrokerURL:      "ws://" + plain.Addr().String() + wire.ConnectPath,
		HostID:         wire.NewID().String(),
		CredentialKind: "route",
		Token:          wire.NewToken(),
	}
	if _, err := Dial(ctx, cfg); err == nil || !strings.Contains(err.Error(), "wss") {
		t.Fatalf("ws:// URL: %v", err)
	}

	for _, target := range []string{"ws://", "http://", "wss://"} {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target+plain.Addr().String()+wire.ConnectPath, http.StatusTemporaryRedirect)
		}))
		srv.StartTLS()
		rc := fakeBrokerConfig(srv)
		if _, err := Dial(ctx, rc); err == nil || !strings.Contains(err.Error(), "redirect, which is refused") {
			t.Errorf("redirect to %s: %v", target, err)
		}
		srv.Close()
	}
	time.Sleep(20 * time.Millisecond)
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the plaintext port saw %d connections", n)
	}
}

func TestUntrustedBrokerCertificateRefused(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(0, wire.KindRoute, wire.NewToken())
	cfg.RootCAs = nil // system roots do not know the test CA
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if _, err := Dial(ctx, cfg); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted broker: %v", err)
	}
}

// TestBrokerErrorAfterMatchedSurfaces: an `error` message before the close
// is what Read reports, as a *wire.Error; any other control message on a
// matched stream is a protocol error.
func TestBrokerErrorAfterMatchedSurfaces(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want func(error) bool
	}{
		{`{"type":"error","protocol_version":1,"code":"revoked"}`, func(err error) bool { return errors.Is(err, wire.ErrRevoked) }},
		{`{"type":"matched","protocol_version":1,"stream_id":"AAECAwQFBgcICQoLDA0ODw"}`, func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "control message on a matched stream")
		}},
	} {
		srv := fakeBroker(t, func(ws *websocket.Conn) {
			ctx, cancel := context.WithTimeout(context.Background(), step)
			defer cancel()
			ws.Write(ctx, websocket.MessageBinary, []byte("data first"))
			ws.Write(ctx, websocket.MessageText, []byte(tc.msg))
			ws.Close(wire.ClosePolicy, "")
		})
		c := dialFake(t, srv)
		c.SetReadDeadline(time.Now().Add(step))
		b, err := io.ReadAll(c)
		if string(b) != "data first" || !tc.want(err) {
			t.Errorf("after %s: read %q, %v", tc.msg, b, err)
		}
		c.Close()
	}
}

// TestMessageBytesReadableAsTheyArrive: the bytes of a broker message are
// the caller's as soon as they arrive, not once the whole message has (a
// stream has no message boundaries, and a Conn holding whole messages held
// buffers sized after them); the message's end still delivers the rest.
func TestMessageBytesReadableAsTheyArrive(t *testing.T) {
	first := bytes.Repeat([]byte("first fragment "), 4<<10) // 60 KiB
	last := []byte("and the end")
	release := make(chan struct{})
	srv := firstFragmentBroker(t, first, func(ctx context.Context, ws *websocket.Conn, wr io.WriteCloser) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		wr.Write(last)
		wr.Close()
		ws.Close(websocket.StatusNormalClosure, "")
	})
	c := dialFake(t, srv)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(step))
	got := make([]byte, len(first))
	_, err := io.ReadFull(c, got)
	close(release)
	if err != nil || !bytes.Equal(got, first) {
		t.Fatalf("the message's first fragment was not readable before its end: %v", err)
	}
	rest, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(rest, last) {
		t.Fatalf("the rest: %q %v", rest, err)
	}
}

// TestUploadLeavesInFullTLSRecords: a Conn's messages reach the broker in
// TLS records larger than the WebSocket library's 4 KiB write buffer
// (which made every 4 KiB its own record to seal here and open at the
// broker), and the bytes arrive intact.
func TestUploadLeavesInFullTLSRecords(t *testing.T) {
	const size = 2 << 20
	got := make(chan [32]byte, 1)
	e, _, tok := published(t, nil, wire.KindRoute, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, size)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Errorf("host read: %v", err)
		}
		got <- sha256.Sum256(buf)
	})
	rec := testenv.ForwardRecords(t, e.addr)
	cfg := e.config(0, wire.KindRoute, tok)
	cfg.BrokerURL = "wss://" + rec.Addr + wire.ConnectPath
	c := dialConfig(t, cfg)
	defer c.Close()
	data := make([]byte, size)
	rand.Read(data)
	c.SetDeadline(time.Now().Add(step))
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	select {
	case sum := <-got:
		if sum != sha256.Sum256(data) {
			t.Fatal("the host received different bytes")
		}
	case <-time.After(step):
		t.Fatal("the host did not receive everything")
	}
	// 2 MiB in 4 KiB records is more than 500 of them, none above
	// 4096 + 17 bytes (TLS 1.3's content type and tag).
	if n, longest := rec.Seen(); longest <= 8<<10 || n > 400 {
		t.Fatalf("the client sent %d TLS records of at most %d bytes for 2 MiB", n, longest)
	}
}

// TestMessageAboveTheLimitEndsTheStream: a broker message above the 1 MiB
// read limit ends the stream with the limit's error (the socket closes
// with 1009), also now that a message's bytes are queued as they arrive:
// the caller reads at most the limit and the one byte more the library
// reads to see a message's end, as from a connection cut mid-stream.
func TestMessageAboveTheLimitEndsTheStream(t *testing.T) {
	closed := make(chan websocket.StatusCode, 1)
	srv := fakeBroker(t, func(ws *websocket.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), step)
		defer cancel()
		ws.Write(ctx, websocket.MessageBinary, make([]byte, wire.MaxClientFrame+1))
		_, _, err := ws.Read(ctx) // until the client's close
		closed <- websocket.CloseStatus(err)
	})
	c := dialFake(t, srv)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(step))
	got, err := io.Copy(io.Discard, c)
	if err == nil || !strings.Contains(err.Error(), "above 1 MiB") || got > wire.MaxClientFrame+1 {
		t.Fatalf("read %d bytes, then %v; want at most %d and the limit's error", got, err, wire.MaxClientFrame+1)
	}
	if code := <-closed; code != websocket.StatusMessageTooBig {
		t.Fatalf("the broker saw close %d, want %d (message too big)", code, websocket.StatusMessageTooBig)
	}
}

// TestCloseInsideAMessageIsACut: a broker that closes normally (1000) in
// the middle of a binary message has cut the stream, not finished it: the
// bytes of the message's first fragment are readable, and then the stream
// fails with ErrConnectionLost instead of ending with io.EOF, so a caller
// reading to the end cannot take a truncated stream for a whole one.
func TestCloseInsideAMessageIsACut(t *testing.T) {
	first := bytes.Repeat([]byte("first fragment "), 4<<10) // 60 KiB
	srv := firstFragmentBroker(t, first, func(_ context.Context, ws *websocket.Conn, _ io.WriteCloser) {
		ws.Close(websocket.StatusNormalClosure, "") // the message never ends
	})
	c := dialFake(t, srv)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(step))
	got, err := io.ReadAll(c)
	if !bytes.Equal(got, first) {
		t.Fatalf("read %d bytes before the close, want the fragment's %d", len(got), len(first))
	}
	if !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("a close inside a message ended the stream with %v, want ErrConnectionLost", err)
	}
}

// firstFragmentBroker is a fake broker that, once matched, sends first as
// the first fragment of a binary message and leaves the rest to then,
// with the message's writer still open.
func firstFragmentBroker(t *testing.T, first []byte, then func(ctx context.Context, ws *websocket.Conn, wr io.WriteCloser)) *httptest.Server {
	return fakeBroker(t, func(ws *websocket.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*step)
		defer cancel()
		wr, err := ws.Writer(ctx, websocket.MessageBinary)
		if err != nil {
			t.Error(err)
			return
		}
		wr.Write(first) // one fragment; the message goes on
		then(ctx, ws, wr)
	})
}
