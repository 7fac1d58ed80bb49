package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-securelink/securelink/internal/policy"
)

// forwarder proxies one namespace to its fixed upstream, on one of two
// paths behind serve (exchange.go): the direct path (direct.go) for a
// request without a body that is not an upgrade, which costs a fraction of
// the CPU, and httputil.ReverseProxy (this file) for the others: it streams
// a request body while the answer may already arrive, and handles the
// WebSocket upgrade as a byte-level copy that closes both legs together.
type forwarder struct {
	s         *Server
	ns        policy.Namespace
	upstream  *url.URL
	authority string
	limits    Limits
	transport *http.Transport
	rp        *httputil.ReverseProxy
	pool      *upstreamPool // the direct path's connections (direct.go)
	basePath  string        // the upstream's escaped path without a trailing slash
}

// exchange is the per-request state the ReverseProxy hooks share.
type exchange struct {
	// clientCtx is the client's own request context: when it ends, the
	// client left; when only ours ends, a limit fired.
	clientCtx context.Context
	start     time.Time
	target    *url.URL // the upstream request URL (forwarder.target)
	upgrade   bool
	cancel    context.CancelFunc
	total     *time.Timer
	body      *limitedBody
	untrack   func() // an event stream's deregistration (Server.trackStream)
}

type exchangeKey struct{}

var errResponseTooLarge = errors.New("upstream response larger than the limit")

// errBadStatus: http.ReadResponse takes any three digits as a status, but
// an answer below 100 cannot be relayed (net/http's WriteHeader panics on
// it, which cut the client's connection and left the upstream's open on
// the direct path); both paths answer 502 instead.
var errBadStatus = errors.New("upstream answered a status below 100")

// bufferPool holds the 32 KiB copy buffers of both paths.
var bufferPool = &byteBufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

type byteBufferPool struct{ p sync.Pool }

func (b *byteBufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *byteBufferPool) Put(p []byte) { b.p.Put(&p) }

func newForwarder(s *Server, ns policy.Namespace, upstream *url.URL, authority string, l Limits) *forwarder {
	dialer := &net.Dialer{Timeout: l.UpstreamConnect, KeepAlive: l.TCPKeepAlive}
	f := &forwarder{s: s, ns: ns, upstream: upstream, authority: authority, limits: l}
	f.transport = &http.Transport{
		Proxy:                  nil, // never an environment proxy: upstreams are loopback
		DialContext:            dialer.DialContext,
		MaxIdleConns:           l.MaxUpstreamIdleConns,
		MaxIdleConnsPerHost:    l.MaxUpstreamIdleConns,
		IdleConnTimeout:        l.UpstreamIdleConn,
		ResponseHeaderTimeout:  l.UpstreamIdleRead,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true, // Content-Encoding passes untouched
		MaxResponseHeaderBytes: 64 << 10,
	}
	f.pool = newUpstreamPool(dialer, canonicalAddr(upstream), l.UpstreamIdleConn, l.MaxUpstreamIdleConns)
	f.basePath = strings.TrimSuffix(upstream.EscapedPath(), "/")
	f.rp = &httputil.ReverseProxy{
		Rewrite:        f.rewrite,
		Transport:      lineChecked{f.transport},
		ModifyResponse: f.modifyResponse,
		ErrorHandler:   f.errorHandler,
		BufferPool:     bufferPool,
		// Not nil: the default would print copy errors to stderr,
		// bypassing the structured log.
		ErrorLog: log.New(serverErrorLog{log: s.log, event: "reverse_proxy"}, "", 0),
	}
	return f
}

// lineChecked refuses a request whose upstream request line would not
// re-parse to its method and target (checkRequestLine) before the Transport
// writes it: the Transport checks the method, but writes a target holding a
// space as it is.
type lineChecked struct{ *http.Transport }

func (t lineChecked) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := checkRequestLine(r.Method, r.URL.RequestURI()); err != nil {
		return nil, err
	}
	return t.Transport.RoundTrip(r)
}

// close releases the idle upstream connections of both paths and keeps no
// more in the direct path's pool.
func (f *forwarder) close() {
	f.transport.CloseIdleConnections()
	f.pool.close()
}

// canonicalAddr is the upstream's host:port, with http's default port when
// none is given, as http.Transport dials it.
func canonicalAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// reverseProxy carries a request with a body, or a WebSocket upgrade, to
// the upstream through httputil.ReverseProxy (see serve for the policy).
func (f *forwarder) reverseProxy(w http.ResponseWriter, r *http.Request, target *url.URL, upgrade bool) {
	l := f.limits
	ex := &exchange{clientCtx: r.Context(), start: time.Now(), target: target, upgrade: upgrade}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ex.cancel = cancel
	if !ex.upgrade {
		ex.total = time.AfterFunc(l.UpstreamTotal, cancel)
		defer ex.total.Stop()
	}
	if r.Body != nil && r.Body != http.NoBody {
		ex.body = &limitedBody{rc: r.Body, remaining: l.MaxRequestBody, ctl: http.NewResponseController(w), timeout: l.BodyReadTimeout}
		r.Body = ex.body
		// The Transport may still read the body (to its end) while the
		// answer already streams back. Without full duplex, net/http's
		// HTTP/1 server drains and closes an unread request body when the
		// response starts; that read then fails, the Transport closes the
		// upstream connection and a streamed answer (an event stream to a
		// POST) is cut after its first event. HTTP/2 is always full duplex.
		_ = ex.body.ctl.EnableFullDuplex()
	}
	if ex.upgrade {
		w = &upgradeWriter{ResponseWriter: w, s: f.s}
	} else {
		w = &infoWriter{ResponseWriter: w, f: f}
	}
	ctx = context.WithValue(ctx, exchangeKey{}, ex)
	defer func() {
		if ex.untrack != nil {
			ex.untrack()
		}
	}()
	f.rp.ServeHTTP(w, r.WithContext(ctx))
	if ex.body != nil && !ex.body.ended.Load() {
		// Finish the body here, not after the handler: an answer can be
		// whole before the client sent all of its body (a 401 to an
		// upload), and in full duplex net/http would otherwise take the
		// body's end after the handler returned, restart its background
		// read there and panic at the next request on the connection
		// (golang/go#68560). Close waits for a Read the Transport still
		// has in progress and is bounded by the body's read deadline; the
		// answer is flushed first, so the client has it meanwhile. A body
		// the Transport read to its end (the usual upload) needs neither.
		_ = ex.body.ctl.Flush()
		ex.body.Close()
	}
}

func (f *forwarder) rewrite(pr *httputil.ProxyRequest) {
	ex := pr.In.Context().Value(exchangeKey{}).(*exchange)
	out := pr.Out
	out.URL.Scheme = f.upstream.Scheme
	out.URL.Host = f.upstream.Host
	out.URL.Opaque = ex.target.Opaque
	out.URL.RawPath = ""
	out.URL.RawQuery = ex.target.RawQuery
	out.URL.ForceQuery = false
	out.Host = f.upstream.Host
	// The header is the one serve's request policy produced: ReverseProxy's
	// copy has lost what the policy set (it deletes X-Forwarded-* before
	// Rewrite). For a WebSocket upgrade it holds the Connection and Upgrade
	// the policy re-created, which ReverseProxy compares with the 101.
	out.Header = pr.In.Header
}

func (f *forwarder) modifyResponse(resp *http.Response) error {
	ex := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	f.s.metrics.UpstreamLatency(f.ns.String(), time.Since(ex.start))
	if resp.StatusCode < 100 {
		return errBadStatus // before any policy runs on an answer that is dropped
	}
	f.responseHead(resp)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The body is the upgraded connection; no totals apply.
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = wholeClose{rwc}
		}
		return nil
	}
	if resp.ContentLength > f.limits.MaxResponseBody {
		return errResponseTooLarge
	}
	ib := newIdleBody(resp.Body, f.limits.UpstreamIdleRead, f.limits.MaxResponseBody, ex.cancel)
	// The trailers' values arrive with the body's end, and ReverseProxy
	// copies them after reading it: the response policy applies then.
	ib.trailers, ib.f = resp, f
	resp.Body = ib
	if ex.total != nil && isEventStream(resp.Header.Get("Content-Type")) {
		ex.total.Stop() // SSE: only the idle read applies
		// Shutdown ends the stream: the upstream request is canceled and
		// the body reports its end, so ReverseProxy finishes the response.
		ex.untrack = f.s.trackStream(func() {
			ib.ended.Store(true)
			ex.cancel()
		})
	}
	return nil
}

func (f *forwarder) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	ex, _ := r.Context().Value(exchangeKey{}).(*exchange)
	if ex != nil && ex.body != nil && ex.body.exceeded {
		plainError(w, http.StatusRequestEntityTooLarge)
		return
	}
	if ex != nil && ex.clientCtx.Err() != nil {
		// The client went away: nothing failed upstream, and nobody reads
		// an answer.
		f.s.log.Debug().Str("ns", f.ns.String()).Str("event", "client_gone").Msg("client left before the upstream answered")
		w.WriteHeader(499)
		return
	}
	f.s.log.Warn().Str("ns", f.ns.String()).Str("event", "upstream_error").Str("error", errorKind(err)).Msg("upstream failed")
	plainError(w, http.StatusBadGateway)
}

// isEventStream reports a text/event-stream Content-Type without the
// allocations of mime.ParseMediaType, which ran on every response.
func isEventStream(ct string) bool {
	const want = "text/event-stream"
	ct = strings.TrimLeft(ct, " \t")
	if len(ct) < len(want) || !strings.EqualFold(ct[:len(want)], want) {
		return false
	}
	rest := strings.TrimLeft(ct[len(want):], " \t")
	return rest == "" || rest[0] == ';'
}

// errorKind names an upstream failure without echoing URLs or paths.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, errResponseTooLarge):
		return "response_too_large"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled_or_timeout"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		var op *net.OpError
		if errors.As(err, &op) {
			return op.Op + "_failed"
		}
		return "failed"
	}
}

// limitedBody enforces the request-body size and per-read progress limits.
// Exactly MaxRequestBody bytes pass; one more aborts the request with 413.
type limitedBody struct {
	rc        io.ReadCloser
	remaining int64
	ctl       *http.ResponseController
	timeout   time.Duration
	exceeded  bool
	// ended is set once the Transport read the body's end (from its
	// writeLoop, so read by the handler atomically).
	ended atomic.Bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.exceeded {
		return 0, errBodyTooLarge
	}
	// Allow one byte past the limit to tell "exactly the limit" from "over".
	if int64(len(p)) > b.remaining+1 {
		p = p[:b.remaining+1]
	}
	_ = b.ctl.SetReadDeadline(time.Now().Add(b.timeout))
	n, err := b.rc.Read(p)
	if err == io.EOF {
		// The body is complete: the deadline must not outlive it. On
		// HTTP/1.1 net/http keeps reading the connection in the background
		// after the body's end to notice a client that leaves; a lingering
		// deadline would make that read time out and cancel a request whose
		// answer is merely slow. After a failed read the expired deadline
		// stays, so net/http's discarding of the unread body cannot block.
		_ = b.ctl.SetReadDeadline(time.Time{})
		b.ended.Store(true)
	}
	if int64(n) > b.remaining {
		b.exceeded = true
		return 0, errBodyTooLarge
	}
	b.remaining -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

var errBodyTooLarge = errors.New("request body larger than the limit")

// idleBody cancels the upstream exchange when no byte arrives for idle, and
// fails the copy when the response passes max bytes (the client then sees a
// cut connection or a reset stream, never a silently truncated success).
type idleBody struct {
	rc        io.ReadCloser
	idle      time.Duration
	timer     *time.Timer
	remaining int64
	// trailers is the response whose Trailer the response policy of f's
	// namespace filters when the body ends.
	trailers *http.Response
	f        *forwarder
	ended    atomic.Bool // Shutdown ended the stream: reads report its end
}

func newIdleBody(rc io.ReadCloser, idle time.Duration, max int64, cancel context.CancelFunc) *idleBody {
	t := time.AfterFunc(idle, cancel)
	t.Stop()
	return &idleBody{rc: rc, idle: idle, timer: t, remaining: max}
}

// Read arms the idle timer only while waiting on the upstream: time spent
// writing to a slow client is not upstream idleness.
func (b *idleBody) Read(p []byte) (int, error) {
	b.timer.Reset(b.idle)
	n, err := b.rc.Read(p)
	b.timer.Stop()
	if err != nil && b.ended.Load() {
		err = io.EOF
	}
	b.remaining -= int64(n)
	if b.remaining < 0 {
		return 0, errResponseTooLarge
	}
	if err == io.EOF && b.trailers != nil {
		b.f.responsePolicy(b.trailers.Trailer)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	return b.rc.Close()
}

// infoWriter applies the response header policy to informational (1xx)
// answers, which ReverseProxy relays as they came, without ModifyResponse:
// a 103 Early Hints Link naming a loopback URL must not reach the client
// any more than a final answer's.
type infoWriter struct {
	http.ResponseWriter
	f *forwarder
}

func (w *infoWriter) WriteHeader(code int) {
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		w.f.responsePolicy(w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *infoWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// upgradeWriter lets the server track connections ReverseProxy hijacks for
// WebSocket pass-through, so Shutdown can close them.
type upgradeWriter struct {
	http.ResponseWriter
	s *Server
}

func (w *upgradeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *upgradeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	return w.s.trackUpgrade(c), brw, nil
}

// wholeClose hides the upstream leg's CloseWrite from ReverseProxy. With it,
// a client that leaves would only half-close the upstream and the proxy would
// keep both legs open until the upstream closed too; without it the first
// leg to end closes both, as the contract requires.
type wholeClose struct{ io.ReadWriteCloser }
