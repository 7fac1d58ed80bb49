package msgconn

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
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
// through the socket's RawConn (sys_raw.go says why).
type BatchConn struct {
	net.Conn
	// Read-ahead (reader only; crypto/tls serializes its reads): raw is
	// the socket's, nil when it has none; ahead holds bytes read but not
	// yet returned, ahead[aoff:] (pooled; nil when empty).
	raw   syscall.RawConn
	ahead *[]byte
	aoff  int
	bulk  bool // the last read filled what was asked: read ahead next

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
	if sc, ok := c.(syscall.Conn); ok && rawIO {
		if rc, err := sc.SyscallConn(); err == nil {
			b.raw = rc
		}
	}
	return b
}

// readAhead is what one read(2) may fill for a small Read.
const readAhead = 128 << 10

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
// small messages pays nothing for it. The buffer
// is taken from a pool only once the socket has data (inside the raw
// read) and goes back as soon as it is drained, so a connection waiting
// for bytes holds none. Every read(2) is a raw one (sysRead) through the
// socket's RawConn, and an empty socket is waited for with
// awaitReadable, which holds nothing. Deadlines and Close apply as to the
// plain connection (RawConn honours them).
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
	if b.raw == nil || len(p) == 0 {
		return b.Conn.Read(p)
	}
	var (
		n     int
		errno syscall.Errno
		bp    *[]byte
		err   error
	)
	for {
		op := rawOps.Get().(*rawOp)
		op.p, op.ahead = p, b.bulk && len(p) < readAhead
		err = b.raw.Read(op.read)
		n, errno, bp = op.n, op.errno, op.buf
		op.done()
		if err != nil || errno != syscall.EAGAIN {
			break
		}
		// Empty: wait for the poller holding nothing (awaitReadable).
		if err = b.raw.Read(awaitReadable); err != nil {
			break
		}
	}
	if err == nil && errno != 0 {
		err = &net.OpError{Op: "read", Net: "tcp", Source: b.Conn.LocalAddr(), Addr: b.Conn.RemoteAddr(), Err: os.NewSyscallError("read", errno)}
	}
	if err != nil || n <= 0 {
		if bp != nil {
			aheadPool.Put(bp)
		}
		b.bulk = false
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	if bp == nil {
		b.bulk = n == len(p)
		return n, nil
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

// rawOp is one raw read or write in progress: its arguments, its result
// and the step functions a RawConn calls (made once per rawOp). They come
// from a pool, so a socket holds none between calls.
type rawOp struct {
	p           []byte  // read: where to; write: what is left after n
	ahead       bool    // read: into a read-ahead buffer (buf) instead
	buf         *[]byte // read: the read-ahead buffer taken
	n           int
	errno       syscall.Errno
	read, write func(fd uintptr) bool
}

var rawOps = sync.Pool{New: func() any {
	op := new(rawOp)
	op.read, op.write = op.readStep, op.writeStep
	return op
}}

func (op *rawOp) done() {
	op.p, op.ahead, op.buf, op.n, op.errno = nil, false, nil, 0, 0
	rawOps.Put(op)
}

// readStep is one raw read (RawConn.Read calls it, and it never asks to
// wait: an empty socket is waited for with awaitReadable, holding no op):
// into p, or into a read-ahead buffer taken only if data is there.
func (op *rawOp) readStep(fd uintptr) bool {
	dst := op.p
	if op.ahead {
		op.buf = aheadPool.Get().(*[]byte)
		dst = (*op.buf)[:readAhead]
	}
	op.n, op.errno = sysRead(fd, dst)
	if op.errno != 0 && op.buf != nil {
		aheadPool.Put(op.buf)
		op.buf = nil
	}
	return true
}

// sockWrite writes all of p to the socket with raw write(2) calls,
// waiting for the poller while the socket is full; deadlines and Close
// apply as to the plain connection.
func (b *BatchConn) sockWrite(p []byte) (int, error) {
	if b.raw == nil {
		return b.Conn.Write(p)
	}
	op := rawOps.Get().(*rawOp)
	op.p = p
	err := b.raw.Write(op.write)
	n, errno := op.n, op.errno
	op.done()
	if err == nil && errno != 0 {
		err = &net.OpError{Op: "write", Net: "tcp", Source: b.Conn.LocalAddr(), Addr: b.Conn.RemoteAddr(), Err: os.NewSyscallError("write", errno)}
	}
	return n, err
}

// writeStep is the raw write: false on EAGAIN, to wait for the poller.
func (op *rawOp) writeStep(fd uintptr) bool {
	for op.n < len(op.p) {
		n, errno := sysWrite(fd, op.p[op.n:])
		if errno == syscall.EAGAIN {
			return false // wait until writable
		}
		if errno != 0 {
			op.errno = errno
			return true
		}
		op.n += n
	}
	return true
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
