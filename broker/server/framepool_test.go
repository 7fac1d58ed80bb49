package server

import (
	"bytes"
	"runtime"
	"sync"
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Frame buffers go back to a pool once written and come out again for
// other streams: concurrent streams moving distinct bytes both ways in the
// pooled sizes (an inner TLS record, a 64 KiB chunk) and next to them
// still get exactly their own bytes.
func TestPooledFramesCarryEachStreamsOwnBytes(t *testing.T) {
	se := newStreamEnv(t, nil)
	const streams, msgs = 4, 40
	type st struct {
		c  *pipeConn
		id wire.ID
	}
	var all []st
	for i := 0; i < streams; i++ {
		c, id := se.open()
		all = append(all, st{c, id})
	}
	sizes := []int{16 << 10, 16<<10 + 29, 64 << 10, 9 << 10, 40 << 10, 100}
	payload := func(s, m int) []byte {
		b := make([]byte, sizes[(s+m)%len(sizes)])
		for i := range b {
			b[i] = byte(s*31 + m*7 + i)
		}
		return b
	}
	// Upload: every stream sends; the host sees each stream's frames in
	// order, interleaved between streams.
	var wg sync.WaitGroup
	for s := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := 0; m < msgs; m++ {
				sendBinary(t, all[s].c, payload(s, m))
			}
		}()
	}
	next := make(map[wire.ID]int)
	index := make(map[wire.ID]int)
	for s := range all {
		index[all[s].id] = s
	}
	for got := 0; got < streams*msgs; got++ {
		f, err := wire.ParseFrame(readBinary(t, se.host))
		if err != nil {
			t.Fatal(err)
		}
		s := index[f.StreamID]
		if want := payload(s, next[f.StreamID]); !bytes.Equal(f.Payload, want) {
			t.Fatalf("stream %d message %d: host got %d bytes that are not the client's %d", s, next[f.StreamID], len(f.Payload), len(want))
		}
		next[f.StreamID]++
	}
	wg.Wait()
	// Download: the host sends to every stream in turn; each client reads
	// its own bytes (coalesced or not) in order.
	var want [streams]bytes.Buffer
	for m := 0; m < msgs; m++ {
		for s := range all {
			p := payload(s+streams, m)
			want[s].Write(p)
			sendBinary(t, se.host, dataFrame(all[s].id, p))
		}
	}
	for s := range all {
		var got bytes.Buffer
		for got.Len() < want[s].Len() {
			got.Write(readBinary(t, all[s].c))
		}
		if !bytes.Equal(got.Bytes(), want[s].Bytes()) {
			t.Fatalf("stream %d: the client's bytes differ from what the host sent it", s)
		}
	}
}

// Moving a 16 KiB message allocates no frame buffer in the broker: the
// bytes allocated per message are the test pipes' own copies (one per
// write) plus small change, not a third copy.
func TestRelayingAllocatesNoFramePerMessage(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	msg := bytes.Repeat([]byte{7}, 16<<10+29) // an inner TLS record
	frame := dataFrame(id, msg)
	relay := func(n int) {
		for i := 0; i < n; i++ {
			sendBinary(t, c, msg)
			readBinary(t, se.host)
			sendBinary(t, se.host, frame)
			readBinary(t, c)
		}
	}
	relay(20) // warm the pools
	const n = 200
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	relay(n)
	runtime.ReadMemStats(&m1)
	perMsg := float64(m1.TotalAlloc-m0.TotalAlloc) / (2 * n)
	// Each message crosses two pipe writes, each a copy of ~16 KiB in the
	// allocator's size class; a third copy would add as much again.
	limit := 2*float64(cap(bytes.Clone(frame))) + 8<<10
	if perMsg > limit {
		t.Errorf("%.0f bytes allocated per relayed message, want at most %.0f (the pipes' two copies): the broker copies each frame into a fresh buffer", perMsg, limit)
	}
	t.Logf("%.0f bytes allocated per message (limit %.0f)", perMsg, limit)
}

// popFrontN drops the first k items in place: the backing array is kept
// (no reallocation at the next append) and the dropped slots are zeroed
// (no payload stays reachable from the array's tail).
func TestPopFrontNKeepsTheArrayAndDropsReferences(t *testing.T) {
	a, b, c := []byte("a"), []byte("b"), []byte("c")
	q := make([][]byte, 3, 8)
	copy(q, [][]byte{a, b, c})
	full := q[:cap(q)]
	q = popFrontN(q, 2)
	if len(q) != 1 || &q[0][0] != &c[0] || cap(q) != 8 || &q[:1][0] != &full[0] {
		t.Fatalf("popFrontN(2) left %q (cap %d), want [c] in the same array", q, cap(q))
	}
	if full[1] != nil || full[2] != nil {
		t.Fatalf("the dropped slots still hold %q %q", full[1], full[2])
	}
	if q = popFrontN(q, 0); len(q) != 1 {
		t.Fatalf("popFrontN(0) changed the queue: %q", q)
	}
	if q = popFront(q); len(q) != 0 || full[0] != nil {
		t.Fatalf("popFront left %q, slot %q", q, full[0])
	}
}

// A credit stream's queue merges small payloads once it holds
// StreamQueueFrames entries, but gives each large one (a grown window's
// 64 KiB DATA) an entry of its own up to creditQueueFrames times that:
// merging them reallocated and copied the last entry at every append.
func TestCreditQueueKeepsLargePayloadsApart(t *testing.T) {
	const frames = 32
	for _, c := range []struct {
		k, n  int
		merge bool
	}{
		{0, 64 << 10, false},
		{frames - 1, 100, false},
		{frames, 100, true},         // many small frames: 32 entries
		{frames, partMin - 1, true}, // below a part's size
		{frames, partMin, false},    // large: an entry of its own
		{frames, 64 << 10, false},   // the connector's DATA
		{4*frames - 1, 64 << 10, false},
		{4 * frames, 64 << 10, true}, // the entries' bound
	} {
		if got := mergeCreditPayload(c.k, c.n, frames); got != c.merge {
			t.Errorf("%d queued, a payload of %d: merge %v, want %v", c.k, c.n, got, c.merge)
		}
	}
}
