package relay

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/net/http/httpguts"
)

// Options configures the /relay/ws bridge. Zero fields take the contract's
// defaults through WithDefaults; tests shorten the durations.
type Options struct {
	// Upstream is the Relay's base URL (http://127.0.0.1:8767); the bridge
	// dials ws://<host><path>/ws. Required.
	Upstream *url.URL
	// ProxySecret, when non-empty, is sent as X-Hermes-Proxy-Secret together
	// with X-Hermes-Proxy-Peer on the upstream upgrade, so a Relay that reads
	// a configured secret can attribute clients. Empty: neither header.
	ProxySecret string

	MaxMessageBytes int64         // 4 MiB per message, each direction; larger closes both legs with 1009
	PingInterval    time.Duration // 30 s between pings, on each leg
	PongTimeout     time.Duration // 60 s without a pong drops the leg
	DialTimeout     time.Duration // 5 s for the upstream TCP connect plus WebSocket handshake
	WriteTimeout    time.Duration // 30 s to write one message to either leg
	HandoffTimeout  time.Duration // 5 s for Handoff.AuthOK before auth.ok goes out unchanged

	AuthFailLimit     int           // 5 auth.fail verdicts ...
	AuthFailWindow    time.Duration // ... within 60 s ...
	BlockDuration     time.Duration // ... block the source's upgrades (429) for 5 min
	MaxTrackedSources int           // 65536 sources in the limiter table

	// Unauthenticated sessions a source may have at once, from admission
	// until the Relay's first auth.ok (or the session's end); one more
	// upgrade is a 429 before the Relay is dialed.
	MaxUnauthenticated      int // 5 per direct source (IPv4 /32, IPv6 /64)
	MaxUnauthenticatedReach int // 16 for the shared source "reach": the connector's stream limit

	// Handoff adds the Reach route credential to a broker-arrived
	// connection's first auth.ok. Nil unless Reach is enabled.
	Handoff Handoff
	Log     zerolog.Logger

	// messagesOnly keeps both pumps reading whole messages after auth.ok
	// (no frame forwarding): tests run the bridge's rules over both modes.
	messagesOnly bool
}

// Handoff is the Reach route-credential hook. The bridge calls AuthOK only
// for connections FromBrokerStream, only for the first Relay message that is
// {"channel":"system","type":"auth.ok",...}, and at most once per
// connection. clientAuth is the client's first frame (its auth message) and
// authOK the Relay's message, both raw and owned by the hook. The result is
// forwarded instead of authOK; nil or empty means "unchanged".
//
// The bridge owns the deadline: ctx expires after Options.HandoffTimeout (or
// at Shutdown), and the bridge then forwards authOK unchanged without waiting
// further. AuthOK must return promptly once ctx is done, because a hook that
// ignores ctx keeps its goroutine alive. While it runs, later Relay messages
// stay unread in the upstream socket: the wait is bounded by the deadline and
// the kernel's socket buffer, never by a queue in the front.
type Handoff interface {
	AuthOK(ctx context.Context, clientAuth, authOK []byte) []byte
}

// WithDefaults fills every zero field with the contract's value.
func (o Options) WithDefaults() Options {
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = 4 << 20
	}
	if o.PingInterval == 0 {
		o.PingInterval = 30 * time.Second
	}
	if o.PongTimeout == 0 {
		o.PongTimeout = 60 * time.Second
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.HandoffTimeout == 0 {
		o.HandoffTimeout = 5 * time.Second
	}
	if o.AuthFailLimit == 0 {
		o.AuthFailLimit = 5
	}
	if o.AuthFailWindow == 0 {
		o.AuthFailWindow = 60 * time.Second
	}
	if o.BlockDuration == 0 {
		o.BlockDuration = 5 * time.Minute
	}
	if o.MaxTrackedSources == 0 {
		o.MaxTrackedSources = 65536
	}
	if o.MaxUnauthenticated == 0 {
		o.MaxUnauthenticated = 5
	}
	if o.MaxUnauthenticatedReach == 0 {
		o.MaxUnauthenticatedReach = 16
	}
	return o
}

// maxMessageCeiling keeps a configuration typo from letting one connection
// pin gigabytes (each direction holds one whole message in memory).
const maxMessageCeiling = 64 << 20

// Validate rejects options that would leave a wait or a buffer unbounded.
func (o Options) Validate() error {
	if _, err := relayWebSocketURL(o.Upstream); err != nil {
		return err
	}
	if err := validSecret(o.ProxySecret); err != nil {
		return err
	}
	if o.MaxMessageBytes <= 0 || o.MaxMessageBytes > maxMessageCeiling {
		return fmt.Errorf("relay: MaxMessageBytes must be in 1..%d", maxMessageCeiling)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"PingInterval", o.PingInterval}, {"PongTimeout", o.PongTimeout},
		{"DialTimeout", o.DialTimeout}, {"WriteTimeout", o.WriteTimeout},
		{"HandoffTimeout", o.HandoffTimeout}, {"AuthFailWindow", o.AuthFailWindow},
		{"BlockDuration", o.BlockDuration},
	} {
		if d.v <= 0 {
			return fmt.Errorf("relay: %s must be positive", d.name)
		}
	}
	// While a pump waits on one leg (a slow write, the handoff) it does not
	// read the other, so that leg's pongs sit unread; both waits must end
	// before a live peer could be mistaken for a dead one.
	if o.WriteTimeout >= o.PongTimeout || o.HandoffTimeout >= o.PongTimeout {
		return errors.New("relay: WriteTimeout and HandoffTimeout must be shorter than PongTimeout")
	}
	if o.PingInterval >= o.PongTimeout {
		return errors.New("relay: PingInterval must be shorter than PongTimeout")
	}
	if o.AuthFailLimit < 1 {
		return errors.New("relay: AuthFailLimit must be at least 1")
	}
	if o.MaxTrackedSources < 1 {
		return errors.New("relay: MaxTrackedSources must be at least 1")
	}
	if o.MaxUnauthenticated < 1 || o.MaxUnauthenticatedReach < 1 {
		return errors.New("relay: MaxUnauthenticated and MaxUnauthenticatedReach must be at least 1")
	}
	return nil
}

// relayWebSocketURL derives the Relay's WebSocket endpoint from its base URL.
// The upstream is configuration, never client input, so anything unusual is
// an error rather than something to repair.
func relayWebSocketURL(u *url.URL) (string, error) {
	if u == nil {
		return "", errors.New("relay: Upstream is required")
	}
	if u.Scheme != "http" || u.Host == "" || u.Opaque != "" {
		return "", errors.New("relay: Upstream must be an http:// URL with a host")
	}
	if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return "", errors.New("relay: Upstream must not carry user info, query or fragment")
	}
	return "ws://" + u.Host + strings.TrimSuffix(u.EscapedPath(), "/") + "/ws", nil
}

// validSecret checks that the secret can travel as a header value. The error
// never quotes the secret.
func validSecret(s string) error {
	if s == "" {
		return nil
	}
	if !httpguts.ValidHeaderFieldValue(s) || strings.TrimSpace(s) != s {
		return errors.New("relay: ProxySecret contains characters not allowed in a header value")
	}
	return nil
}
