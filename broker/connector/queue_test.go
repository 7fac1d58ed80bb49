package connector

import (
	"bytes"
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// A stream's inbound queue returns taken and copied payloads in order,
// across chunk boundaries, and a copied payload no longer depends on the
// slice the transport lent.
func TestInQueueOrderAndCopies(t *testing.T) {
	var q inQueue
	taken := bytes.Repeat([]byte{'t'}, 40<<10) // as a transport hands over a buffer
	lent := []byte("lent bytes")
	q.push(taken[100:], taken)
	q.push(lent, nil)
	copy(lent, "XXXXXXXXXX") // the reader's next message reuses the lent buffer
	q.push([]byte("more"), nil)
	want := append(append(bytes.Repeat([]byte{'t'}, 40<<10-100), "lent bytes"...), "more"...)
	if q.Len() != len(want) {
		t.Fatalf("Len %d, want %d", q.Len(), len(want))
	}
	var got []byte
	buf := make([]byte, 7<<10) // not a multiple of any payload
	for q.Len() > 0 {
		n := q.read(buf)
		if n == 0 {
			t.Fatal("read returned nothing with bytes queued")
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the stream's bytes were reordered or changed")
	}
	q.push([]byte("again"), nil)
	q.reset()
	if q.Len() != 0 || q.read(buf) != 0 {
		t.Fatal("reset left bytes queued")
	}
}

// A DATA frame comes straight out of the stream's send block, and it stays
// intact until the writer's next turn: while the front writes more to the
// same stream, and when the stream ends with the frame in flight and
// another stream's writes take blocks from the pool.
func TestSendFrameStaysIntactUntilNextTurn(t *testing.T) {
	fb := testfake.NewBroker(t, nil)
	c := newConnector(t, fakeConfig(t, fb))
	s := newSession(c, nil, wire.NewID(), false)
	a, b := newStream(s, wire.NewID()), newStream(s, wire.NewID())
	s.streams[a.id], s.streams[b.id] = a, b

	first := bytes.Repeat([]byte{'a'}, 1000)
	a.out.write(first)
	s.scheduleLocked(a)
	_, data, ok := s.next()
	if !ok || data == nil {
		t.Fatal("no frame")
	}
	held := bytes.Clone(data)
	a.out.write(bytes.Repeat([]byte{'A'}, 3*wire.MaxConnectorChunk)) // appended behind the frame
	s.mu.Lock()
	s.finishLocked(a) // the broker's CLOSE while the frame is written
	s.mu.Unlock()
	for range 8 {
		b.out.write(bytes.Repeat([]byte{'b'}, wire.MaxConnectorChunk))
	}
	if !bytes.Equal(data, held) {
		t.Fatal("a frame in flight was overwritten before the writer's next turn")
	}
	f, err := wire.ParseFrame(data)
	if err != nil || f.Flags != wire.FlagData || f.StreamID != a.id || !bytes.Equal(f.Payload, first) {
		t.Fatalf("frame %+v, %v: want stream a's first 1000 bytes", f, err)
	}

	// b's bytes leave in order, in frames of at most MaxConnectorChunk.
	s.scheduleLocked(b)
	var got []byte
	for {
		_, data, ok := s.next()
		if !ok {
			t.Fatal("session ended")
		}
		if data == nil {
			break
		}
		f, err := wire.ParseFrame(data)
		if err != nil || f.StreamID != b.id || len(f.Payload) > wire.MaxConnectorChunk {
			t.Fatalf("frame %v for %v of %d bytes", err, f.StreamID, len(f.Payload))
		}
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{'b'}, 8*wire.MaxConnectorChunk)) {
		t.Fatal("stream b's bytes were changed")
	}
	if b.out.Len() != 0 || len(b.out.blocks) != 0 {
		t.Fatalf("a drained stream holds %d blocks", len(b.out.blocks))
	}
}

// A queue that is never quite empty — small lent payloads arriving while
// the front reads a little behind — keeps its copy buffer sized by what is
// queued, however many bytes the stream carries.
func TestInQueueCopyBufferFollowsWhatIsQueued(t *testing.T) {
	var q inQueue
	payload := bytes.Repeat([]byte{'p'}, 8<<10) // lent: copied on arrival
	buf := make([]byte, 32<<10)
	const queued, carried = 256 << 10, 64 << 20
	peak := 0
	for sent := 0; sent < carried; sent += len(payload) {
		q.push(payload, nil)
		for q.Len() > queued {
			q.read(buf)
		}
		peak = max(peak, cap(q.cp))
	}
	if limit := 4 * (queued + len(payload)); peak > limit {
		t.Fatalf("copy buffer grew to %d bytes for at most %d queued; want at most %d", peak, queued+len(payload), limit)
	}
}
