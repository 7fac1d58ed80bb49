package msgconn

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/memprofile"
)

// countPings counts the pings of a Conn that were answered.
type countPings struct {
	Conn
	n atomic.Int32
}

func (c *countPings) Ping(ctx context.Context) error {
	err := c.Conn.Ping(ctx)
	if err == nil {
		c.n.Add(1)
	}
	return err
}

// A started keepalive keeps no context state from its pings (issue 15: an
// idle socket's memory): each ping's deadline hangs off Start's context
// (here one that never ends, so nothing can be that context's). A
// cancelable context of its own kept, for the socket's life, the map and
// the channel its first ping's deadline allocated in it.
func TestKeepaliveKeepsNoContextOfItsPings(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	a, b := Pipe(4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, end := range []Conn{a, b} { // answers the pings, sees the pongs
		go func() {
			for {
				if _, _, err := end.Read(ctx); err != nil {
					return
				}
			}
		}()
	}
	c := &countPings{Conn: a}
	stop := Keepalive{Conn: c, Interval: time.Millisecond, Timeout: time.Hour,
		Dead: func() { t.Error("Dead with every ping answered") }}.Start(context.Background())
	deadline := time.Now().Add(5 * time.Second)
	for c.n.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stop()
	if n := c.n.Load(); n < 3 {
		t.Fatalf("%d pings answered, want 3", n)
	}
	fromTick := func(pcs []uintptr) bool {
		frames := runtime.CallersFrames(pcs)
		inContext, inTick := false, false
		for {
			f, more := frames.Next()
			inContext = inContext || strings.HasPrefix(f.Function, "context.")
			inTick = inTick || strings.HasSuffix(f.Function, "msgconn.(*keepaliveTimer).tick")
			if !more {
				return inContext && inTick
			}
		}
	}
	// The last ping's deadline context stays reachable for a moment after
	// stop (the runtime drops a stopped timer, and what its function
	// holds, from its heap lazily), and a run now and then still sees one
	// small object of it (32-128 bytes; 128 in one CI run with the whole
	// package) a second later. What fails is the context a keepalive kept
	// for the socket's life: 176 bytes and more.
	const slack = 128
	var held int64
	for try := 0; try < 50; try++ {
		if held, _ = memprofile.Sum(fromTick); held <= slack {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if held > slack {
		t.Fatalf("the stopped keepalive still holds %d bytes of context its pings allocated", held)
	}
	runtime.KeepAlive(stop)
}

// acceptedPair is a WebSocket from Accept (its reader notes pongs) and
// the real peer that dialed it, which reads until the test ends and
// answers pings while answer is true. The server side's reader runs too.
func acceptedPair(t *testing.T, answer *atomic.Bool) *WebSocket {
	t.Helper()
	w, _ := acceptedPeer(t, answer)
	return w
}

// acceptedPeer is acceptedPair with the peer.
func acceptedPeer(t *testing.T, answer *atomic.Bool) (*WebSocket, *websocket.Conn) {
	t.Helper()
	w, peer := acceptedPeerReading(t, answer)
	go func() {
		for {
			if _, _, err := peer.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	return w, peer
}

// acceptedPeerReading is acceptedPeer with the peer's reads left to the
// test; the server side's reader runs.
func acceptedPeerReading(t *testing.T, answer *atomic.Bool) (*WebSocket, *websocket.Conn) {
	t.Helper()
	w, peer := acceptedSocket(t, answer)
	go func() {
		for {
			if _, _, err := w.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	return w, peer
}

// acceptedSocket is an accepted socket and its peer, both sides' reads left
// to the test.
func acceptedSocket(t *testing.T, answer *atomic.Bool) (*WebSocket, *websocket.Conn) {
	t.Helper()
	got := make(chan *WebSocket, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		ws, err := Accept(rw, r, nil, r.RemoteAddr)
		if err != nil {
			return
		}
		got <- ws
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	peer, _, err := websocket.Dial(testCtx(t), "ws"+strings.TrimPrefix(srv.URL, "http"), &websocket.DialOptions{
		OnPingReceived: func(context.Context, []byte) bool { return answer.Load() },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.CloseNow() })
	w := <-got
	t.Cleanup(func() { w.CloseNow() })
	return w, peer
}

// On a socket whose reader notes pongs, the keepalive keeps the spec's
// rules: a peer that answers stays, one that stops is ended once its pong
// is overdue, and a pause on this side forgives the missing pong until it
// ends. Real WebSockets on 127.0.0.1.
func TestKeepaliveWithNotedPongs(t *testing.T) {
	const interval, timeout = 10 * time.Millisecond, 150 * time.Millisecond
	var answer atomic.Bool
	answer.Store(true)
	w := acceptedPair(t, &answer)
	var p Pause
	dead := make(chan time.Time, 1)
	stop := Keepalive{Conn: w, Interval: interval, Timeout: timeout, Pause: &p,
		Dead: func() { dead <- time.Now() }}.Start(context.Background())
	defer stop()
	select {
	case <-dead:
		t.Fatal("Dead while the peer answers")
	case <-time.After(4 * timeout):
	}
	if at, ok := w.lastPong(); !ok || time.Since(at) > timeout {
		t.Fatalf("last pong %v ago (noted: %v), want within %v", time.Since(at), ok, timeout)
	}
	// This side pauses, then the peer stops answering: forgiven while the
	// pause lasts.
	p.Enter()
	answer.Store(false)
	select {
	case <-dead:
		t.Fatal("Dead during a pause")
	case <-time.After(4 * timeout):
	}
	p.Leave()
	left := time.Now()
	select {
	case at := <-dead:
		// The clock restarted at the pause's last tick, at most an
		// interval or two before it ended.
		if at.Sub(left) < timeout/2 {
			t.Fatalf("Dead %v after the pause ended, want about the timeout %v", at.Sub(left), timeout)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Dead with the peer silent")
	}
}

// At the spec's timings the noted-pong keepalive's ticks fall on a
// quarter-second grid shared by every socket: a ping moves earlier (its
// interval never grows past Interval), a pong's deadline later (a socket
// is never dropped before Timeout). Short test intervals stay exact.
func TestKeepaliveSlots(t *testing.T) {
	for i := range 50 {
		at := time.Now().Add(time.Duration(i) * 37 * time.Millisecond)
		down, up := onSlot(at, 15*time.Second, false), onSlot(at, 15*time.Second, true)
		if down.After(at) || at.Sub(down) >= keepaliveSlot || up.Before(at) || up.Sub(at) >= keepaliveSlot {
			t.Fatalf("%v: down %v, up %v: want within a slot below and above", at, at.Sub(down), up.Sub(at))
		}
		if onSlot(up, 15*time.Second, false) != up || onSlot(down, 15*time.Second, true) != down {
			t.Fatalf("%v: %v and %v are not on the grid", at, down, up)
		}
		if onSlot(at, 10*time.Millisecond, false) != at {
			t.Fatal("a test interval was moved onto the grid")
		}
	}
}
