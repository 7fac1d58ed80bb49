package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
)

func testCandidate(t *testing.T, e *env, kind wire.Kind, tok wire.Secret, id *pinning.Identity) Candidate {
	t.Helper()
	c, err := NewCandidate(2, CandidateBroker{
		URL: e.url, HostID: e.hosts[0].id.String(), CredentialKind: string(kind),
		Token: tok, ExpiresAt: time.Now().Add(10 * time.Minute).Unix(),
	}, "https://"+authorityHost+":9443", id.Pin, id.CertDERBase64())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type forwardRun struct {
	addr   string
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

// forwardTo publishes a credential of kind for host 0 serving with serve and
// runs Forward with o and a candidate for it.
func forwardTo(t *testing.T, kind wire.Kind, serve func(net.Conn), o ForwardOptions) (*env, *fakeHost, *forwardRun) {
	t.Helper()
	id, _ := newIdentity(t)
	e, h, tok := published(t, nil, kind, serve)
	o.Candidate = testCandidate(t, e, kind, tok, id)
	return e, h, startForward(t, e, o)
}

func startForward(t *testing.T, e *env, o ForwardOptions) *forwardRun {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &forwardRun{addr: ln.Addr().String(), logs: &syncBuffer{}, done: make(chan error, 1)}
	o.RootCAs = e.pool
	o.DialTimeout = step
	o.Log = zerolog.New(zerolog.MultiLevelWriter(r.logs, zerolog.NewTestWriter(t)))
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	go func() { r.done <- Forward(ctx, ln, o) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *forwardRun) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Forward: %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(3 * step):
		t.Fatal("Forward did not return after its context ended")
	}
}

func (r *forwardRun) dial(t *testing.T) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", r.addr, step)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(3 * step))
	return c.(*net.TCPConn)
}

// refused dials and expects what the forwarder refuses: a connection
// closed without a byte. On a loaded machine the refusal (and its reset)
// can come before connect(2) has returned here, which is the same outcome.
func (r *forwardRun) refused(t *testing.T, what string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", r.addr, step)
	if errors.Is(err, syscall.ECONNRESET) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * step))
	// Closed (EOF) or reset, not merely unanswered until the deadline.
	if n, err := c.Read(make([]byte, 1)); n != 0 || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("%s was not refused: %d %v", what, n, err)
	}
}

// echoRoundTrip sends n random bytes and expects them back byte for byte.
func echoRoundTrip(t *testing.T, c net.Conn, n int) {
	t.Helper()
	data := make([]byte, n)
	rand.Read(data)
	errc := make(chan error, 1)
	go func() { _, err := c.Write(data); errc <- err }()
	back := make([]byte, n)
	if _, err := io.ReadFull(c, back); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(back, data) {
		t.Fatal("echo differs from what was sent")
	}
}

func echo(c net.Conn) { io.Copy(c, c); c.Close() }

func TestForwardIsByteExactBothWays(t *testing.T) {
	e, h, r := forwardTo(t, wire.KindRoute, echo, ForwardOptions{
		// The echo host never ends a stream by itself: after the local
		// EOF only the half-close timeout does.
		HalfCloseTimeout: 200 * time.Millisecond,
	})

	// Two local connections at once, each its own stream.
	a, b := r.dial(t), r.dial(t)
	echoRoundTrip(t, a, 1<<20+333)
	echoRoundTrip(t, b, 70000)
	a.Close()
	b.Close()
	if n := h.opens.Load(); n != 2 {
		t.Fatalf("host saw %d streams, want 2", n)
	}
	waitFor(t, r.logs, `"bytes_up":1048909,"bytes_down":1048909,"message":"local connection finished"`)
	waitFor(t, r.logs, `"bytes_up":70000,"bytes_down":70000,"message":"local connection finished"`)
	testenv.WaitFor(t, "the broker streams to end", func() bool { _, n := e.health(); return n == 0 })
}

// TestForwardHalfClose: a local client that sends its request and shuts
// down its write side still gets the whole answer, then EOF.
func TestForwardHalfClose(t *testing.T) {
	answer := bytes.Repeat([]byte("answer!"), 100000)
	_, _, r := forwardTo(t, wire.KindRoute, func(c net.Conn) {
		defer c.Close()
		req := make([]byte, 5)
		if _, err := io.ReadFull(c, req); err != nil || string(req) != "hello" {
			t.Errorf("host got %q %v", req, err)
			return
		}
		c.Write(answer)
	}, ForwardOptions{})
	c := r.dial(t)
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	if !bytes.Equal(got, answer) {
		t.Fatalf("got %d bytes, want %d", len(got), len(answer))
	}
}

// TestForwardResetsCutStreams: when the host vanishes mid-stream the local
// client sees a reset, not a clean EOF that would pass a cut stream off as
// complete.
func TestForwardResetsCutStreams(t *testing.T) {
	opened := make(chan net.Conn, 1)
	_, h, r := forwardTo(t, wire.KindRoute, func(c net.Conn) { c.Write([]byte("partial")); opened <- c }, ForwardOptions{})
	c := r.dial(t)
	defer c.Close()
	buf := make([]byte, 7)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	<-opened
	h.ws.CloseNow()
	_, err := c.Read(buf)
	if err == nil || err == io.EOF {
		t.Fatalf("read after the host vanished: %v, want a reset", err)
	}
	waitFor(t, r.logs, "1001")
}

func TestForwardBootstrapServesExactlyOneConnection(t *testing.T) {
	_, h, r := forwardTo(t, wire.KindBootstrap, echo, ForwardOptions{})

	first := r.dial(t)
	echoRoundTrip(t, first, 4096)

	for range 2 {
		r.refused(t, "a later connection")
	}
	waitFor(t, r.logs, "bootstrap credential is spent")
	// The first connection is unaffected.
	echoRoundTrip(t, first, 100)
	first.Close()
	if n := h.opens.Load(); n != 1 {
		t.Fatalf("host saw %d streams, want 1", n)
	}
}

// TestForwardBootstrapSurvivesHostOffline: a refusal that did not consume
// the token (host_offline) leaves it usable for the next local connection.
func TestForwardBootstrapSurvivesHostOffline(t *testing.T) {
	e, h, r := forwardTo(t, wire.KindBootstrap, echo, ForwardOptions{})
	h.ws.CloseNow()
	testenv.WaitFor(t, "the host to go offline", func() bool { n, _ := e.health(); return n == 0 })

	r.refused(t, "a connection without a host")
	waitFor(t, r.logs, "host_offline")

	h2 := e.host(0, echo)
	c := r.dial(t)
	echoRoundTrip(t, c, 1000)
	c.Close()
	if h2.opens.Load() != 1 {
		t.Fatal("the bootstrap did not reach the host that came back")
	}
}

func TestForwardMaxConns(t *testing.T) {
	_, h, r := forwardTo(t, wire.KindRoute, echo, ForwardOptions{MaxConns: 1})
	a := r.dial(t)
	echoRoundTrip(t, a, 10)
	r.refused(t, "a second connection beyond MaxConns")
	waitFor(t, r.logs, "too many connections")
	echoRoundTrip(t, a, 10)
	if n := h.opens.Load(); n != 1 {
		t.Fatalf("host saw %d streams, want 1", n)
	}
}

func TestForwardStopsCleanly(t *testing.T) {
	e, _, r := forwardTo(t, wire.KindRoute, echo, ForwardOptions{})
	c := r.dial(t)
	echoRoundTrip(t, c, 10)
	r.stop(t)
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("local connection after stop: %v", err)
	}
	if _, err := net.DialTimeout("tcp", r.addr, step); err == nil {
		t.Fatal("the listener is still open")
	}
	testenv.WaitFor(t, "the broker stream to end", func() bool { _, n := e.health(); return n == 0 })
}

func TestForwardRejectsBadOptions(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = Forward(context.Background(), ln, ForwardOptions{Candidate: Candidate{Role: "plugin_proxy"}})
	if err == nil {
		t.Fatal("invalid candidate accepted")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), step); err == nil {
		t.Fatal("the listener was left open")
	}
}
