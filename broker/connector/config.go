package connector

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Config configures the host connector. The first group comes from the
// operator's `reach.*` settings; everything else has the spec's default
// (WithDefaults) and exists as a field so tests can shorten it.
type Config struct {
	// BrokerURL is exactly wss://host[:port]/v1/connect (reach.broker_url).
	// ws:// is refused: the connector never speaks plaintext.
	BrokerURL string
	// HostID is the canonical host_id the broker operator created
	// (reach.host_id). The connector never invents one.
	HostID string
	// Token is the host registration token (reach.host_token_file),
	// 32..512 characters.
	Token wire.Secret
	// RootCAs verifies the broker's certificate; nil means the system roots.
	// The caller merges reach.ca_file into a copy of the system pool.
	RootCAs *x509.CertPool
	// MaxStreams bounds the streams served at once (reach.max_streams);
	// an `open` beyond it is answered with CLOSE. Default 16.
	MaxStreams int

	// StreamBufferBytes bounds the broker→front bytes buffered per stream
	// that the front has not read yet. A frame is accepted into an empty
	// buffer whatever its size, so it must hold one whole frame payload
	// (1 MiB). Under credit it is also the most the broker's window for
	// the stream grows to (openWindow is granted at open). Default 4 MiB.
	StreamBufferBytes int
	// StreamSendBytes bounds the front→broker bytes buffered per stream
	// before they are framed; a front that writes faster waits. Default
	// 256 KiB.
	StreamSendBytes int
	// MaxPendingControl bounds control frames (publish, revoke) awaiting
	// their reply; more are refused at once. Default 64.
	MaxPendingControl int
	// MaxRouteCache bounds the route credentials remembered for reuse
	// (memory only). Default 1024, the broker's per-host credential quota.
	MaxRouteCache int
	// MaxClosedIDs bounds the stream ids remembered as closed, so late DATA
	// for them is dropped without another CLOSE. Default 4096.
	MaxClosedIDs int

	// DisableCredit declines the broker's "credit" extension: the
	// registration stays plain v1 (tests and benchmarks compare the two).
	DisableCredit bool

	// DialTimeout bounds TCP connect, TLS handshake and WebSocket upgrade
	// together. Default 10 s.
	DialTimeout time.Duration
	// RegisterTimeout bounds the wait for `registered`. Default 10 s.
	RegisterTimeout time.Duration
	// PingInterval: the broker socket is pinged this often. Default 15 s.
	PingInterval time.Duration
	// PongTimeout: without a pong for this long the socket is dropped.
	// Default 45 s.
	PongTimeout time.Duration
	// WriteTimeout is the deadline of every single write to the broker
	// socket (one control message or one frame of at most 64 KiB + 18
	// bytes); a write that misses it ends the registration. It must exceed
	// the broker's own 10 s slow-consumer pause. Default 20 s.
	WriteTimeout time.Duration
	// PublishTimeout bounds a publish or revoke from sending to reply.
	// Default 5 s.
	PublishTimeout time.Duration
	// SlowConsumerTimeout: when a stream's buffer is full the connector stops
	// reading the broker socket (plain v1); if the front then reads nothing
	// from that stream for this long, that stream alone is closed. Default
	// 10 s.
	SlowConsumerTimeout time.Duration

	// Reconnect policy: attempt n (n = 0, 1, …) waits min(MaxBackoff,
	// BackoffBase·2ⁿ) plus a uniform jitter of up to a quarter of that.
	BackoffBase time.Duration // 1 s
	MaxBackoff  time.Duration // 60 s
	// BackoffResetAfter: only a registration that lasted this long resets n.
	BackoffResetAfter time.Duration // 60 s
	// AuthFailureBackoff follows `unauthorized` or `revoked`.
	AuthFailureBackoff time.Duration // 10 min
	// ReplacedBackoff follows a close with reason `replaced`.
	ReplacedBackoff time.Duration // 60 s
	// FastRetries: after a registration that lasted BackoffResetAfter
	// drops, this many attempts go at once before the schedule applies.
	// Default 2; negative means none.
	FastRetries int

	// Now is the wall clock for credential expiries and registration
	// durations; nil = time.Now.
	Now func() time.Time
	// Rand returns a uniform float in [0, 1) for the backoff jitter; nil =
	// math/rand/v2.
	Rand func() float64
	// Sleep waits d or until ctx ends (returning ctx.Err()); nil = a timer.
	// Tests record the backoff sequence through it instead of sleeping.
	Sleep func(ctx context.Context, d time.Duration) error

	Log zerolog.Logger
}

// WithDefaults fills every zero field with the spec's value.
func (c Config) WithDefaults() Config {
	setInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	setDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	setInt(&c.MaxStreams, wire.MaxStreamsPerHost)
	setInt(&c.StreamBufferBytes, 4<<20)
	setInt(&c.StreamSendBytes, 256<<10)
	setInt(&c.MaxPendingControl, 64)
	setInt(&c.MaxRouteCache, wire.MaxCredentialsPerHost)
	setInt(&c.MaxClosedIDs, 4096)
	setDur(&c.DialTimeout, 10*time.Second)
	setDur(&c.RegisterTimeout, wire.RegisterTimeout)
	setDur(&c.PingInterval, wire.PingInterval)
	setDur(&c.PongTimeout, wire.PongTimeout)
	setDur(&c.WriteTimeout, 20*time.Second)
	setDur(&c.PublishTimeout, wire.PublishTimeout)
	setDur(&c.SlowConsumerTimeout, wire.SlowConsumerTimeout)
	setDur(&c.BackoffBase, time.Second)
	setDur(&c.MaxBackoff, wire.MaxReconnectDelay)
	setDur(&c.BackoffResetAfter, wire.BackoffResetAfter)
	setDur(&c.AuthFailureBackoff, wire.AuthFailureBackoff)
	setDur(&c.ReplacedBackoff, wire.ReplacedBackoff)
	setInt(&c.FastRetries, 2)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	return c
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// minFrameBuffer is the largest DATA payload a broker may send (a frame of
// 1 MiB + 18 bytes minus its header): a stream buffer must hold one.
const minFrameBuffer = wire.MaxHostFrameIn - wire.HeaderLen

// Validate checks the configuration before anything is dialed. Errors name
// the operator's reach.* keys where there is one and never quote the token.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("reach: "+format, args...)) }
	if _, err := wire.ParseBrokerURL(c.BrokerURL); err != nil {
		bad("broker_url: %v", err)
	}
	switch {
	case c.HostID == "":
		bad("host_id is required (the broker operator creates it with `securelink broker add-host`)")
	default:
		if _, err := wire.ParseID(c.HostID); err != nil {
			bad("host_id is not a canonical 22-character base64url id")
		}
	}
	if !wire.ValidWireToken(string(c.Token)) {
		bad("host token must be %d..%d characters", wire.MinWireToken, wire.MaxWireToken)
	}
	ints := []struct {
		name      string
		v, lo, hi int
	}{
		{"max_streams", c.MaxStreams, 1, 64},
		{"StreamBufferBytes", c.StreamBufferBytes, minFrameBuffer, 64 << 20},
		{"StreamSendBytes", c.StreamSendBytes, wire.MaxConnectorChunk, 16 << 20},
		{"MaxPendingControl", c.MaxPendingControl, 1, 1 << 12},
		{"MaxRouteCache", c.MaxRouteCache, 1, 1 << 20},
		{"MaxClosedIDs", c.MaxClosedIDs, 16, 1 << 20},
	}
	for _, f := range ints {
		if f.v < f.lo || f.v > f.hi {
			bad("%s must be %d..%d, not %d", f.name, f.lo, f.hi, f.v)
		}
	}
	durs := []struct {
		name string
		v    time.Duration
	}{
		{"DialTimeout", c.DialTimeout}, {"RegisterTimeout", c.RegisterTimeout},
		{"PingInterval", c.PingInterval}, {"PongTimeout", c.PongTimeout},
		{"WriteTimeout", c.WriteTimeout}, {"PublishTimeout", c.PublishTimeout},
		{"SlowConsumerTimeout", c.SlowConsumerTimeout}, {"BackoffBase", c.BackoffBase},
		{"MaxBackoff", c.MaxBackoff}, {"BackoffResetAfter", c.BackoffResetAfter},
		{"AuthFailureBackoff", c.AuthFailureBackoff}, {"ReplacedBackoff", c.ReplacedBackoff},
	}
	for _, d := range durs {
		if d.v <= 0 {
			bad("%s must be a positive duration", d.name)
		}
	}
	if c.PingInterval > 0 && c.PongTimeout <= c.PingInterval {
		bad("PongTimeout must be longer than PingInterval")
	}
	if c.BackoffBase > c.MaxBackoff {
		bad("BackoffBase must not exceed MaxBackoff")
	}
	if c.Now == nil || c.Rand == nil || c.Sleep == nil {
		bad("Now, Rand and Sleep must be set (use WithDefaults)")
	}
	return errors.Join(errs...)
}
