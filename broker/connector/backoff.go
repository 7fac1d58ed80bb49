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
	// advised is the reconnect delay the broker gave in its shutdown close
	// ("shutdown retry=SECONDS"), when hasAdvice.
	advised   time.Duration
	hasAdvice bool
}

// Why a wait was chosen (Status.RetryReason and the "reconnect:<why>"
// counters).
const (
	retryFast      = "fast"      // a blip after a long registration: at once
	retryBackoff   = "backoff"   // the exponential schedule
	retryPermanent = "permanent" // unauthorized or revoked: 10 minutes
	retryReplaced  = "replaced"  // another copy of this host registered
	retryAdvised   = "advised"   // the broker's shutdown close said when
)

// permanent reports whether code is a refusal that retrying soon cannot
// fix.
func permanent(code string) bool {
	return code == string(wire.CodeUnauthorized) || code == string(wire.CodeRevoked)
}

// backoff is the reconnect policy of spec/reach.md "Host connector":
// attempt n waits min(max, base·2ⁿ) + uniform(0, delay/4); the counter
// resets only after a registration lasted BackoffResetAfter; unauthorized or
// revoked wait AuthFailureBackoff and replaced waits ReplacedBackoff, because
// retrying sooner cannot help (a wrong token) or would fight another copy of
// this host over the registration.
//
// Two additions: a registration that lasted BackoffResetAfter and then
// dropped is most likely a network blip, so the next FastRetries attempts go
// at once (without counting in n); and a broker that closes with "shutdown
// retry=SECONDS" is honoured: that delay plus up to a quarter of jitter,
// which spreads the reconnections of all its hosts.
type backoff struct {
	cfg  *Config
	n    int    // attempts since the last reset
	fast int    // fast retries left, refilled by a long registration
	why  string // why the last wait was chosen (retry…)
}

// next returns the wait before the next attempt after o.
func (b *backoff) next(o outcome) time.Duration {
	if o.registered >= b.cfg.BackoffResetAfter {
		b.n = 0
		b.fast = max(b.cfg.FastRetries, 0)
	}
	var d time.Duration
	switch {
	case permanent(o.code):
		b.why, b.fast = retryPermanent, 0
		d = b.cfg.AuthFailureBackoff
	case o.code == codeReplaced:
		b.why, b.fast = retryReplaced, 0
		d = b.cfg.ReplacedBackoff
	case o.hasAdvice:
		b.why = retryAdvised
		d = o.advised + b.jitter(o.advised)
	case b.fast > 0:
		b.why = retryFast
		b.fast--
		return 0 // a fast retry does not count in n
	default:
		b.why = retryBackoff
		d = b.cfg.MaxBackoff
		if b.n < 62 {
			if e := b.cfg.BackoffBase << b.n; e > 0 && e < d && e>>b.n == b.cfg.BackoffBase {
				d = e
			}
		}
		d += b.jitter(d)
	}
	b.n++
	return d
}

// jitter is uniform(0, d/4).
func (b *backoff) jitter(d time.Duration) time.Duration {
	r := b.cfg.Rand()
	if r < 0 || r >= 1 {
		r = 0
	}
	return time.Duration(float64(d/4) * r)
}
