package msgconn

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// slowConn reads at most chunk bytes every pause, a peer on a slow path,
// until fast is set.
type slowConn struct {
	net.Conn
	chunk int
	pause time.Duration
	fast  *atomic.Bool
}

func (c *slowConn) Read(p []byte) (int, error) {
	if c.fast.Load() {
		return c.Conn.Read(p)
	}
	time.Sleep(c.pause)
	if len(p) > c.chunk {
		p = p[:c.chunk]
	}
	return c.Conn.Read(p)
}

// smallBuffers shrinks a loopback TCP connection's kernel buffers, so the
// slow reader's pace reaches the writer within a few KiB, not megabytes.
func smallBuffers(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(8 << 10)
		tc.SetWriteBuffer(8 << 10)
	}
}

// slowPeerRun is the side under test, w with its writes through a
// BatchConn: it reads (answering pings) and writes 128 KiB messages, two
// fragments each, three to a held batch, so a batch passes 256 KiB and is
// flushed inside the library's frame write, holding its frame lock for
// 256 KiB at the peer's pace. ping is the peer's: it pings once a second,
// each ping waiting for its pong up to the spec's 45 s. After slow, the
// peer reads at full speed (fast): the pong of every ping sent so far must
// then come at once (a lost one never does), and two more follow.
func slowPeerRun(t *testing.T, w *WebSocket, ping func(context.Context) error, fast *atomic.Bool, slow time.Duration) {
	t.Helper()
	readErr := make(chan error, 1)
	go func() {
		for {
			if _, _, err := w.Read(context.Background()); err != nil {
				readErr <- err
				return
			}
		}
	}()
	writeErr := make(chan error, 1)
	go func() {
		msg := make([]byte, 128<<10)
		for {
			w.HoldWrites()
			for i := 0; i < 3; i++ {
				if err := w.Write(context.Background(), Binary, msg); err != nil {
					w.SendHeld(context.Background())
					writeErr <- err
					return
				}
			}
			if err := w.SendHeld(context.Background()); err != nil {
				writeErr <- err
				return
			}
		}
	}()
	var pings, pongs atomic.Int32
	pingErr := make(chan error, 1)
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
			pings.Add(1)
			err := ping(ctx)
			cancel()
			if err != nil {
				pingErr <- err
				return
			}
			pongs.Add(1)
			time.Sleep(time.Second)
		}
	}()
	// wait watches the socket for d or until done, false at d.
	wait := func(d time.Duration, done func() bool) bool {
		t.Helper()
		end := time.After(d)
		for done == nil || !done() {
			select {
			case err := <-readErr:
				t.Fatalf("the socket's reader ended (%d pings, %d pongs): %v", pings.Load(), pongs.Load(), err)
			case err := <-writeErr:
				t.Fatalf("the socket's writer ended (%d pings, %d pongs): %v", pings.Load(), pongs.Load(), err)
			case err := <-pingErr:
				t.Fatalf("the peer's ping failed (%d pings, %d pongs): %v", pings.Load(), pongs.Load(), err)
			case <-end:
				return false
			case <-time.After(50 * time.Millisecond):
			}
		}
		return true
	}
	wait(slow, nil)
	t.Logf("at the slow pace: %d pings, %d pongs in %v", pings.Load(), pongs.Load(), slow)
	n := pongs.Load()
	fast.Store(true)
	if !wait(10*time.Second, func() bool { return pongs.Load() >= n+2 }) {
		t.Fatalf("%d pings, %d pongs: a ping sent at the slow pace went unanswered", pings.Load(), pongs.Load())
	}
}

// A socket whose held batch passes 256 KiB inside a frame write holds the
// library's frame lock for as long as a slow peer takes to read 256 KiB
// (13 s at 20 KB/s); the library's own pong waited for that lock at most
// 5 s and then ended the socket's reader. Every ping is answered by the
// adapter (owed to the writer while a message goes out), so a slow but
// moving peer that pings every second keeps the socket and gets its pongs.
// Real WebSockets on 127.0.0.1, the peer reading ~20 KB/s.
func TestSlowPeerKeepsTheSocketAndItsPongs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 12 s against a slow peer")
	}
	const run = 11 * time.Second
	slowConns := func(fast *atomic.Bool) func(c net.Conn) net.Conn {
		return func(c net.Conn) net.Conn {
			smallBuffers(c)
			return &slowConn{Conn: c, chunk: 1 << 10, pause: 50 * time.Millisecond, fast: fast}
		}
	}
	t.Run("accepted", func(t *testing.T) {
		t.Parallel()
		var fast atomic.Bool
		slow := slowConns(&fast)
		l := listenTCP(t)
		got := serveBatched(t, smallBufferListener{l})
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return slow(c), nil
		}}}
		peer, _, err := websocket.Dial(testCtx(t), "ws://"+l.Addr().String()+"/", &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatal(err)
		}
		defer peer.CloseNow()
		readAway(peer)
		w := <-got
		defer w.CloseNow()
		slowPeerRun(t, w, peer.Ping, &fast, run)
	})
	t.Run("dialed", func(t *testing.T) {
		t.Parallel()
		var fast atomic.Bool
		slow := slowConns(&fast)
		l := listenTCP(t)
		got := make(chan *websocket.Conn, 1)
		srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			c, err := websocket.Accept(rw, r, nil)
			if err != nil {
				return
			}
			got <- c
			<-r.Context().Done()
		})}
		go srv.Serve(slowListener{l, slow})
		t.Cleanup(func() { srv.Close() })
		var bc *BatchConn
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			smallBuffers(c)
			bc = NewBatchConn(c)
			return bc, nil
		}}}
		w, _, err := Dial(testCtx(t), "ws://"+l.Addr().String()+"/", &websocket.DialOptions{HTTPClient: hc}, "peer")
		if err != nil {
			t.Fatal(err)
		}
		defer w.CloseNow()
		w.SetBatch(bc)
		peer := <-got
		defer peer.CloseNow()
		readAway(peer)
		slowPeerRun(t, w, peer.Ping, &fast, run)
	})
}

// readAway reads and drops every message c gets, of any size, until c
// ends.
func readAway(c *websocket.Conn) {
	c.SetReadLimit(-1)
	go func() {
		for {
			if _, _, err := c.Read(context.Background()); err != nil {
				return
			}
		}
	}()
}

// smallBufferListener is batchListener with small kernel buffers.
type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	smallBuffers(c)
	return NewBatchConn(c), nil
}

// slowListener hands every accepted connection out through wrap.
type slowListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l slowListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.wrap(c), nil
}

// A WriteGate bounds each fragment of a message by the timeout, with or
// without a progress callback (the client passes none): a message to a
// slow but moving peer that takes several timeouts in all is not cut.
func TestGateBoundsEachFragmentWithoutProgress(t *testing.T) {
	t.Parallel()
	l := listenTCP(t)
	var fast atomic.Bool
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			c, err := websocket.Accept(rw, r, nil)
			if err != nil {
				return
			}
			c.SetReadLimit(-1)
			for {
				if _, _, err := c.Read(r.Context()); err != nil {
					return
				}
			}
		}),
	}
	go srv.Serve(slowListener{l, func(c net.Conn) net.Conn {
		smallBuffers(c)
		return &slowConn{Conn: c, chunk: 1 << 10, pause: 20 * time.Millisecond, fast: &fast}
	}})
	t.Cleanup(func() { srv.Close() })
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			smallBuffers(c)
		}
		return c, err
	}}}
	w, _, err := Dial(testCtx(t), "ws://"+l.Addr().String()+"/", &websocket.DialOptions{HTTPClient: hc}, "peer")
	if err != nil {
		t.Fatal(err)
	}
	defer w.CloseNow()
	// 256 KiB at ~25 KiB/s (1 KiB per 20 ms, framing and reads between):
	// ~10 s in all, each 64 KiB fragment ~2.5 s of the 6 s bound.
	start := time.Now()
	if err := NewWriteGate(w).Write(Binary, make([]byte, 256<<10), 6*time.Second, nil); err != nil {
		t.Fatalf("a message moving at the peer's pace was cut after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if took := time.Since(start); took < 6*time.Second {
		t.Fatalf("the message took %v: the peer was not slow enough to test the per-fragment bound", took)
	}
}
