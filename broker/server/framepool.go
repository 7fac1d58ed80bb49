package server

import (
	"sync"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Frame buffers of the data path. Every client message became a fresh
// frame allocation and every host DATA payload a fresh copy, so the GC ran
// in step with the bytes moved (a fifth of the broker's CPU on a bulk
// upload). The two common sizes come from pools instead: an inner TLS
// record (16 KiB plus its overhead, the client's usual message) and the
// connector's 64 KiB chunk. A buffer is at most twice the bytes it holds,
// so the queues' byte bounds stay within a factor of two of the memory
// they pin; other sizes are allocated as before.
const (
	frameSmall = 16<<10 + 64
	frameLarge = 64<<10 + 64
)

var (
	smallFrames = sync.Pool{New: func() any { return new([frameSmall]byte) }}
	largeFrames = sync.Pool{New: func() any { return new([frameLarge]byte) }}
)

// getFrame returns a buffer of length n, pooled when n is within a factor
// of two of a pool's size.
func getFrame(n int) []byte {
	switch {
	case n > frameSmall/2 && n <= frameSmall:
		return smallFrames.Get().(*[frameSmall]byte)[:n:frameSmall]
	case n > frameLarge/2 && n <= frameLarge:
		return largeFrames.Get().(*[frameLarge]byte)[:n:frameLarge]
	}
	return make([]byte, n)
}

// putFrame gives b back once nothing refers to any byte of it (from b[0]
// to its capacity): a whole queued frame or payload, written and dropped
// from its queue. A slice whose capacity is exactly a pool's size goes
// back to that pool; any other (a read buffer the transport handed over,
// the remainder of a cut frame) to the transport's read pool, which keeps
// the sizes it can use (msgconn.Recycle).
func putFrame(b []byte) {
	switch cap(b) {
	case frameSmall:
		smallFrames.Put((*[frameSmall]byte)(b[:frameSmall]))
	case frameLarge:
		largeFrames.Put((*[frameLarge]byte)(b[:frameLarge]))
	default:
		msgconn.Recycle(b)
	}
}

// putDataHeader writes a DATA header for stream id over f's first
// HeaderLen bytes.
func putDataHeader(f []byte, id wire.ID) {
	f[0], f[1] = wire.FrameVersion, wire.FlagData
	copy(f[2:wire.HeaderLen], id[:])
}

// popFront drops q's first item and keeps its backing array: a queue that
// empties with every message (one in flight) would otherwise lose the
// array's front slot at each pop and reallocate it at the next append. The
// queues it serves hold at most StreamQueueFrames items (a credit stream
// creditQueueFrames times that).
func popFront[T any](q []T) []T { return popFrontN(q, 1) }

// popFrontN drops q's first k items the same way, with one move of the
// rest: a message taking several payloads moves the queue once, not once
// per payload.
func popFrontN[T any](q []T, k int) []T {
	if k == 0 {
		return q
	}
	n := copy(q, q[k:])
	clear(q[n:])
	return q[:n]
}
