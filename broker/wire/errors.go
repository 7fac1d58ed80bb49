package wire

import (
	"strconv"
	"strings"
	"time"
)

// Code is an error code as it travels in {"type":"error","code":...}. The
// codes, their Go errors and their meanings come from one table below so a
// new code cannot be added to one and forgotten in the other.
type Code string

// The error codes of protocol v1 (spec/reach.md "Registration").
const (
	CodeUnsupportedVersion Code = "unsupported_version"
	CodeUnauthorized       Code = "unauthorized"
	CodeExpired            Code = "expired"
	CodeReplayed           Code = "replayed"
	CodeHostOffline        Code = "host_offline"
	CodeHostBusy           Code = "host_busy"
	CodeQuotaExceeded      Code = "quota_exceeded"
	CodeRevoked            Code = "revoked"
	// CodeUnavailable is a temporary broker-side failure (its state file
	// cannot be written): nothing changed, retry later.
	CodeUnavailable Code = "unavailable"
)

// Error is a protocol failure with the code the peer is told. Detail is a
// fixed text for our own logs — never peer data, never a secret, never sent
// on the wire (the wire carries only the code, so an error cannot reveal
// whether an unrelated host or token exists).
type Error struct {
	Code Code
	// Detail says which check failed, for logs only.
	Detail string
	// Violation marks a framing violation: the peer broke the message or
	// frame structure, so after the error message its registration (host)
	// or stream (client) must end with close 1008. A field error on a
	// well-formed host control frame is not a violation: the host gets the
	// error reply and stays connected.
	Violation bool
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "reach: " + string(e.Code)
	}
	return "reach: " + string(e.Code) + ": " + e.Detail
}

// Is makes errors.Is(err, ErrUnauthorized) true for every *Error with that
// code, whatever its detail.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels for errors.Is, one per code.
var (
	ErrUnsupportedVersion = &Error{Code: CodeUnsupportedVersion}
	ErrUnauthorized       = &Error{Code: CodeUnauthorized}
	ErrExpired            = &Error{Code: CodeExpired}
	ErrReplayed           = &Error{Code: CodeReplayed}
	ErrHostOffline        = &Error{Code: CodeHostOffline}
	ErrHostBusy           = &Error{Code: CodeHostBusy}
	ErrQuotaExceeded      = &Error{Code: CodeQuotaExceeded}
	ErrRevoked            = &Error{Code: CodeRevoked}
	ErrUnavailable        = &Error{Code: CodeUnavailable}
)

// codeTable is the single list of codes: wire string, Go error, meaning.
var codeTable = []struct {
	code Code
	err  *Error
	what string
}{
	{CodeUnsupportedVersion, ErrUnsupportedVersion, "protocol_version is not the JSON integer 1"},
	{CodeUnauthorized, ErrUnauthorized, "bad registration, bad field, unknown credential or framing violation"},
	{CodeExpired, ErrExpired, "credential or expires_at lies in the past"},
	{CodeReplayed, ErrReplayed, "connection_id already seen or bootstrap token already consumed"},
	{CodeHostOffline, ErrHostOffline, "the named host has no live registration"},
	{CodeHostBusy, ErrHostBusy, "stream limit of the host or of the route credential reached"},
	{CodeQuotaExceeded, ErrQuotaExceeded, "credential quota or a broker table is full"},
	{CodeRevoked, ErrRevoked, "credential or host was revoked"},
	{CodeUnavailable, ErrUnavailable, "temporary broker failure (its state cannot be written); retry later"},
}

// Codes lists every v1 code in table order.
func Codes() []Code {
	out := make([]Code, len(codeTable))
	for i, row := range codeTable {
		out[i] = row.code
	}
	return out
}

// Known reports whether c is a v1 code.
func (c Code) Known() bool {
	for _, row := range codeTable {
		if row.code == c {
			return true
		}
	}
	return false
}

// Err returns the sentinel of a known code, or a fresh *Error for a code a
// newer peer sent that v1 does not know (it still matches nothing else).
func (c Code) Err() error {
	for _, row := range codeTable {
		if row.code == c {
			return row.err
		}
	}
	return &Error{Code: c, Detail: "code unknown to protocol v1"}
}

// Description is a short human text for status output and docs.
func (c Code) Description() string {
	for _, row := range codeTable {
		if row.code == c {
			return row.what
		}
	}
	return "code unknown to protocol v1"
}

// errf builds a non-violation error; violation builds a violation. Both take
// fixed detail texts only.
func errf(c Code, detail string) *Error { return &Error{Code: c, Detail: detail} }

func violation(detail string) *Error {
	return &Error{Code: CodeUnauthorized, Detail: detail, Violation: true}
}

// WebSocket close codes the protocol uses (spec/reach.md "Data"). They are
// untyped so they convert to any WebSocket library's status type.
const (
	// CloseNormal: the host sent CLOSE for the stream, or a host
	// registration was replaced by a newer one (reason CloseReasonReplaced).
	CloseNormal = 1000
	// CloseGoingAway: the host went offline or the broker shuts down.
	CloseGoingAway = 1001
	// ClosePolicy follows every error message: registration errors,
	// framing violations, revokes.
	ClosePolicy = 1008
	// CloseTooBig: a WebSocket message above the size limit.
	CloseTooBig = 1009
	// CloseTryAgain: the stream exceeded its queue limits (slow consumer).
	CloseTryAgain = 1013
)

// Close reasons with a protocol meaning. Reasons never carry secrets.
const (
	// CloseReasonReplaced: a newer registration of the same host_id won; the
	// connector backs off ReplacedBackoff instead of reconnecting at once.
	CloseReasonReplaced = "replaced"
	// CloseReasonRevoked: the host was removed from the broker's hosts file.
	CloseReasonRevoked = "revoked"
	// CloseReasonLeaseExpired (with 1001, cluster mode): the instance holding
	// the host could not renew its owner lease in the engine for the lease's
	// TTL; the connector reconnects on its normal schedule, to whichever
	// instance it lands on.
	CloseReasonLeaseExpired = "lease expired"
	// CloseReasonShutdownPrefix starts the reason of the close 1001 a
	// broker's graceful stop sends its hosts: "shutdown retry=SECONDS",
	// the delay the broker advises before reconnecting (ShutdownReason).
	CloseReasonShutdownPrefix = "shutdown retry="
)

// MaxAdvisedRetry bounds the delay a shutdown close may advise; a larger
// value is read as this.
const MaxAdvisedRetry = 10 * time.Minute

// ShutdownReason is the close reason advising hosts to reconnect after d
// (whole seconds, 0..MaxAdvisedRetry): "shutdown retry=SECONDS".
func ShutdownReason(d time.Duration) string {
	d = min(max(d, 0), MaxAdvisedRetry)
	return CloseReasonShutdownPrefix + strconv.Itoa(int(d/time.Second))
}

// ParseShutdownReason reads the advised delay of a "shutdown retry=SECONDS"
// close reason: SECONDS is 1..6 ASCII digits, clamped to MaxAdvisedRetry.
// Any other reason gives false.
func ParseShutdownReason(reason string) (time.Duration, bool) {
	digits, ok := strings.CutPrefix(reason, CloseReasonShutdownPrefix)
	if !ok || len(digits) == 0 || len(digits) > 6 {
		return 0, false
	}
	n := 0
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return min(time.Duration(n)*time.Second, MaxAdvisedRetry), true
}
