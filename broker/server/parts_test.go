package server

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/memprofile"
)

// Host payloads queued for a client leave coalesced into one client message
// without being copied into a buffer of their own (issue 14: broker CPU per
// byte): on the WebSocket transport each payload is a fragment of the
// message (stream.takeDown, msgconn.WriteGate.WriteParts). Real TLS
// WebSockets through ServeListener; the client reads nothing until the
// TCP buffers and the stream's queue are full, so the writer finds several
// payloads queued; every byte is checked, messages stay within
// ClientWriteChunk, and no buffer of a client message's size is allocated
// on the way (the copy path draws one from the broker's coalescing pool,
// which is empty in a fresh broker).
func TestQueuedPayloadsLeaveAsFragmentsWithoutCopy(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	ts := openTLSStream(t, 6*step)
	host, client, id := ts.host, ts.client, ts.id
	client.SetReadLimit(1 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 6*step)
	defer cancel()

	before := coalescingAllocs() // the profile counts from the process's start
	// More than loopback's socket buffers and the stream's queue hold
	// together, in the connector's 64 KiB chunks.
	const chunk, chunks = 64 << 10, 512
	pattern := func(i int) []byte { return bytes.Repeat([]byte{byte(i*7 + 1)}, chunk) }
	sent := make(chan error, 1)
	go func() {
		for i := range chunks {
			if err := host.Write(ctx, websocket.MessageBinary, dataFrame(id, pattern(i))); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(200 * time.Millisecond) // the writer blocks, the queue fills
	var got []byte
	messages, joined := 0, 0
	for len(got) < chunk*chunks {
		m := ts.read(client)
		if len(m) > DefaultConfig().ClientWriteChunk {
			t.Fatalf("a %d-byte client message", len(m))
		}
		if len(m) > chunk {
			joined++
		}
		got = append(got, m...)
		messages++
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	for i := range chunks {
		if !bytes.Equal(got[i*chunk:(i+1)*chunk], pattern(i)) {
			t.Fatalf("chunk %d differs from what the host sent", i)
		}
	}
	if joined == 0 {
		t.Fatalf("%d chunks reached the client in %d messages, none of them coalesced: the test did not fill the queue", chunks, messages)
	}
	copied := coalescingAllocs() - before
	t.Logf("%d chunks in %d client messages (%d coalesced); %d bytes of coalescing buffers allocated", chunks, messages, joined, copied)
	if copied > 0 {
		t.Errorf("%d bytes of buffers allocated to coalesce payloads: queued payloads were copied into one message", copied)
	}
}

// coalescingAllocs is the bytes allocated so far, in objects of at least
// 64 KiB, on a stack through stream.takeDown.
func coalescingAllocs() int64 {
	var n int64
	for _, r := range memprofile.Records() {
		if r.AllocObjects > 0 && r.AllocBytes/r.AllocObjects >= 64<<10 && takeDownStack(r.Stack()) {
			n += r.AllocBytes
		}
	}
	return n
}

func takeDownStack(pcs []uintptr) bool {
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "(*stream).takeDown") {
			return true
		}
		if !more {
			return false
		}
	}
}
