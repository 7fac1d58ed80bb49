package connector

import (
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Error codes reported in Status.LastError. Broker codes (wire.Code) are
// reported as they are; these name the failures that happen on our side of
// the socket. None carries peer data or a secret.
const (
	codeReplaced      = "replaced"          // a newer registration of our host_id won
	codeDial          = "dial"              // TCP connect failed
	codeDialTimeout   = "dial_timeout"      // connect + TLS + upgrade took too long
	codeTLS           = "tls"               // TLS handshake or certificate check failed
	codeHTTP          = "http_status"       // the broker refused the upgrade with an HTTP status
	codeRegTimeout    = "register_timeout"  // no answer to register in time
	codePingTimeout   = "ping_timeout"      // no pong within PongTimeout
	codeWriteTimeout  = "write_timeout"     // one write missed WriteTimeout
	codeWrite         = "write_failed"      // a write failed otherwise
	codeProtocol      = "protocol"          // the broker broke the protocol
	codeGoingAway     = "broker_going_away" // the broker closed with 1001 (shutdown)
	codeClosed        = "closed"            // the socket ended for another reason
	codeStopped       = "stopped"           // Run's context ended
	detailReplaced    = "another process registered with this host_id"
	detailAuthFailure = "the broker refused this host's credentials; check reach.host_id and the host token"
)

// outcome is how one connection attempt ended.
type outcome struct {
	code   string
	detail string
	// registered is how long the registration lasted (0 if it never
	// registered).
	registered time.Duration
}

// backoff is the reconnect policy of spec/reach.md "Host connector":
// attempt n waits min(max, base·2ⁿ) + uniform(0, delay/4); the counter
// resets only after a registration lasted BackoffResetAfter; unauthorized or
// revoked wait AuthFailureBackoff and replaced waits ReplacedBackoff, because
// retrying sooner cannot help (a wrong token) or would fight another copy of
// this host over the registration.
type backoff struct {
	cfg *Config
	n   int // attempts since the last reset
}

// next returns the wait before the next attempt after o.
func (b *backoff) next(o outcome) time.Duration {
	if o.registered >= b.cfg.BackoffResetAfter {
		b.n = 0
	}
	defer func() { b.n++ }()
	switch o.code {
	case string(wire.CodeUnauthorized), string(wire.CodeRevoked):
		return b.cfg.AuthFailureBackoff
	case codeReplaced:
		return b.cfg.ReplacedBackoff
	}
	d := b.cfg.MaxBackoff
	if b.n < 62 {
		if e := b.cfg.BackoffBase << b.n; e > 0 && e < d && e>>b.n == b.cfg.BackoffBase {
			d = e
		}
	}
	r := b.cfg.Rand()
	if r < 0 || r >= 1 {
		r = 0
	}
	return d + time.Duration(float64(d/4)*r)
}
