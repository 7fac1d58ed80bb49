package client

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// A write deadline that fires just after a write succeeded, before the
// send's watch of it stopped, must not cut the stream: the cut was
// permanent, so the next Write, with the deadline cleared, closed the
// socket although nothing had failed. The hooks hold the send in that
// window until the deadline's watch has acted. Real WebSocket over TLS to
// a fake broker on 127.0.0.1.
func TestDeadlineAfterASucceededWriteKeepsTheStream(t *testing.T) {
	got := make(chan string, 4)
	srv := fakeBroker(t, func(ws *websocket.Conn) {
		for {
			_, data, err := ws.Read(context.Background())
			if err != nil {
				return
			}
			got <- string(data)
		}
	})
	acted := make(chan struct{})
	var once sync.Once
	var sends atomic.Int32
	c := dialFake(t, srv)
	defer c.Close()
	cc := c.(*Conn)
	cc.hookDeadlineCut = func() { once.Do(func() { close(acted) }) }
	cc.hookSent = func() {
		if sends.Add(1) == 1 {
			<-acted // the deadline fired during this send's window
		}
	}

	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.Write([]byte("first")); err != nil {
		t.Fatalf("the first write: %v", err)
	}
	c.SetWriteDeadline(time.Time{})
	if _, err := c.Write([]byte("second")); err != nil {
		t.Fatalf("a write after the deadline was cleared: %v", err)
	}
	for _, want := range []string{"first", "second"} {
		select {
		case m := <-got:
			if m != want {
				t.Fatalf("the broker got %q, want %q", m, want)
			}
		case <-time.After(step):
			t.Fatalf("the broker did not get %q: the stream was cut", want)
		}
	}
}
