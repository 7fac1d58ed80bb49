package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// ErrConnectionLost means the broker connection ended without a WebSocket
// close: the TCP connection broke or the keepalive gave up. The stream's
// bytes may be truncated.
var ErrConnectionLost = errors.New("reach: broker connection lost")

// CloseError is a close of the stream by the broker with a code other than
// 1000 (which Read reports as io.EOF). The stream's bytes may be truncated.
type CloseError struct {
	Code   int
	Reason string // the broker's fixed reason text, may be empty
}

func (e *CloseError) Error() string {
	what := "closed the stream"
	switch e.Code {
	case wire.CloseGoingAway:
		what = "closed the stream because the host went offline or the broker is shutting down"
	case wire.ClosePolicy:
		what = "closed the stream after a revoke or a protocol error"
	case wire.CloseTooBig:
		what = "closed the stream because a message was too big"
	case wire.CloseTryAgain:
		what = "closed the stream because it exceeded its limits (idle, or not read fast enough)"
	}
	s := fmt.Sprintf("reach: broker %s (close %d)", what, e.Code)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// closeError maps a read error that carries a close frame; a cut socket
// (no close frame, 1006) is a lost connection.
func closeError(err error) error {
	var ce *msgconn.CloseError
	if !errors.As(err, &ce) || ce.Code == msgconn.CloseAbnormal {
		return fmt.Errorf("%w: %v", ErrConnectionLost, err)
	}
	if ce.Code == wire.CloseNormal {
		return io.EOF
	}
	return &CloseError{Code: ce.Code, Reason: ce.Reason}
}

// Conn is one matched broker stream as a net.Conn of raw bytes.
//
//   - Write queues bytes for a background writer, which sends what is
//     queued as binary messages of at most 128 KiB (writeQueueBytes), so
//     the records of an inner TLS connection leave together; Write waits
//     only while the queue is full, and a failed send is reported by the
//     next Write. A write deadline that fires in the middle of a message
//     ends the stream (a partial WebSocket message cannot be resumed),
//     like a timed-out write on a tls.Conn. A message whose fragment the
//     broker's socket does not take within Config.PongTimeout (a stalled
//     or half-open path) ends the stream with ErrConnectionLost.
//   - Read returns io.EOF after the broker's close 1000 (the host sent
//     CLOSE), a *CloseError for any other close code, a *wire.Error when the
//     broker sent an `error` first, and an error wrapping ErrConnectionLost
//     when the connection broke without a close.
//   - A background reader keeps reading the socket (so pings are answered
//     while the caller does something else) into a bounded queue.
//   - Close sends what was queued (for at most 5 s), then ends the stream
//     with close 1000; the broker then sends CLOSE to the host. There is
//     no half-close: the protocol has none.
type Conn struct {
	ws       msgconn.Conn
	streamID wire.ID
	local    net.Addr
	remote   net.Addr
	log      zerolog.Logger

	msgs       chan *[]byte  // chunks of chunkPool filled by readLoop, closed when it ends
	readErr    error         // why readLoop ended; written before msgs is closed
	readerDone chan struct{} // closed when readLoop returned
	lost       atomic.Pointer[error]

	rmu    sync.Mutex // serializes Read; guards cur and curBuf
	cur    []byte
	curBuf *[]byte // the chunk cur is the rest of (back to chunkPool once read)

	wmu sync.Mutex // serializes Write
	// The write queue (see Write and writeLoop), guarded by qmu: q is
	// pooled and nil while empty, so an idle stream holds no buffer.
	qmu        sync.Mutex
	q          *[]byte
	werr       error         // the writer failed: the stream is unusable
	closing    bool          // Close stopped new Writes
	sending    bool          // a message is being written (by the writer or a small Write)
	wready     chan struct{} // capacity 1: bytes were queued
	wspace     chan struct{} // capacity 1: the writer took the queue
	stopWriter chan struct{} // closed by Close: drain the queue and end
	writerDone chan struct{}

	rdl, wdl *msgconn.Deadline

	// gate bounds every send by progress: each 64 KiB of a message must
	// leave within writeTimeout (the keepalive's pong timeout), so a
	// stalled or half-open path to the broker ends the stream instead of
	// holding a Write until the kernel gives up on the connection (the
	// keepalive does not count while a data write is in progress).
	gate         *msgconn.WriteGate
	writeTimeout time.Duration

	closed     chan struct{}
	closeOnce  sync.Once
	writeCtx   context.Context // ends on Close, and with it the keepalive
	cancelAll  context.CancelFunc
	pause      msgconn.Pause
	kaDone     chan struct{}
	pingEvery  time.Duration
	pongWithin time.Duration

	// Tests only, set before the first Write: hookSent runs between a
	// send's write returning and the end of its deadline watch, and
	// hookDeadlineCut once that watch acted on a deadline that fired;
	// together they make the window between the two deterministic.
	hookSent, hookDeadlineCut func()
}

var _ net.Conn = (*Conn)(nil)

func newConn(ws msgconn.Conn, sid wire.ID, local, remote net.Addr, cfg Config, log zerolog.Logger) *Conn {
	c := &Conn{
		ws:         ws,
		streamID:   sid,
		local:      local,
		remote:     remote,
		log:        log.With().Str("stream_id", sid.String()).Logger(),
		msgs:       make(chan *[]byte, readQueueMessages),
		readerDone: make(chan struct{}),
		rdl:        msgconn.NewDeadline(),
		wdl:        msgconn.NewDeadline(),
		closed:     make(chan struct{}),
		kaDone:     make(chan struct{}),
		wready:     make(chan struct{}, 1),
		wspace:     make(chan struct{}, 1),
		stopWriter: make(chan struct{}),
		writerDone: make(chan struct{}),
		pingEvery:  cfg.PingInterval,
		pongWithin: cfg.PongTimeout,
		gate:       msgconn.NewWriteGate(ws),
		// A fragment the broker does not take within the time the
		// keepalive would give a pong is a dead path, not backpressure.
		writeTimeout: cfg.PongTimeout,
	}
	if c.local == nil {
		c.local = brokerAddr("local")
	}
	if c.remote == nil {
		c.remote = brokerAddr("broker")
	}
	c.writeCtx, c.cancelAll = context.WithCancel(context.Background())
	go c.readLoop()
	go c.writeLoop()
	go c.keepalive()
	return c
}

// StreamID is the broker's id of this stream (a locator, not a secret).
func (c *Conn) StreamID() wire.ID { return c.streamID }

// LocalAddr and RemoteAddr are those of the TCP connection to the broker.
func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

type brokerAddr string

func (a brokerAddr) Network() string { return "reach" }
func (a brokerAddr) String() string  { return string(a) }

func (c *Conn) readLoop() {
	defer close(c.readerDone)
	defer close(c.msgs)
	var brokerErr error // an `error` message announcing the close
	// A binary message's bytes are queued as they arrive, in pooled
	// chunks of readChunk bytes (one per frame the broker sent, at most):
	// a stream has no message boundaries to keep. Read whole into a
	// buffer sized after the last messages (the broker's vary from one
	// DATA payload to ClientWriteChunk), a download allocated about a
	// third of its bytes in regrown and copied buffers.
	for {
		typ, r, err := nextReader(c.ws)
		if err != nil {
			c.readErr = c.readError(err, brokerErr)
			return
		}
		if typ == msgconn.Text {
			data, err := io.ReadAll(io.LimitReader(r, wire.MaxControlBytes+1))
			if err != nil {
				c.readErr = c.readError(err, brokerErr)
				return
			}
			m, err := wire.ParseBrokerMessage(data) // refuses one above MaxControlBytes
			if em, ok := m.(wire.ErrorMsg); ok && err == nil {
				brokerErr = &wire.Error{Code: em.Code, Detail: "the broker ended the stream"}
				continue // the close follows
			}
			c.readErr = errors.New("reach: the broker sent a control message on a matched stream")
			c.ws.CloseNow()
			return
		}
		for {
			bp := chunkPool.Get().(*[]byte)
			n, err := r.Read((*bp)[:readChunk])
			if n == 0 {
				chunkPool.Put(bp)
			} else {
				*bp = (*bp)[:n]
				c.pause.Enter()
				select {
				case c.msgs <- bp:
					c.pause.Leave()
				case <-c.closed:
					c.pause.Leave()
					chunkPool.Put(bp)
					c.readErr = net.ErrClosed
					return
				}
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				c.readErr = c.readError(err, brokerErr)
				if c.readErr == io.EOF {
					// A close inside a message: the stream was cut,
					// not finished.
					c.readErr = fmt.Errorf("%w: the broker closed the stream in the middle of a message", ErrConnectionLost)
				}
				return
			}
		}
	}
}

// readChunk is the size of the pieces a Conn queues what it reads in: the
// broker's largest frame (it fragments its messages at 64 KiB).
const readChunk = 64 << 10

var chunkPool = sync.Pool{New: func() any {
	b := make([]byte, readChunk)
	return &b
}}

// nextReader is ws's next message as a reader of its bytes; a transport
// that only reads whole messages (msgconn.Pipe in tests) lends its message
// until the next call, and the caller has copied it into chunks by then.
func nextReader(ws msgconn.Conn) (msgconn.MessageType, io.Reader, error) {
	if s, ok := ws.(msgconn.Streamer); ok {
		return s.NextReader(context.Background())
	}
	typ, data, err := ws.Read(context.Background())
	if err != nil {
		return 0, nil, err
	}
	return typ, bytes.NewReader(data), nil
}

func (c *Conn) readError(err, brokerErr error) error {
	if p := c.lost.Load(); p != nil {
		return *p
	}
	if brokerErr != nil {
		return brokerErr
	}
	select {
	case <-c.closed:
		return net.ErrClosed
	default:
	}
	if errors.Is(err, msgconn.ErrTooBig) {
		return errors.New("reach: the broker sent a message above 1 MiB")
	}
	return closeError(err)
}

// Read reads stream bytes.
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	case <-c.rdl.Wait():
		return 0, os.ErrDeadlineExceeded
	default:
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.cur) == 0 {
		select {
		case bp, ok := <-c.msgs:
			if !ok {
				return 0, c.readErr
			}
			c.cur, c.curBuf = *bp, bp
		case <-c.closed:
			return 0, net.ErrClosed
		case <-c.rdl.Wait():
			return 0, os.ErrDeadlineExceeded
		}
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	if len(c.cur) == 0 {
		chunkPool.Put(c.curBuf) // readLoop reslices what it takes
		c.cur, c.curBuf = nil, nil
	}
	return n, nil
}

// Write queues p for the writer goroutine and returns once all of it is
// queued (it waits only while the queue is full). Bytes queued while the
// writer is busy leave together, as one binary message of at most
// writeQueueBytes (128 KiB):
// an inner TLS connection writes each record of at most 16 KiB with its
// own Write, and as one message and one write(2) each they were most of
// the client's CPU per byte on an upload through the broker. A failed
// send is reported by the next Write (and ends the stream, as before).
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for {
		select {
		case <-c.closed:
			return n, net.ErrClosed
		case <-c.wdl.Wait():
			return n, os.ErrDeadlineExceeded
		default:
		}
		c.qmu.Lock()
		switch {
		case c.werr != nil:
			err := c.werr
			c.qmu.Unlock()
			return n, err
		case c.closing:
			c.qmu.Unlock()
			return n, net.ErrClosed
		case len(p) == 0:
			c.qmu.Unlock()
			return n, nil
		case c.q == nil && !c.sending && len(p) <= directWriteBytes:
			// A small write with nothing queued or in flight (a message
			// of an interactive exchange) is sent by the caller: no
			// hand-off to the writer on the round trip.
			c.sending = true
			c.qmu.Unlock()
			err := c.send(p)
			c.qmu.Lock()
			c.sending = false
			if err != nil && c.werr == nil {
				c.werr = err
			}
			c.qmu.Unlock()
			if err != nil {
				return n, err
			}
			return n + len(p), nil
		}
		// A p that fits in one message is queued whole: cut at the end of
		// a full queue, an inner TLS record left a tail of a few hundred
		// bytes that went out as a message of its own, and a broker or
		// connector reading 128 KiB and 200 B messages in turn sized each
		// large message's buffer after the small one before it (the
		// broker's and the front's CPU per MiB on an upload doubled).
		room := writeQueueBytes - c.queued()
		if len(p) <= writeQueueBytes && len(p) > room {
			room = 0
		}
		if room > 0 {
			if c.q == nil {
				c.q = queuePool.Get().(*[]byte)
			}
			k := min(room, len(p))
			*c.q = append(*c.q, p[:k]...)
			p, n = p[k:], n+k
			c.qmu.Unlock()
			signal(c.wready)
			continue
		}
		c.qmu.Unlock()
		select {
		case <-c.wspace:
		case <-c.closed:
		case <-c.wdl.Wait():
		case <-c.writerDone:
		}
	}
}

// queuePool holds write queues, one per stream while it has bytes queued.
var queuePool = sync.Pool{New: func() any {
	b := make([]byte, 0, writeQueueBytes)
	return &b
}}

func putQueue(q *[]byte) {
	*q = (*q)[:0]
	queuePool.Put(q)
}

// queued is the number of bytes waiting for the writer (c.qmu held).
func (c *Conn) queued() int {
	if c.q == nil {
		return 0
	}
	return len(*c.q)
}

// writeLoop is the only writer of stream bytes: it takes whatever is
// queued and sends it as one message. It ends once Close has let it drain
// the queue (or cut it), or a send failed.
func (c *Conn) writeLoop() {
	defer close(c.writerDone)
	for {
		c.qmu.Lock()
		q := c.q
		c.q = nil
		c.sending = q != nil
		closing, failed := c.closing, c.werr != nil
		c.qmu.Unlock()
		if q == nil {
			if closing || failed {
				return
			}
			select {
			case <-c.wready:
			case <-c.stopWriter:
			}
			continue
		}
		signal(c.wspace)
		err := c.send(*q)
		putQueue(q)
		c.qmu.Lock()
		c.sending = false
		c.qmu.Unlock()
		if err != nil {
			c.qmu.Lock()
			if c.werr == nil {
				c.werr = err
			}
			c.qmu.Unlock()
			signal(c.wspace) // a waiting Write returns the error
			return
		}
	}
}

// send writes b as one binary message (b is at most writeQueueBytes,
// below the 1 MiB message limit) through the gate: each 64 KiB fragment
// must leave within writeTimeout, however long the whole message takes, so
// a slow but moving path is never cut and a stalled one is. A write
// deadline set by the caller that fires during the message ends the
// stream: a partial message cannot be resumed.
func (c *Conn) send(b []byte) error {
	stop := c.cutAtDeadline()
	c.pause.Enter()
	err := c.gate.Write(msgconn.Binary, b, c.writeTimeout, nil)
	c.pause.Leave()
	if c.hookSent != nil {
		c.hookSent()
	}
	stop()
	if err == nil {
		return nil
	}
	switch {
	case isClosed(c.closed):
		return net.ErrClosed
	case isClosed(c.wdl.Wait()):
		return os.ErrDeadlineExceeded
	case errors.Is(err, msgconn.ErrWriteStalled):
		c.log.Warn().Dur("write_timeout", c.writeTimeout).Msg("broker took no stream bytes within the write timeout; dropping the stream")
		return fmt.Errorf("%w: the broker took no stream bytes for %v", ErrConnectionLost, c.writeTimeout)
	case isClosed(c.readerDone) && c.readErr == io.EOF:
		return fmt.Errorf("reach: the host ended the stream: %w", io.ErrClosedPipe)
	case isClosed(c.readerDone):
		return c.readErr
	default:
		return fmt.Errorf("%w: write: %v", ErrConnectionLost, err)
	}
}

// cutAtDeadline cuts the send that is starting once the caller's write
// deadline fires, until stop is called; without a deadline it costs
// nothing.
func (c *Conn) cutAtDeadline() (stop func()) {
	if !c.wdl.IsSet() {
		return func() {}
	}
	var mu sync.Mutex
	sending := true
	fired := c.wdl.Wait()
	done := make(chan struct{})
	go func() {
		select {
		case <-fired:
			mu.Lock()
			if sending {
				// Only a write still in progress: one that just
				// succeeded is not undone, and the next Write sees the
				// deadline itself.
				c.gate.CutWrite()
			}
			mu.Unlock()
			if c.hookDeadlineCut != nil {
				c.hookDeadlineCut()
			}
		case <-done:
		}
	}()
	return func() {
		mu.Lock()
		sending = false
		mu.Unlock()
		close(done)
	}
}

// flush stops new Writes and waits until the writer has sent what was
// queued, or failed, for at most closeFlushTimeout.
func (c *Conn) flush() {
	c.qmu.Lock()
	c.closing = true
	c.qmu.Unlock()
	close(c.stopWriter)
	signal(c.wspace) // a Write waiting for room returns net.ErrClosed
	t := time.NewTimer(closeFlushTimeout)
	defer t.Stop()
	select {
	case <-c.writerDone:
	case <-t.C:
	}
}

// Close sends what Write queued (for at most closeFlushTimeout), ends
// the stream with close 1000 and waits for the background goroutines. A
// second Close returns net.ErrClosed.
func (c *Conn) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		c.flush()
		close(c.closed)
		c.cancelAll()
		c.gate.Cut() // a Write blocked on a stalled broker returns now
		c.ws.Close(wire.CloseNormal, "")
		c.ws.CloseNow() // no-op unless the handshake failed half-way
		<-c.readerDone
		<-c.kaDone
		<-c.writerDone
	})
	if !first {
		return net.ErrClosed
	}
	return nil
}

func (c *Conn) SetDeadline(t time.Time) error {
	c.rdl.Set(t)
	c.wdl.Set(t)
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error  { c.rdl.Set(t); return nil }
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wdl.Set(t); return nil }

// keepalive pings the broker and drops the socket when a ping went out but
// no pong came back within the timeout. Like the broker, it forgives a
// missing pong while this side deliberately does not read (the caller has
// not taken the queued bytes) or while a data write is in progress (the
// broker's backpressure also holds back our ping).
func (c *Conn) keepalive() {
	defer close(c.kaDone)
	msgconn.Keepalive{
		Conn: c.ws, Interval: c.pingEvery, Timeout: c.pongWithin,
		Pause: &c.pause, Stop: c.readerDone,
		Dead: func() {
			lost := fmt.Errorf("%w: no pong within %v", ErrConnectionLost, c.pongWithin)
			c.lost.Store(&lost)
			c.log.Warn().Dur("pong_timeout", c.pongWithin).Msg("broker stopped answering pings; dropping the stream")
			c.ws.CloseNow()
		},
	}.Run(c.writeCtx)
}

// signal wakes the waiter of a capacity-1 channel without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
