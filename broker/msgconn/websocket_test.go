package msgconn

import (
	"context"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

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
	const pings = 100
	pingTimes(t, peer, pings) // warm: the library's and the runtime's first-use allocations
	_, before := readerGarbage()
	pingTimes(t, peer, pings)
	_, after := readerGarbage()
	perPing := float64(after-before) / pings
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

// pingTimes sends n pings from peer, one at a time, each answered.
func pingTimes(t *testing.T, peer interface{ Ping(context.Context) error }, n int) {
	t.Helper()
	for range n {
		if err := peer.Ping(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A socket from Accept answers the peer's pings itself, with one frame
// write under the context the library gives its ping (answerPing), not
// the library's own answer with a second timeout context, its timer and
// its watch: on an idle broker socket the keepalive's frames are all that
// moves, and their garbage is what grows its heap between collections
// (issue 15). Every pong arrives (the peer's Ping returns only then); what
// the waiting reader allocates per ping answered is counted, every
// allocation recorded. Real WebSockets on 127.0.0.1.
func TestAcceptedSocketAnswersPingsWithOneWrite(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	var answer atomic.Bool
	answer.Store(true)
	w, peer := acceptedPeer(t, &answer)
	const pings = 100
	pingTimes(t, peer, pings) // warm
	bytes0, objects0 := readerGarbage()
	pingTimes(t, peer, pings)
	bytes1, objects1 := readerGarbage()
	perPing := float64(objects1-objects0) / pings
	bytesPerPing := float64(bytes1-bytes0) / pings
	t.Logf("the waiting reader allocates %.2f objects, %.0f bytes per ping it answers", perPing, bytesPerPing)
	if perPing > maxAcceptedAllocsPerPing || bytesPerPing > maxAcceptedBytesPerPing {
		t.Errorf("the waiting reader allocates %.2f objects (%.0f bytes) per ping it answers, want at most %d (%d bytes)",
			perPing, bytesPerPing, maxAcceptedAllocsPerPing, maxAcceptedBytesPerPing)
	}
	runtime.KeepAlive(w)
}

// maxAcceptedAllocsPerPing and maxAcceptedBytesPerPing bound what an
// Accept socket's waiting reader allocates per ping it answers: reading
// the ping costs the library a context with a timeout, its timer, its
// done channel and children map, and a watch of it (~12 objects, ~800
// bytes here), the pong's write under that context a watch more (~3,
// ~150 bytes): 15 objects, 944 bytes. With the library's own pong: 20
// objects, 1,408 bytes.
const (
	maxAcceptedAllocsPerPing = 17
	maxAcceptedBytesPerPing  = 1150
)

// readerGarbage is what was allocated so far under a (*WebSocket).Read,
// as of a fresh collection: bytes and objects.
func readerGarbage() (bytes, objects int64) {
	for _, r := range memprofile.Records() {
		frames := runtime.CallersFrames(r.Stack())
		for {
			f, more := frames.Next()
			if strings.HasSuffix(f.Function, "msgconn.(*WebSocket).Read") {
				bytes += r.AllocBytes
				objects += r.AllocObjects
				break
			}
			if !more {
				break
			}
		}
	}
	return bytes, objects
}

// A ping that arrives while a message goes out in several frames is
// answered right after that message, by its writer (answerPing owes it),
// never by the library's pong, which waits at most 5 s for the frame in
// progress and then gives the ping up (TestSlowPeerKeepsTheSocketAndItsPongs):
// the pong comes after the message it arrived in, before the next one has
// gone out. Real WebSockets on 127.0.0.1; the messages are far larger than
// the sockets' buffers, so the write is in progress when the ping arrives.
func TestAcceptedSocketAnswersPingsRightAfterTheMessage(t *testing.T) {
	var answer atomic.Bool
	answer.Store(true)
	w, peer := acceptedPeerReading(t, &answer)
	const size = 8 << 20
	peer.SetReadLimit(size + 1)
	wrote := make(chan error, 1)
	go func() {
		for range 2 {
			if err := w.Write(testCtx(t), Binary, make([]byte, size)); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	// The peer reads nothing after the second message: a pong held
	// behind it is never seen, and the ping fails at testCtx's end.
	pinged := make(chan error, 1)
	read := 0
	buf := make([]byte, 256<<10)
	for m := 0; m < 2; m++ {
		_, rd, err := peer.Reader(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		for got := 0; ; {
			k, err := rd.Read(buf)
			got += k
			read += k
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("after %d bytes: %v", read, err)
			}
			if m == 0 && got >= 1<<20 && got-k < 1<<20 {
				go func() { pinged <- peer.Ping(testCtx(t)) }()
			}
		}
	}
	if err := <-pinged; err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}

// TestNextReaderEndsTheLastReadsLend: NextReader, like Read, hands the
// buffer of the message the last Read returned back to the pool. A client
// stream reads its registration answer whole and every later message with
// NextReader; without this the answer's buffer stayed with the stream for
// its life.
func TestNextReaderEndsTheLastReadsLend(t *testing.T) {
	w, peer := acceptedSocket(t, new(atomic.Bool))
	ctx := testCtx(t)
	if err := peer.Write(ctx, websocket.MessageText, []byte(`{"type":"matched"}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if w.rd.held == nil {
		t.Fatal("Read holds no buffer: the test shows nothing")
	}
	if err := peer.Write(ctx, websocket.MessageBinary, []byte("streamed")); err != nil {
		t.Fatal(err)
	}
	_, r, err := w.NextReader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if w.rd.held != nil {
		t.Fatal("NextReader left the last Read's buffer lent")
	}
	if b, err := io.ReadAll(r); err != nil || string(b) != "streamed" {
		t.Fatalf("the streamed message: %q %v", b, err)
	}
}
