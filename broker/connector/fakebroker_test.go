package connector

// fakeBroker is a scripted broker peer over real TLS on 127.0.0.1: it
// accepts the connector's registration and then lets a test send exactly
// the messages the real broker never sends (opens for other registrations,
// duplicate opens, DATA for unknown streams, out-of-order replies) and read
// exactly what the connector answers. The connector itself is never faked.

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
)

type fakeBroker struct {
	t     *testing.T
	srv   *httptest.Server
	pool  *x509.CertPool
	hosts chan *fakeHost
	pings atomic.Int64
	// answer, when set, replaces the `registered` answer (nil: say nothing).
	answer func() []byte
	// handler, when set, answers the HTTP request instead of upgrading.
	handler http.HandlerFunc
}

type fakeHost struct {
	t      *testing.T
	ws     *websocket.Conn
	reg    wire.Register
	connID wire.ID
	done   chan struct{}
}

func newFakeBroker(t *testing.T, mutate func(*fakeBroker)) *fakeBroker {
	t.Helper()
	fb := &fakeBroker{t: t, hosts: make(chan *fakeHost, 16)}
	if mutate != nil {
		mutate(fb)
	}
	fb.srv = httptest.NewUnstartedServer(http.HandlerFunc(fb.serve))
	fb.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut at cleanup
	fb.srv.StartTLS()
	t.Cleanup(fb.srv.Close)
	fb.pool = x509.NewCertPool()
	fb.pool.AddCert(fb.srv.Certificate())
	return fb
}

func (fb *fakeBroker) url() string {
	return "wss://" + fb.srv.Listener.Addr().String() + wire.ConnectPath
}

func (fb *fakeBroker) config(t *testing.T) Config {
	log, _ := testenv.NewLog(t)
	return Config{
		BrokerURL: fb.url(), HostID: wire.NewID().String(), Token: wire.NewToken(),
		RootCAs: fb.pool, Log: log,
		BackoffBase: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}
}

func (fb *fakeBroker) serve(w http.ResponseWriter, r *http.Request) {
	if fb.handler != nil {
		fb.handler(w, r)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		OnPingReceived: func(context.Context, []byte) bool { fb.pings.Add(1); return true },
	})
	if err != nil {
		return
	}
	ws.SetReadLimit(wire.MaxHostFrameIn)
	ctx, cancel := context.WithTimeout(r.Context(), step)
	_, data, err := ws.Read(ctx)
	cancel()
	if err != nil {
		ws.CloseNow()
		return
	}
	reg, err := wire.ParseRegister(data)
	if err != nil {
		ws.CloseNow()
		fb.t.Errorf("connector sent an invalid register: %v", err)
		return
	}
	h := &fakeHost{t: fb.t, ws: ws, reg: reg, connID: reg.ConnectionID, done: make(chan struct{})}
	answer := registeredMsg
	if fb.answer != nil {
		answer = fb.answer()
	}
	if answer != nil {
		if err := ws.Write(r.Context(), websocket.MessageText, answer); err != nil {
			ws.CloseNow()
			return
		}
	}
	fb.hosts <- h
	select {
	case <-h.done:
	case <-r.Context().Done():
	}
	ws.CloseNow()
}

var registeredMsg, _ = wire.Marshal(wire.Registered{})

// host waits for the next registration.
func (fb *fakeBroker) host() *fakeHost {
	fb.t.Helper()
	select {
	case h := <-fb.hosts:
		fb.t.Cleanup(func() { h.close() })
		return h
	case <-time.After(step):
		fb.t.Fatal("the connector did not register")
		return nil
	}
}

func (h *fakeHost) close() {
	select {
	case <-h.done:
	default:
		close(h.done)
	}
}

func (h *fakeHost) sendText(m wire.Message) {
	h.t.Helper()
	data, err := wire.Marshal(m)
	if err != nil {
		h.t.Fatal(err)
	}
	h.sendRaw(websocket.MessageText, data)
}

func (h *fakeHost) sendRaw(typ websocket.MessageType, data []byte) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if err := h.ws.Write(ctx, typ, data); err != nil {
		h.t.Fatalf("fake broker write: %v", err)
	}
}

func (h *fakeHost) open(id wire.ID) {
	h.t.Helper()
	h.sendText(wire.Open{StreamID: id, HostConnectionID: h.connID})
}

func (h *fakeHost) data(id wire.ID, p []byte) {
	h.t.Helper()
	f, err := wire.AppendFrame(nil, wire.Frame{Flags: wire.FlagData, StreamID: id, Payload: p})
	if err != nil {
		h.t.Fatal(err)
	}
	h.sendRaw(websocket.MessageBinary, f)
}

func (h *fakeHost) closeStream(id wire.ID) {
	h.t.Helper()
	h.sendRaw(websocket.MessageBinary, wire.AppendClose(nil, id))
}

// read returns the connector's next message (text as a parsed host control
// message, binary as a frame).
func (h *fakeHost) read() (wire.Message, *wire.Frame) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	typ, data, err := h.ws.Read(ctx)
	if err != nil {
		h.t.Fatalf("fake broker read: %v", err)
	}
	if typ == websocket.MessageText {
		m, err := wire.ParseHostControl(data)
		if err != nil {
			h.t.Fatalf("connector sent invalid control %q: %v", data, err)
		}
		return m, nil
	}
	f, err := wire.ParseFrame(data)
	if err != nil {
		h.t.Fatalf("connector sent an invalid frame: %v", err)
	}
	if len(data) > wire.HeaderLen+wire.MaxConnectorChunk {
		h.t.Fatalf("connector sent a %d-byte frame; chunks are at most 64 KiB", len(data))
	}
	f.Payload = append([]byte(nil), f.Payload...)
	return nil, &f
}

// frame reads the next message and requires a frame.
func (h *fakeHost) frame() wire.Frame {
	h.t.Helper()
	m, f := h.read()
	if f == nil {
		h.t.Fatalf("expected a frame, got %#v", m)
	}
	return *f
}

// readErr reads until the socket fails and returns the error.
func (h *fakeHost) readErr() error {
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	for {
		if _, _, err := h.ws.Read(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				h.t.Fatal("the socket did not end")
			}
			return err
		}
	}
}

// accept returns the next stream the connector hands to the front.
func accept(t *testing.T, c *Connector) *stream {
	t.Helper()
	type res struct {
		st  *stream
		err error
	}
	ch := make(chan res, 1)
	go func() {
		conn, err := c.Listener().Accept()
		if err != nil {
			ch <- res{err: err}
			return
		}
		ch <- res{st: conn.(*stream)}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("accept: %v", r.err)
		}
		t.Cleanup(func() { r.st.Close() })
		return r.st
	case <-time.After(step):
		t.Fatal("no stream was accepted")
		return nil
	}
}
