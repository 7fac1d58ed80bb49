package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"
)

// closeSpec is the close frame one leg receives when the session ends. Code
// websocket.StatusNoStatusRcvd (1005) means a close frame without a status
// code: coder/websocket writes an empty close payload for exactly that code.
type closeSpec struct {
	code   websocket.StatusCode
	reason string
}

var (
	goingAway = closeSpec{websocket.StatusGoingAway, "going away"}
	tooBig    = closeSpec{websocket.StatusMessageTooBig, "message too big"}
	noStatus  = closeSpec{code: websocket.StatusNoStatusRcvd}
)

// sendable reports whether code may appear in a close frame on the wire
// (RFC 6455 §7.4, IANA registry). 1005, 1006 and 1015 describe what happened
// to a connection and must never be sent; 1004 and unassigned 1016-2999 are
// invalid too.
func sendable(code websocket.StatusCode) bool {
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1014:
		return true
	case code >= 3000 && code <= 4999:
		return true
	}
	return false
}

// forwardClose turns how one leg ended into the close frame for the other:
// the same code and reason when the code may be sent, otherwise (no status,
// abnormal closure, TLS failure, a network error) a close without status.
func forwardClose(err error) closeSpec {
	var ce websocket.CloseError
	if !errors.As(err, &ce) || !sendable(ce.Code) {
		return noStatus
	}
	reason := ce.Reason
	if !utf8.ValidString(reason) {
		reason = "" // an invalid reason would make a strict peer fail the close
	}
	return closeSpec{ce.Code, reason}
}

// session is one bridged connection: the client leg, the Relay leg and a
// pump per direction. Nothing else runs while the session is idle: the
// keepalives are timers whose callbacks exist only while they fire, and
// writes are bounded by the connection's write deadline, because every
// parked goroutine costs an idle connection at least a stack.
type session struct {
	b      *Bridge
	client *leg
	relay  *leg
	remote string // for logs
	source string
	broker bool

	done    chan struct{} // closed when the session starts ending
	endOnce sync.Once
	closers sync.WaitGroup // the legs' close handshakes started by end
	// Set inside endOnce; read after the pumps returned.
	cause             string
	toClient, toRelay closeSpec

	// Timer callbacks register in timerWG under timerMu unless timersOff,
	// so run can stop them all and wait for the ones already running.
	timerMu    sync.Mutex
	timersOff  bool
	timerWG    sync.WaitGroup
	keepalives [2]keepalive

	// Only for broker connections with a Handoff: the client's first frame,
	// written by the client→Relay pump, read by the Relay→client pump.
	firstClient atomic.Pointer[[]byte]
	sawFirst    bool // client→Relay pump only

	// unauth is true while the session holds its source's unauthenticated
	// slot; releaseSlot clears it once.
	unauth atomic.Bool

	inspected int  // Relay→client pump only
	authOK    bool // Relay→client pump only
	// frames is set by the Relay→client pump once the first auth.ok (after
	// the handoff) went out: from then on both pumps forward frames as they
	// arrive, each from its next message boundary.
	frames atomic.Bool

	msgsIn, bytesIn   int64 // client→Relay pump only
	msgsOut, bytesOut int64 // Relay→client pump only
}

func newSession(b *Bridge, cl, up *leg, remote, source string, broker bool) *session {
	s := &session{
		b: b, client: cl, relay: up, remote: remote, source: source, broker: broker,
		done: make(chan struct{}),
	}
	s.unauth.Store(true)
	return s
}

// releaseSlot gives back the source's unauthenticated slot, at most once.
func (s *session) releaseSlot() {
	if s.unauth.Swap(false) {
		s.b.pending.release(s.source)
	}
}

// run bridges until both pumps have stopped, both close handshakes are over
// and every timer callback has returned. The caller's goroutine pumps
// client→Relay; one more goroutine pumps Relay→client.
func (s *session) run() {
	s.logAt(zerolog.DebugLevel).Msg("relay: bridged")
	s.startKeepalives()
	var pumps sync.WaitGroup
	pumps.Add(1)
	go func() {
		defer pumps.Done()
		s.pump(s.relay, s.client, false)
	}()
	s.pump(s.client, s.relay, true)
	pumps.Wait()
	s.end(noStatus, noStatus, "ended") // each pump ended it already
	s.closers.Wait()
	s.stopTimers()
	s.logAt(zerolog.DebugLevel).
		Str("cause", s.cause).
		Int("close_code_client", int(s.toClient.code)).
		Int("close_code_relay", int(s.toRelay.code)).
		Int64("msgs_in", s.msgsIn).Int64("bytes_in", s.bytesIn).
		Int64("msgs_out", s.msgsOut).Int64("bytes_out", s.bytesOut).
		Msg("relay: closed")
}

func (s *session) logAt(level zerolog.Level) *zerolog.Event {
	return s.b.logAt(level, s.remote, s.source)
}

// end starts closing both legs once, each with its close frame; the close
// handshakes run on their own goroutines (run waits for them) while the
// pumps keep reading, which is where each peer's close frame arrives.
func (s *session) end(toClient, toRelay closeSpec, cause string) {
	s.endOnce.Do(func() {
		close(s.done)
		// Nothing reaches the Relay any more: the slot goes back now, not
		// after the close handshakes (a peer that never answers holds those
		// for seconds).
		s.releaseSlot()
		s.cause, s.toClient, s.toRelay = cause, toClient, toRelay
		s.closers.Add(2)
		go func() {
			defer s.closers.Done()
			s.relay.shutdown(toRelay)
		}()
		go func() {
			defer s.closers.Done()
			s.client.shutdown(toClient)
		}()
	})
}

// enterTimer admits one timer callback; false once the session stopped its
// timers. A true result must be paired with timerWG.Done.
func (s *session) enterTimer() bool {
	s.timerMu.Lock()
	defer s.timerMu.Unlock()
	if s.timersOff {
		return false
	}
	s.timerWG.Add(1)
	return true
}

// stopTimers disarms the keepalives and waits for callbacks still running.
func (s *session) stopTimers() {
	s.timerMu.Lock()
	s.timersOff = true
	s.timerMu.Unlock()
	for i := range s.keepalives {
		if t := s.keepalives[i].timer; t != nil {
			t.Stop() // a stopped timer drops its reference to the session at once
		}
	}
	s.timerWG.Wait()
}

// Message buffers (message mode, before auth.ok) come from a shared pool and
// are taken only once a message has started to arrive, so an idle
// connection holds none. A buffer that grew past retainBufBytes for a large
// message is dropped afterwards rather than pooled, so one burst of big
// messages does not pin memory.
const (
	pooledBufBytes = 8 << 10
	retainBufBytes = 64 << 10
)

var msgBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, pooledBufBytes)
	return &b
}}

func putMsgBuf(bp *[]byte) {
	if cap(*bp) <= retainBufBytes {
		*bp = (*bp)[:0]
		msgBufs.Put(bp)
	}
}

// pump relays src to dst in order until src's stream ends (its close frame,
// a failure, a protocol error or a message over the limit), then ends the
// session with the close frames that ending calls for. Until the Relay's
// first auth.ok a pump reads whole messages so the bridge can observe them;
// from the next message boundary after it, frames are forwarded as they
// arrive. Both modes apply the same frame rules (readHeader,
// nextDataFrame). After the session started ending, what src still sends is
// read and dropped until its close frame arrives.
func (s *session) pump(src, dst *leg, toRelay bool) {
	limit := s.b.o.MaxMessageBytes
	var (
		st     msgState
		frames bool    // the current message is forwarded frame by frame
		bp     *[]byte // the current message, in message mode
		err    error
	)
	for {
		start := !st.inMsg
		var h frameHeader
		if h, err = src.nextDataFrame(&st, limit); err != nil {
			break
		}
		if start {
			// The mode is chosen at each message's first frame.
			frames = s.frames.Load()
		}
		if frames {
			var c frameCount
			err = forwardFrames(src, dst, h, &st, limit, &c)
			s.count(toRelay, c.msgs, c.bytes)
			if err != nil {
				break
			}
			continue
		}
		if bp, err = src.appendPayload(bp, h, limit); err != nil {
			break
		}
		if !st.inMsg {
			data := *bp
			s.forward(dst, st.typ, data, toRelay)
			s.count(toRelay, 1, int64(len(data)))
			putMsgBuf(bp)
			bp = nil
		}
	}
	if bp != nil {
		putMsgBuf(bp)
	}
	var perr errProtocol
	switch {
	case errors.Is(err, errTooBig):
		// The rest of the message is read and dropped, so the peer gets
		// its 1009 rather than a reset.
		s.end(tooBig, tooBig, "message too big")
		src.drain()
	case errors.As(err, &perr):
		bad := closeSpec{websocket.StatusProtocolError, "protocol error"}
		if toRelay {
			s.end(bad, noStatus, "client protocol error")
		} else {
			s.end(noStatus, bad, "relay protocol error")
		}
	default:
		// src ended: its peer's close frame or a failure. The same code
		// goes to both legs; on src it only matters when src failed without
		// a close handshake.
		spec := forwardClose(err)
		cause := "client closed"
		if !toRelay {
			cause = "relay closed"
		}
		s.end(spec, spec, cause)
	}
	src.markPeerDone()
}

func (s *session) count(toRelay bool, msgs, n int64) {
	if toRelay {
		s.msgsIn += msgs
		s.bytesIn += n
	} else {
		s.msgsOut += msgs
		s.bytesOut += n
	}
}

// forward observes one whole message and writes it (or the handoff's
// result) to the other leg as one frame; data is the pump's buffer and is
// not retained. A dst that is closing or broken drops it (its reader ends
// the session).
func (s *session) forward(dst *leg, typ byte, data []byte, toRelay bool) {
	select {
	case <-s.done:
		return // the session is ending: nothing more crosses
	default:
	}
	if toRelay {
		s.observeClient(data)
	} else {
		data = s.observeRelay(typ, data)
		if s.authOK && !s.b.o.messagesOnly {
			// Before auth.ok goes out, so the client's first message after
			// it is already forwarded as frames.
			s.frames.Store(true)
		}
	}
	_ = dst.writeFrame(typ, data, dst.wt)
}

// keepalive pings one leg every PingInterval and drops it when PongTimeout
// passes without a pong since the last one (a dead peer goes PongTimeout
// after its last sign of life). The dropped leg's reader then ends the
// session with a close without status on the other leg: the peer vanished,
// an abnormal closure.
//
// It is a timer, not a goroutine: it wakes at the next ping slot (every
// PingInterval from the start) or at the pong deadline, whichever is first,
// and between wakes nothing is parked. Pongs are read by the leg's pump.
type keepalive struct {
	s     *session
	l     *leg
	timer *time.Timer // set under s.timerMu before the first tick can read it
	next  time.Time   // the next ping slot
}

func (s *session) startKeepalives() {
	now := time.Now()
	every := s.b.o.PingInterval
	s.timerMu.Lock()
	defer s.timerMu.Unlock()
	for i, l := range []*leg{s.client, s.relay} {
		k := &s.keepalives[i]
		*k = keepalive{s: s, l: l, next: now.Add(every)}
		k.timer = time.AfterFunc(every, k.tick)
	}
}

func (k *keepalive) tick() {
	s := k.s
	if !s.enterTimer() {
		return
	}
	defer s.timerWG.Done()
	select {
	case <-s.done:
		return
	default:
	}
	o := s.b.o
	now := time.Now()
	deadline := time.Unix(0, k.l.lastPong.Load()).Add(o.PongTimeout)
	if !now.Before(deadline) {
		s.logAt(zerolog.InfoLevel).Str("leg", k.l.name).Msg("relay: no pong, dropping connection")
		k.l.drop()
		return
	}
	if !now.Before(k.next) {
		if k.l.writeFrame(opPing, nil, k.l.wt) != nil {
			return // closing or broken: its reader ends the session
		}
		// Slots that went by (a ping that waited for the leg's lock) are
		// skipped: the schedule resumes at the first slot after now.
		for !k.next.After(now) {
			k.next = k.next.Add(o.PingInterval)
		}
	}
	wait := k.next.Sub(now)
	if d := deadline.Sub(now); d < wait {
		wait = d
	}
	// Re-armed under timerMu so stopTimers cannot be overtaken by a late
	// re-arm; that also orders this tick's fields before the next tick's.
	s.timerMu.Lock()
	if !s.timersOff {
		k.timer.Reset(max(wait, 0))
	}
	s.timerMu.Unlock()
}

// observeClient keeps the client's first frame for the route-credential
// handoff; nothing else about client traffic is inspected.
func (s *session) observeClient(data []byte) {
	if s.sawFirst {
		return
	}
	s.sawFirst = true
	if s.broker && s.b.o.Handoff != nil {
		first := bytes.Clone(data) // data is the pump's reusable buffer
		s.firstClient.Store(&first)
	}
}

// observeRelay looks for the Relay's auth verdict among its first text
// messages: auth.fail counts against the source; the first auth.ok ends
// inspection and, on broker connections, goes through the handoff.
func (s *session) observeRelay(typ byte, data []byte) []byte {
	if typ != opText || s.authOK || s.inspected >= inspectMessages {
		return data
	}
	s.inspected++
	switch classifyOffStack(data) {
	case verdictAuthFail:
		if s.b.limiter.fail(s.source) {
			s.logAt(zerolog.WarnLevel).Msg("relay: source blocked after repeated auth failures")
		}
	case verdictAuthOK:
		s.authOK = true
		s.releaseSlot()
		if s.broker && s.b.o.Handoff != nil {
			return s.handoff(data)
		}
	}
	return data
}

// classifyOffStack runs classify on a short-lived goroutine. encoding/json
// needs more stack than everything else a pump does; run on the pump, the
// auth verdict would double that pump's stack (4 to 8 KiB) for the rest of
// the connection's life, which is most of an idle connection's footprint.
// It runs at most inspectMessages times per connection.
func classifyOffStack(msg []byte) verdict {
	var v verdict
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		v = classify(msg)
	}()
	wg.Wait()
	return v
}

// handoff runs the Reach hook on a genuine auth.ok, within HandoffTimeout.
// Any failure (timeout, panic, empty or non-auth.ok result, oversize result)
// forwards the Relay's message unchanged: the client still authenticates,
// it just gets no route credential.
func (s *session) handoff(authOK []byte) []byte {
	var clientAuth []byte
	if p := s.firstClient.Load(); p != nil {
		clientAuth = bytes.Clone(*p)
	}
	ctx, cancel := context.WithTimeout(s.b.base, s.b.o.HandoffTimeout)
	defer cancel()
	res := make(chan []byte, 1)
	in := bytes.Clone(authOK)
	go func() {
		var out []byte
		defer func() {
			if p := recover(); p != nil {
				// Only the panic value's type: the value may quote the
				// messages the hook was given, the client's credentials.
				s.logAt(zerolog.ErrorLevel).Str("panic_type", fmt.Sprintf("%T", p)).Msg("relay: route credential handoff panicked")
				out = nil
			}
			res <- out
		}()
		out = s.b.o.Handoff.AuthOK(ctx, clientAuth, in)
	}()
	select {
	case out := <-res:
		if len(out) == 0 {
			return authOK
		}
		if int64(len(out)) > s.b.o.MaxMessageBytes || classifyOffStack(out) != verdictAuthOK {
			s.logAt(zerolog.ErrorLevel).Msg("relay: route credential handoff returned an invalid message; forwarding auth.ok unchanged")
			return authOK
		}
		return out
	case <-ctx.Done():
		s.logAt(zerolog.WarnLevel).Msg("relay: route credential handoff timed out; forwarding auth.ok unchanged")
		return authOK
	}
}
