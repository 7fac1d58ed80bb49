package wire

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

var b64 = base64.RawURLEncoding

// ID is a host_id, connection_id or stream_id: 16 random bytes, written as
// exactly 22 characters of unpadded base64url. IDs are locators, not
// secrets, but the only accepted spelling is the canonical one, so two
// spellings can never name the same host or stream.
type ID [16]byte

// NewID returns a fresh random ID.
func NewID() ID {
	var id ID
	rand.Read(id[:]) // never fails (crypto/rand contract since Go 1.24)
	return id
}

// ParseID accepts only the canonical form: decode, re-encode, compare. That
// rejects padding, the '+' and '/' alphabet, line breaks, wrong lengths and
// a last character with non-zero unused bits.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != IDLen {
		return id, errf(CodeUnauthorized, "id is not 22 characters")
	}
	n, err := b64.Decode(id[:], []byte(s))
	if err != nil || n != len(id) || b64.EncodeToString(id[:]) != s {
		return ID{}, errf(CodeUnauthorized, "id is not canonical base64url")
	}
	return id, nil
}

func (id ID) String() string { return b64.EncodeToString(id[:]) }

// IsZero reports the all-zero ID, which no one generates by chance; it
// stands for "absent" in configuration.
func (id ID) IsZero() bool { return id == ID{} }

// MarshalText lets an ID sit in JSON or YAML structs as its canonical string.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText applies the same canonical check as ParseID.
func (id *ID) UnmarshalText(b []byte) error {
	v, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// Secret is a raw token (host registration, bootstrap or route). It redacts
// itself in fmt verbs, in JSON/YAML/text encoders and in zerolog, so a token
// that ends up in a log line by mistake shows as "[redacted]". Use
// string(s) where the raw value is really needed (the register frame, the QR,
// the bootstrap endpoint's answer).
type Secret string

const redacted = "[redacted]"

func (s Secret) String() string   { return redacted }
func (s Secret) GoString() string { return redacted }

// Format covers every fmt verb, including %d and %x, which would otherwise
// print the underlying string.
func (s Secret) Format(f fmt.State, _ rune) { io.WriteString(f, redacted) }

// MarshalText redacts; encoding/json, yaml and zerolog use it.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// NewToken returns a fresh token: 32 random bytes as 43 characters of
// unpadded base64url.
func NewToken() Secret {
	var b [32]byte
	rand.Read(b[:])
	return Secret(b64.EncodeToString(b[:]))
}

// ValidWireToken reports whether the broker accepts s as a token: valid
// UTF-8 of 32..512 characters. Characters are Unicode code points, as the
// reference broker counts them; the alphabet is not restricted because the
// reference accepts any string and existing host tokens need not be
// base64url. Tokens we mint are always 43 base64url characters.
func ValidWireToken(s string) bool {
	if len(s) < MinWireToken || len(s) > 4*MaxWireToken || !utf8.ValidString(s) {
		return false
	}
	n := utf8.RuneCountInString(s)
	return n >= MinWireToken && n <= MaxWireToken
}

// Digest is token_sha256: SHA-256 over the UTF-8 bytes of a token (or of a
// device id, for device_id_hash). The broker stores only digests.
type Digest [32]byte

// TokenDigest computes token_sha256(t).
func TokenDigest(t string) Digest { return sha256.Sum256([]byte(t)) }

// ParseDigest accepts only the canonical 43-character unpadded base64url form.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	if len(s) != DigestLen {
		return d, errf(CodeUnauthorized, "digest is not 43 characters")
	}
	n, err := b64.Decode(d[:], []byte(s))
	if err != nil || n != len(d) || b64.EncodeToString(d[:]) != s {
		return Digest{}, errf(CodeUnauthorized, "digest is not canonical base64url")
	}
	return d, nil
}

func (d Digest) String() string { return b64.EncodeToString(d[:]) }

// IsZero reports the all-zero digest, which stands for "absent".
func (d Digest) IsZero() bool { return d == Digest{} }

// Equal compares in constant time: digests of credentials are compared
// against stored ones, and timing must not tell how many bytes matched.
func (d Digest) Equal(o Digest) bool { return subtle.ConstantTimeCompare(d[:], o[:]) == 1 }

// MarshalText writes the canonical string (a digest is not a secret).
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText applies the same canonical check as ParseDigest.
func (d *Digest) UnmarshalText(b []byte) error {
	v, err := ParseDigest(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// RouteCredentialID derives a route credential_id from a Relay session
// token: the first 16 bytes of its SHA-256 as an ID string. Stable per
// session (so a republish replaces the old digest) without revealing the
// session token.
func RouteCredentialID(sessionToken string) string {
	sum := sha256.Sum256([]byte(sessionToken))
	var id ID
	copy(id[:], sum[:16])
	return id.String()
}

// ValidLabel reports whether s may be a pairing_id or credential_id:
// 1..128 characters of [A-Za-z0-9_-]. The narrow alphabet keeps labels safe
// to log and to embed in JSON without escaping.
func ValidLabel(s string) bool { return validName(s, MaxLabelLen, true) }

// ValidExtension reports whether s may be an extension name: 1..32
// characters of [a-z0-9_-].
func ValidExtension(s string) bool { return validName(s, MaxExtensionLen, false) }

func validName(s string, max int, upper bool) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '-':
		case upper && c >= 'A' && c <= 'Z':
		default:
			return false
		}
	}
	return true
}

// ParseExpiresAt reads an expires_at value: any JSON number, floored to
// whole Unix seconds. Booleans, strings (including ISO dates, which the
// reference accepted) and null are unauthorized. We accept floats because
// the stock Hermes connector publishes fractional session expiries.
//
// Overflow: an integer literal beyond int64 and a float whose floor is
// outside int64 (including 1e400, which Go parses as ±Inf) clamp to
// math.MaxInt64 or math.MinInt64. Clamping is safe: a huge value is a
// far-future expiry (clamped again or refused by CheckExpiry) and a hugely
// negative one is expired. Floats are floored at float64 precision, like the
// reference's Python float.
func ParseExpiresAt(raw json.RawMessage) (int64, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) || !json.Valid([]byte(s)) {
		return 0, errf(CodeUnauthorized, "expires_at is not a JSON number")
	}
	if !strings.ContainsAny(s, ".eE") {
		v, err := strconv.ParseInt(s, 10, 64)
		if err == nil {
			return v, nil
		}
		if s[0] == '-' {
			return math.MinInt64, nil
		}
		return math.MaxInt64, nil
	}
	f, _ := strconv.ParseFloat(s, 64) // range errors give ±Inf or 0, both usable
	f = math.Floor(f)
	switch {
	case f >= math.MaxInt64: // 2^63 exactly as float64
		return math.MaxInt64, nil
	case f <= math.MinInt64:
		return math.MinInt64, nil
	}
	return int64(f), nil
}

// CheckExpiry applies the broker's expiry rules to a published credential
// and returns the expiry to store: a past (or current) expiry is expired; a
// bootstrap expiry more than MaxBootstrapAhead ahead is unauthorized; a route
// expiry beyond MaxRouteLifetime is clamped to now + MaxRouteLifetime.
func CheckExpiry(kind Kind, expiresAt int64, now time.Time) (int64, error) {
	n := now.Unix()
	if expiresAt <= n {
		return 0, errf(CodeExpired, "expires_at is not in the future")
	}
	switch kind {
	case KindBootstrap:
		if expiresAt > n+int64(MaxBootstrapAhead/time.Second) {
			return 0, errf(CodeUnauthorized, "bootstrap expires_at too far ahead")
		}
	case KindRoute:
		if limit := n + int64(MaxRouteLifetime/time.Second); expiresAt > limit {
			return limit, nil
		}
	default:
		return 0, errf(CodeUnauthorized, "credential kind has no published expiry")
	}
	return expiresAt, nil
}

// ParseBrokerURL accepts exactly wss://host[:port]/v1/connect — no other
// path, no user info, query or fragment — because clients reject anything
// else and a credential must never sit in a URL.
func ParseBrokerURL(s string) (*url.URL, error) {
	bad := func(why string) (*url.URL, error) {
		return nil, fmt.Errorf("reach broker URL must be wss://host[:port]%s: %s", ConnectPath, why)
	}
	if strings.ContainsAny(s, "?# \t\r\n") {
		return bad("query, fragment or whitespace")
	}
	u, err := url.Parse(s)
	if err != nil {
		return bad("does not parse")
	}
	switch {
	case u.Scheme != "wss":
		return bad("scheme is not wss")
	case u.User != nil:
		return bad("contains user info")
	case u.Opaque != "" || u.Hostname() == "":
		return bad("no host")
	case u.EscapedPath() != ConnectPath:
		return bad("wrong path")
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
			return bad("bad port")
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return bad("empty port")
	}
	return u, nil
}

// CheckClientCredential applies the Reach rules to what a client registers
// with: the broker URL (ParseBrokerURL), the canonical host_id, a client
// credential kind (bootstrap or route) and the token's length. Every
// failure is listed; none quotes the token.
func CheckClientCredential(brokerURL, hostID, kind string, token Secret) error {
	var errs []error
	if _, err := ParseBrokerURL(brokerURL); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParseID(hostID); err != nil {
		errs = append(errs, errors.New("reach host_id must be the canonical 22-character id"))
	}
	switch Kind(kind) {
	case KindBootstrap, KindRoute:
	default:
		errs = append(errs, fmt.Errorf("reach credential_kind %q: want bootstrap or route", kind))
	}
	if !ValidWireToken(string(token)) {
		errs = append(errs, fmt.Errorf("reach token must be %d..%d characters", MinWireToken, MaxWireToken))
	}
	return errors.Join(errs...)
}
