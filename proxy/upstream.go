package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hermes-securelink/securelink/internal/deadline"
	"github.com/hermes-securelink/securelink/internal/rawsock"
)

// upstreamPool keeps the keep-alive connections of the direct path (see
// direct.go) to one upstream. Unlike http.Transport it runs no goroutine per
// connection: an idle connection is checked with one non-blocking peek when
// it is taken, and a single timer per pool closes connections idle for
// idleTimeout.
type upstreamPool struct {
	dialer      *net.Dialer
	addr        string // host:port
	idleTimeout time.Duration
	maxIdle     int

	gone goneWatch // the client-gone cancels of the exchanges in flight

	mu      sync.Mutex
	idle    []*upConn // oldest first; taken from the end
	retired bool      // close() was called: connections are no longer kept
	reaper  *time.Timer
	armed   bool
}

func newUpstreamPool(dialer *net.Dialer, addr string, idleTimeout time.Duration, maxIdle int) *upstreamPool {
	return &upstreamPool{dialer: dialer, addr: addr, idleTimeout: idleTimeout, maxIdle: maxIdle}
}

// get returns a live pooled connection, or dials one. A pooled connection
// the upstream closed or wrote to unasked is dropped, as http.Transport's
// readLoop drops it when it notices: bytes that arrive while a connection
// is idle are never a response to the next request (which may be another
// client's), so a connection holding any, in its reader or in the socket,
// is closed (see clean).
func (p *upstreamPool) get(ctx context.Context, total time.Time) (*upConn, error) {
	p.mu.Lock()
	for n := len(p.idle); n > 0; n = len(p.idle) {
		pc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if time.Since(pc.idleAt) < p.idleTimeout && pc.clean() {
			pc.reused = true
			return pc, nil
		}
		pc.conn.Close()
		p.mu.Lock()
	}
	p.mu.Unlock()
	if !total.IsZero() && time.Until(total) < p.dialer.Timeout {
		// The connect timeout is not allowed to outlast the total.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, total)
		defer cancel()
	}
	c, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	// Reads and writes are raw system calls (internal/rawsock), as the
	// client's side of the front.
	c = rawsock.Wrap(c)
	pc := &upConn{conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		pc.raw, _ = sc.SyscallConn()
	}
	pc.br = bufio.NewReaderSize(pc, 4<<10)
	// The head is assembled here and sent by send, in one write.
	pc.bw = bufio.NewWriterSize(&pc.head, 4<<10)
	pc.cancelFn = pc.cancel
	pc.peekFn = pc.peek
	pc.sendFn = pc.sendStep
	return pc, nil
}

// put returns a connection whose exchange ended exactly at its framing (the
// caller's part). A connection whose reader holds bytes past that end (a
// body on HEAD, 204 or 304, more than the Content-Length, anything after the
// last chunk) is closed, never kept: those bytes would be read as the next
// request's response.
func (p *upstreamPool) put(pc *upConn) {
	pc.reused, pc.nRead, pc.sawEOF = false, 0, false
	p.mu.Lock()
	if p.retired || len(p.idle) >= p.maxIdle || pc.br.Buffered() > 0 {
		p.mu.Unlock()
		pc.conn.Close()
		return
	}
	pc.idleAt = time.Now()
	p.idle = append(p.idle, pc)
	if !p.armed {
		p.armed = true
		if p.reaper == nil {
			p.reaper = time.AfterFunc(p.idleTimeout, p.reap)
		} else {
			p.reaper.Reset(p.idleTimeout)
		}
	}
	p.mu.Unlock()
}

// reap closes the connections idle for idleTimeout and re-arms itself for
// the oldest remaining one.
func (p *upstreamPool) reap() {
	p.mu.Lock()
	now := time.Now()
	i := 0
	for i < len(p.idle) && now.Sub(p.idle[i].idleAt) >= p.idleTimeout {
		i++
	}
	expired := append([]*upConn(nil), p.idle[:i]...)
	n := copy(p.idle, p.idle[i:])
	clear(p.idle[n:])
	p.idle = p.idle[:n]
	p.armed = n > 0 && !p.retired
	if p.armed {
		p.reaper.Reset(p.idle[0].idleAt.Add(p.idleTimeout).Sub(now))
	}
	p.mu.Unlock()
	for _, pc := range expired {
		pc.conn.Close()
	}
}

// close closes the idle connections and keeps no more: the forwarder was
// replaced by a reload or the front is stopping. Connections still in use
// are closed when their exchange ends.
func (p *upstreamPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.retired, p.armed = nil, true, false
	if p.reaper != nil {
		p.reaper.Stop()
	}
	p.mu.Unlock()
	for _, pc := range idle {
		pc.conn.Close()
	}
}

// upConn is one keep-alive connection to the upstream.
type upConn struct {
	conn     net.Conn
	raw      syscall.RawConn
	br       *bufio.Reader
	bw       *bufio.Writer      // writes into head
	head     bytes.Buffer       // the request head of this exchange, for send
	cancelFn func()             // pc.cancel, bound once per connection
	peekFn   func(uintptr)      // pc.peek, likewise
	sendFn   func(uintptr) bool // pc.sendStep, likewise
	// send's state for sendStep.
	out     []byte
	outN    int
	outErr  error
	outDone bool
	peekOK  bool
	idleAt  time.Time
	reused  bool

	// limit bounds the bytes read while a response head is parsed.
	limit  int64
	nRead  int64 // bytes read in this exchange
	sawEOF bool  // the upstream closed its side

	rdl      deadline.Lazy // the read deadline armRead set
	canceled atomic.Bool
}

// Read is the bufio.Reader's source: it enforces the head limit and notes
// an upstream that closed (a close-delimited body ends the connection).
func (pc *upConn) Read(p []byte) (int, error) {
	if pc.limit <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > pc.limit {
		p = p[:pc.limit]
	}
	n, err := pc.conn.Read(p)
	if err == io.EOF {
		pc.sawEOF = true
	}
	pc.limit -= int64(n)
	pc.nRead += int64(n)
	return n, err
}

var errHeadTooLarge = errors.New("upstream response head larger than the limit")

// send writes the request head assembled in head and returns once the
// upstream has something to read, or the read deadline passed, or the
// exchange was canceled (the read that follows reports those). One write
// and no read: read right after the write, the answer is almost never
// there yet, and that read (EAGAIN) was a wasted syscall per request. The
// wait is armed before the write (RawConn.Read resets the descriptor's
// readiness, then calls sendStep, which writes), so an answer arriving at
// once cannot be missed. A write the socket does not take whole is
// finished by the ordinary, blocking Write, and the answer is then waited
// for by the ordinary Read. It reports how many bytes the upstream was
// given.
func (pc *upConn) send() (int, error) {
	p := pc.head.Bytes()
	defer pc.releaseHead()
	if pc.raw == nil || !canWriteRaw {
		return pc.conn.Write(p)
	}
	pc.out, pc.outN, pc.outErr, pc.outDone = p, 0, nil, false
	pc.raw.Read(pc.sendFn) // its error is the next read's to report
	n, werr, wrote := pc.outN, pc.outErr, pc.outDone
	pc.out, pc.outErr = nil, nil
	switch {
	case !wrote:
		// RawConn.Read ended before calling sendStep (the read deadline
		// has passed, the exchange was canceled, the connection closed):
		// the ordinary Write decides, as it did before the read deadline
		// was set ahead of the write.
		return pc.conn.Write(p)
	case werr != nil && werr != syscall.EAGAIN:
		return n, werr
	}
	// EAGAIN or a short write: the socket buffer is full, and the ordinary
	// Write waits for room.
	if n < len(p) {
		m, err := pc.conn.Write(p[n:])
		return n + m, err
	}
	return n, nil
}

// releaseHead empties the head buffer for the next exchange. One grown by
// a large head (up to the client's MaxHeaderBytes) is not kept while the
// connection idles in the pool.
func (pc *upConn) releaseHead() {
	if pc.head.Cap() > maxKeptHead {
		pc.head = bytes.Buffer{} // pc.bw writes through a pointer to the field
		return
	}
	pc.head.Reset()
}

const maxKeptHead = 8 << 10

// sendStep is send's RawConn.Read function (pc.sendFn): the first call
// writes, and asks to wait for readability when the write was whole; the
// next one is that readability.
func (pc *upConn) sendStep(fd uintptr) bool {
	if pc.outDone {
		return true
	}
	pc.outDone = true
	pc.outN, pc.outErr = writeRaw(fd, pc.out)
	return pc.outErr != nil || pc.outN < len(pc.out)
}

// cancel aborts the exchange from another goroutine (the client left):
// pending and later reads and writes fail at once.
func (pc *upConn) cancel() {
	pc.canceled.Store(true)
	pc.conn.SetDeadline(aLongTimeAgo)
}

var aLongTimeAgo = time.Unix(1, 0)

// armRead times the next wait for the upstream: at least idle from now,
// never past total (zero: none). The deadline already on the connection is
// kept when it allows both (internal/deadline), so a busy keep-alive
// connection re-arms its read timer about once a second, not per request.
// It never undoes a cancel: cancel marks before it sets its deadline, so
// either its deadline lands after this one or the mark is seen here.
func (pc *upConn) armRead(idle time.Duration, total time.Time) error {
	if t, ok := pc.rdl.Next(idle, total); ok {
		pc.conn.SetReadDeadline(t)
	}
	if pc.canceled.Load() {
		return context.Canceled
	}
	return nil
}

// clean reports whether a pooled connection may carry a new exchange: its
// reader holds nothing and the socket is open and silent.
func (pc *upConn) clean() bool {
	return pc.br.Buffered() == 0 && pc.alive()
}

// alive reports whether a pooled connection is still open and silent, with
// one non-blocking peek. Control, unlike Read, ignores the read deadline the
// last exchange left behind.
func (pc *upConn) alive() bool {
	if pc.raw == nil {
		return true
	}
	pc.peekOK = false
	return pc.raw.Control(pc.peekFn) == nil && pc.peekOK
}

func (pc *upConn) peek(fd uintptr) { pc.peekOK = peekAlive(fd) }
