package connector

import (
	"sync"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// outQueue is a stream's outbound bytes (front → broker), guarded by the
// session's mu. The bytes sit in blocks of one DATA frame each, a frame
// header's room in front of them, so the writer sends a frame straight
// from the block (frame) instead of copying the payload behind a header:
// with the copy into a bytes.Buffer on Write and another into the frame,
// the front's CPU on a download through the broker had two copies of
// every byte before the socket's. A block holds at most
// wire.MaxConnectorChunk bytes; the stream's bound (StreamSendBytes) is
// counted in bytes, as before.
//
// A frame lives until the writer's socket Write returns, and the writer
// asks for the next one only after that, so a frame's header may go in
// front of the previous frame's last bytes; Write only ever appends behind
// what the writer may be sending. A block the writer drained, or one of a
// stream ended while its frame may be in flight, goes back to the pool
// only at the writer's next turn (session.tidyOut).
type outQueue struct {
	blocks []*[]byte // from blockPool; (*b)[:len] is written, the first block read from off
	off    int       // where the unread bytes of blocks[0] start; ≥ wire.HeaderLen
	n      int       // bytes queued
}

// blockPool holds the stream send blocks: one DATA frame each, header
// included.
var blockPool = sync.Pool{New: func() any {
	b := make([]byte, 0, wire.HeaderLen+wire.MaxConnectorChunk)
	return &b
}}

func (q *outQueue) Len() int { return q.n }

// write queues all of p (the caller checked the stream's bound).
func (q *outQueue) write(p []byte) {
	q.n += len(p)
	for len(p) > 0 {
		var b *[]byte
		if k := len(q.blocks); k > 0 && len(*q.blocks[k-1]) < cap(*q.blocks[k-1]) {
			b = q.blocks[k-1]
		} else {
			b = blockPool.Get().(*[]byte)
			*b = (*b)[:wire.HeaderLen]
			if len(q.blocks) == 0 {
				q.off = wire.HeaderLen
			}
			q.blocks = append(q.blocks, b)
		}
		k := min(cap(*b)-len(*b), len(p))
		*b = append(*b, p[:k]...)
		p = p[k:]
	}
}

// chunk is how many bytes the next frame can carry: the unread bytes of
// the first block.
func (q *outQueue) chunk() int {
	if len(q.blocks) == 0 {
		return 0
	}
	return len(*q.blocks[0]) - q.off
}

// frame returns a DATA frame of stream id carrying the next k bytes
// (1 ≤ k ≤ chunk()), in place in the first block, valid until the
// writer's next turn. A block it drains to its end leaves the queue and
// is returned as spent, for the caller to recycle at that turn.
func (q *outQueue) frame(id wire.ID, k int) (frame []byte, spent *[]byte) {
	b := q.blocks[0]
	start := q.off - wire.HeaderLen
	// The header wire.AppendFrame writes, in the room in front of the
	// payload.
	hdr := append((*b)[start:start], wire.FrameVersion, wire.FlagData)
	_ = append(hdr, id[:]...)
	frame = (*b)[start : q.off+k]
	q.off += k
	q.n -= k
	if q.off == cap(*b) {
		q.blocks[0] = nil
		q.blocks = q.blocks[1:]
		q.off = wire.HeaderLen
		spent = b
	}
	return frame, spent
}

// take hands all blocks over to the caller (the queue is empty after).
func (q *outQueue) take() []*[]byte {
	bs := q.blocks
	*q = outQueue{}
	return bs
}

// putBlock returns a block to the pool.
func putBlock(b *[]byte) {
	*b = (*b)[:0]
	blockPool.Put(b)
}
