package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
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
// keepalives and write deadlines are timers whose callbacks exist only while
// they fire, because every parked goroutine costs an idle connection at
// least a stack.
type session struct {
	b      *Bridge
	client *websocket.Conn
	relay  *websocket.Conn
	remote string // for logs
	source string
	broker bool

	done    chan struct{} // closed when the session starts ending
	endOnce sync.Once
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

	msgsIn, bytesIn   int64 // client→Relay pump only
	msgsOut, bytesOut int64 // Relay→client pump only
}

func newSession(b *Bridge, cl, up *websocket.Conn, remote, source string, broker bool) *session {
	// The library's own limit sits one byte above ours so that the bridge,
	// not the library, detects an oversize message and closes both legs.
	cl.SetReadLimit(b.o.MaxMessageBytes + 1)
	up.SetReadLimit(b.o.MaxMessageBytes + 1)
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

// run bridges until both pumps have stopped and every timer callback has
// returned. The caller's goroutine pumps client→Relay; one more goroutine
// pumps Relay→client.
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
	// A pump that failed to write stops without ending the session (the
	// reader of the failed leg reports how it ended); if both did, end here.
	s.end(noStatus, noStatus, "write failed")
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

// end closes both legs once, each with its close frame, and waits for both
// close handshakes (each bounded by the library: 5 s write, 5 s wait).
func (s *session) end(toClient, toRelay closeSpec, cause string) {
	s.endOnce.Do(func() {
		close(s.done)
		// Nothing reaches the Relay any more: the slot goes back now, not
		// after the close handshakes (a peer that never answers holds those
		// for seconds).
		s.releaseSlot()
		s.cause, s.toClient, s.toRelay = cause, toClient, toRelay
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.relay.Close(toRelay.code, toRelay.reason)
		}()
		_ = s.client.Close(toClient.code, toClient.reason)
		wg.Wait()
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

// stopTimers disarms the keepalives and waits for callbacks still running
// (a ping in flight returns as soon as its leg is closed, which it is by now).
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

// Message buffers come from a shared pool and are taken only once a message
// has started to arrive, so an idle connection holds none. A buffer that grew
// past retainBufBytes for a large message is dropped afterwards rather than
// pooled, so one burst of big messages does not pin memory.
const (
	pooledBufBytes = 8 << 10
	retainBufBytes = 64 << 10
)

var msgBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, pooledBufBytes)
	return &b
}}

// pump relays messages from src to dst in order, each read whole (bounded by
// MaxMessageBytes) and written with its own type.
func (s *session) pump(src, dst *websocket.Conn, toRelay bool) {
	limit := s.b.o.MaxMessageBytes
	wd := &writeDeadline{s: s, conn: dst}
	defer wd.stop()
	for {
		typ, bp, err := nextMessage(context.Background(), src, limit)
		if errors.Is(err, errTooBig) {
			s.end(tooBig, tooBig, "message too big")
			return
		}
		if err == nil {
			data := *bp
			n := int64(len(data))
			ok := s.forward(wd, typ, data, toRelay)
			if cap(data) <= retainBufBytes {
				*bp = data[:0]
				msgBufs.Put(bp)
			}
			if !ok {
				return
			}
			if toRelay {
				s.msgsIn++
				s.bytesIn += n
			} else {
				s.msgsOut++
				s.bytesOut += n
			}
			continue
		}
		// src ended: its peer's close frame (already answered by the
		// library) or a failure. The same code goes to both legs; on src it
		// only matters when src failed without a close handshake.
		spec := forwardClose(err)
		cause := "client closed"
		if !toRelay {
			cause = "relay closed"
		}
		s.end(spec, spec, cause)
		return
	}
}

// errTooBig is nextMessage's verdict on a message over the limit.
var errTooBig = errors.New("relay: message too big")

// nextMessage reads src's next message whole: the bridge's own code on the
// frame path. The library parses frame headers, answers control frames
// (also between a message's fragments) and hands over the payload of the
// message's data frames in order; readMessage counts it across fragments and
// stops one byte past limit, so a message over limit is errTooBig however
// its frames declared their lengths. The buffer comes from msgBufs once the
// message has started (an idle connection holds none) and holds the message
// on success; after an error it is dropped.
func nextMessage(ctx context.Context, src *websocket.Conn, limit int64) (websocket.MessageType, *[]byte, error) {
	typ, rd, err := src.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	bp := msgBufs.Get().(*[]byte)
	data, err := readMessage(rd, (*bp)[:0], limit)
	if err != nil {
		return 0, nil, err
	}
	if int64(len(data)) > limit {
		return 0, nil, errTooBig
	}
	*bp = data
	return typ, bp, nil
}

// forward observes one message and writes it (or the handoff's result) to
// the other leg; data is the pump's buffer and is not retained.
func (s *session) forward(wd *writeDeadline, typ websocket.MessageType, data []byte, toRelay bool) bool {
	if toRelay {
		s.observeClient(data)
	} else {
		data = s.observeRelay(typ, data)
	}
	return wd.write(typ, data)
}

// readMessage appends the rest of one message to buf, growing it (doubling,
// never past limit+1) until the message ends or limit+1 bytes are read; more
// than limit bytes means the message is too big. It never asks rd for more
// than limit+1 bytes in all, even when buf is larger (a pooled buffer under a
// small limit): past that the library would enforce its own limit instead.
func readMessage(rd io.Reader, buf []byte, limit int64) ([]byte, error) {
	for {
		end := int(min(int64(cap(buf)), limit+1))
		if len(buf) == end {
			if int64(len(buf)) > limit {
				return buf, nil
			}
			// Probe before growing: a message that exactly fills the buffer
			// (a power-of-two size, or exactly the limit) must not cost a copy.
			var probe [1]byte
			n, err := rd.Read(probe[:])
			if n == 0 {
				if err == io.EOF {
					return buf, nil
				}
				if err != nil {
					return buf, err
				}
				continue
			}
			buf = grow(buf, limit+1)
			buf = append(buf, probe[0])
			if err == io.EOF {
				return buf, nil
			}
			if err != nil {
				return buf, err
			}
			continue
		}
		n, err := rd.Read(buf[len(buf):end])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// grow returns buf with double its capacity (at least 512 bytes), capped at
// ceiling.
func grow(buf []byte, ceiling int64) []byte {
	n := min(max(int64(cap(buf))*2, 512), ceiling)
	nb := make([]byte, len(buf), n)
	copy(nb, buf)
	return nb
}

// writeDeadline bounds each write to one leg by WriteTimeout with a single
// reusable timer per direction: the library would otherwise arm a context
// timer per frame, and a context per message costs several allocations. On
// expiry the timer closes the leg, which fails the blocked write, exactly
// what the library does when a write's context expires.
type writeDeadline struct {
	s     *session
	conn  *websocket.Conn
	timer *time.Timer
}

// write sends one message to the leg within WriteTimeout. On failure the leg
// is unusable; it is closed so its own reader notices and ends the session
// with the code the leg reported, if any.
func (w *writeDeadline) write(typ websocket.MessageType, data []byte) bool {
	if w.timer == nil {
		w.timer = time.AfterFunc(w.s.b.o.WriteTimeout, w.expire)
	} else {
		w.timer.Reset(w.s.b.o.WriteTimeout)
	}
	err := w.conn.Write(context.Background(), typ, data)
	w.timer.Stop()
	if err != nil {
		_ = w.conn.CloseNow()
		return false
	}
	return true
}

func (w *writeDeadline) expire() {
	if !w.s.enterTimer() {
		return
	}
	defer w.s.timerWG.Done()
	_ = w.conn.CloseNow()
}

func (w *writeDeadline) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

// keepalive pings one leg every PingInterval and drops it when PongTimeout
// passes without a pong since the last one (the deadline of each ping is the
// previous pong plus PongTimeout, so a dead peer goes 60 s after its last
// sign of life, not 60 s after the next ping). The dropped leg's reader then
// ends the session with a close without status on the other leg: the peer
// vanished, an abnormal closure.
//
// It is a timer, not a goroutine: pings follow a ticker's schedule (every
// PingInterval from the start; a ping that outlasts an interval is followed
// by the next one at once), and between pings nothing is parked.
type keepalive struct {
	s        *session
	conn     *websocket.Conn
	leg      string
	timer    *time.Timer // set under s.timerMu before the first tick can read it
	next     time.Time   // the schedule slot the armed timer stands for
	lastPong time.Time
}

func (s *session) startKeepalives() {
	now := time.Now()
	every := s.b.o.PingInterval
	s.timerMu.Lock()
	defer s.timerMu.Unlock()
	for i, leg := range []struct {
		c    *websocket.Conn
		name string
	}{{s.client, "client"}, {s.relay, "relay"}} {
		k := &s.keepalives[i]
		*k = keepalive{s: s, conn: leg.c, leg: leg.name, next: now.Add(every), lastPong: now}
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
	ctx, cancel := context.WithDeadline(context.Background(), k.lastPong.Add(s.b.o.PongTimeout))
	err := k.conn.Ping(ctx)
	cancel()
	if err != nil {
		select {
		case <-s.done:
		default:
			s.logAt(zerolog.InfoLevel).Str("leg", k.leg).Msg("relay: no pong, dropping connection")
			_ = k.conn.CloseNow()
		}
		return
	}
	now := time.Now()
	k.lastPong = now
	every := s.b.o.PingInterval
	k.next = k.next.Add(every)
	wait := k.next.Sub(now)
	if wait <= 0 {
		// Slots went by during the ping: one fires at once, the schedule
		// resumes at the first slot after now.
		for !k.next.Add(every).After(now) {
			k.next = k.next.Add(every)
		}
		wait = 0
	}
	// Re-armed under timerMu so stopTimers cannot be overtaken by a late
	// re-arm; that also orders this tick's fields before the next tick's.
	s.timerMu.Lock()
	if !s.timersOff {
		k.timer.Reset(wait)
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
func (s *session) observeRelay(typ websocket.MessageType, data []byte) []byte {
	if typ != websocket.MessageText || s.authOK || s.inspected >= inspectMessages {
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
				s.logAt(zerolog.ErrorLevel).Interface("panic", p).Msg("relay: route credential handoff panicked")
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
