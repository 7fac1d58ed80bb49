package connector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// maxOrphanCloses bounds the CLOSE answers queued for stream ids that have
// no stream (refused opens, DATA for unknown ids). Beyond it further answers
// are dropped: a broker flooding unknown ids gets no more attention than
// that, and the registration goes on.
const maxOrphanCloses = 1024

// session is one host registration: the broker socket carrying the control
// channel and the frames of every stream.
//
// Goroutines: the reader (readLoop, the caller of run) is the only one that
// reads the socket and the only one that waits for stream buffer space; the
// writer (writeLoop) is the only one that writes, so frames and control
// messages never interleave and each write has its own deadline; keepalive
// pings. Nothing writes to the network while holding mu.
type session struct {
	c            *Connector
	ws           msgconn.Conn
	connID       wire.ID
	log          zerolog.Logger
	registeredAt time.Time

	ctx    context.Context // cancelled once the end is decided
	cancel context.CancelFunc
	wake   chan struct{} // capacity 1: the writer has work or must end
	done   chan struct{} // closed once the end is decided
	pause  msgconn.Pause

	closers sync.WaitGroup // close handshakes started by fail

	mu          sync.Mutex
	end         *outcome
	streams     map[wire.ID]*stream
	closed      idRing // ids we sent or got CLOSE for: no (further) CLOSE
	ctrl        [][]byte
	pending     []*pendingReply
	orphans     [][]byte
	rr          msgconn.RoundRobin[*stream]
	lastErrCode wire.Code // an error message that answered no control frame
	grants      []*stream // streams with a WINDOW to send
	// heldCredit is the credit-stream DATA payload in the writer's held
	// batch; sendNow says the batch leaves after the frame next returned.
	// Both are the writer's, set by next.
	heldCredit int
	sendNow    bool
	// frameBuf is the writer's buffer for one DATA frame, reused for every
	// frame while there is work (see next) and back in framePool before
	// the writer waits, so an idle registration holds none.
	frameBuf *[]byte

	// credit: this registration agreed to the credit extension (set
	// before the session starts, then read-only); dialect parses frames.
	credit  bool
	dialect wire.Dialect
	// windowSeen (the reader's): the broker sent a WINDOW, which it does
	// only once it read our extensions answer, the host's first frame.
	// Every frame after it on the socket was sent under credit, so DATA
	// beyond a stream's credit is a protocol violation from then on; before
	// it, the excess is what the broker sent on a stream it opened before
	// reading the answer, and is owed (wire.RecvWindow.Overrun).
	windowSeen bool
	// grantEvery is how many drained bytes a stream grants back at once
	// while the broker still holds at least that much credit: an eighth of
	// the stream buffer (the most its window grows to), not the protocol's
	// 64 KiB minimum, which cost the front and the broker a WINDOW message
	// and a write(2) per 64 KiB of an upload.
	grantEvery int
}

// pendingReply is one control frame waiting for its reply. The broker
// answers control frames one by one, in order, so replies are matched first
// in, first out; the expected type and label are checked as well, so a
// broker that answers out of order is caught instead of handing one caller
// another caller's result.
type pendingReply struct {
	typ   string // wire.TypePublished or wire.TypeRevoked
	kind  wire.Kind
	label string
	res   chan error // capacity 1; nil result = success
}

func (p *pendingReply) matches(m wire.Message) bool {
	switch m := m.(type) {
	case wire.Published:
		return p.typ == wire.TypePublished && m.CredentialKind == p.kind && m.Label == p.label
	case wire.Revoked:
		return p.typ == wire.TypeRevoked && m.CredentialID == p.label
	}
	return false
}

// errProtocolReply is given to a caller whose reply did not match its request.
var errProtocolReply = errors.New("reach: the broker answered out of order")

func newSession(c *Connector, ws msgconn.Conn, connID wire.ID, credit bool) *session {
	s := &session{
		c: c, ws: ws, connID: connID, credit: credit, dialect: wire.Dialect{Credit: credit},
		log:     c.log,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		streams: map[wire.ID]*stream{},
		closed:  newIDRing(c.cfg.MaxClosedIDs),

		grantEvery: max(wire.GrantThreshold, c.cfg.StreamBufferBytes/8),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// run serves the registration until it ends (or ctx ends) and returns how
// it ended, after every goroutine it started has finished.
func (s *session) run(ctx context.Context) outcome {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.writeLoop() }()
	go func() { defer wg.Done(); s.keepalive() }()
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		s.fail(codeStopped, "", wire.CloseGoingAway, "host shutting down")
	})
	s.readLoop()
	if !stop() {
		<-stopped // fail may still be adding to closers
	}
	s.fail(codeClosed, "", 0, "")
	wg.Wait()
	s.closers.Wait()
	s.ws.CloseNow()
	s.finishAll()
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.end
}

// fail decides how the registration ends (the first decision wins) and
// closes the socket: with a close frame when status is set, else at once.
func (s *session) fail(code, detail string, status int, reason string) {
	s.endWith(outcome{code: code, detail: detail}, status, reason)
}

// endWith is fail with a whole outcome.
func (s *session) endWith(o outcome, status int, reason string) {
	s.mu.Lock()
	if s.end != nil {
		s.mu.Unlock()
		return
	}
	s.end = &o
	close(s.done)
	s.mu.Unlock()
	s.cancel()
	signal(s.wake)
	if status == 0 {
		s.ws.CloseNow()
		return
	}
	s.closers.Add(1)
	go func() {
		defer s.closers.Done()
		s.ws.Close(status, reason) // bounded by the library's close handshake timeout
	}()
}

// ---------------------------------------------------------------------------
// Reading

func (s *session) readLoop() {
	// Each message is lent until the next read: control messages are
	// decoded into new values and DATA is copied into the stream's buffer.
	for {
		// The socket's lifetime, not a context, ends this read: cancelling
		// a read's context would cut a close handshake in progress.
		typ, data, err := s.ws.Read(context.Background())
		if err != nil {
			s.readFailed(err)
			return
		}
		if isClosed(s.done) {
			continue // drain until the close handshake finishes
		}
		var ok bool
		if typ == msgconn.Text {
			ok = s.control(data)
		} else {
			ok = s.frame(data)
		}
		if !ok {
			return
		}
	}
}

// readFailed turns the end of the socket into an outcome. The close reason
// carries the two endings the spec gives a meaning: `replaced` and
// `revoked`; an error message that answered no control frame (the broker
// says why before closing) is the next best explanation.
func (s *session) readFailed(err error) {
	s.mu.Lock()
	last := s.lastErrCode
	s.mu.Unlock()
	o := outcome{code: codeClosed, detail: "the broker socket ended"}
	var ce *msgconn.CloseError
	closed := errors.As(err, &ce)
	var advice time.Duration
	hasAdvice := false
	if closed && ce.Code == wire.CloseGoingAway {
		advice, hasAdvice = wire.ParseShutdownReason(ce.Reason)
	}
	switch {
	case closed && ce.Reason == wire.CloseReasonReplaced:
		o.code, o.detail = codeReplaced, detailReplaced
	case closed && ce.Reason == wire.CloseReasonRevoked:
		o.code, o.detail = string(wire.CodeRevoked), detailAuthFailure
	case hasAdvice:
		o = outcome{code: codeGoingAway, detail: "the broker is shutting down and advised when to reconnect",
			advised: advice, hasAdvice: true}
	case last != "":
		o.code, o.detail = string(last), last.Description()
	case closed && ce.Code == wire.CloseGoingAway:
		o.code, o.detail = codeGoingAway, "the broker is going away"
	case closed:
		o.detail = fmt.Sprintf("the broker closed the socket with %d", ce.Code)
	}
	if closed {
		// The broker's close frame says why the socket ended; a write
		// that failed while it closed, if it decided first, says less.
		s.mu.Lock()
		if s.end != nil && s.end.code == codeWrite {
			*s.end = o
		}
		s.mu.Unlock()
	}
	s.endWith(o, 0, "")
}

func (s *session) protocolError(detail string) bool {
	s.c.count("protocol_error")
	s.log.Warn().Str("why", detail).Msg("reach: the broker broke the protocol; reconnecting")
	s.fail(codeProtocol, detail, wire.ClosePolicy, "protocol violation")
	return false
}

func (s *session) control(data []byte) bool {
	m, err := wire.ParseBrokerMessage(data)
	if err != nil {
		return s.protocolError("invalid control message")
	}
	switch m := m.(type) {
	case wire.Open:
		s.open(m)
		return true
	case wire.Published, wire.Revoked, wire.ErrorMsg:
		return s.reply(m)
	}
	return s.protocolError("unexpected " + m.Type() + " message")
}

func (s *session) reply(m wire.Message) bool {
	s.mu.Lock()
	if len(s.pending) == 0 {
		if e, ok := m.(wire.ErrorMsg); ok {
			s.lastErrCode = e.Code
			s.mu.Unlock()
			s.log.Warn().Str("code", string(e.Code)).Msg("reach: the broker reported an error")
			return true
		}
		s.mu.Unlock()
		return s.protocolError("reply without a pending control message")
	}
	p := s.pending[0]
	s.pending[0] = nil
	s.pending = s.pending[1:]
	s.mu.Unlock()
	if e, ok := m.(wire.ErrorMsg); ok {
		p.res <- e.Err()
		return true
	}
	if !p.matches(m) {
		p.res <- errProtocolReply
		return s.protocolError("reply does not match the pending control message")
	}
	p.res <- nil
	return true
}

// open accepts a stream, or answers CLOSE at once when it is not for this
// registration, over the limit, or the front cannot take it.
func (s *session) open(m wire.Open) {
	id := m.StreamID
	if m.HostConnectionID != s.connID {
		s.c.count("open_other_registration")
		s.log.Warn().Str("stream_id", id.String()).Msg("reach: open for another registration; answering CLOSE")
		s.mu.Lock()
		s.orphanCloseLocked(id)
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	if s.end != nil {
		s.mu.Unlock()
		return
	}
	if _, live := s.streams[id]; live {
		s.mu.Unlock()
		s.c.count("open_duplicate")
		return
	}
	if len(s.streams) >= s.c.cfg.MaxStreams {
		// Counted before the CLOSE can leave, so whoever sees the CLOSE
		// sees the count (countMu is a leaf lock).
		s.c.count("open_over_limit")
		s.orphanCloseLocked(id)
		s.mu.Unlock()
		s.log.Info().Str("stream_id", id.String()).Int("max_streams", s.c.cfg.MaxStreams).Msg("reach: stream limit reached; answering CLOSE")
		return
	}
	st := newStream(s, id)
	s.streams[id] = st
	s.closed.remove(id)
	s.mu.Unlock()
	if st.credit {
		// Grant the broker openWindow at once rather than the initial
		// 256 KiB, which would bound an upload to 256 KiB per grant round
		// trip; stream.Read grows it up to StreamBufferBytes.
		st.mu.Lock()
		g := st.recv.Widen(int64(min(s.c.cfg.StreamBufferBytes, openWindow) - wire.InitialWindow))
		st.mu.Unlock()
		if g > 0 {
			s.queueGrant(st, g)
		}
	}
	s.c.count("open")
	if !s.c.ln.offer(st) {
		s.reset(st, "the front is not accepting")
	}
}

// openWindow is the broker's credit for a stream once it opens (at most
// StreamBufferBytes). From there the window auto-tunes as the front reads
// (wire.RecvWindow.Grow in stream.Read) up to StreamBufferBytes: an upload
// whose grants wait on the busy front's scheduling gets more in flight, a
// slow front keeps 2 MiB. Granting the whole 4 MiB buffer at open instead
// would give every slow stream 4 MiB.
const openWindow = 2 << 20

// orphanCloseLocked queues a CLOSE for an id that has no stream.
func (s *session) orphanCloseLocked(id wire.ID) {
	s.closed.add(id)
	if len(s.orphans) >= maxOrphanCloses {
		s.c.count("close_dropped")
		return
	}
	s.orphans = append(s.orphans, wire.AppendClose(nil, id))
	signal(s.wake)
}

func (s *session) frame(data []byte) bool {
	f, err := s.dialect.ParseFrame(data)
	if err != nil {
		return s.protocolError("invalid frame")
	}
	s.mu.Lock()
	st := s.streams[f.StreamID]
	if f.Flags == wire.FlagWindow {
		s.windowSeen = true
		// A WINDOW for a stream that is gone is ignored.
		var err error
		if st != nil && !st.finished {
			if err = st.sendWin.Grant(f.Increment()); err == nil && st.out.Len() > 0 {
				s.scheduleLocked(st)
				signal(s.wake)
			}
		}
		s.mu.Unlock()
		if err != nil {
			return s.protocolError("WINDOW takes the window above 2^31-1")
		}
		return true
	}
	if st == nil {
		// Unknown: answer DATA with one CLOSE (never CLOSE with CLOSE, and
		// never a second time for the same id); it does not end the
		// registration.
		if f.Flags == wire.FlagData && !s.closed.has(f.StreamID) && s.end == nil {
			s.c.count("data_unknown_stream")
			s.orphanCloseLocked(f.StreamID)
		}
		s.mu.Unlock()
		return true
	}
	if f.Flags == wire.FlagClose {
		s.finishLocked(st)
		s.mu.Unlock()
		st.endInbound(io.EOF)
		return true
	}
	if st.closePending {
		s.mu.Unlock()
		return true // the front closed it; our CLOSE is on its way
	}
	s.mu.Unlock()
	if !s.deliver(st, f.Payload) {
		return s.protocolError("DATA beyond the stream's credit")
	}
	return true
}

// deliver hands DATA to the front. A stream buffers at most
// StreamBufferBytes; when the front has not made room, the reader stops
// reading the broker socket until it does (plain v1 has no per-stream flow
// control, so this stalls every stream, like the broker's own host→client
// queue). If the front reads nothing from that stream for
// SlowConsumerTimeout, that stream alone is reset and reading goes on; a
// slow reader that makes progress is never cut.
//
// Under credit the broker sends a stream no more than the window granted as
// the front read, which fits the buffer, so the reader never waits here.
// Bytes beyond the credit are kept and owed, and counted, only until the
// broker's first WINDOW (those it sent before it read our answer; see
// windowSeen); after it, deliver refuses them (false: a protocol
// violation).
func (s *session) deliver(st *stream, payload []byte) bool {
	n := len(payload)
	limit := s.c.cfg.StreamBufferBytes
	var waitStart time.Time
	accounted := !st.credit // the credit is taken once, under the first lock
	for {
		st.mu.Lock()
		if !accounted {
			accounted = true
			if !st.recv.Receive(n) {
				if s.windowSeen {
					st.mu.Unlock()
					return false
				}
				st.recv.Overrun(n)
				s.c.count("window_overrun") // countMu is a leaf lock
			}
		}
		if st.closed || st.readErr != nil {
			st.mu.Unlock()
			return true // closed or reset meanwhile: dropped like a late frame
		}
		if st.in.Len() == 0 || st.in.Len()+n <= limit {
			st.in.Write(payload)
			st.mu.Unlock()
			signal(st.readable)
			return true
		}
		st.mu.Unlock()
		now := time.Now()
		if waitStart.IsZero() {
			waitStart = now
			s.c.count("paused")
			s.pause.Enter()
			defer s.pause.Leave()
		}
		last := waitStart
		if p := time.Unix(0, st.progress.Load()); p.After(last) {
			last = p
		}
		stalled := now.Sub(last)
		if stalled >= s.c.cfg.SlowConsumerTimeout {
			s.c.count("slow_consumer")
			s.log.Info().Str("stream_id", st.id.String()).Dur("stalled", stalled).
				Msg("reach: the front made no progress on a full stream buffer; closing that stream")
			s.reset(st, "slow consumer")
			return true
		}
		t := time.NewTimer(s.c.cfg.SlowConsumerTimeout - stalled)
		select {
		case <-st.space:
		case <-t.C:
		case <-s.done:
		}
		t.Stop()
		if isClosed(s.done) {
			return true
		}
	}
}

// ---------------------------------------------------------------------------
// Stream ends

// finishLocked ends st on the session's side: no more frames either way.
func (s *session) finishLocked(st *stream) {
	if st.finished {
		return
	}
	st.finished = true
	if s.streams[st.id] == st {
		delete(s.streams, st.id)
	}
	s.closed.add(st.id)
	st.out.Reset()
	close(st.finCh)
	s.c.completed.Add(1)
}

// closeLocal queues CLOSE for st after its pending bytes (reset: instead of
// them).
func (s *session) closeLocal(st *stream, reset bool) {
	s.mu.Lock()
	if st.finished || st.closePending {
		s.mu.Unlock()
		return
	}
	st.closePending = true
	if reset {
		st.out.Reset()
	}
	s.scheduleLocked(st)
	s.mu.Unlock()
	signal(s.wake)
}

// reset is a local failure: the front gets an error, the broker CLOSE.
func (s *session) reset(st *stream, why string) {
	s.log.Debug().Str("stream_id", st.id.String()).Str("why", why).Msg("reach: resetting stream")
	st.endInbound(errStreamReset)
	s.closeLocal(st, true)
}

// finishAll ends every stream when the registration is over: the front
// reads what already arrived, then EOF; its writes fail. Waiting publishers
// learn the registration is gone.
func (s *session) finishAll() {
	s.mu.Lock()
	sts := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		sts = append(sts, st)
	}
	for _, st := range sts {
		s.finishLocked(st)
	}
	pending := s.pending
	s.pending = nil
	s.rr.Clear()
	s.mu.Unlock()
	for _, st := range sts {
		st.endInbound(io.EOF)
	}
	for _, p := range pending {
		p.res <- ErrNotConnected
	}
}

func (s *session) scheduleLocked(st *stream) {
	s.rr.Add(st)
}

// ---------------------------------------------------------------------------
// Writing

// creditBatchBytes is the DATA a writer's held batch carries at most under
// credit: half the initial window, so a window leaves in two writes the
// broker can drain and grant one after the other. Smaller batches (a
// quarter, GrantThreshold) pipelined as well but made the client's
// messages and every write on the way smaller: download under credit
// 0.87x of plain v1 with a quarter, 0.97x with a half (interleaved
// rounds, docs/decisions.md).
const creditBatchBytes = wire.InitialWindow / 2

// writeLoop is the only writer of the socket. Every write has its own
// deadline; one that misses it ends the registration.
//
// What is queued leaves in as few socket writes as the transport allows
// (msgconn.Batcher): held from the first message, sent once the queue is
// empty, before the writer waits, and under credit as soon as the batch
// carries creditBatchBytes of DATA (next sets sendNow). Held longer,
// a stream's whole 256 KiB window left in one write once it was used up:
// the broker got it at once, wrote it to the client as one message and
// could grant only after that, so the stream waited out every grant round
// trip with no credit (stop-and-wait; download under credit 0.87x of
// plain v1). Sent per half window, the broker drains and grants the first
// half while the second is still being framed here.
func (s *session) writeLoop() {
	batch, _ := s.ws.(msgconn.Batcher)
	held := false
	// The deadline decides the outcome before it cuts the socket, so the
	// reader, which sees the cut too, cannot report it as something else.
	// (Not s.ctx: cancelling that would cut a graceful close in the
	// middle.) One timer serves every write: armed before, stopped after.
	dl := time.AfterFunc(time.Hour, func() {
		s.c.count("write_timeout")
		s.fail(codeWriteTimeout, "a write to the broker missed its deadline", 0, "")
	})
	dl.Stop()
	for {
		typ, data, ok := s.next()
		if !ok {
			if held {
				s.sendHeld(dl, batch)
			}
			return
		}
		if data == nil {
			if held {
				held = false
				if !s.sendHeld(dl, batch) {
					return
				}
				continue
			}
			s.putFrameBuf()
			select {
			case <-s.wake:
			case <-s.done:
			}
			continue
		}
		if batch != nil && !held {
			batch.HoldWrites()
			held = true
		}
		dl.Reset(s.c.cfg.WriteTimeout)
		if !s.wrote(dl, s.ws.Write(context.Background(), typ, data)) {
			return
		}
		if held && s.sendNow {
			held = false
			if !s.sendHeld(dl, batch) {
				return
			}
		}
	}
}

// sendHeld writes what the writer gathered, within WriteTimeout (dl, the
// writer's deadline timer); false ends the registration as a failed write
// would.
func (s *session) sendHeld(dl *time.Timer, batch msgconn.Batcher) bool {
	s.heldCredit = 0
	dl.Reset(s.c.cfg.WriteTimeout)
	return s.wrote(dl, batch.SendHeld(context.Background()))
}

// wrote ends a write the deadline timer dl was armed for: it stops dl and,
// when the write failed, ends the registration (false).
func (s *session) wrote(dl *time.Timer, err error) bool {
	dl.Stop()
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			// The socket is already closing: the broker's close frame
			// (read by readLoop with its reason, e.g. the shutdown's
			// advised delay) or our own end decides the outcome, not this
			// write. Deciding here cut the socket before the reader saw
			// the close, and a graceful broker restart was retried on the
			// normal schedule.
			return false
		}
		s.fail(codeWrite, "a write to the broker failed", 0, "")
		return false
	}
	return true
}

// framePool holds the writer's DATA frame buffers. A frame lives only
// until the socket's Write returns (the library has copied it into its
// write buffer and the TLS record by then), so one buffer per busy writer
// serves every frame: a fresh 64 KiB slice per frame was about a fifth of
// the front's CPU on a download through the broker, in allocation and GC.
var framePool = sync.Pool{New: func() any {
	b := make([]byte, 0, wire.HeaderLen+wire.MaxConnectorChunk)
	return &b
}}

// putFrameBuf returns the writer's frame buffer before it waits.
func (s *session) putFrameBuf() {
	if s.frameBuf != nil {
		framePool.Put(s.frameBuf)
		s.frameBuf = nil
	}
}

// next picks what to write: control messages first (they are small and
// callers wait on them), then CLOSE answers, then stream frames round-robin,
// one chunk of at most 64 KiB per stream per turn, so a bulk stream cannot
// starve another stream's small messages. ok is false once the
// registration ended; data is nil when there is nothing to write. A DATA
// frame is the writer's frameBuf: valid until the next call.
func (s *session) next() (typ msgconn.MessageType, data []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sendNow = false
	if s.end != nil {
		return 0, nil, false
	}
	if len(s.ctrl) > 0 {
		data = s.ctrl[0]
		s.ctrl[0] = nil
		s.ctrl = s.ctrl[1:]
		return msgconn.Text, data, true
	}
	for len(s.grants) > 0 {
		st := s.grants[0]
		s.grants[0] = nil
		s.grants = s.grants[1:]
		inc := st.grant
		st.grant, st.grantQueued = 0, false
		if st.finished {
			continue
		}
		data, _ = wire.AppendWindow(nil, st.id, inc)
		return msgconn.Binary, data, true
	}
	if len(s.orphans) > 0 {
		data = s.orphans[0]
		s.orphans[0] = nil
		s.orphans = s.orphans[1:]
		return msgconn.Binary, data, true
	}
	for s.rr.Len() > 0 {
		st := s.rr.Current()
		switch {
		case st.finished:
			s.rr.Remove()
		case st.out.Len() > 0 && st.credit && st.sendWin.Avail() == 0:
			s.rr.Remove() // waits for a WINDOW, which schedules it again
		case st.out.Len() > 0:
			k := min(wire.MaxConnectorChunk, st.out.Len())
			if st.credit {
				k = min(k, st.sendWin.Avail())
				st.sendWin.Take(k)
				if s.heldCredit += k; s.heldCredit >= creditBatchBytes {
					s.sendNow, s.heldCredit = true, 0
				}
			}
			if s.frameBuf == nil {
				s.frameBuf = framePool.Get().(*[]byte)
			}
			frame, _ := wire.AppendFrame((*s.frameBuf)[:0], wire.Frame{Flags: wire.FlagData, StreamID: st.id, Payload: st.out.Next(k)})
			signal(st.outSpace)
			if st.out.Len() == 0 && !st.closePending {
				s.rr.Remove()
			} else {
				s.rr.Advance()
			}
			return msgconn.Binary, frame, true
		case st.closePending:
			s.rr.Remove()
			s.finishLocked(st)
			return msgconn.Binary, wire.AppendClose(nil, st.id), true
		default:
			s.rr.Remove()
		}
	}
	return 0, nil, true
}

// queueGrant queues a WINDOW of inc bytes for st (the front read them).
func (s *session) queueGrant(st *stream, inc uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.finished || s.end != nil {
		return
	}
	st.grant += inc // at most the window, below 2^31
	if !st.grantQueued {
		st.grantQueued = true
		s.grants = append(s.grants, st)
	}
	signal(s.wake)
}

// send queues a control message and returns the channel its reply arrives
// on.
func (s *session) send(msg []byte, p *pendingReply) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.end != nil {
		return ErrNotConnected
	}
	if len(s.pending) >= s.c.cfg.MaxPendingControl {
		return errTooManyPending
	}
	s.ctrl = append(s.ctrl, msg)
	s.pending = append(s.pending, p)
	signal(s.wake)
	return nil
}

var errTooManyPending = errors.New("reach: too many control messages await a reply")

// ---------------------------------------------------------------------------
// Keepalive

// keepalive pings every PingInterval and ends the registration when no pong
// arrived within PongTimeout of the previous one. The reader's pauses (a
// full stream buffer) are forgiven, and a ping held back behind a data
// write the broker is slow to take is retried by the adapter rather than
// reported as ping_timeout.
func (s *session) keepalive() {
	msgconn.Keepalive{
		Conn: s.ws, Interval: s.c.cfg.PingInterval, Timeout: s.c.cfg.PongTimeout,
		Pause: &s.pause, Stop: s.done,
		Dead: func() {
			s.c.count("ping_timeout")
			s.fail(codePingTimeout, "no pong from the broker in time", 0, "")
		},
	}.Run(s.ctx)
}

// ---------------------------------------------------------------------------

// idRing is a bounded set of stream ids, evicting the oldest.
type idRing struct {
	set  map[wire.ID]struct{}
	ring []wire.ID
	next int
}

func newIDRing(n int) idRing {
	return idRing{set: make(map[wire.ID]struct{}, n), ring: make([]wire.ID, 0, n)}
}

func (r *idRing) has(id wire.ID) bool { _, ok := r.set[id]; return ok }

func (r *idRing) remove(id wire.ID) { delete(r.set, id) }

func (r *idRing) add(id wire.ID) {
	if r.has(id) {
		return
	}
	if len(r.ring) < cap(r.ring) {
		r.ring = append(r.ring, id)
	} else {
		delete(r.set, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % len(r.ring)
	}
	r.set[id] = struct{}{}
}
