package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// stream is one matched client socket and its share of the host's socket.
type stream struct {
	b      *Broker
	id     wire.ID
	h      *hostSession
	conn   msgconn.Conn
	digest wire.Digest
	kind   wire.Kind
	pause  msgconn.Pause

	// lastActive is when the last payload byte moved either way (Unix ns);
	// lastProgress when the client last accepted a chunk.
	lastActive   atomic.Int64
	lastProgress atomic.Int64

	done chan struct{} // closed once the end is decided

	// The writer's: the session's context (set before it starts), and,
	// writer-only, whether `matched` or a later write failed (flushing is
	// pointless then) and whether the close is done.
	ctx              context.Context
	broken, finished bool
	writerDone       chan struct{} // closed once the writer closed the socket
	downWake         *writer       // runs writeLoop: client-bound data or the end arrived
	gate             *msgconn.WriteGate
	progress         func()        // madeProgress, for the gate (made once)
	downSpace        chan struct{} // capacity 1: client-bound queue shrank
	upCredit         chan struct{} // capacity 1: the host granted credit

	// Guarded by h.mu.
	up           [][]byte // host-bound frames, header included
	upBytes      int
	upClose      bool     // send CLOSE to the host once up is written
	msgconn.Turn          // queued in h.rr
	down         [][]byte // client-bound payloads
	downBytes    int
	writing      bool // the writer is in a write: an end with cancel cuts it
	end          *streamEnd

	// The credit extension (guarded by h.mu). upSent counts the payload
	// bytes sent to the host in either mode, so a stream opened before the
	// host agreed starts its window net of them.
	credit      bool
	upWin       wire.Window     // the host's credit for client→host DATA
	upSent      int64           // payload bytes sent to the host
	upPayload   int             // payload bytes queued in up
	upRehead    bool            // up[0] is the rest of a frame cut to the credit: rewrite its header
	downWin     wire.RecvWindow // what the host may still send, and what the client drained
	grant       uint32          // WINDOW increment waiting in h.grants
	grantQueued bool
	dueQueued   bool // in h.due
}

// streamEnd says how a stream ends.
type streamEnd struct {
	code   int    // WebSocket close code for the client
	reason string // close reason (fixed text)
	// errMsg, when set, is sent to the client as an error message first.
	errMsg wire.Code
	// flush delivers the client-bound data already queued before closing
	// (the host's CLOSE, or the host going away).
	flush bool
	// toHost sends CLOSE to the host after the host-bound data already
	// accepted; dropUp discards that data first (revoke).
	toHost bool
	dropUp bool
	// cancel cuts a write to the client in progress (it is stuck or gone).
	cancel bool
	stat   string // counted outcome label
}

func (b *Broker) newStream(id wire.ID, h *hostSession, c msgconn.Conn, cred store.Credential) *stream {
	s := &stream{
		b:          b,
		id:         id,
		h:          h,
		conn:       c,
		digest:     cred.Digest,
		kind:       cred.Kind,
		done:       make(chan struct{}),
		writerDone: make(chan struct{}),
		downSpace:  make(chan struct{}, 1),
		upCredit:   make(chan struct{}, 1),
	}
	s.downWake = newWriter(s.writeLoop) // run starts it
	s.gate = msgconn.NewWriteGate(c)
	s.progress = s.madeProgress
	now := time.Now().UnixNano()
	s.lastActive.Store(now)
	s.lastProgress.Store(now)
	return s
}

// logged adds the stream's id to one of its host logger's events: a
// stream does not keep a logger of its own (112 bytes and its hook, for
// the three events a stream may log in its life). nil: the level is off.
func (s *stream) logged(e *zerolog.Event) *zerolog.Event {
	if e == nil {
		return nil
	}
	return e.Str("stream_id", s.id.String())
}

func (s *stream) touch() { s.lastActive.Store(time.Now().UnixNano()) }

// run sends `matched` and relays the stream until it ends.
func (s *stream) run(ctx context.Context) {
	b := s.b
	// `matched` goes out even when the stream already ended (the host
	// answered CLOSE right after `open`, or went away): the client was
	// matched, and it must see `matched` before the host's bytes and the
	// close, or it cannot tell a finished stream from a refused one.
	msg, _ := wire.Marshal(wire.Matched{StreamID: s.id})
	wctx, cancel := context.WithTimeout(ctx, b.cfg.WriteTimeout)
	err := s.conn.Write(wctx, msgconn.Text, msg)
	cancel()
	s.broken = err != nil
	if s.broken {
		b.endStream(s, streamEnd{code: wire.CloseGoingAway, toHost: true, cancel: true, stat: "client_gone"})
	}
	s.ctx = ctx
	// The reader reads under a context that never ends, so the transport
	// watches none per message; ctx ending cuts the socket instead.
	stopCut := s.gate.CutWhen(ctx)
	if o, ok := s.conn.(msgconn.Owner); ok {
		o.SetReadHeadroom(wire.HeaderLen) // framesUp writes the header there
	}
	s.downWake.start()
	stopKeepalive := b.keepalive(s.conn, &s.pause, s.done, func() {
		b.endStream(s, streamEnd{code: wire.CloseGoingAway, reason: "ping timeout", toHost: true, cancel: true, stat: "ping_timeout"})
	}).Start(ctx)
	idle := startIdleTimer(b.cfg.IdleTimeout, s.idleCheck)
	s.readLoop(ctx)
	// The reader returns once the end is decided, except when ctx ended.
	b.endStream(s, streamEnd{code: wire.CloseGoingAway, toHost: true, cancel: true})
	stopKeepalive()
	idle.stop()
	<-s.writerDone
	stopCut()
	s.logged(s.h.log.Debug()).Int("close_code", s.end.code).Str("reason", s.end.reason).Msg("stream ended")
}

// readLoop reads the client's binary messages and queues them for the host.
func (s *stream) readLoop(ctx context.Context) {
	b := s.b
	for {
		if !s.awaitCredit(ctx) {
			return
		}
		typ, data, err := s.conn.Read(context.Background()) // run's stopCut cuts it
		if err != nil {
			if errors.Is(err, msgconn.ErrTooBig) {
				b.endStream(s, streamEnd{code: wire.CloseTooBig, toHost: true, stat: "too_big"})
			} else {
				b.endStream(s, streamEnd{code: wire.CloseNormal, toHost: true, cancel: true, stat: "client_closed"})
			}
			return
		}
		select {
		case <-s.done:
			return
		default:
		}
		switch {
		case typ != msgconn.Binary:
			b.endStream(s, streamEnd{code: wire.ClosePolicy, errMsg: wire.CodeUnauthorized, toHost: true, stat: "client_text"})
			return
		case len(data) > wire.MaxClientFrame:
			b.endStream(s, streamEnd{code: wire.CloseTooBig, toHost: true, stat: "too_big"})
			return
		case len(data) == 0:
			continue // carries no bytes; DATA may not be empty
		}
		s.touch()
		// SplitData copies data into new frames, so the transport may
		// reuse its read buffer.
		if !s.enqueueUp(ctx, data) {
			return
		}
	}
}

// awaitCredit holds the client's socket unread while its stream runs under
// credit and the host's credit is all spoken for by bytes already queued:
// the client is paused by TCP, the host socket never is. Plain-v1 streams
// pass at once.
func (s *stream) awaitCredit(ctx context.Context) bool {
	h := s.h
	paused := false
	for {
		h.mu.Lock()
		ended := s.end != nil
		ok := !s.credit || s.upWin.Avail() > s.upPayload
		h.mu.Unlock()
		switch {
		case ended:
			return false
		case ok:
			return true
		}
		if !paused {
			paused = true
			s.b.count("paused:credit")
		}
		s.pause.Enter()
		select {
		case <-s.upCredit:
		case <-s.done:
		case <-ctx.Done():
		}
		s.pause.Leave()
		if ctx.Err() != nil {
			return false
		}
	}
}

// enqueueUp queues one client message as DATA frames for the host. When
// the stream's queue (32 frames, 8 MiB), the host's queues (8 MiB) or the
// broker's budget is full, it waits — this client's socket is not read
// meanwhile — and never closes the stream for it.
func (s *stream) enqueueUp(ctx context.Context, data []byte) bool {
	b, h := s.b, s.h
	var into [2][]byte // a message is at most two frames unless SplitData's
	frames := s.framesUp(data, into[:0])
	n := len(data) + wire.HeaderLen*len(frames)
	paused := false
	for {
		h.mu.Lock()
		if s.end != nil {
			h.mu.Unlock()
			return false
		}
		streamFits := len(s.up) == 0 ||
			(len(s.up)+len(frames) <= b.cfg.StreamQueueFrames && s.upBytes+n <= b.cfg.StreamQueueBytes)
		hostFits := h.upBytes == 0 || h.upBytes+n <= b.cfg.HostQueueBytes
		var wait <-chan struct{}
		if streamFits && hostFits {
			ok, ch := b.budget.acquire(n)
			if ok {
				s.up = append(s.up, frames...)
				s.upBytes += n
				s.upPayload += len(data)
				h.upBytes += n
				h.rr.Add(s)
				h.mu.Unlock()
				h.wake.kick()
				return true
			}
			wait = ch
		} else {
			wait = h.upSpace.wait()
		}
		h.mu.Unlock()
		if !paused {
			paused = true
			b.count("paused:client")
		}
		s.pause.Enter()
		select {
		case <-wait:
		case <-s.done:
		case <-ctx.Done():
		}
		s.pause.Leave()
		if ctx.Err() != nil {
			return false
		}
	}
}

// framesUp turns one client message into DATA frames for the host (the
// host's writeLoop gives every buffer back once written). When the
// transport hands its read buffer over (msgconn.Owner, the message read
// behind HeaderLen bytes of headroom), the first frame is that buffer with
// the header written in front: no copy. A message too long for one frame
// (a full 1 MiB one) leaves its last bytes to a second, small frame.
// Otherwise it copies: one pooled frame when it fits, else SplitData's.
func (s *stream) framesUp(data []byte, into [][]byte) [][]byte {
	if o, ok := s.conn.(msgconn.Owner); ok {
		if buf := o.Take(); buf != nil && len(buf) == wire.HeaderLen+len(data) {
			f := buf[:min(len(buf), wire.MaxHostFrameOut)]
			putDataHeader(f, s.id)
			rest := buf[len(f):]
			if len(rest) == 0 {
				return append(into, f)
			}
			g := getFrame(wire.HeaderLen + len(rest))
			putDataHeader(g, s.id)
			copy(g[wire.HeaderLen:], rest)
			return append(into, f, g)
		}
	}
	if wire.HeaderLen+len(data) > wire.MaxHostFrameOut {
		return wire.SplitData(s.id, data, 0)
	}
	f, err := wire.AppendFrame(getFrame(wire.HeaderLen + len(data))[:0], wire.Frame{Flags: wire.FlagData, StreamID: s.id, Payload: data})
	if err != nil { // not reached: data is not empty and fits
		return wire.SplitData(s.id, data, 0)
	}
	return append(into, f)
}

// writeLoop is the only goroutine writing to the client after `matched`.
// The host's payloads go out coalesced into messages of up to
// ClientWriteChunk bytes (takeDown). It runs while there is something to
// write or the end to carry out (s.downWake) and returns once there is not,
// true once the socket is closed.
func (s *stream) writeLoop() (closed bool) {
	b, h, ctx := s.b, s.h, s.ctx
	for !s.finished {
		h.mu.Lock()
		if s.end != nil && (s.broken || !s.end.flush || len(s.down) == 0) {
			e := *s.end
			s.dropDownLocked()
			h.mu.Unlock()
			if s.broken {
				e.errMsg = ""
			}
			s.finished = true
			s.finish(ctx, e)
			close(s.writerDone)
			return true
		}
		if len(s.down) == 0 {
			h.mu.Unlock()
			return false
		}
		p, parts, size, kind := s.takeDown(b.cfg.ClientWriteChunk, &b.coalesce, !s.gate.JoinsParts())
		credit := s.credit
		if !credit {
			h.downPlain -= size
			h.downSpace.fire()
		}
		s.writing = true
		h.mu.Unlock()
		signal(s.downSpace)

		var err error
		if parts != nil {
			err = s.gate.WriteParts(msgconn.Binary, *parts, b.cfg.WriteTimeout, s.progress)
		} else {
			err = s.gate.Write(msgconn.Binary, p, b.cfg.WriteTimeout, s.progress)
		}
		// Written (or failed) and no longer in the queue: the buffers go
		// back, except a payload's front whose rest is still queued.
		switch kind {
		case takeWhole:
			putFrame(p)
		case takeCopy:
			bp := p // only a pooled buffer escapes to the heap
			b.coalesce.Put(&bp)
		case takeParts, takePartsCut:
			whole := *parts
			if kind == takePartsCut {
				whole = whole[:len(whole)-1]
			}
			for _, q := range whole {
				putFrame(q)
			}
			clear(*parts)
			*parts = (*parts)[:0]
			partsPool.Put(parts)
		}

		h.mu.Lock()
		s.writing = false
		if credit {
			// The client took these bytes: the host may send as many more
			// (WINDOW), within the host's cap on queued bytes.
			h.downHeld -= size
			if err == nil {
				s.downWin.Consumed(size)
				h.growLocked(s)
			}
			h.grantAllLocked(s)
		}
		h.mu.Unlock()
		b.budget.release(size)
		if err != nil {
			s.broken = true
			b.endStream(s, streamEnd{code: wire.CloseGoingAway, reason: "write failed", toHost: true, cancel: true, stat: "write_failed"})
		}
	}
	return true
}

// dropDownLocked (h.mu held) releases the client-bound bytes that will not
// be delivered.
func (s *stream) dropDownLocked() {
	s.b.budget.release(s.downBytes)
	freed := s.credit && s.downBytes > 0
	if s.credit {
		s.h.downHeld -= s.downBytes
	} else if s.downBytes > 0 {
		s.h.downPlain -= s.downBytes
		s.h.downSpace.fire()
	}
	s.down, s.downBytes = nil, 0
	delete(s.h.drainingPlain, s)
	if freed {
		s.h.grantAllLocked(nil) // room for the streams waiting
	}
}

// startCreditLocked (h.mu held) puts the stream under the credit
// extension: its windows start at 256 KiB, net of what already went to the
// host before it agreed.
func (s *stream) startCreditLocked() {
	if s.credit {
		return
	}
	s.credit = true
	s.upWin = wire.NewWindowAfter(s.upSent)
	s.downWin = wire.NewRecvWindow()
	if s.end == nil { // an ended stream's credit is void (endStreamLocked)
		s.h.creditOut += s.downWin.Credit()
	}
	s.h.downHeld += s.downBytes
	if s.downBytes > 0 { // no longer under the plain per-host cap
		s.h.downPlain -= s.downBytes
		s.h.downSpace.fire()
	}
	signal(s.upCredit)
}

// What takeDown took: how the writer gives the bytes back once written.
type takeKind int

const (
	takeWhole    takeKind = iota // msg is a payload that left the queue
	takeFront                    // msg is the front of a payload still queued
	takeCopy                     // msg is a pooled buffer the payloads were copied into
	takeParts                    // parts are the message: payloads that left the queue
	takePartsCut                 // the same, but the last part is the front of a payload still queued
)

// partsPool holds the slices of a message's parts (takeDown), so a stream
// holds none between writes.
var partsPool = sync.Pool{New: func() any {
	p := make([][]byte, 0, 16)
	return &p
}}

// partMin is the smallest payload sent as a fragment of its own rather
// than copied next to its neighbours: a fragment costs a frame header and
// a short TLS record or two (the library's 512-byte write buffer), which
// a copy of 16 KiB costs more than.
const partMin = 16 << 10

// takeDown (h.mu held, s.down not empty) takes the next client message:
// everything queued, up to max bytes, in one message. It never waits for
// more to arrive, so a small message leaves as soon as the writer is free.
// size is the message's length, kind says how its buffers go back.
//
// A lone payload is sent as it is (or its first max bytes). Several are
// the message's parts, each payload a fragment of its own with no byte
// copied, when the transport writes parts without joining them (parts)
// and the payloads are at least partMin bytes each (the last one may be
// cut to max; the rest stays queued); otherwise they are copied into a
// pooled buffer.
func (s *stream) takeDown(max int, pool *sync.Pool, split bool) (msg []byte, parts *[][]byte, size int, kind takeKind) {
	first := s.down[0]
	if len(first) >= max || len(s.down) == 1 {
		msg = first[:min(len(first), max)]
		kind = takeWhole
		if len(msg) == len(first) {
			s.down = popFront(s.down)
		} else {
			kind = takeFront
			s.down[0] = first[len(msg):]
		}
		s.downBytes -= len(msg)
		return msg, nil, len(msg), kind
	}
	if split && len(first) >= partMin && len(s.down[1]) >= partMin {
		parts = partsPool.Get().(*[][]byte)
		kind = takeParts
		taken := 0 // payloads that left the queue whole, dropped at once
		for taken < len(s.down) && size < max && len(s.down[taken]) >= partMin {
			p := s.down[taken]
			k := min(len(p), max-size)
			*parts = append(*parts, p[:k])
			size += k
			if k < len(p) {
				s.down[taken] = p[k:]
				kind = takePartsCut
				break
			}
			taken++
		}
		s.down = popFrontN(s.down, taken)
		s.downBytes -= size
		return nil, parts, size, kind
	}
	bp := pool.Get().(*[]byte)
	buf := (*bp)[:0]
	taken := 0
	for taken < len(s.down) && len(buf) < max {
		p := s.down[taken]
		k := min(len(p), max-len(buf))
		buf = append(buf, p[:k]...)
		if k < len(p) {
			s.down[taken] = p[k:]
			break
		}
		putFrame(p) // copied, and leaves the queue below
		taken++
	}
	s.down = popFrontN(s.down, taken)
	s.downBytes -= len(buf)
	return buf, nil, len(buf), takeCopy
}

// madeProgress (the writer's, after each fragment the client accepted;
// the gate bounds each by WriteTimeout, so a 256 KiB message to a slow but
// moving reader is never cut) counts for the slow-consumer rule.
func (s *stream) madeProgress() {
	now := time.Now().UnixNano()
	s.lastProgress.Store(now)
	s.lastActive.Store(now)
}

func (s *stream) finish(ctx context.Context, e streamEnd) {
	if e.errMsg != "" {
		msg, _ := wire.Marshal(wire.ErrorMsg{Code: e.errMsg})
		wctx, cancel := context.WithTimeout(s.b.ctx, s.b.cfg.WriteTimeout)
		s.conn.Write(wctx, msgconn.Text, msg)
		cancel()
	}
	s.conn.Close(e.code, e.reason)
}

// idleCheck (on the stream's idle timer) closes the stream after
// IdleTimeout without payload bytes in either direction (pings do not
// count); otherwise it returns when to look again.
func (s *stream) idleCheck() time.Duration {
	b := s.b
	if isDone(s.done) || s.ctx.Err() != nil {
		return 0
	}
	idle := time.Since(time.Unix(0, s.lastActive.Load()))
	if idle < b.cfg.IdleTimeout {
		return b.cfg.IdleTimeout - idle
	}
	// Under credit, client bytes still queued wait for a WINDOW the host
	// is not sending: they are dropped, so the CLOSE does not wait behind
	// them.
	s.h.mu.Lock()
	credit := s.credit
	s.h.mu.Unlock()
	b.endStream(s, streamEnd{code: wire.CloseTryAgain, reason: "idle", toHost: true, dropUp: credit, cancel: true, stat: "idle"})
	return 0
}
