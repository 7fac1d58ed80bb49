// Package connector is the Reach host connector (spec/reach.md "Host
// connector"): it keeps one outbound wss:// registration with a rendezvous
// broker, turns every broker stream into an in-memory net.Conn that the
// front serves like a TCP connection (Listener), publishes bootstrap and
// route credentials (digests only), and adds the route credential to the
// first Relay auth.ok of broker-arrived /relay/ws connections (Handoff).
//
// The broker sees only ciphertext: each stream carries the client's TLS
// connection to the front, checked against the QR pin. The connector never
// falls back to plaintext and never invents a host_id.
//
// Flow control is plain v1, mirroring the broker's rules for its own
// queues:
//   - broker → front: each stream buffers at most StreamBufferBytes the front
//     has not read. When a DATA frame does not fit, the connector stops
//     reading the broker socket (TCP backpressure; every stream waits, which
//     plain v1 cannot avoid) until the front reads. If the front reads
//     nothing from that stream for SlowConsumerTimeout, that stream alone is
//     reset (CLOSE to the broker, an error to the front) and reading goes on;
//     a slow reader that makes progress is never cut. Pongs are not seen
//     while paused, so the keepalive forgives pauses.
//   - front → broker: each stream buffers at most StreamSendBytes; a front
//     writing faster blocks in Write. One writer frames the buffers
//     round-robin, at most 64 KiB per stream per turn, after control
//     messages, so a bulk stream cannot starve another stream's small
//     messages. Every write to the broker has its own deadline.
package connector

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Connector states reported by Status.
const (
	StateConnecting = "connecting"
	StateConnected  = "connected"
	StateBackoff    = "backoff"
	StateStopped    = "stopped"
)

// ErrNotConnected: the connector has no live registration, so nothing can
// be published (the admin socket answers 409).
var ErrNotConnected = errors.New("reach: not connected to the broker")

// Connector is one host's connection to its broker. Create it with New,
// serve Listener with the front, run it with Run.
type Connector struct {
	cfg    Config
	hostID wire.ID
	client *http.Client
	log    zerolog.Logger
	ln     *listener
	routes *routeCache
	// dial opens the broker socket: a WebSocket to BrokerURL, or an
	// in-memory pipe in tests.
	dial func(ctx context.Context) (msgconn.Conn, *http.Response, error)

	running   atomic.Bool
	completed atomic.Int64

	countMu sync.Mutex
	counts  map[string]int64

	mu             sync.Mutex
	state          string
	attempts       int
	lastErr        string
	lastDetail     string
	connectedSince time.Time
	retryAt        time.Time
	retryReason    string
	permanentErr   string
	cur            *session
}

// Status is the connector's state for the admin socket and `securelink
// status`. It never carries a secret.
type Status struct {
	Enabled          bool       `json:"enabled"`
	State            string     `json:"state"` // connecting|connected|backoff|stopped
	BrokerURL        string     `json:"broker_url"`
	HostID           string     `json:"host_id"`
	ActiveStreams    int        `json:"active_streams"`
	CompletedStreams int        `json:"completed_streams"`
	Attempts         int        `json:"attempts"`
	LastError        string     `json:"last_error"` // a code, e.g. "unauthorized", "replaced", "tls"
	LastErrorDetail  string     `json:"last_error_detail,omitempty"`
	ConnectedSince   *time.Time `json:"connected_since"`
	RetryAt          *time.Time `json:"retry_at,omitempty"` // next attempt, in state backoff
	// Ready: a registration is up (streams can be served, credentials
	// published). Live: the connector's loop is running, whatever its
	// state; live but not ready is connecting or backing off.
	Ready bool `json:"ready"`
	Live  bool `json:"live"`
	// RetryReason says why the current wait was chosen: "fast" (a blip
	// after a long registration), "backoff", "permanent", "replaced" or
	// "advised" (the broker's shutdown close named the delay).
	RetryReason string `json:"retry_reason,omitempty"`
	// PermanentError is the broker's refusal ("unauthorized", "revoked")
	// behind the 10-minute wait; operator action is needed.
	PermanentError string `json:"permanent_error,omitempty"`
	// Credit: the live registration runs the credit extension.
	Credit bool `json:"credit"`
}

// New checks cfg (zero fields take their defaults) and builds a connector.
// Nothing is dialed before Run.
func New(cfg Config) (*Connector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hostID, _ := wire.ParseID(cfg.HostID)
	c := &Connector{
		cfg:    cfg,
		hostID: hostID,
		log:    cfg.Log.With().Str("host", hostLabel(hostID)).Logger(),
		ln:     newListener(cfg.MaxStreams),
		routes: newRouteCache(cfg.MaxRouteCache),
		counts: map[string]int64{},
		state:  StateStopped,
	}
	c.client = newHTTPClient(cfg)
	c.dial = c.dialWebSocket
	return c, nil
}

// dialWebSocket opens the broker's WebSocket and adapts it.
func (c *Connector) dialWebSocket(ctx context.Context) (msgconn.Conn, *http.Response, error) {
	slot := &batchSlot{}
	// msgconn.Dial answers the broker's pings itself: never the library's
	// pong, which ends the reader after 5 s behind a long frame write (a
	// batch flushed to a slow uplink), and never a pong per ping grown
	// into a batch the broker does not read.
	w, resp, err := msgconn.Dial(context.WithValue(ctx, batchSlot{}, slot), c.cfg.BrokerURL, &websocket.DialOptions{
		HTTPClient:      c.client,
		CompressionMode: websocket.CompressionDisabled,
	}, "broker")
	if err != nil {
		return nil, resp, err
	}
	if slot.bc != nil {
		w.SetBatch(slot.bc)
	}
	return w, resp, nil
}

// batchSlot, in a dial's context (and as its key), receives the BatchConn
// the transport put above the socket's TLS (holding the one under it), so
// each DATA frame leaves in 16 KiB records and one write instead of one
// record and one write per 4 KiB.
type batchSlot struct{ bc *msgconn.BatchConn }

// errRedirect refuses every redirect of the upgrade request: one could lead
// to ws:// or to another host, and the broker URL is exact.
var errRedirect = errors.New("reach: the broker answered with a redirect")

// tlsError marks a failed TLS handshake with the broker, which net/http
// would otherwise flatten into text (e.g. a plaintext server's answer).
type tlsError struct{ err error }

func (e *tlsError) Error() string { return "TLS handshake with the broker: " + e.err.Error() }
func (e *tlsError) Unwrap() error { return e.err }

func newHTTPClient(cfg Config) *http.Client {
	dialer := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: cfg.PingInterval}
	tlsConfig := &tls.Config{
		RootCAs:    cfg.RootCAs,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"}, // WebSocket upgrades are HTTP/1.1
	}
	tr := &http.Transport{
		// An HTTPS proxy from the environment only ever sees a CONNECT
		// tunnel; TLS to the broker stays end to end.
		Proxy:           http.ProxyFromEnvironment,
		DialContext:     dialer.DialContext,
		TLSClientConfig: tlsConfig,
		// Direct connections do their own handshake so a failure keeps its
		// type (status reports "tls", not "dial").
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				raw.Close()
				return nil, err
			}
			c := tlsConfig.Clone()
			c.ServerName = host
			bc := msgconn.NewBatchConn(raw)
			tc := tls.Client(bc, c)
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, &tlsError{err}
			}
			// The library writes a client's frames through a 4 KiB
			// buffer, each 4 KiB its own TLS record: gathered above
			// TLS, a DATA frame leaves in 16 KiB records (a quarter of
			// the records to seal here and to open at the broker), and
			// those in one write(2) below it.
			plain := msgconn.NewBatchConnAbove(tc, bc)
			if slot, ok := ctx.Value(batchSlot{}).(*batchSlot); ok {
				slot.bc = plain
			}
			return plain, nil
		},
		TLSHandshakeTimeout: cfg.DialTimeout,
		MaxIdleConns:        1,
		IdleConnTimeout:     time.Second,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect },
	}
}

// Listener returns the listener on which every broker stream is accepted as
// an in-memory net.Conn. Serve it with the front's ServeReach, which adds
// TLS and marks the connections as arrived through Reach. Closing it makes new
// streams fail with CLOSE; Run does not close it.
func (c *Connector) Listener() net.Listener { return c.ln }

// Run dials, registers (with a fresh connection_id each time), serves, and
// reconnects with backoff until ctx ends; then it returns nil. Live streams
// end when their registration ends. Run may be called once at a time.
func (c *Connector) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("reach: the connector is already running")
	}
	defer c.running.Store(false)
	defer c.setState(StateStopped, time.Time{})
	bo := backoff{cfg: &c.cfg}
	for ctx.Err() == nil {
		c.mu.Lock()
		c.attempts++
		c.state = StateConnecting
		c.retryAt, c.retryReason = time.Time{}, ""
		c.mu.Unlock()
		out := c.attempt(ctx)
		if ctx.Err() != nil {
			break
		}
		d := bo.next(out)
		c.mu.Lock()
		c.lastErr, c.lastDetail = out.code, out.detail
		c.connectedSince = time.Time{}
		c.state = StateBackoff
		c.retryAt = c.cfg.Now().Add(d)
		c.retryReason, c.permanentErr = bo.why, ""
		if bo.why == retryPermanent {
			c.permanentErr = out.code
		}
		c.mu.Unlock()
		c.count("reconnect:" + bo.why)
		ev := c.log.Warn()
		if permanent(out.code) {
			ev = c.log.Error()
		}
		ev.Str("code", out.code).Str("why", out.detail).Str("retry", bo.why).Dur("retry_in", d).
			Dur("registered_for", out.registered).Msg("reach: broker connection ended")
		if err := c.cfg.Sleep(ctx, d); err != nil {
			break
		}
	}
	return nil
}

// attempt is one connection: dial, register, serve until it ends.
func (c *Connector) attempt(ctx context.Context) outcome {
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	ws, resp, err := c.dial(dctx)
	timedOut := errors.Is(dctx.Err(), context.DeadlineExceeded)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return outcome{code: codeStopped}
		}
		return dialOutcome(err, resp, timedOut)
	}
	if w, ok := ws.(*msgconn.WebSocket); ok {
		defer w.Release() // the session's reader is done with it
	}
	ws.SetReadLimit(wire.MaxHostFrameIn)

	connID := wire.NewID()
	msg, err := wire.Marshal(wire.Register{
		Role: wire.RoleHost, HostID: c.hostID, ConnectionID: connID,
		CredentialKind: wire.KindHost, Token: c.cfg.Token,
	})
	if err != nil { // Validate checked the token; this cannot happen
		ws.CloseNow()
		return outcome{code: codeProtocol, detail: "cannot encode the registration"}
	}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.WriteTimeout)
	err = ws.Write(wctx, msgconn.Text, msg)
	cancel()
	if err != nil {
		ws.CloseNow()
		if ctx.Err() != nil {
			return outcome{code: codeStopped}
		}
		return outcome{code: codeWrite, detail: "sending the registration failed"}
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RegisterTimeout)
	typ, data, err := ws.Read(rctx)
	timedOut = errors.Is(rctx.Err(), context.DeadlineExceeded)
	cancel()
	if err != nil {
		ws.CloseNow()
		switch {
		case ctx.Err() != nil:
			return outcome{code: codeStopped}
		case timedOut:
			return outcome{code: codeRegTimeout, detail: "the broker did not answer the registration in time"}
		}
		return outcome{code: codeClosed, detail: "the broker closed the socket during registration"}
	}
	var m wire.Message
	if typ == msgconn.Text {
		m, err = wire.ParseBrokerMessage(data)
	}
	credit := false
	switch m := m.(type) {
	case wire.Registered:
		// The answer to an offered extension goes out before anything
		// past registered is read, so every stream of this registration
		// is opened after it. A broker that offers nothing hears nothing.
		if m.Has(wire.ExtensionCredit) && !c.cfg.DisableCredit {
			msg, _ := wire.Marshal(wire.Extensions{Names: []string{wire.ExtensionCredit}})
			wctx, cancel := context.WithTimeout(ctx, c.cfg.WriteTimeout)
			err := ws.Write(wctx, msgconn.Text, msg)
			cancel()
			if err != nil {
				ws.CloseNow()
				if ctx.Err() != nil {
					return outcome{code: codeStopped}
				}
				return outcome{code: codeWrite, detail: "sending the extensions answer failed"}
			}
			credit = true
			c.count("credit")
		}
	case wire.ErrorMsg:
		ws.CloseNow()
		detail := m.Code.Description()
		if m.Code == wire.CodeUnauthorized || m.Code == wire.CodeRevoked {
			detail = detailAuthFailure
		}
		return outcome{code: string(m.Code), detail: detail}
	default:
		ws.Close(wire.ClosePolicy, "protocol violation")
		return outcome{code: codeProtocol, detail: "the broker did not answer register with registered"}
	}

	s := newSession(c, ws, connID, credit)
	s.registeredAt = c.cfg.Now()
	c.mu.Lock()
	c.cur = s
	c.state = StateConnected
	c.connectedSince = s.registeredAt
	c.lastErr, c.lastDetail, c.permanentErr = "", "", ""
	c.mu.Unlock()
	c.count("registered")
	c.log.Info().Str("broker", c.cfg.BrokerURL).Msg("reach: registered with the broker")
	out := s.run(ctx)
	c.mu.Lock()
	if c.cur == s {
		c.cur = nil
	}
	c.mu.Unlock()
	out.registered = c.cfg.Now().Sub(s.registeredAt)
	return out
}

// dialOutcome names a failed dial without quoting peer data.
func dialOutcome(err error, resp *http.Response, timedOut bool) outcome {
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		hnerr x509.HostnameError
		ciErr x509.CertificateInvalidError
		tlErr *tlsError
	)
	switch {
	case errors.Is(err, errRedirect):
		return outcome{code: codeHTTP, detail: "the broker answered with a redirect"}
	case resp != nil && resp.StatusCode != http.StatusSwitchingProtocols:
		return outcome{code: codeHTTP, detail: fmt.Sprintf("the broker refused the upgrade with HTTP %d", resp.StatusCode)}
	case errors.As(err, &verr), errors.As(err, &uaerr), errors.As(err, &hnerr), errors.As(err, &ciErr):
		return outcome{code: codeTLS, detail: "the broker's certificate is not trusted (system roots plus reach.ca_file)"}
	case errors.As(err, &tlErr) && !timedOut:
		return outcome{code: codeTLS, detail: "TLS handshake with the broker failed (is it serving plain ws://?)"}
	case timedOut:
		return outcome{code: codeDialTimeout, detail: "connecting to the broker timed out"}
	}
	return outcome{code: codeDial, detail: "cannot connect to the broker"}
}

// Status reports the current state.
func (c *Connector) Status() Status {
	c.mu.Lock()
	st := Status{
		Enabled:          true,
		State:            c.state,
		BrokerURL:        c.cfg.BrokerURL,
		HostID:           c.hostID.String(),
		CompletedStreams: int(c.completed.Load()),
		Attempts:         c.attempts,
		LastError:        c.lastErr,
		LastErrorDetail:  c.lastDetail,
		Ready:            c.state == StateConnected,
		Live:             c.running.Load(),
		RetryReason:      c.retryReason,
		PermanentError:   c.permanentErr,
	}
	if !c.connectedSince.IsZero() {
		t := c.connectedSince
		st.ConnectedSince = &t
	}
	if !c.retryAt.IsZero() {
		t := c.retryAt
		st.RetryAt = &t
	}
	s := c.cur
	c.mu.Unlock()
	if s != nil {
		st.Credit = s.credit
		s.mu.Lock()
		st.ActiveStreams = len(s.streams)
		s.mu.Unlock()
	}
	return st
}

// Ready reports whether a registration is up (a readiness probe).
func (c *Connector) Ready() bool { return c.Status().Ready }

// Live reports whether the connector's loop is running (a liveness probe).
func (c *Connector) Live() bool { return c.running.Load() }

func (c *Connector) setState(state string, since time.Time) {
	c.mu.Lock()
	c.state = state
	c.connectedSince = since
	c.retryAt = time.Time{}
	c.mu.Unlock()
}

// current returns the live registration, or nil.
func (c *Connector) current() *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// count records a counted outcome (e.g. "open_over_limit",
// "slow_consumer", "route_reused"; "registered", "credit", and
// "reconnect:<why>" for every wait, why being fast, backoff, permanent,
// replaced or advised).
func (c *Connector) count(label string) {
	c.countMu.Lock()
	c.counts[label]++
	c.countMu.Unlock()
}

// Counts returns the counted outcomes by label.
func (c *Connector) Counts() map[string]int64 {
	c.countMu.Lock()
	defer c.countMu.Unlock()
	out := make(map[string]int64, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// hostLabel hashes a host_id for logs, like the broker does: ids are
// locators, not secrets, but shipped logs need not name them.
func hostLabel(id wire.ID) string {
	sum := sha256.Sum256(id[:])
	return base64.RawURLEncoding.EncodeToString(sum[:6])
}
