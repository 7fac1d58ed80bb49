package server

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// pipeConn is one end of an in-memory message pipe, the transport the unit
// tests drive Broker.Serve over. It behaves like a WebSocket where it
// matters to the broker: messages keep their type and boundaries; each
// direction buffers a bounded number of messages, so a reader that stops
// reading blocks the writer (backpressure); pings are answered only while
// the peer reads, and the pong is seen only while this end reads; a close
// reaches the peer after the messages sent before it.
type pipeConn struct {
	in     chan pipeMsg
	peer   *pipeConn
	sh     *pipeShared
	limit  atomic.Int64
	seq    atomic.Uint64
	noPong atomic.Bool // test knob: this end ignores pings
	// cutOnCancel is a test knob: like github.com/coder/websocket, a write
	// whose context ends while it waits cuts the socket (the peer sees
	// 1006, not the close frame the broker meant to send).
	cutOnCancel atomic.Bool
	// waiting counts Write calls blocked on the peer's full buffer, so a
	// test can know a write is in flight.
	waiting atomic.Int32
	// limitHook, when set before Serve starts, runs at every SetReadLimit:
	// a test can hold the broker at that point of a session.
	limitHook func(n int64)
	remote    string
	// lends makes this end behave like the WebSocket adapter: the slice
	// Read returns is valid only until the next Read, which overwrites it,
	// so a broker that queues it without copying corrupts the data tests.
	// Set on the broker's end; only its single reader touches last.
	lends bool
	last  []byte

	mu    sync.Mutex
	pongs map[uint64]chan struct{}
}

type pipeMsg struct {
	typ  MessageType
	data []byte
	ping uint64
	pong uint64
}

type pipeShared struct {
	once   sync.Once
	gone   chan struct{}
	code   int
	reason string
}

// closeError is what Read returns once the pipe is closed.
type closeError struct {
	Code   int
	Reason string
}

func (e *closeError) Error() string { return fmt.Sprintf("closed %d %q", e.Code, e.Reason) }

// newPipe returns two connected ends; each direction buffers capacity
// messages.
func newPipe(capacity int, remote string) (a, b *pipeConn) {
	sh := &pipeShared{gone: make(chan struct{})}
	a = &pipeConn{in: make(chan pipeMsg, capacity), sh: sh, remote: remote, pongs: map[uint64]chan struct{}{}}
	b = &pipeConn{in: make(chan pipeMsg, capacity), sh: sh, remote: "broker", pongs: map[uint64]chan struct{}{}, lends: true}
	a.peer, b.peer = b, a
	return a, b
}

func (p *pipeConn) Read(ctx context.Context) (MessageType, []byte, error) {
	for i := range p.last {
		p.last[i] ^= 0xa5
	}
	p.last = nil
	for {
		var m pipeMsg
		select {
		case m = <-p.in:
		case <-p.sh.gone:
			select {
			case m = <-p.in:
			default:
				return 0, nil, &closeError{Code: p.sh.code, Reason: p.sh.reason}
			}
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
		switch {
		case m.ping != 0:
			if !p.noPong.Load() {
				select { // a full peer buffer drops the pong, as a test shortcut
				case p.peer.in <- pipeMsg{pong: m.ping}:
				default:
				}
			}
			continue
		case m.pong != 0:
			p.mu.Lock()
			if ch := p.pongs[m.pong]; ch != nil {
				close(ch)
				delete(p.pongs, m.pong)
			}
			p.mu.Unlock()
			continue
		}
		if l := p.limit.Load(); l > 0 && int64(len(m.data)) > l {
			p.Close(1009, "")
			return 0, nil, fmt.Errorf("%w: %d bytes", ErrTooBig, len(m.data))
		}
		if p.lends {
			p.last = m.data
		}
		return m.typ, m.data, nil
	}
}

func (p *pipeConn) Write(ctx context.Context, typ MessageType, data []byte) error {
	select {
	case <-p.sh.gone:
		return net.ErrClosed
	default:
	}
	m := pipeMsg{typ: typ, data: append([]byte(nil), data...)}
	select {
	case p.peer.in <- m:
		return nil
	default:
	}
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	select {
	case p.peer.in <- m:
		return nil
	case <-p.sh.gone:
		return net.ErrClosed
	case <-ctx.Done():
		if p.cutOnCancel.Load() {
			p.Close(closeAbnormal, "")
		}
		return ctx.Err()
	}
}

// closeAbnormal is what a peer sees when the socket is cut without a close
// frame (RFC 6455 1006).
const closeAbnormal = 1006

func (p *pipeConn) Ping(ctx context.Context) error {
	id := p.seq.Add(1)
	ch := make(chan struct{})
	p.mu.Lock()
	p.pongs[id] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.pongs, id)
		p.mu.Unlock()
	}()
	select {
	case p.peer.in <- pipeMsg{ping: id}:
	case <-p.sh.gone:
		return net.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-p.sh.gone:
		return net.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *pipeConn) Close(code int, reason string) error {
	p.sh.once.Do(func() {
		p.sh.code, p.sh.reason = code, reason
		close(p.sh.gone)
	})
	return nil
}

func (p *pipeConn) SetReadLimit(n int64) {
	if p.limitHook != nil {
		p.limitHook(n)
	}
	p.limit.Store(n)
}

func (p *pipeConn) RemoteAddr() string { return p.remote }
