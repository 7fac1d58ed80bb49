package connector

import "github.com/hermes-securelink/securelink/broker/msgconn"

// inQueue is a stream's inbound bytes (broker → front), guarded by the
// stream's mu. A DATA payload stays in the buffer the session's reader
// read it into when the transport hands that buffer over (msgconn.Owner:
// a payload that fills at least half of it), so the front's Read copies
// each byte once, from the frame straight into its own buffer; only a
// payload the transport merely lends (a small one) is copied on arrival.
// Copying every payload into a bytes.Buffer first was ~6 % of the front's
// CPU on an upload through the broker. A taken buffer is at most twice
// its payload (msgconn.Reader.Take), so the stream's bound on queued
// bytes (StreamBufferBytes, counted in payload bytes as the credit is)
// holds at most twice that in taken buffers; copied payloads live in copy
// buffers each sized from the bytes queued when it was made, so those
// still referred to by unread chunks hold a small multiple of it too.
type inQueue struct {
	chunks []inChunk
	n      int    // bytes queued
	cp     []byte // where lent payloads are copied; reused once the queue is empty
}

// inChunk is one payload not yet read: data, the rest of it, lies in buf
// when buf was taken from the reader (recycled once read), else in the
// queue's cp.
type inChunk struct {
	data []byte
	buf  []byte
}

// maxKeptCopyBuf is the largest copy buffer an empty queue keeps: an
// interactive stream reuses its few KiB; a burst of small payloads does
// not pin its buffer for the stream's life.
const maxKeptCopyBuf = 32 << 10

func (q *inQueue) Len() int { return q.n }

// push queues payload; buf, when not nil, is the taken buffer payload lies
// in, owned by the queue from now on.
func (q *inQueue) push(payload, buf []byte) {
	if len(payload) == 0 {
		recycle(buf)
		return
	}
	if buf == nil {
		if len(q.cp)+len(payload) > cap(q.cp) {
			// Earlier chunks keep referring to the old buffer, which is
			// never written again. The new one is sized from the bytes
			// queued, not from the old buffer: a queue that is never
			// quite empty (a front reading a little slower than a
			// stream of small payloads arrives) would otherwise double
			// it for every buffer's worth carried, without bound.
			q.cp = make([]byte, 0, max(2*(q.n+len(payload)), 4<<10))
		}
		start := len(q.cp)
		q.cp = append(q.cp, payload...)
		payload = q.cp[start:len(q.cp):len(q.cp)]
	}
	q.chunks = append(q.chunks, inChunk{data: payload, buf: buf})
	q.n += len(payload)
}

// read copies queued bytes into p, as many as fit, in order.
func (q *inQueue) read(p []byte) int {
	n := 0
	for n < len(p) && len(q.chunks) > 0 {
		c := &q.chunks[0]
		k := copy(p[n:], c.data)
		n += k
		c.data = c.data[k:]
		if len(c.data) > 0 {
			break
		}
		q.pop()
	}
	q.n -= n
	if q.n == 0 {
		q.emptied()
	}
	return n
}

// pop drops the first chunk, which has been read, recycling its buffer.
func (q *inQueue) pop() {
	recycle(q.chunks[0].buf)
	q.chunks[0] = inChunk{}
	q.chunks = q.chunks[1:]
}

// emptied rewinds an empty queue: its copy buffer is reused from the
// start (no chunk refers to it any more) unless it grew large.
func (q *inQueue) emptied() {
	q.chunks = q.chunks[:0]
	if cap(q.cp) > maxKeptCopyBuf {
		q.cp = nil
	} else {
		q.cp = q.cp[:0]
	}
}

// reset drops everything queued, recycling the taken buffers.
func (q *inQueue) reset() {
	for len(q.chunks) > 0 {
		q.pop()
	}
	q.n = 0
	q.emptied()
}

// recycle gives a taken buffer back, if there is one.
func recycle(buf []byte) {
	if buf != nil {
		msgconn.Recycle(buf)
	}
}
