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

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/internal/wsmsg"
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

// closeError maps a WebSocket read error that carries a close frame.
func closeError(err error) error {
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		return fmt.Errorf("%w: %v", ErrConnectionLost, err)
	}
	if ce.Code == websocket.StatusNormalClosure {
		return io.EOF
	}
	return &CloseError{Code: int(ce.Code), Reason: ce.Reason}
}

// Conn is one matched broker stream as a net.Conn of raw bytes.
//
//   - Write sends binary messages of at most 1 MiB; larger buffers are
//     split. A write deadline that fires in the middle of a message ends
//     the stream (a partial WebSocket message cannot be resumed), like a
//     timed-out write on a tls.Conn.
//   - Read returns io.EOF after the broker's close 1000 (the host sent
//     CLOSE), a *CloseError for any other close code, a *wire.Error when the
//     broker sent an `error` first, and an error wrapping ErrConnectionLost
//     when the connection broke without a close.
//   - A background reader keeps reading the socket (so pings are answered
//     while the caller does something else) into a bounded queue.
//   - Close ends the stream with close 1000; the broker then sends CLOSE to
//     the host. There is no half-close: the protocol has none.
type Conn struct {
	ws       *websocket.Conn
	streamID wire.ID
	local    net.Addr
	remote   net.Addr
	log      zerolog.Logger

	msgs       chan []byte   // filled by readLoop, closed when it ends
	readErr    error         // why readLoop ended; written before msgs is closed
	readerDone chan struct{} // closed when readLoop returned
	lost       atomic.Pointer[error]

	rmu sync.Mutex // serializes Read; guards cur
	cur []byte

	wmu  sync.Mutex // serializes Write; guards werr
	werr error

	rdl, wdl *deadline

	closed     chan struct{}
	closeOnce  sync.Once
	writeCtx   context.Context // ends on Close, so a blocked Write returns
	cancelAll  context.CancelFunc
	pause      pauseState
	kaDone     chan struct{}
	progress   atomic.Uint64 // messages moved either way, for the keepalive
	pingEvery  time.Duration
	pongWithin time.Duration
}

var _ net.Conn = (*Conn)(nil)

func newConn(ws *websocket.Conn, sid wire.ID, local, remote net.Addr, cfg Config, log zerolog.Logger) *Conn {
	c := &Conn{
		ws:         ws,
		streamID:   sid,
		local:      local,
		remote:     remote,
		log:        log.With().Str("stream_id", sid.String()).Logger(),
		msgs:       make(chan []byte, readQueueMessages),
		readerDone: make(chan struct{}),
		rdl:        newDeadline(),
		wdl:        newDeadline(),
		closed:     make(chan struct{}),
		kaDone:     make(chan struct{}),
		pingEvery:  cfg.PingInterval,
		pongWithin: cfg.PongTimeout,
	}
	if c.local == nil {
		c.local = brokerAddr("local")
	}
	if c.remote == nil {
		c.remote = brokerAddr("broker")
	}
	c.writeCtx, c.cancelAll = context.WithCancel(context.Background())
	go c.readLoop()
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

// maxReaderRetries bounds how often in a row readLoop resumes after the
// library gave up answering a ping (see readLoop).
const maxReaderRetries = 16

func (c *Conn) readLoop() {
	defer close(c.readerDone)
	defer close(c.msgs)
	var brokerErr error // an `error` message announcing the close
	retries := 0
	// Each message is lent until the next one: only a copy of the bytes
	// is queued for Read.
	var rd wsmsg.Reader
	defer rd.Release()
	for {
		typ, r, err := c.ws.Reader(context.Background())
		if err != nil {
			// The library answers a ping while reading and waits at most
			// 5 s for the write lock; behind a data write blocked by the
			// broker's backpressure that fails without harming the
			// socket. Resume: if the socket is really gone, the next
			// Reader says so.
			if errors.Is(err, context.DeadlineExceeded) && retries < maxReaderRetries {
				retries++
				continue
			}
			c.readErr = c.readError(err, brokerErr)
			return
		}
		retries = 0
		data, err := rd.ReadAll(r) // bounded by SetReadLimit
		if err != nil {
			c.readErr = c.readError(err, brokerErr)
			return
		}
		if typ == websocket.MessageText {
			m, err := wire.ParseBrokerMessage(data)
			if em, ok := m.(wire.ErrorMsg); ok && err == nil {
				brokerErr = &wire.Error{Code: em.Code, Detail: "the broker ended the stream"}
				continue // the close follows
			}
			c.readErr = errors.New("reach: the broker sent a control message on a matched stream")
			c.ws.CloseNow()
			return
		}
		if len(data) == 0 {
			continue
		}
		c.progress.Add(1)
		c.pause.enter()
		select {
		case c.msgs <- bytes.Clone(data):
			c.pause.leave()
		case <-c.closed:
			c.pause.leave()
			c.readErr = net.ErrClosed
			return
		}
	}
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
	if errors.Is(err, websocket.ErrMessageTooBig) {
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
	case <-c.rdl.wait():
		return 0, os.ErrDeadlineExceeded
	default:
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.cur) == 0 {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				return 0, c.readErr
			}
			c.cur = m
		case <-c.closed:
			return 0, net.ErrClosed
		case <-c.rdl.wait():
			return 0, os.ErrDeadlineExceeded
		}
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}

// Write sends p as binary messages of at most 1 MiB each.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	case <-c.wdl.wait():
		return 0, os.ErrDeadlineExceeded
	default:
	}
	if c.werr != nil {
		return 0, c.werr
	}
	ctx := c.writeCtx
	if c.wdl.isSet() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		fired := c.wdl.wait()
		go func() {
			select {
			case <-fired:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	c.pause.enter()
	defer c.pause.leave()
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), wire.MaxClientFrame)]
		if err := c.ws.Write(ctx, websocket.MessageBinary, chunk); err != nil {
			switch {
			case isClosed(c.closed):
				c.werr = net.ErrClosed
			case isClosed(c.wdl.wait()):
				c.werr = os.ErrDeadlineExceeded
			case isClosed(c.readerDone) && c.readErr == io.EOF:
				c.werr = fmt.Errorf("reach: the host ended the stream: %w", io.ErrClosedPipe)
			case isClosed(c.readerDone):
				c.werr = c.readErr
			default:
				c.werr = fmt.Errorf("%w: write: %v", ErrConnectionLost, err)
			}
			return n, c.werr
		}
		c.progress.Add(1)
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// Close ends the stream with close 1000 and waits for the background
// goroutines. A second Close returns net.ErrClosed.
func (c *Conn) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		close(c.closed)
		c.cancelAll() // a Write blocked on a stalled broker returns now
		c.ws.Close(websocket.StatusNormalClosure, "")
		c.ws.CloseNow() // no-op unless the handshake failed half-way
		<-c.readerDone
		<-c.kaDone
	})
	if !first {
		return net.ErrClosed
	}
	return nil
}

func (c *Conn) SetDeadline(t time.Time) error {
	c.rdl.set(t)
	c.wdl.set(t)
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error  { c.rdl.set(t); return nil }
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wdl.set(t); return nil }

// keepalive pings the broker and drops the socket when a ping went out but
// no pong came back within the timeout. Like the broker, it forgives a
// missing pong while this side deliberately does not read (the caller has
// not taken the queued bytes) or while a data write is in progress (the
// broker's backpressure also holds back our ping).
func (c *Conn) keepalive() {
	defer close(c.kaDone)
	last := time.Now()
	t := time.NewTimer(c.pingEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.closed:
			return
		case <-c.readerDone:
			return
		}
		e0, p0 := c.pause.epoch.Load(), c.progress.Load()
		if c.pause.n.Load() > 0 {
			last = time.Now()
			t.Reset(c.pingEvery)
			continue
		}
		ctx, cancel := context.WithDeadline(c.writeCtx, last.Add(c.pongWithin))
		err := c.pingUntil(ctx)
		cancel()
		switch {
		case err == nil || c.pause.epoch.Load() != e0 || c.pause.n.Load() > 0 || c.progress.Load() != p0:
			last = time.Now()
		case isClosed(c.closed):
			return
		default:
			lost := fmt.Errorf("%w: no pong within %v", ErrConnectionLost, c.pongWithin)
			c.lost.Store(&lost)
			c.log.Warn().Dur("pong_timeout", c.pongWithin).Msg("broker stopped answering pings; dropping the stream")
			c.ws.CloseNow()
			return
		}
		t.Reset(c.pingEvery)
	}
}

// pingUntil retries while the library's internal 5 s wait for the write
// lock times out; only ctx decides when the pong is overdue.
func (c *Conn) pingUntil(ctx context.Context) error {
	for {
		err := c.ws.Ping(ctx)
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// pauseState records when this side deliberately does not read or is
// inside a data write, so the keepalive does not blame the broker for it.
type pauseState struct {
	n     atomic.Int32
	epoch atomic.Uint64
}

func (p *pauseState) enter() { p.n.Add(1); p.epoch.Add(1) }
func (p *pauseState) leave() { p.n.Add(-1) }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// deadline is a settable, resettable deadline whose channel closes when it
// passes (the net.Pipe technique).
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{}
	armed  bool
}

func newDeadline() *deadline { return &deadline{cancel: make(chan struct{})} }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait until its callback closed cancel
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	d.armed = !t.IsZero()
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		ch := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func (d *deadline) isSet() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.armed
}
