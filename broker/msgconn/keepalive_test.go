package msgconn

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	held, _ := memprofile.Sum(func(pcs []uintptr) bool {
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
	})
	if held > 0 {
		t.Fatalf("the stopped keepalive still holds %d bytes of context its pings allocated", held)
	}
	runtime.KeepAlive(stop)
}
