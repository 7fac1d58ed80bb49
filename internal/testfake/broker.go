// Package testfake holds the project's test fakes: one fake broker (this
// file) and one fake Relay.
package testfake

// Broker is a scripted Reach broker peer over real TLS on 127.0.0.1: it
// accepts the connector's registration and then lets a test send exactly
// the messages the real broker never sends (opens for other registrations,
// duplicate opens, DATA for unknown streams, out-of-order replies) and read
// exactly what the connector answers. The connector itself is never faked.
// It is the one fake broker of the project's tests.

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

	"github.com/hermes-securelink/securelink/broker/wire"
)

type Broker struct {
	t     *testing.T
	srv   *httptest.Server
	Pool  *x509.CertPool
	hosts chan *Host
	Pings atomic.Int64
	// answer, when set, replaces the `registered` answer (nil: say nothing).
	Answer func() []byte
	// handler, when set, answers the HTTP request instead of upgrading.
	Handler http.HandlerFunc
}

type Host struct {
	t      *testing.T
	WS     *websocket.Conn
	Reg    wire.Register
	ConnID wire.ID
	done   chan struct{}
}

func NewBroker(t *testing.T, mutate func(*Broker)) *Broker {
	t.Helper()
	fb := &Broker{t: t, hosts: make(chan *Host, 16)}
	if mutate != nil {
		mutate(fb)
	}
	fb.srv = httptest.NewUnstartedServer(http.HandlerFunc(fb.serve))
	fb.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut at cleanup
	fb.srv.StartTLS()
	t.Cleanup(fb.srv.Close)
	fb.Pool = x509.NewCertPool()
	fb.Pool.AddCert(fb.srv.Certificate())
	return fb
}

// URL is the broker's wss:// connect URL.
func (fb *Broker) URL() string {
	return "wss://" + fb.srv.Listener.Addr().String() + wire.ConnectPath
}

func (fb *Broker) serve(w http.ResponseWriter, r *http.Request) {
	if fb.Handler != nil {
		fb.Handler(w, r)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		OnPingReceived: func(context.Context, []byte) bool { fb.Pings.Add(1); return true },
	})
	if err != nil {
		return
	}
	ws.SetReadLimit(wire.MaxHostFrameIn)
	ctx, cancel := context.WithTimeout(r.Context(), Step)
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
	h := &Host{t: fb.t, WS: ws, Reg: reg, ConnID: reg.ConnectionID, done: make(chan struct{})}
	answer := registeredMsg
	if fb.Answer != nil {
		answer = fb.Answer()
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

// Step bounds every single wait of the fake.
const Step = 10 * time.Second

var registeredMsg, _ = wire.Marshal(wire.Registered{})

// Host waits for the next registration.
func (fb *Broker) Host() *Host {
	fb.t.Helper()
	select {
	case h := <-fb.hosts:
		fb.t.Cleanup(func() { h.Close() })
		return h
	case <-time.After(Step):
		fb.t.Fatal("the connector did not register")
		return nil
	}
}

func (h *Host) Close() {
	select {
	case <-h.done:
	default:
		close(h.done)
	}
}

func (h *Host) SendText(m wire.Message) {
	h.t.Helper()
	data, err := wire.Marshal(m)
	if err != nil {
		h.t.Fatal(err)
	}
	h.SendRaw(websocket.MessageText, data)
}

func (h *Host) SendRaw(typ websocket.MessageType, data []byte) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Step)
	defer cancel()
	if err := h.WS.Write(ctx, typ, data); err != nil {
		h.t.Fatalf("fake broker write: %v", err)
	}
}

func (h *Host) Open(id wire.ID) {
	h.t.Helper()
	h.SendText(wire.Open{StreamID: id, HostConnectionID: h.ConnID})
}

func (h *Host) Data(id wire.ID, p []byte) {
	h.t.Helper()
	f, err := wire.AppendFrame(nil, wire.Frame{Flags: wire.FlagData, StreamID: id, Payload: p})
	if err != nil {
		h.t.Fatal(err)
	}
	h.SendRaw(websocket.MessageBinary, f)
}

func (h *Host) CloseStream(id wire.ID) {
	h.t.Helper()
	h.SendRaw(websocket.MessageBinary, wire.AppendClose(nil, id))
}

// read returns the connector's next message (text as a parsed host control
// message, binary as a frame).
func (h *Host) Read() (wire.Message, *wire.Frame) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Step)
	defer cancel()
	typ, data, err := h.WS.Read(ctx)
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
func (h *Host) Frame() wire.Frame {
	h.t.Helper()
	m, f := h.Read()
	if f == nil {
		h.t.Fatalf("expected a frame, got %#v", m)
	}
	return *f
}

// readErr reads until the socket fails and returns the error.
func (h *Host) ReadErr() error {
	ctx, cancel := context.WithTimeout(context.Background(), Step)
	defer cancel()
	for {
		if _, _, err := h.WS.Read(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				h.t.Fatal("the socket did not end")
			}
			return err
		}
	}
}
