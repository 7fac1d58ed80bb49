// Package proxy is the front: one pinned-TLS HTTPS origin serving exactly
// three fixed namespaces (/relay, /api/, /dashboard/) of one Hermes host.
//
// The request path is deliberately narrow: method and request-target checks,
// the Host check, then a fixed split of the raw path into a namespace. No
// client input ever selects an upstream, and each namespace keeps its own
// credential (see internal/policy for the header table).
//
// Every listener is served by the same http.Server, so a connection that
// arrives through a Reach broker stream takes exactly the policy path of one
// that arrived over TCP; ConnContext marks the former for the /relay bridge.
package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/internal/policy"
	"github.com/hermes-securelink/securelink/internal/probe"
	"github.com/hermes-securelink/securelink/internal/rawsock"
	"github.com/hermes-securelink/securelink/internal/tlsconf"
	"github.com/hermes-securelink/securelink/pinning"
	"github.com/hermes-securelink/securelink/relay"
)

// Server is the front. Create it with New, serve listeners with Serve, apply
// configuration and identity changes with Reload, stop it with Shutdown.
type Server struct {
	log      zerolog.Logger
	identity atomic.Pointer[pinning.Identity]
	state    atomic.Pointer[state]
	prober   *probe.Prober
	bridge   *relay.Bridge
	health   http.Handler
	http     *http.Server
	tls      *tls.Config
	// tlsNoResume is tls without session resumption (see configForClient).
	tlsNoResume *tls.Config

	// sniRejected counts handshakes refused for an unknown server name.
	sniRejected atomic.Uint64
	metrics     *metrics.Front

	h3 quicFront // HTTP/3, when ServeQUIC runs (http3.go)

	mu               sync.Mutex
	upgraded         map[net.Conn]struct{}     // byte-level upgrades, closed on Shutdown
	streams          map[*eventStream]struct{} // open event streams, ended on Shutdown
	closing          bool
	reverseProxyOnly bool // Options.reverseProxyOnly
}

// state is everything Reload replaces at once; requests read one snapshot.
type state struct {
	opts      Options
	host      *policy.HostPolicy
	authority string // host:port as clients see it
	api       *forwarder
	dashboard *forwarder
}

// New builds a front serving id. It does not listen.
func New(opts Options, id *pinning.Identity) (*Server, error) {
	if id == nil {
		return nil, errors.New("proxy: an identity is required")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Server{log: opts.Log, metrics: opts.Metrics, upgraded: map[net.Conn]struct{}{}, streams: map[*eventStream]struct{}{},
		reverseProxyOnly: opts.reverseProxyOnly}
	s.prober = probe.New(probe.Options{
		Interval: opts.Limits.ProbeInterval,
		Timeout:  opts.Limits.ProbeTimeout,
		Log:      opts.Log,
	})
	ro := opts.Relay
	ro.Upstream, ro.ProxySecret, ro.Log = opts.Upstreams.Relay, opts.ProxySecret, opts.Log
	bridge, err := relay.NewBridge(ro.WithDefaults())
	if err != nil {
		return nil, err
	}
	s.bridge = bridge
	s.health = relay.NewHealthHandler(s.Availability)
	if err := s.Reload(opts, id); err != nil {
		return nil, err
	}
	s.tls = &tls.Config{
		MinVersion:     tlsconf.MinVersion,
		CipherSuites:   tlsconf.TLS12Suites,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: s.getCertificate,
	}
	// A handshake naming an unknown server gets this copy: without session
	// resumption, so a ticket issued under a known name cannot skip the
	// certificate choice (TLS 1.3 resumption does not ask GetCertificate),
	// and getCertificate refuses it with unrecognized_name.
	s.tlsNoResume = s.tls.Clone()
	s.tlsNoResume.SessionTicketsDisabled = true
	s.tls.GetConfigForClient = s.configForClient
	s.tls.WrapSession, s.tls.UnwrapSession = s.wrapSession, s.unwrapSession
	l := opts.Limits
	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		// "OPTIONS *" is not on the route table; without this net/http
		// answers it itself, outside every check of ServeHTTP.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     log.New(serverErrorLog{log: opts.Log, event: "http_server", metrics: opts.Metrics}, "", 0),
		ConnContext:                  connContext,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          250,
			MaxReceiveBufferPerStream:     1 << 20,
			MaxReceiveBufferPerConnection: 4 << 20,
		},
	}
	return s, nil
}

// Reload applies new options and identity to new requests and handshakes.
// Established connections keep running; nothing is half-applied: on error
// the previous state stays in force.
func (s *Server) Reload(opts Options, id *pinning.Identity) error {
	if id == nil {
		return errors.New("proxy: an identity is required")
	}
	if err := opts.validate(); err != nil {
		return err
	}
	hp, err := policy.NewHostPolicy(opts.AuthorityHost, opts.AuthorityPort, opts.ExtraNames)
	if err != nil {
		return fmt.Errorf("proxy: authority: %w", err)
	}
	st := &state{
		opts:      opts,
		host:      hp,
		authority: pinning.Authority{Host: opts.AuthorityHost, Port: opts.AuthorityPort}.String(),
	}
	st.api = newForwarder(s, policy.NSAPI, opts.Upstreams.API, st.authority, opts.Limits)
	st.dashboard = newForwarder(s, policy.NSDashboard, opts.Upstreams.Dashboard, st.authority, opts.Limits)
	old := s.state.Swap(st)
	s.identity.Store(id)
	s.prober.SetTargets(opts.Upstreams.Relay, opts.Upstreams.API, opts.Upstreams.Dashboard)
	if s.bridge != nil {
		s.bridge.Update(opts.Upstreams.Relay, opts.ProxySecret)
	}
	if old != nil {
		// In-flight requests hold their own reference; only idle pooled
		// connections of the old transports are released.
		old.api.close()
		old.dashboard.close()
	}
	return nil
}

// Identity returns the identity new handshakes present.
func (s *Server) Identity() *pinning.Identity { return s.identity.Load() }

// TLSConfig is the server TLS configuration; the certificate is looked up per
// handshake so Reload takes effect without restarting listeners.
func (s *Server) TLSConfig() *tls.Config { return s.tls }

// SNIRejected reports how many handshakes named an unknown server.
func (s *Server) SNIRejected() uint64 { return s.sniRejected.Load() }

// RegisterMetrics adds the scrape-time gauges that read the front's state:
// open WebSockets, cached upstream availability and probe counts.
func (s *Server) RegisterMetrics(m *metrics.Front) {
	if m == nil {
		return
	}
	s.registerQUICMetrics(m)
	const wsHelp = "Open WebSockets: relay = /relay/ws bridges, passthrough = byte-level upgrades on /api and /dashboard."
	m.GaugeFunc("securelink_websockets_active", wsHelp, prometheus.Labels{"ns": "relay"},
		func() float64 { return float64(s.bridge.Active()) })
	m.GaugeFunc("securelink_websockets_active", wsHelp, prometheus.Labels{"ns": "passthrough"},
		func() float64 { return float64(s.ActiveUpgrades()) })
	for _, t := range []struct {
		name   string
		target probe.Target
	}{{"relay", probe.Relay}, {"api", probe.API}, {"dashboard", probe.Dashboard}} {
		t := t
		m.CounterFunc("securelink_probes_total", "Availability probes sent to upstreams (coalesced, cached).", prometheus.Labels{"target": t.name},
			func() float64 { return float64(s.prober.Count(t.target)) })
		m.GaugeFunc("securelink_upstream_available", "1 when an upstream's last probe succeeded (the Dashboard: its login gate is on).", prometheus.Labels{"target": t.name},
			func() float64 {
				if s.prober.Available(context.Background(), t.target) {
					return 1
				}
				return 0
			})
	}
}

// Bridge exposes the /relay/ws bridge (for status and Reach wiring).
func (s *Server) Bridge() *relay.Bridge { return s.bridge }

// getCertificate implements the SNI policy: no SNI (IP authorities) or a
// configured name gets the identity's certificate (an ACME identity's
// current one, or an error and an alert while it has none); any other name
// gets no certificate, which crypto/tls answers with the unrecognized_name
// alert.
func (s *Server) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if hello.ServerName != "" && !s.state.Load().host.Allowed(hello.ServerName) {
		s.sniRejected.Add(1)
		s.metrics.HandshakeFailure(metrics.ReasonUnknownSNI)
		return nil, nil
	}
	return s.identity.Load().GetCertificate(hello)
}

// configForClient keeps the SNI rule on resumed sessions: a hello naming
// an unknown server may not resume, so it takes the full handshake, where
// getCertificate refuses it. It runs for every ClientHello, before the
// resumption decision; known names and no SNI keep the shared config.
// wrapSession and unwrapSession bind a session ticket to the certificate it
// was issued under. A resumed session presents no certificate: the client
// keeps the one it saw, so without this a ticket from before a rotation
// would keep old clients on the old pin for the ticket's lifetime (up to 7
// days). A ticket for another certificate is ignored and the client makes a
// full handshake with the current identity. The tickets' keys stay Go's
// own, rotated automatically.
func (s *Server) wrapSession(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
	tag := sha256.Sum256(s.identity.Load().CertDER)
	ss.Extra = append(ss.Extra, tag[:])
	return s.tls.EncryptTicket(cs, ss)
}

func (s *Server) unwrapSession(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
	ss, err := s.tls.DecryptTicket(identity, cs)
	if err != nil || ss == nil {
		return nil, err
	}
	cur := sha256.Sum256(s.identity.Load().CertDER)
	for _, e := range ss.Extra {
		if bytes.Equal(e, cur[:]) {
			return ss, nil
		}
	}
	return nil, nil
}

func (s *Server) configForClient(hello *tls.ClientHelloInfo) (*tls.Config, error) {
	if hello.ServerName != "" && !s.state.Load().host.Allowed(hello.ServerName) {
		return s.tlsNoResume, nil
	}
	return nil, nil
}

// Serve accepts TLS connections on ln until Shutdown. ln is a plain
// (TCP or in-memory) listener; TLS is added here with the front's policy,
// over the accepted TCP socket's raw reads and writes (rawListener).
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(tls.NewListener(rawListener{ln}, s.tls))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// rawListener hands net/http's TLS the accepted TCP sockets as
// internal/rawsock Conns: their reads and writes are raw system calls,
// which do not wake the runtime's monitor thread after an idle spell
// (measured on main: ~1.7 futex and ~1 nanosleep per 1-connection
// WebSocket echo, sysmon ~a fifth of the front's CPU there). Other
// connections (Reach's broker streams: no socket) are served as they are.
type rawListener struct{ net.Listener }

func (l rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return rawsock.Wrap(c), nil
}

// Shutdown stops accepting, ends open event streams cleanly at once (they
// would otherwise hold the drain for all of ctx and then be cut), lets the
// other in-flight requests finish until ctx ends (on TCP and on HTTP/3),
// closes bridged WebSockets with 1001 and byte-level upgrades, and returns.
func (s *Server) Shutdown(ctx context.Context) error {
	s.endStreams()
	bridgeErr, quicErr := make(chan error, 1), make(chan error, 1)
	go func() { bridgeErr <- s.bridge.Shutdown(ctx) }()
	go func() { quicErr <- s.shutdownQUIC(ctx) }()
	httpErr := s.http.Shutdown(ctx)
	err := errors.Join(httpErr, <-bridgeErr, <-quicErr)
	s.closeUpgrades()
	s.prober.Close()
	st := s.state.Load()
	st.api.close()
	st.dashboard.close()
	return err
}

// Close stops everything at once.
func (s *Server) Close() error {
	err := errors.Join(s.http.Close(), s.closeQUIC())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.bridge.Shutdown(ctx)
	s.closeUpgrades()
	s.prober.Close()
	return err
}

// eventStream is one open text/event-stream response; end makes its copy
// loop see the end of the upstream body, so the handler returns and the
// client gets a properly terminated response (the last chunk on HTTP/1.1,
// END_STREAM on HTTP/2), as a WebSocket gets 1001.
type eventStream struct{ end func() }

// trackStream registers an event stream for Shutdown and returns its
// deregistration. A stream that starts once Shutdown has begun is ended at
// once.
func (s *Server) trackStream(end func()) (untrack func()) {
	es := &eventStream{end: end}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		end()
		return func() {}
	}
	s.streams[es] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.streams, es)
		s.mu.Unlock()
	}
}

// endStreams marks the front as closing (no new upgrades or streams) and
// ends the open event streams.
func (s *Server) endStreams() {
	s.mu.Lock()
	s.closing = true
	open := make([]*eventStream, 0, len(s.streams))
	for es := range s.streams {
		open = append(open, es)
	}
	s.mu.Unlock()
	for _, es := range open {
		es.end()
	}
}

// closeUpgrades refuses new byte-level upgrades and closes the open ones.
// The set is copied first: trackedConn.Close takes s.mu to remove itself.
func (s *Server) closeUpgrades() {
	s.mu.Lock()
	s.closing = true
	open := make([]net.Conn, 0, len(s.upgraded))
	for c := range s.upgraded {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// Availability reports the three coalesced probes (run in parallel, so a
// cold cache costs one probe timeout, not three).
func (s *Server) Availability(ctx context.Context) relay.Availability {
	var a relay.Availability
	a.Relay, a.API, a.Dashboard = s.prober.All(ctx)
	return a
}

// ServeHTTP answers one request, recording it when metrics are on.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.advertiseHTTP3(w, r)
	if s.metrics == nil {
		s.route(w, r)
		return
	}
	rec := newRecorder(w, r)
	ns := s.route(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK // net/http's answer when nothing was written
	}
	s.metrics.Request(ns, rec.status, rec.in.n, rec.out)
}

// nsNone labels requests refused before a namespace was chosen.
const nsNone = "none"

// route is the whole routing table of the front; it returns the namespace
// label of the request for metrics.
func (s *Server) route(w http.ResponseWriter, r *http.Request) string {
	st := s.state.Load()
	// HTTP/2 carries the method as a header value: "TRACE " or "GET /x"
	// must not pass the check below and then be written upstream.
	if !policy.ValidMethod(r.Method) {
		plainError(w, http.StatusBadRequest)
		return nsNone
	}
	if r.Method == http.MethodConnect || r.Method == http.MethodTrace {
		plainError(w, http.StatusMethodNotAllowed)
		return nsNone
	}
	// Origin-form only: an absolute-form target ("GET http://x/ HTTP/1.1")
	// would let a client name a host other than the authority.
	if !strings.HasPrefix(r.RequestURI, "/") {
		plainError(w, http.StatusBadRequest)
		return nsNone
	}
	if !st.host.Allowed(r.Host) {
		plainError(w, http.StatusMisdirectedRequest)
		return nsNone
	}
	rawPath, rawQuery, _ := strings.Cut(r.RequestURI, "?")
	if policy.CheckRawQuery(rawQuery) != nil {
		// Over HTTP/2 a query may hold a space or a '#'; forwarded, it
		// would add tokens to the upstream's request line.
		plainError(w, http.StatusBadRequest)
		return nsNone
	}
	ns, tail, ok := policy.Split(rawPath)
	if !ok {
		plainError(w, http.StatusNotFound)
		return nsNone
	}
	switch ns {
	case policy.NSRelay:
		switch rawPath {
		case "/relay/health":
			s.health.ServeHTTP(w, r)
		case "/relay/ws":
			s.bridge.ServeHTTP(w, r)
		default:
			plainError(w, http.StatusNotFound)
		}
	case policy.NSAPI, policy.NSDashboard:
		if err := policy.CheckRawPath(rawPath); err != nil {
			plainError(w, http.StatusBadRequest)
			break
		}
		if ns == policy.NSDashboard {
			if !s.prober.Dashboard(r.Context()) {
				// Fail closed: without the Dashboard's own login gate its
				// HTML may embed a local operator token.
				plainError(w, http.StatusServiceUnavailable)
				break
			}
			st.dashboard.serve(w, r, tail, rawQuery)
			break
		}
		st.api.serve(w, r, tail, rawQuery)
	default:
		plainError(w, http.StatusNotFound)
		return nsNone
	}
	return ns.String()
}

// plainError writes a short generic body; upstream details never reach clients.
func plainError(w http.ResponseWriter, code int) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	fmt.Fprintln(w, http.StatusText(code))
}

// trackUpgrade registers a hijacked connection so Shutdown can close it.
func (s *Server) trackUpgrade(c net.Conn) net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		c.Close()
		return c
	}
	tc := &trackedConn{Conn: c, s: s}
	s.upgraded[tc] = struct{}{}
	return tc
}

// ActiveUpgrades reports open byte-level WebSocket pass-throughs.
func (s *Server) ActiveUpgrades() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.upgraded)
}

type trackedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.upgraded, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// serverErrorLog routes the standard library's log lines (net/http's
// internal messages: TLS handshake errors and the like) to zerolog at debug
// level. They are client or upstream noise, and some quote what a peer sent
// (http.Transport's "Unsolicited response ... starting with %q" quotes an
// upstream's stray bytes), so only a bounded, inert prefix is kept (see
// logLine). Handshake failures are classified on the whole line first.
type serverErrorLog struct {
	log     zerolog.Logger
	event   string
	metrics *metrics.Front
}

func (l serverErrorLog) Write(p []byte) (int, error) {
	if l.metrics != nil {
		if reason, ok := handshakeFailureReason(string(p)); ok {
			l.metrics.HandshakeFailure(reason)
		}
	}
	if e := l.log.Debug(); e.Enabled() { // logLine's copy only when it is kept
		e.Str("event", l.event).Msg(logLine(p))
	}
	return len(p), nil
}

// maxLogLine bounds a standard-library log line in the structured log.
const maxLogLine = 120

// logLine is a standard-library log line as the structured log keeps it: at
// most maxLogLine bytes, trimmed, every byte outside printable ASCII (control
// characters, terminal escapes, line breaks) replaced by '?'.
func logLine(p []byte) string {
	p = bytes.TrimSpace(p)
	cut := len(p) > maxLogLine
	if cut {
		p = p[:maxLogLine]
	}
	b := make([]byte, 0, len(p)+len(" [truncated]"))
	for _, c := range p {
		if c < 0x20 || c >= 0x7f {
			c = '?'
		}
		b = append(b, c)
	}
	if cut {
		b = append(b, " [truncated]"...)
	}
	return string(b)
}

// CaptureStandardLog sends the global log package's output (net/http's
// Transport reports through it and has no logger of its own) through l, as
// serverErrorLog does for the servers' ErrorLog. The daemon calls it once at
// start.
func CaptureStandardLog(l zerolog.Logger) {
	log.SetFlags(0)
	log.SetPrefix("")
	log.SetOutput(serverErrorLog{log: l, event: "stdlib"})
}

// handshakeFailureReason classifies net/http's "TLS handshake error" lines.
// Unknown-SNI refusals are counted where they are decided, not here.
func handshakeFailureReason(msg string) (string, bool) {
	_, detail, ok := strings.Cut(msg, "TLS handshake error from ")
	if !ok {
		return "", false
	}
	switch {
	case strings.Contains(detail, "no certificates configured"):
		return "", false
	case strings.Contains(detail, "timeout"):
		return metrics.ReasonTimeout, true
	case strings.Contains(detail, "tls: "):
		return metrics.ReasonProtocol, true
	default:
		return metrics.ReasonOther, true
	}
}
