package relay

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"
	"golang.org/x/net/http/httpguts"

	"github.com/hermes-securelink/securelink/internal/policy"
)

// Upgrade headers the bridge adds for a Relay that reads a configured secret.
const (
	headerProxySecret = "X-Hermes-Proxy-Secret"
	headerProxyPeer   = "X-Hermes-Proxy-Peer"
)

// inspectMessages is how many Relay→client text messages the bridge parses
// looking for the auth verdict. The Relay's first-frame protocol answers the
// client's auth frame before anything else, so the verdict is its first
// message; a few more allow for a Relay that greets first or accepts a retry
// after auth.fail. Inspection stops at the first auth.ok, so an authenticated
// session's (possibly 4 MiB) traffic is never parsed.
const inspectMessages = 8

// target is what Update swaps atomically: connections read it once, at upgrade.
type target struct {
	url    string // ws://host/ws, without query
	host   string // for logs
	secret string
}

// Bridge is the /relay/ws handler: a message-level WebSocket bridge from a
// client to the Relay's /ws. It answers the client's upgrade only after the
// Relay accepted its own, so a down or refusing Relay is an HTTP status, never
// a 101 followed by a close.
type Bridge struct {
	o       Options
	log     zerolog.Logger
	target  atomic.Pointer[target]
	limiter *authLimiter
	pending *pendingLimiter

	// base is cancelled by Shutdown to abort upgrades still dialing and
	// route-credential handoffs still running.
	base       context.Context
	cancelBase context.CancelFunc

	mu       sync.Mutex
	closing  bool
	sessions map[*session]struct{}
	// wg counts handler goroutines past admission plus every goroutine they
	// and Shutdown start, so Shutdown can wait for all of them.
	wg sync.WaitGroup
}

// NewBridge validates o (after defaults) and builds the bridge.
func NewBridge(o Options) (*Bridge, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	t, err := newTarget(o.Upstream, o.ProxySecret)
	if err != nil {
		return nil, err
	}
	b := &Bridge{
		o:        o,
		log:      o.Log.With().Str("ns", "relay").Logger(),
		limiter:  newAuthLimiter(o.AuthFailLimit, o.AuthFailWindow, o.BlockDuration, o.MaxTrackedSources),
		pending:  newPendingLimiter(o.MaxUnauthenticated, o.MaxUnauthenticatedReach),
		sessions: make(map[*session]struct{}),
	}
	b.base, b.cancelBase = context.WithCancel(context.Background())
	b.target.Store(t)
	return b, nil
}

func newTarget(upstream *url.URL, secret string) (*target, error) {
	ws, err := relayWebSocketURL(upstream)
	if err != nil {
		return nil, err
	}
	if err := validSecret(secret); err != nil {
		return nil, err
	}
	return &target{url: ws, host: upstream.Host, secret: secret}, nil
}

// Update applies a reloaded upstream and proxy secret (SIGHUP). Established
// connections keep the Relay they were bridged to; new upgrades use the new
// values. Invalid values are logged and ignored, keeping the previous ones,
// because a reload must never take the namespace down.
func (b *Bridge) Update(upstream *url.URL, proxySecret string) {
	t, err := newTarget(upstream, proxySecret)
	if err != nil {
		b.log.Error().Err(err).Msg("relay: reload ignored, keeping previous upstream")
		return
	}
	b.target.Store(t)
}

// Active reports how many connections are currently bridged.
func (b *Bridge) Active() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sessions)
}

// Shutdown refuses new upgrades, closes every bridged connection with 1001 on
// both legs and waits for all bridge goroutines. Hijacked connections are
// invisible to http.Server.Shutdown, so the front must call this too. If ctx
// ends first, Shutdown returns ctx.Err(); the remaining close handshakes are
// still bounded (5 s to write the close frame, 5 s to await the peer's).
func (b *Bridge) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	first := !b.closing
	b.closing = true
	list := make([]*session, 0, len(b.sessions))
	for s := range b.sessions {
		list = append(list, s)
	}
	if first {
		// Adding here is safe: nothing waits on wg before the first Shutdown.
		b.wg.Add(len(list))
	}
	b.mu.Unlock()
	b.cancelBase()
	if first {
		for _, s := range list {
			go func() {
				defer b.wg.Done()
				s.end(goingAway, goingAway, "shutdown")
			}()
		}
	}
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// admit reserves a wg slot for one upgrade unless the bridge is shutting down.
func (b *Bridge) admit() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return false
	}
	b.wg.Add(1)
	return true
}

func (b *Bridge) register(s *session) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return false
	}
	b.sessions[s] = struct{}{}
	return true
}

func (b *Bridge) unregister(s *session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sessions, s)
}

// ServeHTTP handles /relay/ws.
func (b *Bridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !httpguts.HeaderValuesContainsToken(r.Header["Connection"], "upgrade") ||
		!httpguts.HeaderValuesContainsToken(r.Header["Upgrade"], "websocket") {
		http.Error(w, "websocket upgrade required", http.StatusBadRequest)
		return
	}
	if code, msg := checkClientHandshake(w, r); code != 0 {
		http.Error(w, msg, code)
		return
	}
	source, broker, remote := SourceOf(r), FromBrokerStream(r.Context()), peerOf(r)
	if left, blocked := b.limiter.blocked(source); blocked {
		secs := int64((left + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		http.Error(w, "too many failed authentications", http.StatusTooManyRequests)
		b.logAt(zerolog.DebugLevel, remote, source).Msg("relay: upgrade refused, source blocked")
		return
	}
	// The slot is taken before the Relay is dialed and handed to the
	// session once there is one; every earlier return gives it back.
	if !b.pending.acquire(source) {
		http.Error(w, "too many unauthenticated connections", http.StatusTooManyRequests)
		b.logAt(zerolog.DebugLevel, remote, source).Msg("relay: upgrade refused, too many unauthenticated connections")
		return
	}
	slotHeld := true
	defer func() {
		if slotHeld {
			b.pending.release(source)
		}
	}()
	if !b.admit() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	defer b.wg.Done()

	t := b.target.Load()
	offered := offeredSubprotocols(r.Header)
	up, resp, err := b.dialRelay(r, t, offered)
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 && resp.StatusCode <= 599 {
			// The Relay's own refusal (its 429, 401, ...) is its answer to the
			// client; only the status and a Retry-After cross the front.
			if ra := resp.Header.Get("Retry-After"); validRetryAfter(ra) {
				w.Header().Set("Retry-After", ra)
			}
			http.Error(w, http.StatusText(resp.StatusCode), resp.StatusCode)
			b.logAt(zerolog.DebugLevel, remote, source).Int("status", resp.StatusCode).Msg("relay: upstream refused upgrade")
			return
		}
		http.Error(w, "relay unavailable", http.StatusBadGateway)
		b.logAt(zerolog.WarnLevel, remote, source).Str("upstream", t.host).Str("error", dialErrorText(err)).Msg("relay: upstream upgrade failed")
		return
	}
	conn, br, err := acceptClient(w, r, up.subprotocol, b.o.WriteTimeout)
	if err != nil {
		upLeg := newLeg(up.conn, up.br, false, "relay", b.o.WriteTimeout)
		upLeg.markPeerDone()
		upLeg.shutdown(closeSpec{websocket.StatusGoingAway, "client handshake failed"})
		b.logAt(zerolog.DebugLevel, remote, source).Err(err).Msg("relay: client upgrade failed")
		return
	}
	cl := newLeg(conn, br, true, "client", b.o.WriteTimeout)
	upLeg := newLeg(up.conn, up.br, false, "relay", b.o.WriteTimeout)

	s := newSession(b, cl, upLeg, remote, source, broker)
	slotHeld = false // the session releases it: at its first auth.ok or its end
	if !b.register(s) {
		// No pump will read the peers' answers: close without waiting.
		cl.markPeerDone()
		upLeg.markPeerDone()
		s.end(goingAway, goingAway, "shutdown")
		s.closers.Wait()
		return
	}
	// The session runs on its own goroutine and the handler returns: the
	// server's connection goroutine, whose stack grew through the TLS and
	// HTTP handshakes, and the request and response it holds are released
	// instead of parking for the connection's lifetime. Adding to wg is safe
	// here: this handler's own slot keeps the counter above zero.
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer b.unregister(s)
		s.run()
	}()
}

// logAt starts a log event with the connection's fields. Sessions keep the
// two strings rather than a derived zerolog.Logger, whose copied context
// buffer every idle connection would otherwise hold; the output is the same.
func (b *Bridge) logAt(level zerolog.Level, remote, source string) *zerolog.Event {
	return b.log.WithLevel(level).Str("remote", remote).Str("source", source)
}

// checkClientHandshake validates the client's upgrade before the Relay is
// dialed, so a malformed handshake costs no upstream connection.
func checkClientHandshake(w http.ResponseWriter, r *http.Request) (int, string) {
	if r.ProtoMajor != 1 || r.ProtoMinor < 1 {
		return http.StatusBadRequest, "websocket upgrade requires HTTP/1.1"
	}
	if r.Header.Get("Sec-WebSocket-Version") != "13" {
		w.Header().Set("Sec-WebSocket-Version", "13")
		return http.StatusUpgradeRequired, "unsupported websocket version"
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return http.StatusBadRequest, "invalid websocket key"
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
		return http.StatusBadRequest, "invalid websocket key"
	}
	return 0, ""
}

// offeredSubprotocols lists the client's Sec-WebSocket-Protocol tokens in
// order; the Relay chooses among exactly these.
func offeredSubprotocols(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}

// dialRelay opens the upstream WebSocket. The upgrade request is built from
// nothing: it carries only Origin, User-Agent and the offered subprotocols
// from the client (never Cookie, Authorization or forwarding headers), plus
// the proxy-secret pair when configured. The query string is forwarded raw,
// because clients may carry Relay parameters there.
func (b *Bridge) dialRelay(r *http.Request, t *target, offered []string) (*relayConn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(r.Context(), b.o.DialTimeout)
	defer cancel()
	stop := context.AfterFunc(b.base, cancel)
	defer stop()

	// The namespace header table decides what a /relay/ws client may tell
	// the Relay (Origin, Sec-WebSocket-Protocol, User-Agent); the
	// subprotocols travel as the bridge's own offer.
	h := r.Header.Clone()
	policy.RequestHeaders(policy.NSRelay, h, "", "", false)
	h.Del("Sec-Websocket-Protocol")
	// Always set: an empty value stops net/http from inventing a Go User-Agent.
	h["User-Agent"] = []string{r.Header.Get("User-Agent")}
	if t.secret != "" {
		h.Set(headerProxySecret, t.secret)
		h.Set(headerProxyPeer, peerOf(r))
	}
	u := t.url
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	return dialRelayWS(ctx, u, h, offered)
}

// dialErrorText describes a dial failure without the request URL: its query
// string may carry client credentials.
func dialErrorText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Sprintf("%s: %v", ue.Op, ue.Err)
	}
	return err.Error()
}

// validRetryAfter accepts the delta-seconds form only, short enough to be
// harmless; HTTP dates from a loopback service are not worth parsing.
func validRetryAfter(v string) bool {
	if v == "" || len(v) > 10 {
		return false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
