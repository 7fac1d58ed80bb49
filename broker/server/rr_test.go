package server

import (
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// A stream that gets something to send while others wait goes to the back
// of the round-robin queue. The broker's scheduler used to keep its turn
// index past the end after removing the last queued stream, so a stream
// scheduled right then was served before one that had waited longer.
func TestNewStreamWaitsItsTurn(t *testing.T) {
	se := newStreamEnv(t, nil)
	se.pipeN = 1 // the host's buffer holds one message: each write waits for the test
	se.host = se.env.host(0)
	se.publishRoute(se.host, "r2", se.token2())
	clients := map[string]*pipeConn{}
	for _, name := range []string{"d", "a", "b", "c"} {
		clients[name], _ = se.client(se.host, 0, wire.KindRoute, se.tok2)
	}
	const frame = wire.HeaderLen + 2 // every payload below is 2 bytes
	queued := func(want int) func() bool {
		return func() bool { return se.b.budget.inUse() == int64(want*frame) }
	}
	writing := func() bool { return se.host.Peer().BlockedWrites() == 1 }
	send := func(payload string, want int) {
		t.Helper()
		sendBinary(t, clients[payload[:1]], []byte(payload))
		waitFor(t, payload+" to queue", queued(want))
	}
	got := []string{}
	readOne := func() {
		t.Helper()
		f, err := wire.ParseFrame(readBinary(t, se.host))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(f.Payload))
	}

	// d1 fills the host's buffer, d2 is the write in flight.
	sendBinary(t, clients["d"], []byte("d1"))
	waitFor(t, "d1 in the host's buffer", func() bool { n, _ := se.host.Unread(); return n == 1 })
	sendBinary(t, clients["d"], []byte("d2"))
	waitFor(t, "d2 in flight", func() bool { return writing() && queued(1)() })
	// Queue: a (two frames), b (one frame).
	send("a1", 2)
	send("a2", 3)
	send("b1", 4)
	readOne() // d1; d2 moves into the buffer and a1 is in flight
	waitFor(t, "a1 in flight", func() bool { return writing() && queued(3)() })
	readOne() // d2; a1 moves in, b1 is in flight and b leaves the queue
	waitFor(t, "b1 in flight", func() bool { return writing() && queued(2)() })
	// a2 has waited since before b1 was sent; c1 arrives now.
	send("c1", 3)
	for range 4 {
		readOne()
	}
	want := []string{"d1", "d2", "a1", "b1", "a2", "c1"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("the host got %v, want %v: a new stream jumped the queue", got, want)
		}
	}
}
