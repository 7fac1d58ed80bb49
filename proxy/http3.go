package proxy

// HTTP/3 (`http3: true`): the front also serves QUIC on a UDP socket of the
// same address, through quic-go. This file is the only one that imports
// quic-go (its API changes between minor versions; go.mod pins one).
//
// What is shared with TCP, by construction rather than by copy:
//   - the handler: requests go to (*Server).ServeHTTP, so the request-line
//     rules, Host check, path safety, header policy, body and response
//     limits and timeouts are the TCP ones;
//   - the identity: the QUIC TLS configuration is s.tls with ALPN h3, so
//     getCertificate picks the certificate per handshake (Reload and
//     rotation apply to new QUIC handshakes) and configForClient keeps the
//     SNI rule on resumption;
//   - Shutdown: event streams end first, in-flight requests finish, then the
//     QUIC connections close, within the same grace as TCP.
//
// What differs, on purpose: 0-RTT is off (a replayable request buys nothing
// here); WebSockets stay on TCP (no RFC 9220 extended CONNECT, so /relay/ws
// over h3 is a plain GET and gets 400); a request quic-go finds malformed
// (a :method that is not a token, a forbidden connection header) is reset
// with H3_MESSAGE_ERROR by quic-go before the handler (RFC 9114 §4.1.2),
// where TCP answers 400 — either way nothing reaches an upstream.

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/metrics"
)

// altSvcMaxAge is the ma= of the Alt-Svc header TCP responses carry (s).
const altSvcMaxAge = 86400

// quicWantBuffer is the UDP socket buffer quic-go asks for (its
// desiredBufferSize, sys_conn_buffers.go); below it, quic-go logs its own
// warning and throughput suffers. UDPBufferFix raises the limit.
const quicWantBuffer = 7 << 20

// UDPBufferFix is the command that lets a socket get quicWantBuffer bytes
// (the limits must exceed quic-go's wish, as Linux counts doubled).
const UDPBufferFix = "sysctl -w net.core.rmem_max=7500000 net.core.wmem_max=7500000 (persist it in /etc/sysctl.d/)"

// quicFront is the HTTP/3 side of a Server; its zero value is "not serving".
type quicFront struct {
	mu        sync.Mutex
	srv       *http3.Server
	listeners map[*quicListener]struct{}
	// stopped closes when Shutdown's drain or Close has ended the
	// connections; ServeQUIC keeps its transport (which carries them) open
	// until then.
	stopped  chan struct{}
	stopOnce sync.Once

	serving    atomic.Int32 // ServeQUIC calls running: Alt-Svc is sent while > 0
	active     atomic.Int64 // HTTP/3 requests in their handler
	handshakes atomic.Uint64
	requests   atomic.Uint64
	altSvc     atomic.Pointer[altSvcValue]
	warnOnce   sync.Once
}

type altSvcValue struct {
	port  int
	value []string // shared by every response: net/http only reads it
}

// quicListener counts completed handshakes: a quic.Listener (not the early
// one) hands out connections only once their handshake is complete.
type quicListener struct {
	*quic.Listener
	q *quicFront
}

func (l *quicListener) Accept(ctx context.Context) (*quic.Conn, error) {
	c, err := l.Listener.Accept(ctx)
	if err == nil {
		l.q.handshakes.Add(1)
	}
	return c, err
}

// quicConfig is the transport policy: 0-RTT off, the TCP handshake bound,
// flow-control windows as the HTTP/2 ones (1 MiB a stream, 4 MiB a
// connection), quic-go's 100 concurrent request streams.
func quicConfig(l Limits) *quic.Config {
	return &quic.Config{
		Allow0RTT:                  false,
		HandshakeIdleTimeout:       l.ReadHeaderTimeout,
		MaxStreamReceiveWindow:     1 << 20,
		MaxConnectionReceiveWindow: 4 << 20,
		MaxIncomingStreams:         100,
	}
}

// http3Server builds the HTTP/3 server once, from the limits in force.
func (s *Server) http3Server() *http3.Server {
	q := &s.h3
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.srv != nil {
		return q.srv
	}
	l := s.state.Load().opts.Limits
	// quic-go logs every request URI at debug level (which may hold a
	// token); only its warnings and errors reach the structured log.
	ql := s.log.With().Str("event", "http3_server").Logger()
	if ql.GetLevel() < zerolog.WarnLevel {
		ql = ql.Level(zerolog.WarnLevel)
	}
	q.srv = &http3.Server{
		Handler:        http.HandlerFunc(s.serveHTTP3),
		QUICConfig:     quicConfig(l),
		MaxHeaderBytes: l.MaxHeaderBytes,
		IdleTimeout:    l.IdleTimeout,
		Logger:         slog.New(zerolog.NewSlogHandler(ql)),
		// ReverseProxy and the direct path cut a response that fails after
		// its start (panic(http.ErrAbortHandler)) only under a server they
		// can see in the request context; quic-go answers that panic with a
		// stream reset, so an oversize or broken answer is never a silently
		// truncated success on h3 either.
		ConnContext: func(ctx context.Context, _ *quic.Conn) context.Context {
			return context.WithValue(ctx, http.ServerContextKey, s.http)
		},
	}
	q.listeners = map[*quicListener]struct{}{}
	q.stopped = make(chan struct{})
	return q.srv
}

// server is the HTTP/3 server, nil when ServeQUIC never ran.
func (q *quicFront) server() *http3.Server {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.srv
}

// stop marks the connections as ended (see stopped).
func (q *quicFront) stop() { q.stopOnce.Do(func() { close(q.stopped) }) }

// serveHTTP3 is the HTTP/3 entry: counted, then the one handler.
func (s *Server) serveHTTP3(w http.ResponseWriter, r *http.Request) {
	s.h3.requests.Add(1)
	s.h3.active.Add(1)
	defer s.h3.active.Add(-1)
	s.ServeHTTP(w, r)
}

// ServeQUIC serves HTTP/3 on pc (a UDP socket on the TCP listener's
// address) until Shutdown or Close, then returns nil. It warns once when
// the socket's buffers are smaller than QUIC wants, naming the fix; while
// it runs, TCP responses advertise HTTP/3 with Alt-Svc. pc stays open: the
// caller closes it after ServeQUIC returns.
func (s *Server) ServeQUIC(pc net.PacketConn) error {
	srv := s.http3Server()
	q := &s.h3
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return nil
	}
	tr := &quic.Transport{Conn: pc}
	qtls := http3.ConfigureTLSConfig(s.tls)
	ln, err := tr.Listen(qtls, quicConfig(s.state.Load().opts.Limits))
	if err != nil {
		tr.Close()
		return err
	}
	s.checkUDPBuffers(pc)
	ql := &quicListener{Listener: ln, q: q}
	q.mu.Lock()
	q.listeners[ql] = struct{}{}
	q.mu.Unlock()
	q.serving.Add(1)
	defer func() {
		q.serving.Add(-1)
		q.mu.Lock()
		delete(q.listeners, ql)
		q.mu.Unlock()
		tr.Close()
	}()
	err = srv.ServeListener(ql)
	ln.Close() // no new handshakes; established connections stay
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, quic.ErrServerClosed) {
		// Shutdown's drain is still under way on this transport.
		<-q.stopped
		return nil
	}
	return err
}

// checkUDPBuffers logs, once per front, the warning quic-go would print to
// the standard log, with the command that fixes it.
func (s *Server) checkUDPBuffers(pc net.PacketConn) {
	rcv, snd, ok := udpBuffers(pc)
	if !ok || (rcv >= quicWantBuffer && snd >= quicWantBuffer) {
		return
	}
	s.h3.warnOnce.Do(func() {
		s.log.Warn().Str("event", "udp_buffer_small").
			Int("receive_kib", rcv>>10).Int("send_kib", snd>>10).Int("want_kib", quicWantBuffer>>10).
			Str("fix", UDPBufferFix).
			Msg("UDP socket buffers are smaller than QUIC wants; HTTP/3 throughput may suffer")
	})
}

// advertiseHTTP3 adds Alt-Svc to a TCP response while HTTP/3 is served,
// naming the advertised port (AuthorityPort: advertise_port, or the listen
// port). Upstream Alt-Svc headers are dropped by the response policy, so
// this is the only one.
func (s *Server) advertiseHTTP3(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor >= 3 || s.h3.serving.Load() == 0 {
		return
	}
	port := s.state.Load().opts.AuthorityPort
	v := s.h3.altSvc.Load()
	if v == nil || v.port != port {
		v = &altSvcValue{port: port, value: []string{`h3=":` + strconv.Itoa(port) + `"; ma=` + strconv.Itoa(altSvcMaxAge)}}
		s.h3.altSvc.Store(v)
	}
	w.Header()["Alt-Svc"] = v.value
}

// shutdownQUIC drains HTTP/3 as http.Server.Shutdown drains TCP: GOAWAY to
// every connection, in-flight requests finish, and the connections close as
// soon as no request is left (quic-go alone would wait for each client to
// close, a misbehaving one for all of ctx), or when ctx ends.
func (s *Server) shutdownQUIC(ctx context.Context) error {
	q := &s.h3
	srv := q.server()
	if srv == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	idle := 0
	defer q.stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			// Two quiet ticks in a row: a request whose stream was accepted
			// just before the GOAWAY has had time to reach its handler.
			if q.active.Load() > 0 {
				idle = 0
				continue
			}
			if idle++; idle == 2 {
				go srv.Close()
			}
		}
	}
}

// closeQUIC stops HTTP/3 at once.
func (s *Server) closeQUIC() error {
	q := &s.h3
	srv := q.server()
	if srv == nil {
		return nil
	}
	defer q.stop()
	return srv.Close()
}

// registerQUICMetrics adds the HTTP/3 counters (zero while HTTP/3 is off).
// Requests are also in securelink_requests_total with every other request.
func (s *Server) registerQUICMetrics(m *metrics.Front) {
	m.CounterFunc("securelink_quic_handshakes_total", "QUIC handshakes completed (HTTP/3).", prometheus.Labels{},
		func() float64 { return float64(s.h3.handshakes.Load()) })
	m.CounterFunc("securelink_http3_requests_total", "Requests that arrived over HTTP/3.", prometheus.Labels{},
		func() float64 { return float64(s.h3.requests.Load()) })
}
