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

// session is one bridged connection: the client leg, the Relay leg, a pump
// per direction and a keepalive per leg.
type session struct {
	b      *Bridge
	client *websocket.Conn
	relay  *websocket.Conn
	source string
	broker bool
	log    zerolog.Logger

	done    chan struct{} // closed when the session starts ending
	endOnce sync.Once
	// Set inside endOnce; read after the pumps returned.
	cause             string
	toClient, toRelay closeSpec

	// Only for broker connections with a Handoff: the client's first frame,
	// written by the client→Relay pump, read by the Relay→client pump.
	firstClient atomic.Pointer[[]byte]
	sawFirst    bool // client→Relay pump only

	inspected int  // Relay→client pump only
	authOK    bool // Relay→client pump only

	msgsIn, bytesIn   int64 // client→Relay pump only
	msgsOut, bytesOut int64 // Relay→client pump only
}

func newSession(b *Bridge, cl, up *websocket.Conn, source string, broker bool, log zerolog.Logger) *session {
	// The library's own limit sits one byte above ours so that the bridge,
	// not the library, detects an oversize message and closes both legs.
	cl.SetReadLimit(b.o.MaxMessageBytes + 1)
	up.SetReadLimit(b.o.MaxMessageBytes + 1)
	return &session{
		b: b, client: cl, relay: up, source: source, broker: broker, log: log,
		done: make(chan struct{}),
	}
}

// run bridges until both pumps have stopped, then waits for the keepalives.
func (s *session) run() {
	s.log.Debug().Msg("relay: bridged")
	var pumps, keepalives sync.WaitGroup
	pumps.Add(1)
	keepalives.Add(2)
	go func() {
		defer pumps.Done()
		s.pump(s.relay, s.client, false)
	}()
	go func() {
		defer keepalives.Done()
		s.keepalive(s.client, "client")
	}()
	go func() {
		defer keepalives.Done()
		s.keepalive(s.relay, "relay")
	}()
	s.pump(s.client, s.relay, true)
	pumps.Wait()
	// A pump that failed to write stops without ending the session (the
	// reader of the failed leg reports how it ended); if both did, end here.
	s.end(noStatus, noStatus, "write failed")
	keepalives.Wait()
	s.log.Debug().
		Str("cause", s.cause).
		Int("close_code_client", int(s.toClient.code)).
		Int("close_code_relay", int(s.toRelay.code)).
		Int64("msgs_in", s.msgsIn).Int64("bytes_in", s.bytesIn).
		Int64("msgs_out", s.msgsOut).Int64("bytes_out", s.bytesOut).
		Msg("relay: closed")
}

// end closes both legs once, each with its close frame, and waits for both
// close handshakes (each bounded by the library: 5 s write, 5 s wait).
func (s *session) end(toClient, toRelay closeSpec, cause string) {
	s.endOnce.Do(func() {
		close(s.done)
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

// pump relays messages from src to dst in order, each read whole (bounded by
// MaxMessageBytes) and written with its own type.
func (s *session) pump(src, dst *websocket.Conn, toRelay bool) {
	limit := s.b.o.MaxMessageBytes
	for {
		typ, rd, err := src.Reader(context.Background())
		if err == nil {
			var data []byte
			data, err = io.ReadAll(io.LimitReader(rd, limit+1))
			if err == nil && int64(len(data)) > limit {
				s.end(tooBig, tooBig, "message too big")
				return
			}
			if err == nil {
				if toRelay {
					s.observeClient(data)
				} else {
					data = s.observeRelay(typ, data)
				}
				if !s.write(dst, typ, data) {
					return
				}
				if toRelay {
					s.msgsIn++
					s.bytesIn += int64(len(data))
				} else {
					s.msgsOut++
					s.bytesOut += int64(len(data))
				}
				continue
			}
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

// write sends one message to dst within WriteTimeout. On failure dst is
// unusable; it is closed so its own reader notices and ends the session with
// the code dst reported, if any.
func (s *session) write(dst *websocket.Conn, typ websocket.MessageType, data []byte) bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.b.o.WriteTimeout)
	err := dst.Write(ctx, typ, data)
	cancel()
	if err != nil {
		_ = dst.CloseNow()
		return false
	}
	return true
}

// keepalive pings one leg every PingInterval and drops it when PongTimeout
// passes without a pong since the last one (the deadline of each ping is the
// previous pong plus PongTimeout, so a dead peer goes 60 s after its last
// sign of life, not 60 s after the next ping). The dropped leg's reader then
// ends the session with a close without status on the other leg: the peer
// vanished, an abnormal closure.
func (s *session) keepalive(c *websocket.Conn, leg string) {
	t := time.NewTicker(s.b.o.PingInterval)
	defer t.Stop()
	lastPong := time.Now()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithDeadline(context.Background(), lastPong.Add(s.b.o.PongTimeout))
		err := c.Ping(ctx)
		cancel()
		if err == nil {
			lastPong = time.Now()
			continue
		}
		select {
		case <-s.done:
		default:
			s.log.Info().Str("leg", leg).Msg("relay: no pong, dropping connection")
			_ = c.CloseNow()
		}
		return
	}
}

// observeClient keeps the client's first frame for the route-credential
// handoff; nothing else about client traffic is inspected.
func (s *session) observeClient(data []byte) {
	if s.sawFirst {
		return
	}
	s.sawFirst = true
	if s.broker && s.b.o.Handoff != nil {
		s.firstClient.Store(&data)
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
	switch classify(data) {
	case verdictAuthFail:
		if s.b.limiter.fail(s.source) {
			s.log.Warn().Msg("relay: source blocked after repeated auth failures")
		}
	case verdictAuthOK:
		s.authOK = true
		if s.broker && s.b.o.Handoff != nil {
			return s.handoff(data)
		}
	}
	return data
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
				s.log.Error().Interface("panic", p).Msg("relay: route credential handoff panicked")
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
		if int64(len(out)) > s.b.o.MaxMessageBytes || classify(out) != verdictAuthOK {
			s.log.Error().Msg("relay: route credential handoff returned an invalid message; forwarding auth.ok unchanged")
			return authOK
		}
		return out
	case <-ctx.Done():
		s.log.Warn().Msg("relay: route credential handoff timed out; forwarding auth.ok unchanged")
		return authOK
	}
}
