package msgconn

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// WriteGate is the write side of a socket's single writer: every write is
// bounded by a timeout (per 64 KiB fragment on the WebSocket adapter,
// whose writeWatch restarts at each), and Cut, from any goroutine, ends the write in
// progress and every later one as a context ending would.
//
// On the WebSocket adapter this costs no context, timer or allocation per
// write: the socket's one lazily armed timer watches the deadline of the
// write in progress (writeWatch), and Cut closes the socket under a write in
// progress, which is what the library does when a write's context ends. A
// small message relayed by the broker used to cost a context with a
// timeout, its timer and the library's watch of it on every write. Other
// transports (Pipe) get a context per write, as before.
type WriteGate struct {
	c     Conn
	tw    timedWriter // c's, nil when it has none
	state atomic.Int32
	one   [1][]byte // the writer's: Write's message as WriteParts's one part

	mu     sync.Mutex         // the fallback's: cancel and the cut
	cancel context.CancelFunc // the fallback write in progress's
}

const (
	gateIdle = iota
	gateWriting
	gateCut
)

// timedWriter is a transport that bounds a write by a duration itself and
// sends a message given in parts without joining them.
type timedWriter interface {
	writeWithin(typ MessageType, parts [][]byte, timeout time.Duration, progress func()) error
	sendHeldWithin(timeout time.Duration) error
}

// NewWriteGate returns the gate of c's single writer.
func NewWriteGate(c Conn) *WriteGate {
	g := &WriteGate{c: c}
	g.tw, _ = c.(timedWriter)
	return g
}

// Write sends one message within timeout (per fragment on the WebSocket
// adapter); progress, when set, is called after each fragment the peer
// accepted (once, after the whole message, on other transports).
func (g *WriteGate) Write(typ MessageType, data []byte, timeout time.Duration, progress func()) error {
	if g.tw == nil {
		return g.fallback(timeout, func(ctx context.Context) error {
			err := g.c.Write(ctx, typ, data)
			if err == nil && progress != nil {
				progress()
			}
			return err
		})
	}
	// One part, in the gate's own slice: a fresh one would escape to the
	// heap through the transport's interface on every message.
	g.one[0] = data
	err := g.WriteParts(typ, g.one[:], timeout, progress)
	g.one[0] = nil
	return err
}

// JoinsParts reports whether WriteParts has to copy the parts into one
// buffer first (transports other than the WebSocket adapter): a caller
// holding pieces of a message then gains nothing over joining them itself.
func (g *WriteGate) JoinsParts() bool { return g.tw == nil }

// WriteParts sends parts, in order, as one message, as Write does. On the
// WebSocket adapter no byte is copied to join them: each part leaves as
// fragments of its own (64 KiB at most), each bounded by timeout and
// followed by progress; elsewhere they are joined into one buffer first.
func (g *WriteGate) WriteParts(typ MessageType, parts [][]byte, timeout time.Duration, progress func()) error {
	if g.tw == nil {
		var n int
		for _, p := range parts {
			n += len(p)
		}
		data := make([]byte, 0, n)
		for _, p := range parts {
			data = append(data, p...)
		}
		return g.Write(typ, data, timeout, progress)
	}
	if !g.begin() {
		return net.ErrClosed
	}
	err := g.tw.writeWithin(typ, parts, timeout, progress)
	g.end()
	return err
}

// SendHeld ends a Batcher's HoldWrites within timeout. c must be a
// Batcher.
func (g *WriteGate) SendHeld(timeout time.Duration) error {
	if g.tw == nil {
		return g.fallback(timeout, g.c.(Batcher).SendHeld)
	}
	if !g.begin() {
		return net.ErrClosed
	}
	err := g.tw.sendHeldWithin(timeout)
	g.end()
	return err
}

// Cut ends the write in progress, if any, and every later one: on the
// WebSocket by closing the socket (the peer sees 1006), elsewhere by
// ending the write's context.
func (g *WriteGate) Cut() {
	if g.tw == nil {
		g.mu.Lock()
		g.state.Store(gateCut)
		if g.cancel != nil {
			g.cancel()
		}
		g.mu.Unlock()
		return
	}
	if g.state.Swap(gateCut) == gateWriting {
		g.c.CloseNow()
	}
}

// CutWrite cuts the write in progress, if any, and with it every later
// one, as Cut does; on a gate with no write in progress it does nothing,
// so a caller's deadline that fires just after a write succeeded does not
// end the socket (the caller checks its deadline before the next write).
func (g *WriteGate) CutWrite() {
	if g.tw == nil {
		g.mu.Lock()
		if g.cancel != nil {
			g.state.Store(gateCut)
			g.cancel()
		}
		g.mu.Unlock()
		return
	}
	if g.state.CompareAndSwap(gateWriting, gateCut) {
		g.c.CloseNow()
	}
}

// CutWhen cuts the gate and closes its socket once ctx ends: the write in
// progress and the reader's wait end, as they would under a context per
// call, while the reader reads under one that never ends. stop undoes it
// (context.AfterFunc).
func (g *WriteGate) CutWhen(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		g.Cut()
		g.c.CloseNow()
	})
}

// begin starts a write on a timedWriter; once cut, it closes the socket
// and says no, as a write under an ended context does.
func (g *WriteGate) begin() bool {
	if g.state.CompareAndSwap(gateIdle, gateWriting) {
		return true
	}
	g.c.CloseNow()
	return false
}

func (g *WriteGate) end() { g.state.CompareAndSwap(gateWriting, gateIdle) }

// fallback runs write under a context with timeout, ended by Cut (at once
// when the gate is already cut, so the transport decides, as it did for a
// write under an ended context).
func (g *WriteGate) fallback(timeout time.Duration, write func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	g.mu.Lock()
	if g.state.Load() == gateCut {
		cancel()
	} else {
		g.cancel = cancel
	}
	g.mu.Unlock()
	err := write(ctx)
	g.mu.Lock()
	g.cancel = nil
	g.mu.Unlock()
	return err
}

// writeWatch is a socket's write deadline without a timer per write: begin
// records the deadline of the write in progress, end clears it, and one
// timer, armed by the first begin and re-armed only while writes go on,
// cuts the socket once a write is still in progress past its deadline. An
// idle socket's timer has fired and was dropped: it holds none.
type writeWatch struct {
	deadline atomic.Int64 // monotonic ns (mono) of the write in progress; 0: none
	armed    atomic.Bool
	cut      atomic.Bool  // the timer cut the socket (ErrWriteStalled)
	mu       sync.Mutex   // t, at
	t        *time.Timer  // fires at at (mono) while armed
	at       atomic.Int64 // when the armed timer fires (mono)
}

// epoch is the origin of mono: time.Since reads the monotonic clock, so a
// wall-clock step never cuts a write nor spares one.
var epoch = time.Now()

func mono() int64 { return int64(time.Since(epoch)) + 1 }

// closer is what a writeWatch cuts: the library's connection.
type closer interface{ CloseNow() error }

// begin records a write (or a fragment) on c that must be done within d.
func (w *writeWatch) begin(d time.Duration, c closer) {
	dl := mono() + int64(d)
	w.deadline.Store(dl)
	// A deadline before the armed timer's (a shorter timeout than an
	// earlier write's) moves the timer up.
	if w.armed.CompareAndSwap(false, true) || dl < w.at.Load() {
		w.arm(d, c)
	}
}

func (w *writeWatch) end() { w.deadline.Store(0) }

// stalled marks err as the watch's when the watch cut the socket.
func (w *writeWatch) stalled(err error) error {
	if err != nil && w.cut.Load() {
		return fmt.Errorf("%w (%v)", ErrWriteStalled, err)
	}
	return err
}

func (w *writeWatch) arm(d time.Duration, c closer) {
	w.mu.Lock()
	w.at.Store(mono() + int64(d))
	if w.t == nil {
		w.t = time.AfterFunc(d, func() {
			if w.fire(c) {
				w.cut.Store(true)
				c.CloseNow()
			}
		})
	} else {
		w.t.Reset(d)
	}
	w.mu.Unlock()
}

// fire is the timer's: it reports whether the write in progress is past
// its deadline (the caller cuts the socket), re-arms for a write still
// running, and disarms once none is.
func (w *writeWatch) fire(c closer) (late bool) {
	for {
		dl := w.deadline.Load()
		if dl == 0 {
			w.disarm()
			// A write that began meanwhile saw the timer armed and left
			// it to this call.
			if w.deadline.Load() == 0 || !w.armed.CompareAndSwap(false, true) {
				return false
			}
			continue
		}
		left := dl - mono()
		if left <= 0 {
			w.disarm()
			return true
		}
		w.arm(time.Duration(left), c)
		return false
	}
}

// disarm drops the fired timer (the next begin makes another), so a
// socket between bursts of writes keeps none.
func (w *writeWatch) disarm() {
	w.mu.Lock()
	w.t = nil
	w.armed.Store(false)
	w.mu.Unlock()
}
