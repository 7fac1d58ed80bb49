package server

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/memprofile"
)

// An idle socket's keepalive is a frame write per ping (issue 15: the
// keepalive's CPU and the heap it grows): the socket's reader notes the
// pong, so no goroutine of the broker waits for one, a ping allocates
// nothing, and the pings leave nothing behind in the socket's heap. Real
// TLS WebSockets through ServeListener; the hosts are real
// github.com/coder/websocket peers that count the pings they answer.
func TestKeepalivePingIsAWriteOnly(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	const interval = 20 * time.Millisecond
	e, addr, hc := serveIdleTLS(t, func(c *Config) {
		c.PingInterval, c.PongTimeout = interval, time.Minute
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*step)
	defer cancel()
	var pings atomic.Int64
	reading := make(chan struct{}) // closed: the peers read (and so answer pings)
	var hosts []*websocket.Conn
	for _, h := range e.hosts {
		ws, _, err := websocket.Dial(ctx, "wss://"+addr+wire.ConnectPath, &websocket.DialOptions{
			HTTPClient:     hc,
			OnPingReceived: func(context.Context, []byte) bool { pings.Add(1); return true },
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.CloseNow() })
		msg, _ := wire.Marshal(wire.Register{Role: wire.RoleHost, HostID: h.id, ConnectionID: wire.NewID(), CredentialKind: wire.KindHost, Token: h.token})
		if err := ws.Write(ctx, websocket.MessageText, msg); err != nil {
			t.Fatal(err)
		}
		if _, data, err := ws.Read(ctx); err != nil || !strings.Contains(string(data), wire.TypeRegistered) {
			t.Fatalf("registration: %q, %v", data, err)
		}
		hosts = append(hosts, ws)
		go func() {
			<-reading
			for {
				if _, _, err := ws.Read(ctx); err != nil {
					return
				}
			}
		}()
	}
	n := int64(len(hosts))

	// The peers do not read yet: every ping the broker writes now waits
	// for its pong. None of the broker's goroutines may wait with it.
	// A snapshot can catch a tick writing its ping; one waiting for the
	// pong is in every snapshot, so the fewest seen must be none.
	time.Sleep(5 * interval)
	w := waitingInKeepalive()
	for i := 0; i < 10 && w > 0; i++ {
		time.Sleep(interval / 7)
		w = min(w, waitingInKeepalive())
	}
	if w > 0 {
		t.Errorf("%d goroutines wait in the keepalive for a pong (%d sockets): want none", w, n)
	}
	close(reading)
	waitFor(t, "the peers to answer pings", func() bool { return pings.Load() >= 3*n })

	p0, a0 := pings.Load(), pingAllocs()
	waitFor(t, "more pings", func() bool { return pings.Load() >= p0+10*n })
	perPing := float64(pingAllocs()-a0) / float64(pings.Load()-p0)
	held := keepaliveHeld() / n
	t.Logf("%.2f objects allocated by the keepalive per ping; %d bytes of them held per socket after %d pings",
		perPing, held, pings.Load())
	if perPing > maxKeepaliveAllocsPerPing {
		t.Errorf("the keepalive allocates %.2f objects per ping, want at most %d", perPing, maxKeepaliveAllocsPerPing)
	}
	if held > maxKeepaliveHeldPerSocket {
		t.Errorf("the pings left %d bytes per socket allocated by the keepalive, want at most %d", held, maxKeepaliveHeldPerSocket)
	}
	if got := e.b.Stats().HostsOnline; got != int(n) {
		t.Fatalf("%d hosts online, want %d: answered pings ended a registration", got, n)
	}
}

// maxKeepaliveAllocsPerPing: a ping written as a plain frame allocates
// nothing of its own (under -race ~1.8 objects: the runtime's timer heap,
// crypto/tls's pooled record buffer and its first uses); waiting for its pong with the library's Ping cost ~20 objects
// (a deadline context and its timer, the library's pong channel, map
// entry, number string, timeout context and watch).
const maxKeepaliveAllocsPerPing = 4

// maxKeepaliveHeldPerSocket bounds what the pings' allocating stacks still
// hold per socket: a waiting ping left its context's children map and
// done channel in the socket's context and a group in the library's map
// of pending pings (~450 bytes).
const maxKeepaliveHeldPerSocket = 32

// sharedByAllSockets are where a ping's write may grow what every socket
// shares: crypto/tls's pool of record buffers, the runtime's timer heap and
// its interface-switch cache.
var sharedByAllSockets = map[string]bool{
	"crypto/tls.(*Conn).writeRecordLocked": true,
	"runtime.(*timers).addHeap":            true,
	"runtime.buildInterfaceSwitchCache":    true,
}

// waitingInKeepalive counts the goroutines inside a keepalive tick.
func waitingInKeepalive() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "msgconn.(*keepaliveTimer).tick") {
			n++
		}
	}
	return n
}

func inKeepalive(pcs []uintptr) bool {
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/hermes-securelink/securelink/broker/msgconn.(*keepaliveTimer).") {
			return true
		}
		if !more {
			return false
		}
	}
}

// pingAllocs counts the objects allocated so far under a keepalive tick;
// keepaliveHeld is what those allocations still hold, as of a fresh
// collection, but for what all sockets share.
func pingAllocs() int64 {
	_, objects := memprofile.Sum(inKeepalive)
	return objects
}

func keepaliveHeld() int64 {
	inUse, _ := memprofile.Sum(func(pcs []uintptr) bool {
		frames := runtime.CallersFrames(pcs)
		for {
			f, more := frames.Next()
			if sharedByAllSockets[f.Function] {
				return false
			}
			if !more {
				return inKeepalive(pcs)
			}
		}
	})
	return inUse
}
