package msgconn

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/memprofile"
)

// A reader waiting for the next message is cut when its context ends, and
// while it waits the peer's pings are answered without the reader's
// goroutine allocating a watch of that context per frame: on an idle
// socket the keepalive's frames are all that moves (issue 15). Real
// WebSockets on 127.0.0.1; every allocation recorded.
func TestWebSocketIdleReaderAnswersPingsAndEndsWithItsContext(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	client, server := pair(t)
	peer, w := FromWebSocket(client, "server"), FromWebSocket(server, "client")
	ctx, cancel := context.WithCancel(testCtx(t))
	read := make(chan error, 1)
	go func() {
		_, _, err := w.Read(ctx)
		read <- err
	}()
	go peer.Read(testCtx(t)) // the peer's reader sees the pongs
	const pings = 200
	ping := func() {
		for range pings / 2 {
			if err := peer.Ping(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	ping() // warm: the library's and the runtime's first-use allocations
	before := readerAllocs()
	ping()
	perPing := float64(readerAllocs()-before) / (pings / 2)
	t.Logf("%.2f allocations by the waiting reader per ping it answers", perPing)
	if perPing > maxReaderAllocsPerPing {
		t.Errorf("the waiting reader allocates %.2f objects per ping it answers, want at most %d", perPing, maxReaderAllocsPerPing)
	}
	cancel()
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("Read returned a message after its context ended")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still waits after its context ended")
	}
}

// maxReaderAllocsPerPing: answering a ping costs the library about 31
// objects (reading the frame, a context with a timeout for the pong's
// write, its timer, the watch of it, error wrapping); a watch of the
// reader's context for every frame read cost 8 more.
const maxReaderAllocsPerPing = 35

// readerAllocs counts the objects allocated so far under a
// (*WebSocket).Read, as of a fresh collection.
func readerAllocs() int64 {
	_, objects := memprofile.Sum(func(stack []uintptr) bool {
		frames := runtime.CallersFrames(stack)
		for {
			f, more := frames.Next()
			if strings.HasSuffix(f.Function, "msgconn.(*WebSocket).Read") {
				return true
			}
			if !more {
				return false
			}
		}
	})
	return objects
}
