package proxy

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/relay"
)

// Limits bounds every body, header and wait of the front. The defaults are
// the contract's; tests shorten them.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers and, because
	// net/http derives its TLS handshake deadline from it, the handshake too.
	ReadHeaderTimeout time.Duration // 10 s
	// BodyReadTimeout is how long one read of a request body may wait for
	// progress. There is deliberately no whole-request ReadTimeout: it would
	// kill slow but healthy uploads.
	BodyReadTimeout time.Duration // 60 s
	IdleTimeout     time.Duration // 120 s keep-alive idle
	MaxHeaderBytes  int           // 64 KiB

	MaxRequestBody  int64 // 16 MiB; exactly this much is allowed
	MaxResponseBody int64 // 64 MiB

	UpstreamConnect  time.Duration // 5 s
	UpstreamIdleRead time.Duration // 2 min without a byte from the upstream
	UpstreamTotal    time.Duration // 15 min for ordinary responses; none for SSE and upgrades
	TCPKeepAlive     time.Duration // 15 s on both legs of byte-level upgrades

	ProbeInterval time.Duration // 15 s availability cache
	ProbeTimeout  time.Duration // 3 s

	// MaxUpstreamIdleConns bounds pooled keep-alive connections per upstream.
	MaxUpstreamIdleConns int // 256
	// UpstreamIdleConn is how long an unused keep-alive connection to an
	// upstream is kept open.
	UpstreamIdleConn time.Duration // 90 s
}

// DefaultLimits returns the contract's limits.
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout:    10 * time.Second,
		BodyReadTimeout:      60 * time.Second,
		IdleTimeout:          120 * time.Second,
		MaxHeaderBytes:       64 << 10,
		MaxRequestBody:       16 << 20,
		MaxResponseBody:      64 << 20,
		UpstreamConnect:      5 * time.Second,
		UpstreamIdleRead:     2 * time.Minute,
		UpstreamTotal:        15 * time.Minute,
		TCPKeepAlive:         15 * time.Second,
		ProbeInterval:        15 * time.Second,
		ProbeTimeout:         3 * time.Second,
		MaxUpstreamIdleConns: 256,
		UpstreamIdleConn:     90 * time.Second,
	}
}

// Validate rejects zero or negative limits: an unbounded wait or body is a bug.
func (l Limits) Validate() error {
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": l.ReadHeaderTimeout, "BodyReadTimeout": l.BodyReadTimeout,
		"IdleTimeout": l.IdleTimeout, "UpstreamConnect": l.UpstreamConnect,
		"UpstreamIdleRead": l.UpstreamIdleRead, "UpstreamTotal": l.UpstreamTotal,
		"TCPKeepAlive": l.TCPKeepAlive, "ProbeInterval": l.ProbeInterval, "ProbeTimeout": l.ProbeTimeout,
		"UpstreamIdleConn": l.UpstreamIdleConn,
	} {
		if d <= 0 {
			return fmt.Errorf("proxy: limit %s must be positive", name)
		}
	}
	if l.MaxHeaderBytes <= 0 || l.MaxRequestBody <= 0 || l.MaxResponseBody <= 0 || l.MaxUpstreamIdleConns <= 0 {
		return errors.New("proxy: size limits must be positive")
	}
	return nil
}

// Upstreams are the three fixed services; nothing a client sends selects another.
type Upstreams struct {
	Relay, API, Dashboard *url.URL
}

// Options configures a front. Everything here can change on reload except
// what the listener itself is bound to.
type Options struct {
	// AuthorityHost and AuthorityPort are what clients dial; Host headers
	// and SNI must name them (or an ExtraName).
	AuthorityHost string
	AuthorityPort int
	ExtraNames    []string
	Upstreams     Upstreams
	// ProxySecret, when set, is sent to the Relay on /relay/ws upgrades.
	ProxySecret string
	Limits      Limits
	// Relay tunes the /relay/ws bridge (message size, pings, auth-failure
	// limiting); zero fields get the bridge's defaults. Its Upstream,
	// ProxySecret and Log are taken from the fields above.
	Relay relay.Options
	// Metrics records requests, bytes, latency and handshake failures; nil
	// records nothing.
	Metrics *metrics.Front
	Log     zerolog.Logger
	// reverseProxyOnly sends every forwarded request through the
	// ReverseProxy path (tests run the request matrix over both paths).
	reverseProxyOnly bool
}

func (o *Options) validate() error {
	if o.AuthorityHost == "" || o.AuthorityPort <= 0 || o.AuthorityPort > 65535 {
		return errors.New("proxy: authority host and port are required")
	}
	if o.Upstreams.Relay == nil || o.Upstreams.API == nil || o.Upstreams.Dashboard == nil {
		return errors.New("proxy: all three upstreams are required")
	}
	return o.Limits.Validate()
}
