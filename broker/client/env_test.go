package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/testfake"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
)

// step bounds every single wait of a test, so a broken client fails the
// test instead of hanging it.
const step = 5 * time.Second

// authorityHost is the front's name in the inner TLS. It never resolves:
// the inner connection runs over the broker stream, not DNS.
const (
	authorityHost = "host.example"
	authorityPort = 9443
)

func testLog(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
}

// env is a real broker serving wss:// on 127.0.0.1 with a test CA and two
// hosts.
type env struct {
	t     *testing.T
	tb    *testenv.Broker
	url   string
	addr  string
	pool  *x509.CertPool
	hosts []testHostCred
}

type testHostCred struct {
	id    wire.ID
	token wire.Secret
}

func newEnv(t *testing.T, mutate func(*server.Config)) *env {
	t.Helper()
	tb := testenv.StartBroker(t, testenv.BrokerOptions{Hosts: 2, Mutate: mutate})
	e := &env{t: t, tb: tb, url: tb.URL(), addr: tb.Addr, pool: tb.Pool}
	for _, h := range tb.Hosts {
		hid, err := wire.ParseID(h.ID)
		if err != nil {
			t.Fatal(err)
		}
		e.hosts = append(e.hosts, testHostCred{id: hid, token: h.Token})
	}
	return e
}

// published starts a broker, connects host 0 serving its streams with serve
// and publishes one credential of kind for it ("route-1" or "pairing-1").
func published(t *testing.T, mutate func(*server.Config), kind wire.Kind, serve func(net.Conn)) (*env, *fakeHost, wire.Secret) {
	t.Helper()
	e := newEnv(t, mutate)
	h := e.host(0, serve)
	tok := wire.NewToken()
	if kind == wire.KindBootstrap {
		h.publishBootstrap("pairing-1", tok)
	} else {
		h.publishRoute("route-1", tok)
	}
	return e, h, tok
}

// dial opens a stream of host 0 with a route token; it is closed when the
// test ends.
func (e *env) dial(tok wire.Secret) net.Conn {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	c, err := Dial(ctx, e.config(0, wire.KindRoute, tok))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// config is a client configuration for host i.
func (e *env) config(i int, kind wire.Kind, token wire.Secret) Config {
	return Config{
		BrokerURL:      e.url,
		HostID:         e.hosts[i].id.String(),
		CredentialKind: string(kind),
		Token:          token,
		RootCAs:        e.pool,
		DialTimeout:    step,
		Log:            testLog(e.t),
	}
}

// health reads the broker's /health.
func (e *env) health() (hostsOnline, streams int) {
	e.t.Helper()
	resp, err := e.tb.HTTPClient().Get("https://" + e.addr + "/health")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		Hosts   int `json:"hosts_online"`
		Streams int `json:"active_streams"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		e.t.Fatal(err)
	}
	return h.Hosts, h.Streams
}

// newIdentity creates a pinned front identity for host.example.
func newIdentity(t *testing.T) (*pinning.Identity, pinning.IdentityConfig) {
	t.Helper()
	ic := pinning.IdentityConfig{
		StateDir:  filepath.Join(t.TempDir(), "state"),
		Authority: pinning.Authority{Host: authorityHost, Port: authorityPort},
	}
	id, err := pinning.LoadOrCreate(ic)
	if err != nil {
		t.Fatal(err)
	}
	return id, ic
}

// fakeHost is a host connector written directly against the wire package:
// it registers, publishes credentials, answers `open` and maps each stream
// onto a net.Pipe whose other end is handed to serve.
type fakeHost struct {
	t       *testing.T
	ws      *websocket.Conn
	connID  wire.ID
	serve   func(net.Conn)
	replies chan wire.Message
	opens   atomic.Int32
	done    chan struct{}

	mu      sync.Mutex
	streams map[wire.ID]*hostStream
}

type hostStream struct {
	id       wire.ID
	in       chan []byte
	quit     chan struct{} // the serving side finished
	byBroker atomic.Bool   // the broker sent CLOSE: never answer it
}

func (e *env) host(i int, serve func(net.Conn)) *fakeHost {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.pool}}}
	ws, _, err := websocket.Dial(ctx, e.url, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(wire.MaxHostFrameIn)
	h := &fakeHost{
		t: t, ws: ws, connID: wire.NewID(), serve: serve,
		replies: make(chan wire.Message, 16), done: make(chan struct{}),
		streams: map[wire.ID]*hostStream{},
	}
	reg, _ := wire.Marshal(wire.Register{Role: wire.RoleHost, HostID: e.hosts[i].id, ConnectionID: h.connID,
		CredentialKind: wire.KindHost, Token: e.hosts[i].token})
	if err := ws.Write(ctx, websocket.MessageText, reg); err != nil {
		t.Fatal(err)
	}
	_, data, err := ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := wire.ParseBrokerMessage(data); err != nil || m.Type() != wire.TypeRegistered {
		t.Fatalf("host registration answered %q", data)
	}
	go h.readLoop()
	t.Cleanup(func() {
		h.ws.CloseNow()
		<-h.done
	})
	return h
}

func (h *fakeHost) readLoop() {
	defer close(h.done)
	defer func() {
		h.mu.Lock()
		for id, s := range h.streams {
			s.byBroker.Store(true)
			close(s.in)
			delete(h.streams, id)
		}
		h.mu.Unlock()
	}()
	for {
		typ, data, err := h.ws.Read(context.Background())
		if err != nil {
			return
		}
		if typ == websocket.MessageText {
			m, err := wire.ParseBrokerMessage(data)
			if err != nil {
				h.t.Errorf("broker sent %q: %v", data, err)
				return
			}
			if o, ok := m.(wire.Open); ok {
				h.open(o)
				continue
			}
			h.replies <- m
			continue
		}
		f, err := wire.ParseFrame(data)
		if err != nil {
			h.t.Errorf("broker sent a bad frame: %v", err)
			return
		}
		h.mu.Lock()
		s := h.streams[f.StreamID]
		h.mu.Unlock()
		if s == nil {
			continue
		}
		switch f.Flags {
		case wire.FlagData:
			s.in <- bytes.Clone(f.Payload)
		case wire.FlagClose:
			s.byBroker.Store(true)
			h.mu.Lock()
			delete(h.streams, f.StreamID)
			h.mu.Unlock()
			close(s.in)
		}
	}
}

func (h *fakeHost) open(o wire.Open) {
	h.opens.Add(1)
	if o.HostConnectionID != h.connID {
		h.t.Errorf("open names connection %v, ours is %v", o.HostConnectionID, h.connID)
	}
	ours, theirs := net.Pipe()
	s := &hostStream{id: o.StreamID, in: make(chan []byte, 4096), quit: make(chan struct{})}
	h.mu.Lock()
	h.streams[o.StreamID] = s
	h.mu.Unlock()
	go func() { // broker → serve
		defer ours.Close()
		for {
			select {
			case b, ok := <-s.in:
				if !ok {
					return
				}
				if _, err := ours.Write(b); err != nil {
					return
				}
			case <-s.quit:
				return
			}
		}
	}()
	go func() { // serve → broker
		buf := make([]byte, wire.MaxConnectorChunk)
		for {
			n, err := ours.Read(buf)
			if n > 0 {
				f, _ := wire.AppendFrame(nil, wire.Frame{Flags: wire.FlagData, StreamID: s.id, Payload: buf[:n]})
				if h.ws.Write(context.Background(), websocket.MessageBinary, f) != nil {
					return
				}
			}
			if err != nil {
				break
			}
		}
		close(s.quit)
		if !s.byBroker.Load() {
			h.ws.Write(context.Background(), websocket.MessageBinary, wire.AppendClose(nil, s.id))
		}
	}()
	go h.serve(theirs)
}

func (h *fakeHost) expectReply(want wire.Message) {
	h.t.Helper()
	select {
	case got := <-h.replies:
		if got != want {
			h.t.Fatalf("broker replied %#v, want %#v", got, want)
		}
	case <-time.After(step):
		h.t.Fatal("no reply from the broker")
	}
}

func (h *fakeHost) publishRoute(credID string, token wire.Secret) {
	h.t.Helper()
	msg, err := wire.Marshal(wire.PublishRoute{
		CredentialID: credID, TokenSHA256: wire.TokenDigest(string(token)),
		ExpiresAt: time.Now().Add(time.Hour).Unix(), DeviceIDHash: wire.TokenDigest("device"),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.ws.Write(context.Background(), websocket.MessageText, msg); err != nil {
		h.t.Fatal(err)
	}
	h.expectReply(wire.Published{CredentialKind: wire.KindRoute, Label: credID})
}

func (h *fakeHost) publishBootstrap(pairingID string, token wire.Secret) {
	h.t.Helper()
	msg, err := wire.Marshal(wire.PublishBootstrap{
		PairingID: pairingID, TokenSHA256: wire.TokenDigest(string(token)),
		ExpiresAt: time.Now().Add(10 * time.Minute).Unix(),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.ws.Write(context.Background(), websocket.MessageText, msg); err != nil {
		h.t.Fatal(err)
	}
	h.expectReply(wire.Published{CredentialKind: wire.KindBootstrap, Label: pairingID})
}

// httpFront serves a tiny HTTP handler behind TLS with the identity, like
// the Secure Link front, and records every request that reaches it.
type httpFront struct {
	ln   *chanListener
	srv  *http.Server
	mu   sync.Mutex
	reqs []*http.Request
}

func newHTTPFront(t *testing.T, id *pinning.Identity) *httpFront {
	f := &httpFront{ln: newChanListener()}
	f.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			f.reqs = append(f.reqs, r.Clone(context.Background()))
			f.mu.Unlock()
			io.WriteString(w, "hello from the host: "+r.URL.Path)
		}),
		ErrorLog: log.New(io.Discard, "", 0), // failed pin checks are expected
	}
	f.srv.SetKeepAlivesEnabled(false)
	tl := tls.NewListener(f.ln, &tls.Config{Certificates: []tls.Certificate{id.Certificate}, MinVersion: tls.VersionTLS12})
	go f.srv.Serve(tl)
	t.Cleanup(func() { f.srv.Close() })
	return f
}

func (f *httpFront) serve(c net.Conn) { f.ln.push(c) }

func (f *httpFront) requests() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.reqs...)
}

// chanListener hands net.Pipe ends to an http.Server.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *chanListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// get sends one HTTP/1.1 request over c and returns the response body.
func get(t *testing.T, c net.Conn, path string, header http.Header) (int, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(step))
	req, err := http.NewRequest(http.MethodGet, "https://"+authorityHost+":9443"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Close = true
	if err := req.Write(c); err != nil {
		t.Fatalf("write request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, string(body)
}

// syncBuffer is a log sink tests can search.
type syncBuffer = testfake.LogBuffer

// waitFor waits until the log holds sub.
func waitFor(t *testing.T, s *syncBuffer, sub string) {
	t.Helper()
	deadline := time.Now().Add(step)
	for !strings.Contains(s.String(), sub) {
		if time.Now().After(deadline) {
			t.Fatalf("log never contained %q:\n%s", sub, s.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
