package msgconn

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/hermes-securelink/securelink/internal/rawsock"
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
// flight: it closes the socket, which ends the write. Reads are read ahead
// (see Read). On Linux every read(2) and write(2) is a raw system call
// through the socket's RawConn (internal/rawsock says why).
type BatchConn struct {
	net.Conn
	// Read-ahead (reader only; crypto/tls serializes its reads): sock is
	// the socket's raw calls (none when it has no RawConn); ahead holds
	// bytes read but not yet returned, ahead[aoff:] (pooled; nil when
	// empty).
	sock  rawsock.Sock
	ahead *[]byte
	aoff  int
	bulk  bool  // the last read filled what was asked: read ahead next
	quick uint8 // consecutive plain reads that returned within quietAfter, up to busyAfter

	mu       sync.Mutex
	cond     sync.Cond // flushing ended
	held     int
	flushing bool
	buf      *[]byte // pooled; nil when empty
	err      error   // a gathered write failed: the socket is unusable

	under *BatchConn // held and released with this one (NewBatchConnAbove); nil: none
}

// NewBatchConn wraps c.
func NewBatchConn(c net.Conn) *BatchConn {
	b := &BatchConn{Conn: c}
	b.cond.L = &b.mu
	b.sock, _ = rawsock.Of(c)
	return b
}

// readAhead is what one read(2) may fill for a small Read.
const readAhead = 128 << 10

// quietAfter is how long a plain read may wait for its bytes and still
// count as a busy socket's, and busyAfter how many such reads in a row
// make the socket busy (see Read). quietAfter is a variable only so that
// a test on a loaded machine can lengthen it.
var quietAfter = 4 * time.Millisecond

const busyAfter = 4

var aheadPool = sync.Pool{New: func() any {
	b := make([]byte, readAhead)
	return &b
}}

// Read serves bytes already read ahead first. crypto/tls reads one record
// (at most ~16 KiB) at a time into a buffer of about that size, so on a
// bulk stream each record cost a read(2) and most of the broker's system
// time. Once a read filled all that was asked (more is likely waiting), a
// smaller Read than readAhead is served from one read(2) of up to
// readAhead bytes, the rest kept for the next Reads; a read-ahead that
// brings no more than was asked goes back to plain reads, so a socket of
// small messages pays nothing for it. The buffer is taken from a pool only
// once the socket has data (rawsock.Sock.ReadPooled) and goes back as soon
// as it is drained, so a connection waiting for bytes holds none.
//
// A plain read that finds the socket empty waits in one of two ways. A
// quiet socket's holds nothing while it waits (rawsock.Sock.Read: two
// ppoll(2) calls around the poller's wait and a second call into the
// RawConn). Once busyAfter reads in a row returned within quietAfter of
// being called, the socket is busy and its reads wait as the plain
// connection's do (rawsock.Sock.ReadWait: no ppoll, one RawConn call),
// holding a pooled ~100-byte op while they wait: on a stream of small
// messages two system calls fewer per message. A read that waited longer
// makes the socket quiet again, so a socket that goes idle holds one op
// through its first long wait and none after it (an idle host or stream
// is woken by a keepalive round every ping interval), and one that went
// idle after a few messages (a registration) holds none. Every read(2) is
// a raw one through the socket's RawConn (internal/rawsock). Deadlines
// and Close apply as to the plain connection.
func (b *BatchConn) Read(p []byte) (int, error) {
	if b.ahead != nil {
		n := copy(p, (*b.ahead)[b.aoff:])
		b.aoff += n
		if b.aoff == len(*b.ahead) {
			*b.ahead = (*b.ahead)[:cap(*b.ahead)]
			aheadPool.Put(b.ahead)
			b.ahead = nil
		}
		return n, nil
	}
	if !b.sock.Raw() || len(p) == 0 {
		return b.Conn.Read(p)
	}
	if !b.bulk || len(p) >= readAhead {
		t := time.Now()
		var n int
		var err error
		if b.quick >= busyAfter {
			n, err = b.sock.ReadWait(p)
		} else {
			n, err = b.sock.Read(p)
		}
		if err == nil && time.Since(t) < quietAfter {
			b.quick = min(b.quick+1, busyAfter)
		} else {
			b.quick = 0
		}
		b.bulk = err == nil && n == len(p)
		return n, err
	}
	n, bp, err := b.sock.ReadPooled(&aheadPool, readAhead)
	if err != nil {
		b.bulk = false
		return 0, err
	}
	k := copy(p, (*bp)[:n])
	if k == n {
		// No more than was asked for: small messages, not a bulk stream.
		b.bulk = false
		aheadPool.Put(bp)
		return k, nil
	}
	*bp = (*bp)[:n]
	b.ahead, b.aoff = bp, k
	return k, nil
}

// sockWrite writes all of p to the socket with raw write(2) calls,
// waiting for the poller while the socket is full; deadlines and Close
// apply as to the plain connection.
func (b *BatchConn) sockWrite(p []byte) (int, error) {
	if !b.sock.Raw() {
		return b.Conn.Write(p)
	}
	return b.sock.Write(p)
}

// Write sends p at once while nothing is held; otherwise it joins the batch
// (and writes the batch once it passes 256 KiB). A write that finds a
// batch leaving joins the next round of it and returns at once, so a
// close alert never waits behind a stuck batch; what bounds that round is
// that pongs, the one write a peer can call for at will, wait before they
// are written (awaitRoom).
func (b *BatchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if b.held == 0 && !b.flushing && b.buf == nil {
		b.mu.Unlock()
		n, err := b.sockWrite(p)
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

// pongBacklog is how many bytes may wait for the next round of a running
// flush before a pong (answerPing) waits for that round to leave: writes
// that arrive during a flush return at once so that a close alert never
// waits behind a stuck batch, which let a peer that stops reading and
// sends pings grow the batch by a pong per ping without end.
const pongBacklog = 4 << 10

// awaitRoom waits while a flush is running here or in the BatchConn under
// this one and pongBacklog bytes already wait for its next round; false
// when ctx ended first. It takes no lock a writer holds (TLS's included),
// so Close still ends the stuck flush and with it the wait.
func (b *BatchConn) awaitRoom(ctx context.Context) bool {
	b.mu.Lock()
	if b.crowded() {
		stop := context.AfterFunc(ctx, func() {
			b.mu.Lock()
			b.cond.Broadcast()
			b.mu.Unlock()
		})
		for b.crowded() && ctx.Err() == nil {
			b.cond.Wait()
		}
		stop()
	}
	b.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	return b.under == nil || b.under.awaitRoom(ctx)
}

// crowded (b.mu held): a flush is running and its next round is full.
func (b *BatchConn) crowded() bool {
	return b.flushing && b.err == nil && b.buf != nil && len(*b.buf) >= pongBacklog
}

// NewBatchConnAbove wraps tc, a TLS connection over under, so that a
// writer's Hold and Release hold and release under with it: the plaintext
// gathered here leaves as one TLS Write, in records of up to 16 KiB instead
// of one per write (a WebSocket client's 4 KiB write buffer made each 4 KiB
// of a frame its own record), and those records leave in one write(2)
// through under. It reads and writes through tc only, never with raw
// system calls: a wrapper of tc that exposed the socket's RawConn would
// otherwise send plaintext past TLS.
func NewBatchConnAbove(tc net.Conn, under *BatchConn) *BatchConn {
	b := &BatchConn{Conn: tc, under: under}
	b.cond.L = &b.mu
	return b
}

// Hold starts gathering writes; each Hold is paired with one Release.
func (b *BatchConn) Hold() {
	b.mu.Lock()
	b.held++
	b.mu.Unlock()
	if b.under != nil {
		b.under.Hold()
	}
}

// Release ends one Hold; the last one writes what was gathered and
// returns the error of any gathered write.
func (b *BatchConn) Release() error {
	err := b.release()
	if b.under != nil {
		// After b's own write: its records are in under's batch.
		if uerr := b.under.Release(); err == nil {
			err = uerr
		}
	}
	return err
}

func (b *BatchConn) release() error {
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
		b.cond.Broadcast() // the next round is empty again (awaitRoom)
		b.mu.Unlock()
		_, err := b.sockWrite(*bp)
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
