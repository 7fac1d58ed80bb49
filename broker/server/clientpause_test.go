package server

import (
	"bytes"
	"context"
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestClientSocketUnreadWithoutHostCredit: under credit the broker reads a
// client's socket only while the host's credit exceeds what is queued for
// it, so a client sending far more than the window is held back by its own
// socket, not queued at the broker (the plain-v1 queue would take 32
// frames). Once the host grants more, the rest flows.
func TestClientSocketUnreadWithoutHostCredit(t *testing.T) {
	e := newEnv(t, nil)
	host := e.creditHost(0)
	c, id := routeClient(e, host, "r1")
	const msgs, size = 40, 64 << 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for i := 0; i < msgs; i++ {
			if c.Write(ctx, Binary, bytes.Repeat([]byte{byte(i)}, size)) != nil {
				return
			}
		}
	}()
	credit := wire.Dialect{Credit: true}
	got := 0
	for got < wire.InitialWindow {
		got += len(hostFrame(t, host, credit).Payload)
	}
	if !quiet(host) || got != wire.InitialWindow {
		t.Fatalf("host got %d bytes (or more) on a %d window", got, wire.InitialWindow)
	}
	h := e.session(0)
	h.mu.Lock()
	queued := h.streams[id].upPayload
	h.mu.Unlock()
	if queued > size {
		t.Fatalf("the broker read %d bytes beyond the host's credit (at most one message may wait)", queued)
	}
	if n := e.b.Stats().Counts["paused:credit"]; n == 0 {
		t.Fatal("the client's reader never waited for credit")
	}
	sendBinary(t, host, windowFrame(id, msgs*size))
	for got < msgs*size {
		got += len(hostFrame(t, host, credit).Payload)
	}
	if got != msgs*size {
		t.Fatalf("host got %d of %d bytes", got, msgs*size)
	}
}
