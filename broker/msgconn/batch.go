package msgconn

import (
	"net"
	"sync"
)

// batchLimit is what a held BatchConn gathers before it writes anyway.
const batchLimit = 256 << 10

// batchMin is the smallest message worth holding: the library's 4 KiB
// write buffer sends a smaller frame in one write already.
const batchMin = 4 << 10

var batchPool = sync.Pool{New: func() any {
	b := make([]byte, 0, batchLimit+32<<10)
	return &b
}}

// BatchConn sits under a socket's TLS and gathers the records of one
// WebSocket message (or of a writer's whole queue) into one write(2).
// crypto/tls writes every record of at most 16 KiB with its own write, and
// the library's 4 KiB buffer cuts a frame in two more; on loopback and
// short links the per-write cost (the peer's wake-up included) is most of
// the broker's CPU per byte.
//
// Writes are gathered only between Hold and Release, and only for the
// writer holding it: a control frame another goroutine writes meanwhile
// (a pong) joins the batch and leaves with it. While nothing is held it is
// the plain connection. The buffer comes from a pool and goes back once
// written, so an idle socket holds none. Close never waits for a batch in
// flight: it closes the socket, which ends the write. Reads pass through.
type BatchConn struct {
	net.Conn
	mu       sync.Mutex
	cond     sync.Cond // flushing ended
	held     int
	flushing bool
	buf      *[]byte // pooled; nil when empty
	err      error   // a gathered write failed: the socket is unusable
}

// NewBatchConn wraps c.
func NewBatchConn(c net.Conn) *BatchConn {
	b := &BatchConn{Conn: c}
	b.cond.L = &b.mu
	return b
}

// Write sends p at once while nothing is held; otherwise it joins the batch
// (and writes the batch once it passes 256 KiB). A write that finds a
// batch leaving joins the next round of it and returns at once, so a
// close alert never waits behind a stuck batch.
func (b *BatchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if b.held == 0 && !b.flushing && b.buf == nil {
		b.mu.Unlock()
		n, err := b.Conn.Write(p)
		b.mu.Lock()
		return n, err
	}
	if b.buf == nil {
		b.buf = batchPool.Get().(*[]byte)
	}
	*b.buf = append(*b.buf, p...)
	if b.flushing || (b.held > 0 && len(*b.buf) < batchLimit) {
		return len(p), nil
	}
	if err := b.flushLocked(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Hold starts gathering writes; each Hold is paired with one Release.
func (b *BatchConn) Hold() {
	b.mu.Lock()
	b.held++
	b.mu.Unlock()
}

// Release ends one Hold; the last one writes what was gathered and
// returns the error of any gathered write.
func (b *BatchConn) Release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held--
	if b.held > 0 {
		return b.err
	}
	if err := b.flushLocked(); err != nil {
		return err
	}
	return b.err
}

// flushLocked (b.mu held) writes the batch, without holding b.mu during
// the write, until nothing is left; writes that arrive meanwhile leave in
// the next round, so bytes keep their order. When another flush is
// running, it waits for it: that flush takes this caller's bytes too.
func (b *BatchConn) flushLocked() error {
	if b.flushing {
		for b.flushing {
			b.cond.Wait()
		}
		return b.err
	}
	for b.buf != nil && b.err == nil {
		bp := b.buf
		b.buf = nil
		b.flushing = true
		b.mu.Unlock()
		_, err := b.Conn.Write(*bp)
		putBatch(bp)
		b.mu.Lock()
		if err != nil {
			b.err = err
		}
	}
	b.flushing = false
	b.cond.Broadcast()
	if b.buf != nil { // after an error: what can never leave
		putBatch(b.buf)
		b.buf = nil
	}
	return b.err
}

// putBatch returns a buffer to the pool, unless one large write grew it
// past the pool's size.
func putBatch(bp *[]byte) {
	if cap(*bp) > 2*batchLimit {
		return
	}
	*bp = (*bp)[:0]
	batchPool.Put(bp)
}
