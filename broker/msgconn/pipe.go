package msgconn

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// CloseAbnormal is what a peer sees when the socket is cut without a close
// frame (RFC 6455 1006).
const CloseAbnormal = 1006

// PipeConn is one end of an in-memory message pipe, the transport tests of
// the broker, the connector and the client run over (Pipe). It behaves
// like a WebSocket where it matters to them: messages keep their type and
// boundaries; each direction buffers a bounded number of messages, so a
// reader that stops reading blocks the writer (backpressure); pings are
// answered only while the peer reads, and the pong is seen only while this
// end reads; a close reaches the peer after the messages sent before it.
// Knobs let a test provoke what a real network does rarely.
type PipeConn struct {
	in          chan pipeMsg
	peer        *PipeConn
	sh          *pipeShared
	limit       atomic.Int64
	seq         atomic.Uint64
	noPong      atomic.Bool
	cutOnCancel atomic.Bool
	waiting     atomic.Int32
	limitHook   func(n int64)
	remote      string
	// lends: the slice Read returns is overwritten at the next Read, as
	// the WebSocket adapter's pooled buffer is, so a reader that keeps it
	// without copying corrupts what it kept. Only the single reader
	// touches last.
	lends bool
	last  []byte

	mu    sync.Mutex
	pongs map[uint64]chan struct{}
}

var _ Conn = (*PipeConn)(nil)

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

// Pipe returns two connected ends; each direction buffers capacity
// messages (at least 1). Their RemoteAddr is "pipe" until SetRemoteAddr.
func Pipe(capacity int) (a, b *PipeConn) {
	capacity = max(capacity, 1)
	sh := &pipeShared{gone: make(chan struct{})}
	a = &PipeConn{in: make(chan pipeMsg, capacity), sh: sh, remote: "pipe", pongs: map[uint64]chan struct{}{}}
	b = &PipeConn{in: make(chan pipeMsg, capacity), sh: sh, remote: "pipe", pongs: map[uint64]chan struct{}{}}
	a.peer, b.peer = b, a
	return a, b
}

// Peer is the other end.
func (p *PipeConn) Peer() *PipeConn { return p.peer }

// SetRemoteAddr sets what RemoteAddr reports. Call it before use.
func (p *PipeConn) SetRemoteAddr(addr string) { p.remote = addr }

// SetLends makes Read lend its slice like the WebSocket adapter: the next
// Read overwrites it. Set it on the end the code under test reads, before
// use, so code that keeps a read slice without copying fails its tests.
func (p *PipeConn) SetLends(on bool) { p.lends = on }

// SetNoPong makes this end ignore pings (it reads, never answers).
func (p *PipeConn) SetNoPong(on bool) { p.noPong.Store(on) }

// SetCutOnCancel makes a Write whose context ends while it waits cut the
// socket, like github.com/coder/websocket: the peer then sees 1006, not
// the close frame this end meant to send.
func (p *PipeConn) SetCutOnCancel(on bool) { p.cutOnCancel.Store(on) }

// BlockedWrites is the number of Write calls waiting for the peer's full
// buffer, so a test can know a write is in flight.
func (p *PipeConn) BlockedWrites() int { return int(p.waiting.Load()) }

// Unread is the number of messages (pings included) waiting in this end's
// buffer, and its capacity, so a test can know the peer's writes block.
func (p *PipeConn) Unread() (n, capacity int) { return len(p.in), cap(p.in) }

// OnSetReadLimit runs hook at every SetReadLimit, so a test can hold the
// code under test at that point. Call it before use.
func (p *PipeConn) OnSetReadLimit(hook func(n int64)) { p.limitHook = hook }

func (p *PipeConn) Read(ctx context.Context) (MessageType, []byte, error) {
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
				return 0, nil, &CloseError{Code: p.sh.code, Reason: p.sh.reason}
			}
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
		switch {
		case m.ping != 0:
			if !p.noPong.Load() {
				select { // a full peer buffer drops the pong, as a shortcut
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

func (p *PipeConn) Write(ctx context.Context, typ MessageType, data []byte) error {
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
			p.Close(CloseAbnormal, "")
		}
		return ctx.Err()
	}
}

func (p *PipeConn) Ping(ctx context.Context) error {
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

// Close closes both ends: each Read returns the messages already sent,
// then a *CloseError with code and reason.
func (p *PipeConn) Close(code int, reason string) error {
	p.sh.once.Do(func() {
		p.sh.code, p.sh.reason = code, reason
		close(p.sh.gone)
	})
	return nil
}

// CloseNow is Close with 1006, as a cut socket looks to the peer.
func (p *PipeConn) CloseNow() error { return p.Close(CloseAbnormal, "") }

func (p *PipeConn) SetReadLimit(n int64) {
	if p.limitHook != nil {
		p.limitHook(n)
	}
	p.limit.Store(n)
}

func (p *PipeConn) RemoteAddr() string { return p.remote }
