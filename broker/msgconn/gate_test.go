package msgconn

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// A gated write to a peer that stopped reading is cut once it runs past
// its timeout (the socket closes, as under a context that ended), while a
// socket that was idle far longer than the timeout between two writes is
// not: the watch only times writes in progress. Real WebSockets on
// 127.0.0.1.
func TestWriteGateTimesOnlyWritesInProgress(t *testing.T) {
	client, server := pair(t)
	peer, w := FromWebSocket(client, "server"), FromWebSocket(server, "client")
	g := NewWriteGate(w)
	const timeout = 500 * time.Millisecond
	msg := []byte("small")
	for range 2 {
		if err := g.Write(Binary, msg, timeout, nil); err != nil {
			t.Fatal(err)
		}
		if _, got, err := peer.Read(testCtx(t)); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("peer read %q, %v", got, err)
		}
		time.Sleep(2 * timeout) // idle: past any deadline the watch saw
	}
	// The peer reads no more: 32 MiB fill both socket buffers and stall.
	done := make(chan error, 1)
	progressed := 0
	go func() { done <- g.Write(Binary, make([]byte, 32<<20), timeout, func() { progressed++ }) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a write the peer never read returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write the peer never read was never cut")
	}
	if progressed == 0 {
		t.Error("no fragment reported progress before the write stalled")
	}
	if err := g.Write(Binary, msg, timeout, nil); err == nil {
		t.Fatal("a write after the socket was cut succeeded")
	}
}

// Cut ends a gated write that is stuck (the socket is cut) and every later
// one; a write after Cut fails at once. CutWrite does the same to a write
// in progress. Both transports.
func TestWriteGateCut(t *testing.T) {
	for name, cut := range map[string]func(*WriteGate){"Cut": (*WriteGate).Cut, "CutWrite": (*WriteGate).CutWrite} {
		t.Run(name, func(t *testing.T) { testWriteGateCut(t, cut) })
	}
}

// CutWrite on a gate with no write in progress changes nothing: the next
// write goes out (a caller's deadline that fired just after its write
// succeeded). Both transports.
func TestWriteGateCutWriteLeavesAnIdleGate(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		g := NewWriteGate(a)
		g.CutWrite()
		if err := g.Write(Binary, []byte("after"), time.Minute, nil); err != nil {
			t.Fatalf("a write after CutWrite on an idle gate: %v", err)
		}
		if _, got, err := b.Read(testCtx(t)); err != nil || string(got) != "after" {
			t.Fatalf("peer read %q, %v", got, err)
		}
	})
}

func testWriteGateCut(t *testing.T, cut func(*WriteGate)) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		if p, ok := a.(*PipeConn); ok {
			p.SetCutOnCancel(true)
		}
		g := NewWriteGate(a)
		done := make(chan error, 1)
		go func() {
			for {
				// Nobody reads b: the writes stall once its buffers are full.
				if err := g.Write(Binary, make([]byte, 64<<10), time.Minute, nil); err != nil {
					done <- err
					return
				}
			}
		}()
		time.Sleep(100 * time.Millisecond)
		cut(g)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the cut did not end the stuck write")
		}
		if err := g.Write(Binary, []byte("x"), time.Minute, nil); err == nil {
			t.Fatal("a write after the cut succeeded")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for {
			if _, _, err := b.Read(ctx); err != nil {
				if ctx.Err() != nil {
					t.Fatal("the peer never saw the socket end")
				}
				return
			}
		}
	})
}

// CutWhen: a reader waiting under a context that never ends, and the
// socket under it, end once the watched context does.
func TestWriteGateCutWhen(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		ctx, cancel := context.WithCancel(context.Background())
		stop := NewWriteGate(a).CutWhen(ctx)
		defer stop()
		read := make(chan error, 1)
		go func() {
			_, _, err := a.Read(context.Background())
			read <- err
		}()
		cancel()
		select {
		case err := <-read:
			if err == nil {
				t.Fatal("Read returned a message after the watched context ended")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the reader still waits after the watched context ended")
		}
	})
}

// WriteParts sends its parts as one message, in order, on both transports;
// on the WebSocket adapter progress follows every fragment, a part's end
// included (each part leaves as fragments of its own, never joined to the
// next), and a message of one part is what Write sends.
func TestWriteGateWriteParts(t *testing.T) {
	forEachConnType(t, func(t *testing.T, a, b Conn) {
		b.SetReadLimit(2 << 20)
		g := NewWriteGate(a)
		parts := [][]byte{
			bytes.Repeat([]byte{1}, 40<<10),
			bytes.Repeat([]byte{2}, 100<<10), // two fragments: 64 + 36 KiB
			bytes.Repeat([]byte{3}, 16<<10),
		}
		progressed := 0
		done := make(chan error, 1)
		go func() { done <- g.WriteParts(Binary, parts, 5*time.Second, func() { progressed++ }) }()
		typ, got, err := b.Read(testCtx(t))
		if err != nil || typ != Binary {
			t.Fatalf("read %v %v", typ, err)
		}
		if want := bytes.Join(parts, nil); !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes that are not the %d of the parts in order", len(got), len(want))
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_, ws := a.(*WebSocket)
		if ws && progressed != 4 {
			t.Errorf("progress after %d fragments, want 4 (40, 64+36, 16 KiB)", progressed)
		}
		if g.JoinsParts() == ws {
			t.Errorf("JoinsParts %v on %T", g.JoinsParts(), a)
		}
		if err := g.WriteParts(Binary, [][]byte{[]byte("one")}, 5*time.Second, nil); err != nil {
			t.Fatal(err)
		}
		if _, got, err := b.Read(testCtx(t)); err != nil || string(got) != "one" {
			t.Fatalf("read %q %v", got, err)
		}
	})
}
