package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/testfake"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// The unit tests drive Broker.Serve over msgconn's in-memory pipe.
type (
	pipeConn    = msgconn.PipeConn
	closeError  = msgconn.CloseError
	MessageType = msgconn.MessageType
)

const (
	Text          = msgconn.Text
	Binary        = msgconn.Binary
	closeAbnormal = msgconn.CloseAbnormal
)

// newPipe returns a peer end and the broker's end, which lends its reads like the WebSocket
// adapter, so a broker that queues a read slice without copying corrupts
// the data tests.
func newPipe(capacity int, remote string) (peer, broker *pipeConn) {
	peer, broker = msgconn.Pipe(capacity)
	peer.SetRemoteAddr(remote)
	broker.SetRemoteAddr("broker")
	broker.SetLends(true)
	return peer, broker
}

// step bounds every single wait of a test, so a broken broker fails the
// test instead of hanging it.
const step = 5 * time.Second

// fakeClock is the broker's wall clock for credential expiry.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// env is a broker over in-memory pipes with two hosts in its hosts file.
type env struct {
	t      *testing.T
	b      *Broker
	cfg    Config
	dir    string
	clock  *fakeClock
	hosts  [2]testHost
	served sync.WaitGroup
	pipeN  int
	logs   logBuffer // every line of every broker this env started, debug included
}

// logBuffer keeps log lines so tests can check that no secret was logged.
type logBuffer = testfake.LogBuffer

type testHost struct {
	id    wire.ID
	token wire.Secret
}

func testConfig(t *testing.T, dir string) Config {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.InsecurePlaintext = true
	cfg.HostsFile = filepath.Join(dir, "hosts.json")
	cfg.StateFile = filepath.Join(dir, "state.json")
	// Keepalive is tested on its own; elsewhere it must stay out of the way.
	cfg.PingInterval = time.Hour
	cfg.PongTimeout = 2 * time.Hour
	cfg.ShutdownGrace = time.Second
	return cfg
}

func newEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, clock: &fakeClock{t: time.Now()}, pipeN: 16}
	e.cfg = testConfig(t, dir)
	e.cfg.Now = e.clock.Now
	for i := range e.hosts {
		id, tok, err := store.AddHost(e.cfg.HostsFile)
		if err != nil {
			t.Fatal(err)
		}
		hid, _ := wire.ParseID(id)
		e.hosts[i] = testHost{id: hid, token: tok}
	}
	if mutate != nil {
		mutate(&e.cfg)
	}
	e.start()
	return e
}

func (e *env) start() {
	e.t.Helper()
	lg := zerolog.New(zerolog.MultiLevelWriter(&e.logs, &zerolog.FilteredLevelWriter{
		Writer: zerolog.LevelWriterAdapter{Writer: zerolog.NewTestWriter(e.t)},
		Level:  zerolog.InfoLevel,
	}))
	b, err := New(e.cfg, lg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.b = b
	e.t.Cleanup(func() {
		b.Close()
		e.served.Wait()
	})
}

// restart closes the broker and starts a new one on the same files.
func (e *env) restart() {
	e.t.Helper()
	e.b.Close()
	e.served.Wait()
	e.start()
}

// dial connects a new socket to the broker and returns the peer's end.
func (e *env) dial() *pipeConn {
	peer, brokerEnd := newPipe(e.pipeN, "127.0.0.1:1")
	e.served.Add(1)
	go func() {
		defer e.served.Done()
		e.b.Serve(context.Background(), brokerEnd)
	}()
	return peer
}

func (e *env) register(p *pipeConn, role wire.Role, host wire.ID, kind wire.Kind, token wire.Secret, conn wire.ID) {
	e.t.Helper()
	msg, err := wire.Marshal(wire.Register{Role: role, HostID: host, ConnectionID: conn, CredentialKind: kind, Token: token})
	if err != nil {
		e.t.Fatal(err)
	}
	sendText(e.t, p, string(msg))
}

// host registers host i and expects `registered`.
func (e *env) host(i int) *pipeConn {
	e.t.Helper()
	return e.hostWith(i, wire.NewID())
}

func (e *env) hostWith(i int, conn wire.ID) *pipeConn {
	e.t.Helper()
	p := e.dial()
	e.register(p, wire.RoleHost, e.hosts[i].id, wire.KindHost, e.hosts[i].token, conn)
	if m := readMsg(e.t, p); m.Type() != wire.TypeRegistered {
		e.t.Fatalf("host registration answered %#v", m)
	}
	return p
}

// publishRoute publishes a route token for the host behind p.
func (e *env) publishRoute(p *pipeConn, credID string, token wire.Secret) {
	e.t.Helper()
	e.publishRouteExp(p, credID, token, e.clock.Now().Add(time.Hour).Unix())
	expectMsg(e.t, p, wire.Published{CredentialKind: wire.KindRoute, Label: credID})
}

func (e *env) publishRouteExp(p *pipeConn, credID string, token wire.Secret, exp int64) {
	e.t.Helper()
	msg, err := wire.Marshal(wire.PublishRoute{
		CredentialID: credID, TokenSHA256: wire.TokenDigest(string(token)),
		ExpiresAt: exp, DeviceIDHash: wire.TokenDigest("device"),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	sendText(e.t, p, string(msg))
}

func (e *env) publishBootstrap(p *pipeConn, pairingID string, token wire.Secret) {
	e.t.Helper()
	msg, _ := wire.Marshal(wire.PublishBootstrap{
		PairingID: pairingID, TokenSHA256: wire.TokenDigest(string(token)),
		ExpiresAt: e.clock.Now().Add(10 * time.Minute).Unix(),
	})
	sendText(e.t, p, string(msg))
	expectMsg(e.t, p, wire.Published{CredentialKind: wire.KindBootstrap, Label: pairingID})
}

// client connects a client of host i with a credential and expects it to be
// matched; it returns the client's end and the stream id the host was told.
func (e *env) client(host *pipeConn, i int, kind wire.Kind, token wire.Secret) (*pipeConn, wire.ID) {
	e.t.Helper()
	c := e.dial()
	e.register(c, wire.RoleClient, e.hosts[i].id, kind, token, wire.NewID())
	open, ok := readMsg(e.t, host).(wire.Open)
	if !ok {
		e.t.Fatalf("host did not get open")
	}
	m, ok := readMsg(e.t, c).(wire.Matched)
	if !ok || m.StreamID != open.StreamID {
		e.t.Fatalf("client got %#v, host opened %v", m, open.StreamID)
	}
	return c, open.StreamID
}

// refused connects a client and expects the error code and close 1008.
func (e *env) refused(i int, kind wire.Kind, token wire.Secret, conn wire.ID) wire.Code {
	e.t.Helper()
	c := e.dial()
	e.register(c, wire.RoleClient, e.hosts[i].id, kind, token, conn)
	return expectError(e.t, c)
}

func sendText(t *testing.T, p *pipeConn, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if err := p.Write(ctx, Text, []byte(s)); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func sendBinary(t *testing.T, p *pipeConn, b []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if err := p.Write(ctx, Binary, b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func read(t *testing.T, p *pipeConn) (MessageType, []byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	typ, data, err := p.Read(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("nothing arrived within %v", step)
	}
	return typ, data, err
}

func readMsg(t *testing.T, p *pipeConn) wire.Message {
	t.Helper()
	typ, data, err := read(t, p)
	if err != nil {
		t.Fatalf("expected a text message, got %v", err)
	}
	if typ != Text {
		t.Fatalf("expected a text message, got %d binary bytes", len(data))
	}
	m, err := wire.ParseBrokerMessage(data)
	if err != nil {
		t.Fatalf("broker sent %q: %v", data, err)
	}
	return m
}

func expectMsg(t *testing.T, p *pipeConn, want wire.Message) {
	t.Helper()
	got := readMsg(t, p)
	if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

func readBinary(t *testing.T, p *pipeConn) []byte {
	t.Helper()
	typ, data, err := read(t, p)
	if err != nil {
		t.Fatalf("expected a binary message, got %v", err)
	}
	if typ != Binary {
		t.Fatalf("expected a binary message, got text %q", data)
	}
	return data
}

// expectClose reads the close and returns its code and reason; any message
// before it fails the test.
func expectClose(t *testing.T, p *pipeConn) (int, string) {
	t.Helper()
	typ, data, err := read(t, p)
	var ce *closeError
	if !errors.As(err, &ce) {
		t.Fatalf("expected a close, got %v message %q (err %v)", typ, trim(data), err)
	}
	return ce.Code, ce.Reason
}

// expectError reads an error message followed by close 1008.
func expectError(t *testing.T, p *pipeConn) wire.Code {
	t.Helper()
	m, ok := readMsg(t, p).(wire.ErrorMsg)
	if !ok {
		t.Fatalf("expected an error message")
	}
	if code, _ := expectClose(t, p); code != wire.ClosePolicy {
		t.Fatalf("error %s followed by close %d, want 1008", m.Code, code)
	}
	return m.Code
}

func trim(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}

// dataFrame builds a host DATA frame.
func dataFrame(id wire.ID, payload []byte) []byte {
	f, err := wire.AppendFrame(nil, wire.Frame{Flags: wire.FlagData, StreamID: id, Payload: payload})
	if err != nil {
		panic(err)
	}
	return f
}

func closeFrame(id wire.ID) []byte { return wire.AppendClose(nil, id) }

// registerJSON builds a register message with raw member values, for the
// exact-key-set and version tests.
func registerJSON(e *env, mutate func(map[string]string)) string {
	m := map[string]string{
		"type":             `"register"`,
		"protocol_version": `1`,
		"role":             `"host"`,
		"host_id":          `"` + e.hosts[0].id.String() + `"`,
		"connection_id":    `"` + wire.NewID().String() + `"`,
		"credential_kind":  `"host"`,
		"token":            `"` + string(e.hosts[0].token) + `"`,
	}
	mutate(m)
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%q:%s", k, v))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// alive proves a host registration still works: a control frame is answered.
func (e *env) alive(p *pipeConn) {
	e.t.Helper()
	sendText(e.t, p, `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"no-such"}`)
	expectMsg(e.t, p, wire.Revoked{CredentialID: "no-such"})
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(step)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func nopLog() zerolog.Logger { return zerolog.Nop() }

// sample runs f every interval until the returned stop is called; stop
// returns once f no longer runs.
func sample(every time.Duration, f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(every):
			}
			f()
		}
	}()
	return func() { close(quit); <-done }
}

// session is the broker's session of the env's i-th host.
func (e *env) session(i int) *hostSession {
	e.b.mu.Lock()
	defer e.b.mu.Unlock()
	return e.b.hosts[e.hosts[i].id]
}

// downHeld is what h holds for its credit streams' clients.
func downHeld(h *hostSession) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.downHeld
}
