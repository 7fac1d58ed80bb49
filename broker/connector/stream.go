package connector

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// errStreamReset is what the front reads from a stream the connector cut
// (its reader made no progress, or the front could not take it).
var errStreamReset = errors.New("reach: stream reset")

// errStreamClosed is what the front gets when it writes to a stream the
// broker already finished (CLOSE, or the registration ended).
var errStreamClosed = errors.New("reach: stream closed by the broker")

// stream is one broker stream as the front sees it: an in-memory net.Conn
// whose bytes are the client's inner TLS connection. The front wraps it in
// its TLS listener like a TCP connection.
//
// Inbound bytes (broker → front) sit in in, guarded by mu. Outbound bytes
// (front → broker) sit in out and are framed by the session's writer; they
// and the scheduling flags are guarded by the session's mu, because the
// writer picks among all streams under that lock. Lock order: session.mu,
// then stream.mu.
type stream struct {
	s  *session
	id wire.ID

	mu       sync.Mutex
	in       bytes.Buffer
	readErr  error // no more inbound bytes will come: io.EOF or errStreamReset
	closed   bool  // the front called Close
	readable chan struct{}
	space    chan struct{} // the front read something: the session reader may go on
	progress atomic.Int64  // UnixNano of the front's last read
	// recv is the broker's credit for this stream under the credit
	// extension, granted back as the front reads (guarded by mu).
	recv wire.RecvWindow

	closeOnce sync.Once
	closedCh  chan struct{} // closed by Close
	finCh     chan struct{} // closed once the session is done with the stream
	rd, wd    *msgconn.Deadline

	// Guarded by s.mu.
	out          bytes.Buffer
	outSpace     chan struct{}
	msgconn.Turn      // queued in s.rr
	closePending bool // send CLOSE once out is drained
	finished     bool // CLOSE sent or received, or the registration ended
	// The credit extension: set at open when the registration agreed.
	credit      bool
	sendWin     wire.Window // our credit for front→broker DATA
	grant       uint32      // WINDOW increment waiting in s.grants
	grantQueued bool
}

func newStream(s *session, id wire.ID) *stream {
	st := &stream{
		s: s, id: id, credit: s.credit,
		readable: make(chan struct{}, 1),
		space:    make(chan struct{}, 1),
		outSpace: make(chan struct{}, 1),
		closedCh: make(chan struct{}),
		finCh:    make(chan struct{}),
		rd:       msgconn.NewDeadline(),
		wd:       msgconn.NewDeadline(),
	}
	st.progress.Store(time.Now().UnixNano())
	if st.credit {
		st.sendWin = wire.NewWindow()
		st.recv = wire.NewRecvWindow()
	}
	return st
}

func (st *stream) Read(p []byte) (int, error) {
	for {
		select {
		case <-st.rd.Wait():
			return 0, os.ErrDeadlineExceeded
		default:
		}
		st.mu.Lock()
		if st.closed {
			st.mu.Unlock()
			return 0, net.ErrClosed
		}
		if st.in.Len() > 0 {
			n, _ := st.in.Read(p)
			more := st.in.Len() > 0
			st.progress.Store(time.Now().UnixNano())
			var grant uint32
			if st.credit {
				st.recv.Consumed(n)
				// Auto-tuning first (up to the buffer), then the drained
				// bytes: both count in the window, so the sum stays in it.
				grant = st.recv.Grow(int64(st.s.c.cfg.StreamBufferBytes), wire.MaxWindow)
				grant += st.recv.DueEvery(st.s.grantEvery, wire.MaxWindow)
			}
			st.mu.Unlock()
			signal(st.space)
			if more {
				signal(st.readable)
			}
			if grant > 0 {
				st.s.queueGrant(st, grant)
			}
			return n, nil
		}
		if err := st.readErr; err != nil {
			st.mu.Unlock()
			return 0, err
		}
		st.mu.Unlock()
		if len(p) == 0 {
			return 0, nil
		}
		select {
		case <-st.readable:
		case <-st.rd.Wait():
		case <-st.closedCh:
		}
	}
}

func (st *stream) Write(p []byte) (int, error) {
	s := st.s
	n := 0
	for {
		select {
		case <-st.wd.Wait():
			return n, os.ErrDeadlineExceeded
		default:
		}
		s.mu.Lock()
		switch {
		case st.closePending && !st.finished:
			s.mu.Unlock()
			return n, net.ErrClosed
		case st.finished:
			s.mu.Unlock()
			select {
			case <-st.closedCh:
				return n, net.ErrClosed
			default:
				return n, errStreamClosed
			}
		}
		if len(p) == 0 {
			s.mu.Unlock()
			return n, nil
		}
		if room := s.c.cfg.StreamSendBytes - st.out.Len(); room > 0 {
			k := min(room, len(p))
			st.out.Write(p[:k])
			p, n = p[k:], n+k
			s.scheduleLocked(st)
			s.mu.Unlock()
			signal(s.wake)
			continue
		}
		s.mu.Unlock()
		select {
		case <-st.outSpace:
		case <-st.wd.Wait():
		case <-st.closedCh:
		case <-st.finCh:
		}
	}
}

// Close finishes the stream from the front's side: bytes already written
// still go out, then CLOSE. It never blocks on the broker.
func (st *stream) Close() error {
	first := false
	st.closeOnce.Do(func() {
		first = true
		close(st.closedCh)
	})
	if !first {
		return nil
	}
	st.mu.Lock()
	st.closed = true
	st.in.Reset()
	st.mu.Unlock()
	signal(st.space)
	st.s.closeLocal(st, false)
	return nil
}

func (st *stream) LocalAddr() net.Addr  { return streamAddr{"host"} }
func (st *stream) RemoteAddr() net.Addr { return streamAddr{st.id.String()} }

func (st *stream) SetDeadline(t time.Time) error {
	st.rd.Set(t)
	st.wd.Set(t)
	return nil
}
func (st *stream) SetReadDeadline(t time.Time) error  { st.rd.Set(t); return nil }
func (st *stream) SetWriteDeadline(t time.Time) error { st.wd.Set(t); return nil }

// endInbound records that no more inbound bytes will arrive; buffered ones
// are still read first (io.EOF) unless the stream was reset.
func (st *stream) endInbound(err error) {
	st.mu.Lock()
	if st.readErr == nil || err == errStreamReset {
		st.readErr = err
	}
	if err == errStreamReset {
		st.in.Reset()
	}
	st.mu.Unlock()
	signal(st.readable)
	signal(st.space)
}

// streamAddr is the synthetic address of a broker stream. It is not an IP
// address on purpose: the front then adds no X-Forwarded-For, and only the
// listener (never a header) says where the connection came from.
type streamAddr struct{ id string }

func (a streamAddr) Network() string { return "reach" }
func (a streamAddr) String() string  { return "reach:" + a.id }

// signal wakes one waiter of a capacity-1 channel without blocking.
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

// listener hands accepted streams to the front. Its queue holds at most
// MaxStreams streams; an `open` that does not fit, or that arrives after
// Close, is a local failure and answered with CLOSE.
type listener struct {
	mu     sync.Mutex
	ch     chan *stream
	closed chan struct{}
	done   bool
}

func newListener(n int) *listener {
	return &listener{ch: make(chan *stream, n), closed: make(chan struct{})}
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		select {
		case st := <-l.ch:
			if st.takeForAccept() {
				return st, nil
			}
			// The stream ended while queued; the session already counted it.
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
}

func (l *listener) Close() error {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return nil
	}
	l.done = true
	close(l.closed)
	var queued []*stream
	for {
		select {
		case st := <-l.ch:
			queued = append(queued, st)
			continue
		default:
		}
		break
	}
	l.mu.Unlock()
	for _, st := range queued {
		st.s.reset(st, "listener closed")
	}
	return nil
}

func (l *listener) Addr() net.Addr { return streamAddr{"listener"} }

// offer queues st for Accept without blocking.
func (l *listener) offer(st *stream) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return false
	}
	select {
	case l.ch <- st:
		return true
	default:
		return false
	}
}

// takeForAccept marks a queued stream as handed to the front, unless the
// connector reset it meanwhile. A stream the broker already finished is
// still handed over: the front reads the bytes that arrived, then EOF.
func (st *stream) takeForAccept() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.readErr != errStreamReset
}

var _ io.ReadWriteCloser = (*stream)(nil)
