package connector

import (
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// github.com/coder/websocket waits at most 5 s for its write lock when it
// sends a ping. Behind a data write the broker is slow to take (a slow
// uplink) that wait runs out long before the pong is due; the connector
// retries the ping instead of ending a live registration as ping_timeout.
func TestPingBehindASlowWriteIsRetried(t *testing.T) {
	if testing.Short() {
		t.Skip("waits past the library's 5 s control-write wait")
	}
	var sl sleeps
	sl.setBlock(true)
	fb, c, h := startFake(t, func(cfg *Config) {
		cfg.PingInterval = time.Second // the first ping finds the writer blocked
		cfg.PongTimeout = 20 * time.Second
		cfg.WriteTimeout = 30 * time.Second
		cfg.Sleep = sl.sleep
	})
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	// More than the loopback socket buffers hold, while the fake broker
	// reads nothing for 7 s: the connector's writer blocks in the middle
	// of a frame and holds the library's write lock.
	const total = 32 << 20
	go st.Write(make([]byte, total))
	time.Sleep(7 * time.Second)
	if n := c.Counts()["ping_timeout"]; n != 0 {
		t.Fatalf("%d ping timeouts while the broker was slow to read", n)
	}
	for got := 0; got < total; {
		got += len(h.Frame().Payload)
	}
	go h.ReadErr() // keep reading: pongs go out
	testenv.WaitFor(t, "a ping after the write", func() bool { return fb.Pings.Load() >= 1 })
	if n := c.Counts()["ping_timeout"]; n != 0 || c.Status().State != StateConnected || c.Status().Attempts != 1 {
		t.Fatalf("the registration ended: %+v, %d ping timeouts", c.Status(), n)
	}
}
